// What the two halves of the Python package's saved states share
// (ckpt_state.cc: Python objects -> StateValue, for stoker.save;
// ckpt_load.cc: loaded trees -> Python objects, for stoker.load): the
// checkpoint names of torch and numpy dtypes, an object's text, and the
// layout of a ShardedTensor. Called with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "stoker/checkpoint.h"

namespace stoker::python::state {

namespace py = pybind11;

using Kind = StateValue::Kind;

// numpy dtypes a checkpoint stores, by checkpoint dtype name (§3.3);
// bfloat16 and float8 have none.
inline const std::unordered_set<std::string> kNumpyNames = {
    "bool",  "uint8",  "int8",    "int16",   "uint16",  "int32",     "uint32",
    "int64", "uint64", "float16", "float32", "float64", "complex64", "complex128"};

inline std::string Str(py::handle h) { return py::str(h).cast<std::string>(); }
inline std::string Repr(py::handle h) { return py::repr(h).cast<std::string>(); }
inline std::string Format(const char* fmt, py::args args) {
  return Str(py::str(fmt).attr("format")(*args));
}

// A torch dtype's checkpoint name ("float32"), or "" where there is none.
inline std::string TorchDTypeName(py::handle dtype) {
  std::string s = Str(dtype);
  if (s.rfind("torch.", 0) != 0) return "";
  s = s.substr(6);
  return ParseDType(s).ok() ? s : "";
}

// The numpy dtype's checkpoint name (byte order aside), or "".
inline std::string NumpyName(py::handle dtype) {
  std::string s = Str(dtype.attr("name"));
  return kNumpyNames.contains(s) ? s : "";
}

// stoker.checkpoint's Python side of pieces: _piece(value) gives a
// ShardedTensor for a ShardedTensor or a DTensor, None otherwise.
inline py::object CheckpointModule() { return py::module_::import("stoker.checkpoint"); }

// The layout of a ShardedTensor (docs/checkpoint.md §3.4).
inline TensorLayout LayoutOf(py::handle piece) {
  TensorLayout l;
  l.global_shape = piece.attr("global_shape").cast<std::vector<int64_t>>();
  if (piece.attr("offsets").is_none()) {
    l.kind = TensorLayout::Kind::kFlat;
    l.flat_start = piece.attr("flat_start").cast<uint64_t>();
  } else {
    l.kind = TensorLayout::Kind::kBox;
    l.offsets = piece.attr("offsets").cast<std::vector<int64_t>>();
  }
  return l;
}

}  // namespace stoker::python::state
