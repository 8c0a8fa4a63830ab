// The Python package's saved states (stoker.save / stoker.load), converted
// to and from the C++ state trees of stoker/checkpoint.h (EncodeState,
// LoadState). Only type translation lives here: which Python objects map to
// which StateValue, and tensors <-> buffers; naming, ties, the document and
// the load's checks are C++'s. Part of the _stoker module (stoker_ext.cc);
// EncodePyState is ckpt_state.cc, LoadPyState ckpt_load.cc.
//
// Thread safety: called with the GIL held; LoadPyState releases it while
// C++ reads (through `run`) and takes it again for the plan of load(into=).
#pragma once

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>
#include <string>

#include "stoker/checkpoint.h"

namespace stoker::python {

namespace py = pybind11;

// Raises the Python exception of a Status (stoker_ext.cc).
[[noreturn]] void ThrowStatus(const Status& s);

// A state walked into what Checkpointer::Save takes; `keep` holds what the
// tensors point into (CPU copies of CUDA tensors, contiguous copies) until
// C++ has read them.
struct PyEncodedState {
  StateValue root;
  EncodedState encoded;
  py::list keep;
};

// Raises TypeError naming the key path of a value a checkpoint cannot hold.
std::shared_ptr<PyEncodedState> EncodePyState(py::handle state);

struct PyLoadArgs {
  std::string name;  // "" or "latest": the latest
  StateLoadOptions options;
  py::object device;  // None, or where to move restored tensors
  py::object into;    // None, or the state to restore into in place
  std::string uri;    // for messages
};

// Runs f on the Checkpointer with the GIL released (CheckpointerHandle::Run).
using LoadRunner =
    std::function<Result<LoadedState>(const std::function<Result<LoadedState>(Checkpointer&)>&)>;

// stoker.load: one rank's state, or (all_ranks) a list by rank.
py::object LoadPyState(const LoadRunner& run, const PyLoadArgs& args);

}  // namespace stoker::python
