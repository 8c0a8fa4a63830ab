// stoker._stoker: binds the C++ core to Python (pybind11). This file joins
// the module's parts and holds what they share at the top:
//   binding.h          Status -> Python exception (the translator is here)
//   batches.cc         batches as numpy arrays over the batch buffer, or
//                      DLPack arrays over its device copy
//   loader_binding.cc  _Loader, decode options, pack, inspect, verify
//   ckpt_binding.cc    _Checkpointer; saved states through ckpt_state.cc (save)
//                      and ckpt_load.cc (load)
//   metrics_binding.cc stoker.metrics' C++ side
//   here               the option structs, rank discovery, the module
//
// It stays thin on purpose: argument checks, epoch semantics and the friendly
// API are plain Python (python/stoker/); option structs are bound field by
// field (their defaults are C++'s). What lives in C++ is what must:
//   - batches as numpy arrays that share the batch buffer: every array of a
//     batch has as its base one capsule that owns a reference to the buffer,
//     so the memory lives while any array (or a torch tensor made from one)
//     refers to it and goes back to the loader's pool after;
//   - the GIL released while C++ waits (Next, StartEpoch, Open, pack, verify);
//   - Status -> Python exception, with the Status message unchanged. The
//     exception classes are defined in stoker/errors.py and registered here
//     by _register_errors(); until then errors are RuntimeError.
//
// Thread safety: a _Loader may be called from several Python threads; calls
// are serialised by a mutex taken after the GIL is released (so a thread
// waiting for data never holds the GIL while another waits for the mutex).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "binding.h"
#include "ckpt_state.h"
#include "stoker/checkpoint.h"
#include "stoker/gpu.h"
#include "stoker/loader.h"
#include "stoker/rank.h"
#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker::python {
namespace {

// ---- errors -----------------------------------------------------------------

// Python exception class per Code, filled by _register_errors.
std::array<PyObject*, static_cast<size_t>(Code::kInternal) + 1> g_error_classes{};

// Raises the registered class for the code, with the Status message as its
// only argument (so str(e) is the message) and .code / .retryable set.
void RaiseStatus(const Status& s) {
  const auto index = static_cast<size_t>(s.code());
  PyObject* cls = index < g_error_classes.size() ? g_error_classes[index] : nullptr;
  if (cls == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, s.ToString().c_str());
    return;
  }
  py::object exc = py::reinterpret_borrow<py::object>(cls)(s.message());
  exc.attr("code") = std::string(CodeName(s.code()));
  exc.attr("retryable") = s.retryable();
  PyErr_SetObject(cls, exc.ptr());
}

void RegisterErrors(const py::dict& classes) {
  for (auto [key, value] : classes) {
    const int code = key.cast<int>();
    if (code <= 0 || code >= static_cast<int>(g_error_classes.size())) {
      throw py::value_error("no stoker status code " + std::to_string(code));
    }
    PyObject* cls = value.ptr();
    Py_INCREF(cls);  // kept for the life of the process
    std::swap(g_error_classes[code], cls);
    Py_XDECREF(cls);
  }
}

// ---- option structs, field by field (their defaults are C++'s) -------------

// A std::chrono::milliseconds member as seconds (a float).
template <typename C>
void SecondsProperty(py::class_<C>& c, const char* name, std::chrono::milliseconds C::*member) {
  c.def_property(
      name, [member](const C& o) { return (o.*member).count() / 1000.0; },
      [member](C& o, double s) {
        o.*member = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
      });
}

void BindOptions(py::module_& m) {
  py::class_<StoreOptions> store(m, "_StoreOptions");
  store.def(py::init<>())
      .def_readwrite("posix_engine", &StoreOptions::posix_engine)
      .def_readwrite("io_threads", &StoreOptions::io_threads)
      .def_readwrite("direct_writes", &StoreOptions::direct_writes)
      .def_readwrite("keep_mapped_bytes", &StoreOptions::keep_mapped_bytes);
  SecondsProperty(store, "op_timeout_s", &StoreOptions::op_timeout);
  py::class_<LoaderState>(m, "_LoaderState")
      .def(py::init<>())
      .def_readwrite("epoch", &LoaderState::epoch)
      .def_readwrite("position", &LoaderState::position)
      .def_readwrite("version", &LoaderState::version)
      .def_readwrite("dataset_id", &LoaderState::dataset_id)
      .def_readwrite("seed", &LoaderState::seed)
      .def_readwrite("shuffle", &LoaderState::shuffle)
      .def_readwrite("shuffle_window_shards", &LoaderState::shuffle_window_shards)
      .def_readwrite("world_size", &LoaderState::world_size);
  m.attr("LOADER_STATE_VERSION") = kLoaderStateVersion;
  py::class_<LoaderOptions> lo(m, "_LoaderOptions");
  lo.def(py::init<>())
      .def_readwrite("batch_size", &LoaderOptions::batch_size)
      .def_readwrite("shuffle", &LoaderOptions::shuffle)
      .def_readwrite("seed", &LoaderOptions::seed)
      .def_readwrite("shuffle_window_shards", &LoaderOptions::shuffle_window_shards)
      .def_readwrite("rank", &LoaderOptions::rank)
      .def_readwrite("world_size", &LoaderOptions::world_size)
      .def_readwrite("drop_last", &LoaderOptions::drop_last)
      .def_readwrite("reads_in_flight", &LoaderOptions::reads_in_flight)
      .def_readwrite("memory_budget", &LoaderOptions::memory_budget)
      .def_readwrite("prefetch_batches", &LoaderOptions::prefetch_batches)
      .def_readwrite("threads", &LoaderOptions::threads)
      .def_readwrite("direct_io", &LoaderOptions::direct_io)
      .def_readwrite("read_unit", &LoaderOptions::read_unit)
      .def_readwrite("fields", &LoaderOptions::fields)
      .def_readwrite("decode", &LoaderOptions::decode)
      .def_readwrite("read_retries", &LoaderOptions::read_retries)
      .def_readwrite("start", &LoaderOptions::start)
      .def_readwrite("store", &LoaderOptions::store)
      .def_readwrite("device", &LoaderOptions::device)
      .def_readwrite("device_memory_budget", &LoaderOptions::device_memory_budget)
      .def_readwrite("cache_dir", &LoaderOptions::cache_dir)
      .def_readwrite("cache_bytes", &LoaderOptions::cache_bytes)
      .def_readwrite("cache_policy", &LoaderOptions::cache_policy)
      .def_readwrite("ranks_per_node", &LoaderOptions::ranks_per_node)
      .def_readwrite("node_affinity", &LoaderOptions::node_affinity);
  SecondsProperty(lo, "read_timeout_s", &LoaderOptions::read_timeout);
  py::class_<CheckpointerOptions>(m, "_CheckpointerOptions")
      .def(py::init<>())
      .def_readwrite("io_threads", &CheckpointerOptions::io_threads)
      .def_readwrite("write_retries", &CheckpointerOptions::write_retries)
      .def_readwrite("direct_reads", &CheckpointerOptions::direct_reads)
      .def_readwrite("store", &CheckpointerOptions::store);
}

}  // namespace

[[noreturn]] void ThrowStatus(const Status& s) { Throw(s); }

}  // namespace stoker::python

PYBIND11_MODULE(_stoker, m) {
  using namespace stoker::python;
  namespace st = stoker;
  m.doc() = "stoker's C++ core (use the `stoker` package, not this module)";
  m.attr("__version__") = STOKER_VERSION;

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseStatus(e.status);
    }
  });
  m.def("_register_errors", &RegisterErrors, py::arg("classes"),
        "Maps status codes (int) to the exception classes raised for them.");
  py::dict codes;
  for (int c = 1; c <= static_cast<int>(st::Code::kInternal); ++c) {
    codes[py::str(std::string(st::CodeName(static_cast<st::Code>(c))))] = c;
  }
  m.attr("STATUS_CODES") = codes;
  m.def(
      "_raise_status",
      [](int code, std::string message, bool retryable) {
        Throw(st::Status(static_cast<st::Code>(code), std::move(message), retryable));
      },
      "Raises the exception for a status (for tests of the mapping).");

  BindBatches(m);

  BindOptions(m);
  BindLoader(m);
  BindTokens(m);

  BindCheckpoints(m);
  BindWriter(m);
  BindImport(m);
  RegisterMetrics(m);
#ifdef STOKER_PYTHON_TESTING
  BindTesting(m);
#endif

  // ---- rank discovery (rank.h; stoker.distributed_env) ----
  m.def(
      "_discover_rank",
      [](const std::map<std::string, std::string>& env) {
        const st::RankInfo r = Unwrap(st::DiscoverRank(env));
        py::dict d;
        d["rank"] = r.rank;
        d["world_size"] = r.world_size;
        d["local_rank"] = r.local_rank;
        d["local_size"] = r.local_size;
        d["node"] = r.node;
        d["num_nodes"] = r.num_nodes;
        d["launcher"] = r.launched() ? py::object(py::str(r.launcher)) : py::object(py::none());
        return d;
      },
      py::arg("environ"), "Where this process stands in its job, from launcher variables.");
  m.def("_rank_variables", &st::RankVariables, "Every variable _discover_rank reads.");
  // ---- end of rank discovery ----
}
