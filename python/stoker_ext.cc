// stoker._stoker: the one file that binds the C++ core to Python (pybind11).
//
// It stays thin on purpose: argument checks, epoch semantics and the friendly
// API are plain Python (python/stoker/); option structs are bound field by
// field (their defaults are C++'s); saved states are converted by
// ckpt_state.cc. What lives here is what must be C++:
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
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ckpt_state.h"
#include "stoker/checkpoint.h"
#include "stoker/dataset.h"
#include "stoker/format.h"
#include "stoker/gpu.h"
#include "stoker/loader.h"
#include "stoker/metrics.h"
#include "stoker/pack.h"
#include "stoker/rank.h"
#include "stoker/status.h"
#include "stoker/store.h"

namespace py = pybind11;

namespace stoker::python {
namespace {

// ---- errors -----------------------------------------------------------------

// A non-OK Status on its way to Python.
struct StatusError {
  Status status;
};

// Python exception class per Code, filled by _register_errors.
std::array<PyObject*, static_cast<size_t>(Code::kInternal) + 1> g_error_classes{};

[[noreturn]] void Throw(const Status& s) { throw StatusError{s}; }

template <typename T>
T Unwrap(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(r).value();
}

void Check(const Status& s) {
  if (!s.ok()) Throw(s);
}

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

// ---- batches as arrays --------------------------------------------------------

// One capsule per batch owns a reference to the batch buffer; it is the base
// of every array of the batch.
py::capsule BufferOwner(const Batch& batch) {
  auto* ref = new std::shared_ptr<const BatchMemory>(batch.memory());
  return py::capsule(ref,
                     [](void* p) { delete static_cast<std::shared_ptr<const BatchMemory>*>(p); });
}

template <typename T>
py::array View(std::span<const T> values, const py::capsule& owner) {
  // Writable: the buffer belongs to this batch alone, and torch.from_numpy
  // warns about read-only arrays.
  return py::array_t<T>({values.size()}, {sizeof(T)}, const_cast<T*>(values.data()), owner);
}

py::array BoolView(std::span<const uint8_t> values, const py::capsule& owner) {
  return py::array(py::dtype("bool"), {values.size()}, {sizeof(uint8_t)},
                   const_cast<uint8_t*>(values.data()), owner);
}

py::array ByteView(std::span<const std::byte> bytes, const py::capsule& owner) {
  auto* p = reinterpret_cast<uint8_t*>(const_cast<std::byte*>(bytes.data()));
  return py::array_t<uint8_t>({bytes.size()}, {sizeof(uint8_t)}, p, owner);
}

// An image column's shape: (N, H, W, C) or (N, C, H, W) by its layout.
std::vector<int64_t> ImageShape(const Batch::ImageColumn& c, size_t n) {
  const int64_t h = c.height, w = c.width, ch = c.channels;
  if (c.layout == ImageLayout::kNCHW) return {int64_t(n), ch, h, w};
  return {int64_t(n), h, w, ch};
}

py::dtype ImageNumpyDType(ImageDType t) {
  switch (t) {
    case ImageDType::kFloat32:
      return py::dtype("float32");
    case ImageDType::kFloat16:
      return py::dtype("float16");
    case ImageDType::kUInt8:
      break;
  }
  return py::dtype("uint8");
}

py::array ImageView(const Batch::ImageColumn& c, size_t n, const py::capsule& owner) {
  const std::vector<int64_t> shape = ImageShape(c, n);
  std::vector<py::ssize_t> strides(shape.size());
  py::ssize_t stride = py::ssize_t(ImageDTypeSize(c.dtype));
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return py::array(ImageNumpyDType(c.dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()),
                   strides, const_cast<std::byte*>(c.data.data()), owner);
}

// How batches are handed to Python: `array` (e.g. torch.from_numpy) is applied
// to each numpy view, `bytes_column` builds a bytes field's value from its
// (offsets, data), and `signed_ids` types sample ids and offsets as int64
// (torch has no uint64; both stay far below 2**63). None: as they are.
struct Output {
  py::object array = py::none();
  py::object bytes_column = py::none();
  bool signed_ids = false;
};

py::object Out(const Output& out, py::array a) {
  return out.array.is_none() ? py::object(a) : out.array(a);
}

template <typename T>
py::object Out(const Output& out, std::span<const T> values, const py::capsule& owner) {
  if constexpr (std::is_same_v<T, uint64_t>) {
    if (out.signed_ids) {
      const auto* p = reinterpret_cast<const int64_t*>(values.data());
      return Out(out, View(std::span<const int64_t>(p, values.size()), owner));
    }
  }
  return Out(out, View(values, owner));
}

// The batch as a dict: "sample_ids" (uint64), "padding" (bool), int64 fields
// (int64), decoded image fields (uint8 N x H x W x C) and bytes fields as
// bytes_column(offsets uint64[N + 1], data uint8), all views of the batch
// buffer.
py::dict BatchDict(const Batch& batch, const Output& out) {
  const py::capsule owner = BufferOwner(batch);
  py::dict d;
  d["sample_ids"] = Out(out, batch.sample_ids(), owner);
  d["padding"] = Out(out, BoolView(batch.padding(), owner));
  for (const auto& c : batch.int64_columns()) d[py::str(c.name)] = Out(out, c.values, owner);
  for (const auto& c : batch.image_columns()) {
    d[py::str(c.name)] = Out(out, ImageView(c, batch.size(), owner));
  }
  for (const auto& c : batch.bytes_columns()) {
    py::object offsets = Out(out, c.offsets, owner);
    py::object data = Out(out, ByteView(c.data, owner));
    d[py::str(c.name)] = out.bytes_column.is_none() ? py::object(py::make_tuple(offsets, data))
                                                    : out.bytes_column(offsets, data);
  }
  return d;
}

// ---- batches on the GPU (DLPack) ----------------------------------------------
//
// With device delivery every array of a batch is a _DeviceArray over the
// batch's device copy, exported through DLPack's __dlpack__(stream=...): the
// consumer's stream waits for the loader's copy (an event, on the device) and
// is remembered, so the device buffer is not reused before the work queued
// on it has run (gpu.h). The DLPack structs (dlpack.h v1.0, a stable C ABI)
// are declared here so the binding needs no extra header.

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion {
  uint32_t major;
  uint32_t minor;
};
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr int32_t kDLCUDA = 2;
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBool = 6;

// One array of a batch in device memory; holds the batch's device copy.
struct DeviceArray {
  std::shared_ptr<DeviceBatch> batch;
  const void* data = nullptr;
  std::vector<int64_t> shape;
  DLDataType dtype{kDLUInt, 8, 1};

  py::tuple DlpackDevice() const { return py::make_tuple(kDLCUDA, batch->device()); }

  // The DLPack protocol (array API standard): `stream` is the consumer's
  // stream (None: the legacy default stream; -1: no synchronisation).
  py::object Dlpack(py::object stream, py::object max_version, py::object dl_device,
                    py::object copy) {
    if (!copy.is_none() && copy.cast<bool>()) {
      throw py::buffer_error("stoker device arrays are exported without a copy");
    }
    if (!dl_device.is_none() && !dl_device.equal(DlpackDevice())) {
      throw py::buffer_error("a stoker batch on cuda:" + std::to_string(batch->device()) +
                             " cannot be exported to another device");
    }
    int64_t s = stream.is_none() ? int64_t(kLegacyDefaultStream) : stream.cast<int64_t>();
    if (s == 0) throw py::value_error("stream 0 is ambiguous for CUDA (DLPack): pass 1 or 2");
    if (s != -1) {
      Status st;
      {
        py::gil_scoped_release release;
        st = batch->WaitOn(static_cast<CudaStreamHandle>(s));
      }
      Check(st);
    }
    auto* ctx = new Ctx{batch, shape};
    DLTensor t{const_cast<void*>(data),
               {kDLCUDA, batch->device()},
               int32_t(shape.size()),
               dtype,
               ctx->shape.data(),
               nullptr,
               0};
    const bool versioned =
        !max_version.is_none() && max_version.cast<std::pair<int, int>>().first >= 1;
    if (versioned) {
      auto* m = new DLManagedTensorVersioned{{1, 0}, ctx, nullptr, 0, t};
      m->deleter = [](DLManagedTensorVersioned* x) {
        delete static_cast<Ctx*>(x->manager_ctx);
        delete x;
      };
      return Capsule(m, "dltensor_versioned");
    }
    auto* m = new DLManagedTensor{t, ctx, nullptr};
    m->deleter = [](DLManagedTensor* x) {
      delete static_cast<Ctx*>(x->manager_ctx);
      delete x;
    };
    return Capsule(m, "dltensor");
  }

 private:
  // What a DLPack consumer holds: the device copy and the shape array. Its
  // deleter may run on any thread, without the GIL: no Python objects here.
  struct Ctx {
    std::shared_ptr<DeviceBatch> batch;
    std::vector<int64_t> shape;
  };

  // A capsule nobody consumed (still named `name`) frees the tensor itself.
  template <typename M>
  static py::object Capsule(M* m, const char* name) {
    PyCapsule_Destructor destroy = [](PyObject* cap) {
      for (const char* n : {"dltensor", "dltensor_versioned"}) {
        if (PyCapsule_IsValid(cap, n)) {
          auto* x = static_cast<M*>(PyCapsule_GetPointer(cap, n));
          x->deleter(x);
        }
      }
    };
    PyObject* cap = PyCapsule_New(m, name, destroy);
    if (cap == nullptr) {
      m->deleter(m);
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(cap);
  }
};

template <typename T>
py::object DeviceOut(const Output& out, const Batch& b, const T* host, std::vector<int64_t> shape,
                     DLDataType dtype) {
  DeviceArray a{b.device(), b.device_pointer(host), std::move(shape), dtype};
  py::object o = py::cast(std::move(a));
  return out.array.is_none() ? o : out.array(o);
}

// BatchDict's layout, every array on the device.
py::dict DeviceBatchDict(const Batch& b, const Output& out) {
  const int64_t n = int64_t(b.size());
  const DLDataType u64{out.signed_ids ? kDLInt : kDLUInt, 64, 1};
  py::dict d;
  d["sample_ids"] = DeviceOut(out, b, b.sample_ids().data(), {n}, u64);
  d["padding"] = DeviceOut(out, b, b.padding().data(), {n}, {kDLBool, 8, 1});
  for (const auto& c : b.int64_columns()) {
    d[py::str(c.name)] = DeviceOut(out, b, c.values.data(), {n}, {kDLInt, 64, 1});
  }
  for (const auto& c : b.image_columns()) {
    const DLDataType t = c.dtype == ImageDType::kUInt8
                             ? DLDataType{kDLUInt, 8, 1}
                             : DLDataType{kDLFloat, uint8_t(8 * ImageDTypeSize(c.dtype)), 1};
    d[py::str(c.name)] = DeviceOut(out, b, c.data.data(), ImageShape(c, size_t(n)), t);
  }
  for (const auto& c : b.bytes_columns()) {
    py::object offsets = DeviceOut(out, b, c.offsets.data(), {n + 1}, u64);
    py::object data = DeviceOut(out, b, c.data.data(), {int64_t(c.data.size())}, {kDLUInt, 8, 1});
    d[py::str(c.name)] = out.bytes_column.is_none() ? py::object(py::make_tuple(offsets, data))
                                                    : out.bytes_column(offsets, data);
  }
  return d;
}

// ---- the dataset as a dict ---------------------------------------------------

py::dict ManifestDict(std::string_view uri, const format::Manifest& m) {
  uint64_t bytes = 0;
  py::list shard_samples;
  for (const auto& s : m.shards) {
    bytes += s.bytes;
    shard_samples.append(s.samples);
  }
  py::list fields;
  for (const auto& f : m.fields) {
    py::dict field;
    field["name"] = f.name;
    field["type"] = std::string(format::FieldTypeName(f.type));
    fields.append(field);
  }
  py::dict d;
  d["uri"] = std::string(uri);
  d["format_version"] = m.format_version;
  d["dataset_id"] = m.IdHex();
  d["samples"] = m.sample_count;
  d["shards"] = m.shards.size();
  d["shard_samples"] = shard_samples;
  d["bytes"] = bytes;
  d["payload_bytes"] = m.payload_bytes;
  d["max_sample_bytes"] = m.max_sample_bytes;
  d["fields"] = fields;
  d["classes"] = m.classes;
  d["created_by"] = m.created_by;
  return d;
}

// ---- the loader ---------------------------------------------------------------

class LoaderHandle {
 public:
  LoaderHandle(const std::string& uri, const LoaderOptions& options) : uri_(uri) {
    Result<std::unique_ptr<Loader>> r = [&] {
      py::gil_scoped_release release;
      return metrics::OpenLoader(uri, options);  // metered when metrics are on
    }();
    loader_ = Unwrap(std::move(r));
    info_ = ManifestDict(uri, loader_->manifest());
  }

  // The next batch as a dict of arrays, or None when the epoch is over.
  py::object Next() {
    Result<Batch> r = Locked([](Loader& l) { return l.Next(); });
    if (!r.ok()) {
      if (r.status().code() == Code::kOutOfRange) return py::none();
      Throw(r.status());
    }
    const auto buffer = r->buffer();
    last_buffer_ = {reinterpret_cast<uintptr_t>(buffer.data()), buffer.size()};
    return r->device() ? DeviceBatchDict(*r, output_) : BatchDict(*r, output_);
  }

  void SetOutput(py::object array, py::object bytes_column, bool signed_ids) {
    output_ = {std::move(array), std::move(bytes_column), signed_ids};
  }

  void StartEpoch(uint64_t epoch, uint64_t position) {
    Check(Locked([&](Loader& l) { return l.StartEpoch(epoch, position); }));
  }

  uint64_t NumBatches() {
    return Locked([](Loader& l) { return l.num_batches(); });
  }

  std::pair<uint64_t, uint64_t> State() {
    const LoaderState s = Locked([](Loader& l) { return l.state(); });
    return {s.epoch, s.position};
  }

  // The state at (epoch, position) with this loader's identity (versioned;
  // what Loader.state_dict() saves).
  LoaderState Identified(uint64_t epoch, uint64_t position) const {
    return IdentifiedState(epoch, position, loader_->manifest(), loader_->options());
  }

  // Whether this loader may resume from `s` (CheckResumeState's error).
  void CheckResume(const LoaderState& s) const {
    Check(CheckResumeState(s, loader_->manifest(), loader_->options()).WithContext(uri_));
  }

  py::dict Stats() {
    const LoaderStats s = Locked([](Loader& l) { return l.stats(); });
    py::dict d;
    d["shards_read"] = s.shards_read;
    d["bytes_read"] = s.bytes_read;
    d["samples_delivered"] = s.samples_delivered;
    d["batches_delivered"] = s.batches_delivered;
    d["read_retries"] = s.read_retries;
    d["decode_skipped"] = s.decode_skipped;
    d["shared_batches"] = s.shared_batches;
    d["wait_seconds"] = std::chrono::duration<double>(s.wait_time).count();
    d["peak_buffer_bytes"] = s.peak_buffer_bytes;
    d["h2d_bytes"] = s.h2d_bytes;
    d["h2d_seconds"] = std::chrono::duration<double>(s.h2d_time).count();
    d["device_bytes"] = s.device_bytes;
    d["peak_device_bytes"] = s.peak_device_bytes;
    d["pinned_bytes"] = s.pinned_bytes;
    d["remote_bytes"] = s.remote_bytes;
    d["cache_bytes"] = s.cache_bytes;
    d["cache_hits"] = s.cache_hits;
    d["cache_misses"] = s.cache_misses;
    d["cache_fetch_waits"] = s.cache_fetch_waits;
    d["cache_evictions"] = s.cache_evictions;
    d["cache_refetches"] = s.cache_refetches;
    return d;
  }

  // Stops the workers and frees the buffers not held by batches. Idempotent.
  void Close() {
    py::gil_scoped_release release;
    std::lock_guard lock(mu_);
    loader_.reset();
  }

  // After fork(): the workers do not exist in the child, so the Loader can
  // neither be used nor destroyed (joining them would hang). Leak it.
  void Abandon() { (void)loader_.release(); }

  const py::dict& info() const { return info_; }
  std::string read_unit() const { return std::string(loader_->read_unit()); }
  std::pair<uintptr_t, size_t> last_buffer() const { return last_buffer_; }

 private:
  // Runs f(loader) without the GIL, holding the loader's mutex. A closed
  // loader raises (Cancelled, "the loader is closed").
  template <typename F>
  auto Locked(F f) -> decltype(f(std::declval<Loader&>())) {
    std::optional<decltype(f(std::declval<Loader&>()))> result;
    {
      py::gil_scoped_release release;
      std::lock_guard lock(mu_);
      if (loader_) result.emplace(f(*loader_));
    }
    if (!result) Throw(Cancelled("the loader is closed"));
    return std::move(*result);
  }

  std::string uri_;  // for messages
  std::mutex mu_;
  std::unique_ptr<Loader> loader_;
  py::dict info_;
  Output output_;
  std::pair<uintptr_t, size_t> last_buffer_{0, 0};
};

// ---- decode options (stoker/decode.h), built by stoker/loader.py ------------

template <typename E>
void EnumProperty(py::class_<DecodeOptions>& c, const char* name, E DecodeOptions::*member) {
  c.def_property(
      name, [member](const DecodeOptions& o) { return int(o.*member); },
      [member](DecodeOptions& o, int v) { o.*member = E(v); });
}

void TripleProperty(py::class_<DecodeOptions>& c, const char* name,
                    float (DecodeOptions::*member)[3]) {
  c.def_property(
      name,
      [member](const DecodeOptions& o) {
        return std::array<float, 3>{(o.*member)[0], (o.*member)[1], (o.*member)[2]};
      },
      [member](DecodeOptions& o, std::array<float, 3> v) {
        std::copy(v.begin(), v.end(), o.*member);
      });
}

// DecodeSample on one JPEG into a new array (HWC or CHW): the loader's
// per-sample work without a dataset, for tests and bench/augment_bench.py.
py::array DecodeOne(const DecodeOptions& o, py::bytes jpeg, uint64_t seed, uint64_t epoch,
                    uint64_t sample_id) {
  Check(ValidateDecodeOptions(o));
  std::vector<py::ssize_t> shape{o.height, o.width, 3};
  if (o.layout == ImageLayout::kNCHW) shape = {3, o.height, o.width};
  py::array out(ImageNumpyDType(o.dtype), shape);
  const std::string_view data = jpeg;
  Status st;
  {
    py::gil_scoped_release release;
    thread_local DecodeScratch scratch;
    st = DecodeSample(
        o, {reinterpret_cast<const std::byte*>(data.data()), data.size()}, {seed, epoch, sample_id},
        {static_cast<std::byte*>(out.mutable_data()), size_t(out.nbytes())}, &scratch);
  }
  Check(st);
  return out;
}

void BindDecode(py::module_& m) {
  py::class_<DecodeOptions> c(m, "_DecodeOptions");
  c.def(py::init<>())
      .def_readwrite("field", &DecodeOptions::field)
      .def_readwrite("height", &DecodeOptions::height)
      .def_readwrite("width", &DecodeOptions::width)
      .def_readwrite("scale_min", &DecodeOptions::scale_min)
      .def_readwrite("scale_max", &DecodeOptions::scale_max)
      .def_readwrite("ratio_min", &DecodeOptions::ratio_min)
      .def_readwrite("ratio_max", &DecodeOptions::ratio_max)
      .def_readwrite("resize_shorter", &DecodeOptions::resize_shorter)
      .def_readwrite("flip", &DecodeOptions::flip)
      .def_readwrite("normalize", &DecodeOptions::normalize)
      .def_readwrite("skip_corrupt", &DecodeOptions::skip_corrupt)
      .def("validate", [](const DecodeOptions& o) { Check(ValidateDecodeOptions(o)); });
  EnumProperty(c, "crop", &DecodeOptions::crop);  // CropMode's values
  EnumProperty(c, "dtype", &DecodeOptions::dtype);
  EnumProperty(c, "layout", &DecodeOptions::layout);
  EnumProperty(c, "extent", &DecodeOptions::extent);  // for bench/augment_bench.py
  TripleProperty(c, "mean", &DecodeOptions::mean);
  TripleProperty(c, "std", &DecodeOptions::std);
  m.def("_decode_sample", &DecodeOne, py::arg("options"), py::arg("jpeg"), py::arg("seed") = 0,
        py::arg("epoch") = 0, py::arg("sample_id") = 0);
  m.def(
      "_sample_crop",
      [](const DecodeOptions& o, uint32_t image_h, uint32_t image_w, uint64_t seed, uint64_t epoch,
         uint64_t sample_id) {
        const SampleCrop c = SampleCropFor(o, image_h, image_w, {seed, epoch, sample_id});
        return py::make_tuple(c.top, c.left, c.height, c.width, c.flip);
      },
      py::arg("options"), py::arg("image_h"), py::arg("image_w"), py::arg("seed") = 0,
      py::arg("epoch") = 0, py::arg("sample_id") = 0,
      "(top, left, height, width, flip) of a sample's crop, in source pixels");
}

// ---- pack, inspect, verify --------------------------------------------------

py::dict PackDataset(const std::string& src, const std::string& dst, uint64_t shard_bytes,
                     uint32_t threads, std::optional<py::function> progress, bool shuffle,
                     uint64_t seed) {
  PackOptions o;
  o.shard_bytes = shard_bytes;
  o.threads = threads;
  o.shuffle = shuffle;
  o.shuffle_seed = seed;
  // The callback runs on pack's workers (serialised by pack). Its first
  // exception is raised once Pack returns; later calls are skipped.
  std::optional<py::error_already_set> callback_error;
  if (progress) {
    o.progress = [&](const PackProgress& p) {
      py::gil_scoped_acquire acquire;
      if (callback_error) return;
      try {
        py::dict d;
        d["files_done"] = p.files_done;
        d["files_total"] = p.files_total;
        d["bytes_done"] = p.bytes_done;
        d["bytes_total"] = p.bytes_total;
        d["shards_written"] = p.shards_written;
        (*progress)(d);
      } catch (py::error_already_set& e) {
        callback_error.emplace(std::move(e));
      }
    };
  }
  Result<format::Manifest> r = [&] {
    py::gil_scoped_release release;
    return Pack(src, dst, o);
  }();
  if (callback_error) throw std::move(*callback_error);
  return ManifestDict(dst, Unwrap(std::move(r)));
}

py::dict Inspect(const std::string& uri) {
  Result<format::Manifest> r = [&]() -> Result<format::Manifest> {
    py::gil_scoped_release release;
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(uri));
    return ReadManifest(*store);
  }();
  return ManifestDict(uri, Unwrap(std::move(r)));
}

py::dict Verify(const std::string& uri, uint32_t reads_in_flight) {
  Result<VerifyReport> r = [&]() -> Result<VerifyReport> {
    py::gil_scoped_release release;
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(uri));
    VerifyOptions o;
    o.reads_in_flight = reads_in_flight;
    return VerifyDataset(*store, o);
  }();
  const VerifyReport report = Unwrap(std::move(r));
  py::list problems;
  for (const auto& p : report.problems) {
    py::dict d;
    d["shard"] = p.shard_key;
    d["sample"] = p.sample >= 0 ? py::object(py::int_(p.sample)) : py::object(py::none());
    d["code"] = std::string(CodeName(p.status.code()));
    d["message"] = p.status.message();
    problems.append(d);
  }
  py::dict d;
  d["uri"] = uri;
  d["ok"] = report.ok();
  d["shards_checked"] = report.shards_checked;
  d["samples_checked"] = report.samples_checked;
  d["bytes_read"] = report.bytes_read;
  d["problems"] = problems;
  return d;
}

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
  d["metadata_json"] = m.metadata_json;
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
      .def_readwrite("direct_writes", &StoreOptions::direct_writes);
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

// ---- metrics (stoker.metrics is the Python side) ----
namespace stoker::python {

void RegisterMetrics(py::module_& m) {
  namespace sm = stoker::metrics;
  m.def(
      "_metrics_enable",
      [](std::string dir, double interval_s, std::string job, int64_t rank) {
        sm::Options o;
        o.dir = std::move(dir);
        o.interval = std::chrono::milliseconds(int64_t(interval_s * 1000));
        o.job = std::move(job);
        o.rank = rank;
        Check(sm::Enable(o));
      },
      py::arg("dir"), py::arg("interval_s"), py::arg("job"), py::arg("rank"));
  m.def("_metrics_disable", [] {
    py::gil_scoped_release release;
    sm::Disable();
  });
  m.def("_metrics_enabled", &sm::Enabled);
  m.def("_metrics_path", &sm::PublishedPath);
  m.def("_metrics_exposition", [] {
    py::gil_scoped_release release;
    return sm::Exposition();
  });
  // Checkpoints: _Checkpointer is metered (metrics::OpenCheckpointer), so
  // C++ counts every save.
  // `with _stoker._CheckpointSaveStarted(time.monotonic_ns()): impl.save(...)`:
  // the save's stall and seconds count from then, so the Python skin's
  // flattening and GPU-to-host copies are in them (metrics::SaveStartedAt).
  struct SaveStarted {
    explicit SaveStarted(int64_t ns) : begin(std::chrono::nanoseconds(ns)) {}
    Clock::time_point begin;
    std::optional<sm::SaveStartedAt> scope;
  };
  py::class_<SaveStarted>(m, "_CheckpointSaveStarted")
      .def(py::init<int64_t>(), py::arg("began_ns"))
      .def("__enter__", [](SaveStarted& s) { s.scope.emplace(s.begin); })
      .def("__exit__", [](SaveStarted& s, py::args) { s.scope.reset(); });
  m.def(
      "_timeline_start", [](std::string log) { Check(sm::StepTimeline::Get().Start(log)); },
      py::arg("log"));
  m.def("_timeline_stop", [] { sm::StepTimeline::Get().Stop(); });
  m.def("_timeline_active", [] { return sm::StepTimeline::Get().active(); });
  m.def(
      "_timeline_set_gpu", [](int i) { sm::StepTimeline::Get().SetGpu(i); }, py::arg("index"));
  // Intervals in time.monotonic_ns() (CLOCK_MONOTONIC, steady_clock's clock).
  m.def(
      "_timeline_add",
      [](int phase, int64_t begin_ns, int64_t end_ns) {
        if (phase < 0 || phase >= sm::kPhases) Check(InvalidArgument("no such phase"));
        sm::StepTimeline::Get().Add(sm::Phase(phase),
                                    Clock::time_point(std::chrono::nanoseconds(begin_ns)),
                                    Clock::time_point(std::chrono::nanoseconds(end_ns)));
      },
      py::arg("phase"), py::arg("begin_ns"), py::arg("end_ns"));
  auto record = [](const sm::StepRecord& r) {
    py::dict d;
    d["step"] = r.step;
    d["seconds"] = r.seconds;
    for (int p = 0; p < sm::kPhases; ++p)
      d[py::str(std::string(sm::PhaseName(sm::Phase(p))))] = r.phase[p];
    d["other"] = r.other;
    d["samples"] = r.samples;
    d["bytes"] = r.bytes;
    d["h2d_copy_seconds"] = r.h2d_copy_seconds;
    if (r.gpu_utilization >= 0) d["gpu_utilization"] = r.gpu_utilization;
    return d;
  };
  m.def("_timeline_mark", [record] { return record(sm::StepTimeline::Get().Mark()); });
  m.def("_timeline_totals", [record] { return record(sm::StepTimeline::Get().Totals()); });
  m.def("_timeline_phases", [] {
    py::list l;
    for (int p = 0; p < sm::kPhases; ++p) l.append(std::string(sm::PhaseName(sm::Phase(p))));
    return l;
  });
  m.def(
      "_write_report", [](std::string log, std::string out) { Check(sm::WriteReport(log, out)); },
      py::arg("run_log"), py::arg("html_path"));
}

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

  py::class_<DeviceArray>(m, "_DeviceArray")
      .def("__dlpack__", &DeviceArray::Dlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none())
      .def("__dlpack_device__", &DeviceArray::DlpackDevice)
      .def_property_readonly("shape",
                             [](const DeviceArray& a) { return py::tuple(py::cast(a.shape)); })
      .def_property_readonly("device", [](const DeviceArray& a) { return a.batch->device(); })
      .def("__len__", [](const DeviceArray& a) { return a.shape.empty() ? 0 : a.shape[0]; })
      .def("__repr__", [](const DeviceArray& a) {
        std::string shape;
        for (int64_t x : a.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(x);
        return "<stoker device array (" + shape + ") on cuda:" + std::to_string(a.batch->device()) +
               ">";
      });
  m.def("_built_with_cuda", &stoker::BuiltWithCuda);

  BindDecode(m);
  BindOptions(m);

  py::class_<LoaderHandle>(m, "_Loader")
      .def(py::init<const std::string&, const st::LoaderOptions&>(), py::arg("uri"),
           py::arg("options"))
      .def("next", &LoaderHandle::Next)
      .def("set_output", &LoaderHandle::SetOutput, py::arg("array"), py::arg("bytes_column"),
           py::arg("signed_ids"))
      .def("start_epoch", &LoaderHandle::StartEpoch, py::arg("epoch"), py::arg("position"))
      .def("num_batches", &LoaderHandle::NumBatches)
      .def("state", &LoaderHandle::State)
      .def("identified_state", &LoaderHandle::Identified, py::arg("epoch"), py::arg("position"))
      .def("check_resume", &LoaderHandle::CheckResume, py::arg("state"))
      .def("stats", &LoaderHandle::Stats)
      .def("close", &LoaderHandle::Close)
      .def("abandon", &LoaderHandle::Abandon)
      .def_property_readonly("info", &LoaderHandle::info)
      .def_property_readonly("read_unit", &LoaderHandle::read_unit)
      .def_property_readonly("last_buffer", &LoaderHandle::last_buffer,
                             "(address, size) of the buffer of the last batch (for tests)");

  m.def("pack", &PackDataset, py::arg("src"), py::arg("dst"), py::arg("shard_bytes"),
        py::arg("threads"), py::arg("progress") = py::none(), py::arg("shuffle") = true,
        py::arg("seed") = 0);
  m.def("inspect", &Inspect, py::arg("uri"));
  m.def("verify", &Verify, py::arg("uri"), py::arg("reads_in_flight"));

  // ---- checkpoints (stoker/checkpoint.py) ----
  // The options struct itself, field by field: its defaults are C++'s.
  py::class_<st::SaveOptions>(m, "_SaveOptions")
      .def(py::init([](const py::kwargs& fields) {
        // _SaveOptions(rank=..., ...): each keyword sets the field of its name.
        st::SaveOptions o;
        py::object self = py::cast(&o, py::return_value_policy::reference);
        for (const auto& [key, value] : fields) py::setattr(self, key, value);
        return o;
      }))
      .def_readwrite("rank", &st::SaveOptions::rank)
      .def_readwrite("world_size", &st::SaveOptions::world_size)
      .def_readwrite("chunk_bytes", &st::SaveOptions::chunk_bytes)
      .def_readwrite("metadata_json", &st::SaveOptions::metadata_json)
      .def_readwrite("keep_last", &st::SaveOptions::keep_last)
      .def_readwrite("attempt", &st::SaveOptions::attempt)
      .def_readwrite("wait_for_commit", &st::SaveOptions::wait_for_commit)
      .def_property(
          "commit_timeout_s",
          [](const st::SaveOptions& o) { return o.commit_timeout.count() / 1000.0; },
          [](st::SaveOptions& o, double s) {
            o.commit_timeout = std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
          });
  // Constants defined once, in C++.
  m.attr("DEFAULT_CHUNK_BYTES") = st::kDefaultChunkBytes;
  m.attr("MAX_TENSOR_NAME_BYTES") = st::kMaxTensorNameBytes;
  m.attr("MAX_CHECKPOINT_RANKS") = st::kMaxCheckpointRanks;
  m.attr("MAX_DECODE_SIDE") = st::kMaxDecodeSide;
  py::class_<st::StateLoadOptions>(m, "_StateLoadOptions")
      .def(py::init<>())
      .def_readwrite("rank", &st::StateLoadOptions::rank)
      .def_readwrite("world_size", &st::StateLoadOptions::world_size)
      .def_readwrite("any_world_if_single", &st::StateLoadOptions::any_world_if_single)
      .def_readwrite("all_ranks", &st::StateLoadOptions::all_ranks);
  py::class_<PyEncodedState, std::shared_ptr<PyEncodedState>>(m, "_EncodedState")
      .def_property_readonly("nbytes", [](const PyEncodedState& s) {
        return s.encoded.tensor_bytes + s.encoded.document.size();
      });
  m.def("_encode_state", &EncodePyState, py::arg("state"),
        "A state's tensors and structure document (docs/checkpoint.md §8), for save_state.");
  py::class_<SaveHandleWrapper>(m, "_SaveHandle")
      .def("done", &SaveHandleWrapper::Done)
      .def("wait", &SaveHandleWrapper::Wait, py::arg("timeout_s") = py::none())
      .def_property_readonly("name", &SaveHandleWrapper::name);
  py::class_<CheckpointerHandle>(m, "_Checkpointer")
      .def(py::init<const std::string&, const st::CheckpointerOptions&>(), py::arg("uri"),
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
      .def("remove", &CheckpointerHandle::Remove, py::arg("name"))
      .def("close", &CheckpointerHandle::Close)
      .def("abandon", &CheckpointerHandle::Abandon)
      .def_property_readonly("uri", &CheckpointerHandle::uri);
  m.def(
      "_validate_checkpoint_name",
      [](std::string_view name) { Check(st::ValidateCheckpointName(name)); }, py::arg("name"));
  // ---- end of checkpoints ----
  stoker::python::RegisterMetrics(m);

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
