// The parts of the _stoker module (stoker_ext.cc joins them) and what they
// share: a Status on its way to Python (StatusError, raised as the
// registered exception class by the module's translator) and its helpers.
//
// Thread safety: every function here is called with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <utility>

#include "stoker/status.h"

namespace stoker {
class Checkpointer;
}  // namespace stoker

namespace stoker::python {

namespace py = pybind11;

// A non-OK Status on its way to Python.
struct StatusError {
  Status status;
};

[[noreturn]] inline void Throw(const Status& s) { throw StatusError{s}; }

template <typename T>
T Unwrap(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(r).value();
}

inline void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}

// The module's parts, each in its own file.
void BindBatches(py::module_& m);      // batches.cc: _DeviceArray
void BindLoader(py::module_& m);       // loader_binding.cc: _Loader, decode, pack, inspect, verify
void BindCheckpoints(py::module_& m);  // ckpt_binding.cc: _Checkpointer, saved states
void RegisterMetrics(py::module_& m);  // metrics_binding.cc
void BindTokens(py::module_& m);       // mix_binding.cc: sequence_* options, _Mix
void BindWriter(py::module_& m);       // writer_binding.cc: _Writer, commit_parts
void BindImport(py::module_& m);       // import_binding.cc: import_webdataset, import_jsonl, export_webdataset
// testing_binding.cc, built into test builds only (STOKER_PYTHON_TESTING):
// _stoker._testing, hooks for the tests (a gated store).
void BindTesting(py::module_& m);

// A _Checkpointer over `checkpointer` (ckpt_binding.cc), for the test hooks.
py::object WrapCheckpointer(const std::string& uri, std::unique_ptr<Checkpointer> checkpointer);

}  // namespace stoker::python
