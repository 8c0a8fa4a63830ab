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
struct Output {
  py::object array = py::none();
  py::object bytes_column = py::none();
  bool signed_ids = false;
};

// numpy's dtype for a decoded image column's element type.
py::dtype ImageNumpyDType(ImageDType t);

// The batch as a dict: "sample_ids" (uint64), "padding" (bool), int64 fields
// (int64), decoded image fields (uint8 N x H x W x C) and bytes fields as
// bytes_column(offsets uint64[N + 1], data uint8), all views of the batch
// buffer.
py::dict BatchDict(const Batch& batch, const Output& out);
// The same over the batch's device copy (DLPack).
py::dict DeviceBatchDict(const Batch& b, const Output& out);

}  // namespace stoker::python
