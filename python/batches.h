// Batches handed to Python: numpy views of the batch buffer (BatchDict) or,
// with device delivery, _DeviceArrays exported through DLPack
// (DeviceBatchDict). Part of the _stoker module.
//
// Thread safety: called with the GIL held.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include "stoker/loader.h"

namespace stoker::python {

namespace py = pybind11;

// How batches are handed to Python: `array` (e.g. torch.from_numpy) is applied
// to each numpy view, `bytes_column` builds a bytes field's value from its
// (offsets, data), and `signed_ids` types sample ids and offsets as int64
// (torch has no uint64; both stay far below 2**63). None: as they are.
// `from_dlpack` (e.g. torch.from_dlpack) takes host arrays numpy cannot hold
// (bfloat16); None: they are numpy uint16 arrays of the raw bits.
// `widen_unsigned`: uint16 and uint32 arrays are copied into int32 and int64
// ones (torch before 2.3 has neither type).
struct Output {
  py::object array = py::none();
  py::object bytes_column = py::none();
  bool signed_ids = false;
  py::object from_dlpack = py::none();
  bool widen_unsigned = false;
};

// numpy's dtype for a decoded image column's element type.
py::dtype ImageNumpyDType(ImageDType t);

// The batch as a dict: "sample_ids" (uint64), "padding" (bool), int64 fields
// (int64), decoded image fields (uint8 N x H x W x C) and bytes fields as
// bytes_column(offsets uint64[N + 1], data uint8), all views of the batch
// buffer. Format 3's typed fields: float32 / float64 fields and arrays of
// fixed shape as (N, *shape) arrays of their dtype (views); str fields as a
// list of str and json fields as a list of parsed values (copies); arrays
// of shape [*, ...] as their RaggedColumn (views): padded, NAME (N, longest,
// ...) and NAME_lengths (int64 N), else NAME (rows, ...) and NAME_offsets
// (int64 N + 1).
py::dict BatchDict(const Batch& batch, const Output& out);
// The same over the batch's device copy (DLPack). Typed arrays are device
// arrays of their own dtype (no widening); str and json lists are made from
// the host copy, as in BatchDict.
py::dict DeviceBatchDict(const Batch& b, const Output& out);

}  // namespace stoker::python
