// The _stoker module's checkpoints: _Checkpointer over the C++ Checkpointer
// (stoker/checkpoint.h), tensors by address, restored memory as arrays, and
// saved states through ckpt_state.h.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "binding.h"
#include "ckpt_state.h"
#include "stoker/checkpoint.h"
#include "stoker/metrics.h"

namespace stoker::python {
namespace {

// ---- checkpoints (stoker/checkpoint.py) -------------------------------------
//
// Tensors arrive from checkpoint.py as (name, dtype, shape, address, nbytes):
// the address of memory the Python caller keeps alive for the call (a CPU
// torch tensor's storage, a numpy array's data), so the bytes reach C++
// without a copy. Restored tensors go back as writable uint8 arrays over
// Restored::memory: one capsule per restore owns it and is the base of every
// array, so the memory lives while any array, or a torch tensor made from
// one, does; checkpoint.py views each as its dtype and shape. The GIL is
// released while C++ saves, restores, lists or removes.

using TensorArg = std::tuple<std::string, std::string, std::vector<int64_t>, uintptr_t, size_t>;

std::vector<TensorRef> MakeTensorRefs(const std::vector<TensorArg>& tensors) {
  std::vector<TensorRef> refs;
  refs.reserve(tensors.size());
  for (const auto& [name, dtype, shape, address, nbytes] : tensors) {
    TensorRef& t = refs.emplace_back();
    t.name = name;
    t.dtype = Unwrap(ParseDType(dtype));
    t.shape = shape;
    t.data = {reinterpret_cast<const std::byte*>(address), nbytes};
  }
  return refs;
}

py::dict CheckpointManifestDict(const CheckpointManifest& m) {
  py::list ranks;
  for (const RankPart& part : m.ranks) {
    py::list tensors;
    for (const TensorInfo& t : part.tensors) {
      py::dict d;
      d["name"] = t.name;
      d["dtype"] = std::string(DTypeName(t.dtype));
      d["shape"] = t.shape;
      d["bytes"] = t.bytes;
      tensors.append(d);
    }
    py::dict r;
    r["rank"] = part.rank;
    r["bytes"] = part.bytes();
    r["chunks"] = part.chunks.size();
    r["tensors"] = tensors;
    ranks.append(r);
  }
  py::dict d;
  d["name"] = m.name;
  d["format_version"] = m.format_version;
  d["sequence"] = m.sequence;
  d["created_by"] = m.created_by;
  d["created_unix_ms"] = m.created_unix_ms;
  d["world_size"] = m.world_size;
  d["attempt"] = m.attempt;
  d["metadata_json"] = m.metadata_json;  // the user's, out of the envelope (C++'s)
  d["step"] = m.step ? py::object(py::int_(*m.step)) : py::object(py::none());
  d["bytes"] = m.bytes();
  d["tensors"] = m.tensor_count();
  d["ranks"] = ranks;
  return d;
}

// An asynchronous save, for stoker.checkpoint.SaveHandle.
class SaveHandleWrapper {
 public:
  explicit SaveHandleWrapper(SaveHandle h) : handle_(std::move(h)), pid_(getpid()) {}

  bool Done() const {
    CheckProcess();
    py::gil_scoped_release release;
    return handle_.Done();
  }

  // True once the save succeeded; False if `timeout_s` passed first; raises
  // the save's error. A save that itself failed with TimedOut (the commit
  // timeout) is told from a wait that timed out by Done().
  bool Wait(std::optional<double> timeout_s) const {
    CheckProcess();
    Status s;
    {
      py::gil_scoped_release release;
      if (!timeout_s) {
        s = handle_.Wait();
      } else {
        const auto wait = std::chrono::duration<double>(std::max(0.0, *timeout_s));
        s = handle_.WaitUntil(Clock::now() + std::chrono::duration_cast<Clock::duration>(wait));
        if (s.code() == Code::kTimedOut) {
          if (!handle_.Done()) return false;
          s = handle_.Wait();
        }
      }
    }
    Check(s);
    return true;
  }

  // Returns once the save's device tensors are in host staging.
  void WaitStaged() const {
    CheckProcess();
    Status s;
    {
      py::gil_scoped_release release;
      s = handle_.WaitStaged();
    }
    Check(s);
  }

  const std::string& name() const { return handle_.name(); }

 private:
  // A forked child has the handle but not the threads writing the save.
  void CheckProcess() const {
    if (getpid() != pid_) {
      throw std::runtime_error(
          "this stoker.SaveHandle belongs to another process (fork): its save is written by "
          "the parent");
    }
  }

  SaveHandle handle_;
  pid_t pid_;
};

// One checkpoint root, kept open so that asynchronous saves reuse its staging
// area. Safe for concurrent use (the Checkpointer is); close() waits for its
// saves and frees it; calls after it raise CancelledError.
class CheckpointerHandle {
 public:
  CheckpointerHandle(const std::string& uri, const CheckpointerOptions& options) : uri_(uri) {
    Result<std::unique_ptr<Checkpointer>> r = [&] {
      py::gil_scoped_release release;
      return metrics::OpenCheckpointer(uri, options);  // saves counted; store metered when on
    }();
    ckpt_ = Unwrap(std::move(r));
  }
  // Over a Checkpointer made by the caller (the test hooks' gated store,
  // testing_binding.cc).
  CheckpointerHandle(const std::string& uri, std::unique_ptr<Checkpointer> checkpointer)
      : uri_(uri), ckpt_(std::move(checkpointer)) {}

  void Save(const std::string& name, const std::vector<TensorArg>& tensors,
            const SaveOptions& options) {
    const std::vector<TensorRef> refs = MakeTensorRefs(tensors);
    Check(Run([&](Checkpointer& c) { return c.Save(name, refs, options); }));
  }

  SaveHandleWrapper SaveAsync(const std::string& name, const std::vector<TensorArg>& tensors,
                              const SaveOptions& options) {
    const std::vector<TensorRef> refs = MakeTensorRefs(tensors);
    return SaveHandleWrapper(
        Unwrap(Run([&](Checkpointer& c) { return c.SaveAsync(name, refs, options); })));
  }

  // {"manifest": dict, "tensors": [(name, dtype, shape, rank, uint8 array,
  // address)]}, the arrays in manifest order.
  py::dict Restore(const std::string& name, uint32_t rank, uint32_t world_size, bool all_ranks,
                   std::vector<std::string> only) {
    RestoreOptions o;
    o.rank = rank;
    o.world_size = world_size;
    o.all_ranks = all_ranks;
    o.only = std::move(only);
    Restored r = Unwrap(Run([&](Checkpointer& c) { return c.Restore(name, o); }));
    const py::capsule owner(new std::shared_ptr<void>(r.memory),
                            [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
    py::list tensors;
    for (const RestoredTensor& t : r.tensors) {
      auto* p = reinterpret_cast<uint8_t*>(const_cast<std::byte*>(t.data.data()));
      // Writable: the memory belongs to this restore alone (as torch.load's).
      py::array a = py::array_t<uint8_t>({t.data.size()}, {size_t{1}}, p, owner);
      tensors.append(py::make_tuple(t.info.name, std::string(DTypeName(t.info.dtype)), t.info.shape,
                                    t.info.rank, a, reinterpret_cast<uintptr_t>(p)));
    }
    py::dict d;
    d["manifest"] = CheckpointManifestDict(r.manifest);
    d["tensors"] = tensors;
    return d;
  }

  // stoker.save's state, walked by _encode_state (ckpt_state.cc).
  void SaveState(const std::string& name, const PyEncodedState& state, const SaveOptions& options) {
    Check(Run([&](Checkpointer& c) { return c.Save(name, state.encoded.tensors, options); }));
  }

  SaveHandleWrapper SaveStateAsync(const std::string& name, const PyEncodedState& state,
                                   const SaveOptions& options) {
    return SaveHandleWrapper(Unwrap(
        Run([&](Checkpointer& c) { return c.SaveAsync(name, state.encoded.tensors, options); })));
  }

  // stoker.load, one call: see LoadPyState.
  py::object LoadState(const std::string& name, const StateLoadOptions& options, py::object device,
                       py::object into) {
    PyLoadArgs args{name, options, std::move(device), std::move(into), uri_};
    return LoadPyState(
        [this](const std::function<Result<LoadedState>(Checkpointer&)>& f) { return Run(f); },
        args);
  }

  py::dict ReadManifest(const std::string& name) {
    return CheckpointManifestDict(
        Unwrap(Run([&](Checkpointer& c) { return c.ReadManifest(name); })));
  }

  py::list List() {
    const std::vector<CheckpointListing> listings =
        Unwrap(Run([](Checkpointer& c) { return c.List(); }));
    py::list out;
    for (const CheckpointListing& l : listings) {
      py::dict d;
      d["name"] = l.name;
      d["committed"] = l.committed;
      d["latest"] = l.latest;
      d["sequence"] = l.sequence;
      d["bytes"] = l.bytes;
      d["tensors"] = l.tensors;
      d["world_size"] = l.world_size;
      d["created_unix_ms"] = l.created_unix_ms;
      d["objects"] = l.objects;
      out.append(d);
    }
    return out;
  }

  // The name `latest` points to; None when nothing was committed.
  std::optional<std::string> Latest() {
    Result<std::string> r = Run([](Checkpointer& c) { return c.Latest(); });
    if (r.status().code() == Code::kNotFound) return std::nullopt;
    return Unwrap(std::move(r));
  }
  std::string ClaimName() {
    return Unwrap(Run([](Checkpointer& c) { return c.ClaimName(); }));
  }
  // The name a save goes under: CheckpointNameFor (the given one, the
  // step's, or one claimed).
  std::string NameFor(const std::string& name, const SaveOptions& options) {
    return Unwrap(Run([&](Checkpointer& c) { return CheckpointNameFor(c, name, options); }));
  }

  void Remove(const std::string& name) {
    Check(Run([&](Checkpointer& c) { return c.Remove(name); }));
  }

  // Waits for the pending saves (the Checkpointer's destructor does) and frees
  // the staging area. Idempotent.
  void Close() {
    std::shared_ptr<Checkpointer> last;
    py::gil_scoped_release release;
    {
      std::lock_guard lock(mu_);
      last.swap(ckpt_);
    }
    last.reset();
  }

  // After fork(): the Checkpointer's threads do not exist in the child, so it
  // can neither be used nor destroyed. Leak it.
  void Abandon() {
    std::lock_guard lock(mu_);
    if (ckpt_) (void)new std::shared_ptr<Checkpointer>(std::move(ckpt_));
  }

  const std::string& uri() const { return uri_; }

 private:
  // Runs f(checkpointer) without the GIL. The shared_ptr keeps the
  // Checkpointer alive through a concurrent close(), which then frees it
  // here, still without the GIL.
  template <typename F>
  auto Run(F f) -> decltype(f(std::declval<Checkpointer&>())) {
    if (getpid() != pid_) {
      throw std::runtime_error(
          "this stoker.Checkpointer was created in another process: a forked child cannot use "
          "it (its threads do not exist here); make a new one in the child");
    }
    std::optional<decltype(f(std::declval<Checkpointer&>()))> result;
    {
      py::gil_scoped_release release;
      std::shared_ptr<Checkpointer> c;
      {
        std::lock_guard lock(mu_);
        c = ckpt_;
      }
      if (c) result.emplace(f(*c));
    }
    if (!result) Throw(Cancelled("the checkpointer of " + uri_ + " is closed"));
    return std::move(*result);
  }

  const std::string uri_;
  const pid_t pid_ = getpid();
  std::mutex mu_;
  std::shared_ptr<Checkpointer> ckpt_;
};

// ---- end of checkpoints -----------------------------------------------------
}  // namespace

py::object WrapCheckpointer(const std::string& uri, std::unique_ptr<Checkpointer> checkpointer) {
  return py::cast(new CheckpointerHandle(uri, std::move(checkpointer)),
                  py::return_value_policy::take_ownership);
}

void BindCheckpoints(py::module_& m) {
  // The options struct itself, field by field: its defaults are C++'s.
  py::class_<SaveOptions>(m, "_SaveOptions")
      .def(py::init([](const py::kwargs& fields) {
        // _SaveOptions(rank=..., ...): each keyword sets the field of its name.
        SaveOptions o;
        py::object self = py::cast(&o, py::return_value_policy::reference);
        for (const auto& [key, value] : fields) py::setattr(self, key, value);
        return o;
      }))
      .def_readwrite("rank", &SaveOptions::rank)
      .def_readwrite("world_size", &SaveOptions::world_size)
      .def_readwrite("chunk_bytes", &SaveOptions::chunk_bytes)
      .def_readwrite("metadata_json", &SaveOptions::metadata_json)
      .def_readwrite("keep_last", &SaveOptions::keep_last)
      .def_readwrite("attempt", &SaveOptions::attempt)
      .def_readwrite("wait_for_commit", &SaveOptions::wait_for_commit)
      .def_readwrite("step", &SaveOptions::step)
      .def_property(
          "commit_timeout_s",
          [](const SaveOptions& o) { return o.commit_timeout.count() / 1000.0; },
          [](SaveOptions& o, double s) {
            o.commit_timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
          });
  // Constants defined once, in C++.
  m.attr("DEFAULT_CHUNK_BYTES") = kDefaultChunkBytes;
  m.attr("MAX_TENSOR_NAME_BYTES") = kMaxTensorNameBytes;
  m.attr("MAX_CHECKPOINT_RANKS") = kMaxCheckpointRanks;
  m.attr("MAX_DECODE_SIDE") = kMaxDecodeSide;
  py::class_<StateLoadOptions>(m, "_StateLoadOptions")
      .def(py::init<>())
      .def_readwrite("rank", &StateLoadOptions::rank)
      .def_readwrite("world_size", &StateLoadOptions::world_size)
      .def_readwrite("any_world_if_single", &StateLoadOptions::any_world_if_single)
      .def_readwrite("all_ranks", &StateLoadOptions::all_ranks)
      .def_readwrite("reshard", &StateLoadOptions::reshard);
  py::class_<PyEncodedState, std::shared_ptr<PyEncodedState>>(m, "_EncodedState")
      .def_property_readonly("nbytes",
                             [](const PyEncodedState& s) {
                               return s.encoded.tensor_bytes + s.encoded.document.size();
                             })
      .def_property_readonly("on_device", [](const PyEncodedState& s) {
        for (const TensorRef& t : s.encoded.tensors) {
          if (t.device >= 0) return true;
        }
        return false;
      });
  m.def("_encode_state", &EncodePyState, py::arg("state"),
        "A state's tensors and structure document (docs/checkpoint.md §8), for save_state.");
  py::class_<SaveHandleWrapper>(m, "_SaveHandle")
      .def("done", &SaveHandleWrapper::Done)
      .def("wait", &SaveHandleWrapper::Wait, py::arg("timeout_s") = py::none())
      .def("wait_staged", &SaveHandleWrapper::WaitStaged)
      .def_property_readonly("name", &SaveHandleWrapper::name);
  py::class_<CheckpointerHandle>(m, "_Checkpointer")
      .def(py::init<const std::string&, const CheckpointerOptions&>(), py::arg("uri"),
           py::arg("options"))
      .def("save", &CheckpointerHandle::Save, py::arg("name"), py::arg("tensors"),
           py::arg("options"))
      .def("save_async", &CheckpointerHandle::SaveAsync, py::arg("name"), py::arg("tensors"),
           py::arg("options"))
      .def("restore", &CheckpointerHandle::Restore, py::arg("name"), py::arg("rank"),
           py::arg("world_size"), py::arg("all_ranks"), py::arg("only"))
      .def("save_state", &CheckpointerHandle::SaveState, py::arg("name"), py::arg("state"),
           py::arg("options"))
      .def("save_state_async", &CheckpointerHandle::SaveStateAsync, py::arg("name"),
           py::arg("state"), py::arg("options"))
      .def("load_state", &CheckpointerHandle::LoadState, py::arg("name"), py::arg("options"),
           py::arg("map_location"), py::arg("into"))
      .def("read_manifest", &CheckpointerHandle::ReadManifest, py::arg("name"))
      .def("list", &CheckpointerHandle::List)
      .def("latest", &CheckpointerHandle::Latest)
      .def("claim_name", &CheckpointerHandle::ClaimName)
      .def("name_for", &CheckpointerHandle::NameFor, py::arg("name"), py::arg("options"))
      .def("remove", &CheckpointerHandle::Remove, py::arg("name"))
      .def("close", &CheckpointerHandle::Close)
      .def("abandon", &CheckpointerHandle::Abandon)
      .def_property_readonly("uri", &CheckpointerHandle::uri);
  m.def(
      "_set_device_staging",
      [](CheckpointerOptions& o, std::optional<std::string> mode,
         std::optional<uint64_t> ring_bytes) {
        if (!mode) {
          // None: CheckpointerOptions' default
        } else if (*mode == "snapshot") {
          o.device_staging = CheckpointerOptions::DeviceStaging::kSnapshot;
        } else if (*mode == "bounded") {
          o.device_staging = CheckpointerOptions::DeviceStaging::kBounded;
        } else {
          throw py::value_error("device_staging must be 'snapshot' or 'bounded', not '" + *mode +
                                "'");
        }
        if (ring_bytes) o.staging_ring_bytes = *ring_bytes;
      },
      py::arg("options"), py::arg("mode") = py::none(), py::arg("ring_bytes") = py::none(),
      "CheckpointerOptions::device_staging and staging_ring_bytes (docs/checkpoint.md §9); "
      "None keeps the default.");
  // Read back (stoker.Checkpointer's options, against C++'s defaults).
  auto options = py::reinterpret_borrow<py::class_<CheckpointerOptions>>(
      m.attr("_CheckpointerOptions"));
  options.def_readonly("staging_ring_bytes", &CheckpointerOptions::staging_ring_bytes)
      .def_property_readonly("device_staging", [](const CheckpointerOptions& o) {
        return o.device_staging == CheckpointerOptions::DeviceStaging::kBounded ? "bounded"
                                                                                : "snapshot";
      });
  m.def("step_checkpoint_name", &StepCheckpointName, py::arg("step"),
        "The name of training step `step`'s checkpoint: 'step-%012d' (StepCheckpointName).");
  m.def("parse_step_checkpoint_name", &ParseStepCheckpointName, py::arg("name"),
        "The step of a name step_checkpoint_name made, else None.");
  m.def(
      "_validate_checkpoint_name",
      [](std::string_view name) { Check(ValidateCheckpointName(name)); }, py::arg("name"));
}

}  // namespace stoker::python
