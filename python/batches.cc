// The _stoker module's batches: numpy views that share the batch buffer and,
// with device delivery, DLPack exports of the device copy (batches.h).
#include "batches.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "binding.h"
#include "stoker/gpu.h"
#include "stoker/loader.h"

namespace stoker::python {
namespace {

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

}  // namespace

py::dtype ImageNumpyDType(ImageDType t) {
  switch (t) {
    case ImageDType::kFloat32:
      return py::dtype("float32");
    case ImageDType::kFloat16:
      return py::dtype("float16");
    case ImageDType::kBFloat16:
      return py::dtype("uint16");  // raw bits: numpy has no bfloat16 (loader.py refuses it on the host)
    case ImageDType::kUInt8:
      break;
  }
  return py::dtype("uint8");
}

namespace {

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

// Format 3's typed columns (below, after DLPack's structs): fixed and
// ragged arrays, str and json lists.
void AddTypedColumns(const Batch& b, const Output& out, const py::capsule& owner, py::dict& d);
py::object TextColumn(const Batch::BytesColumn& c, size_t n);

}  // namespace

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
    if (c.type != format::FieldType::kBytes) {
      d[py::str(c.name)] = TextColumn(c, batch.size());
      continue;
    }
    py::object offsets = Out(out, c.offsets, owner);
    py::object data = Out(out, ByteView(c.data, owner));
    d[py::str(c.name)] = out.bytes_column.is_none() ? py::object(py::make_tuple(offsets, data))
                                                    : out.bytes_column(offsets, data);
  }
  AddTypedColumns(batch, out, owner, d);
  return d;
}

namespace {

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
constexpr int32_t kDLCPU = 1, kDLCUDA = 2;
constexpr uint8_t kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6;

// One array of a batch in device memory; holds the batch's device copy. Or,
// with `batch` null, one in host memory (a bfloat16 array, which numpy
// cannot hold), held by `host`.
struct DeviceArray {
  std::shared_ptr<DeviceBatch> batch;
  const void* data = nullptr;
  std::vector<int64_t> shape;
  DLDataType dtype{kDLUInt, 8, 1};
  std::shared_ptr<const BatchMemory> host{};

  int32_t device_type() const { return batch ? kDLCUDA : kDLCPU; }
  int device_id() const { return batch ? batch->device() : 0; }
  py::tuple DlpackDevice() const { return py::make_tuple(device_type(), device_id()); }
  std::string Where() const { return batch ? "cuda:" + std::to_string(batch->device()) : "cpu"; }

  // The DLPack protocol (array API standard): `stream` is the consumer's
  // stream (None: the legacy default stream; -1: no synchronisation).
  py::object Dlpack(py::object stream, py::object max_version, py::object dl_device,
                    py::object copy) {
    if (!copy.is_none() && copy.cast<bool>()) {
      throw py::buffer_error("stoker device arrays are exported without a copy");
    }
    if (!dl_device.is_none() && !dl_device.equal(DlpackDevice())) {
      throw py::buffer_error("a stoker batch on " + Where() +
                             " cannot be exported to another device");
    }
    int64_t s = stream.is_none() ? int64_t(kLegacyDefaultStream) : stream.cast<int64_t>();
    if (batch && s == 0) {
      throw py::value_error("stream 0 is ambiguous for CUDA (DLPack): pass 1 or 2");
    }
    if (batch && s != -1) {
      Status st;
      {
        py::gil_scoped_release release;
        st = batch->WaitOn(static_cast<CudaStreamHandle>(s));
      }
      Check(st);
    }
    auto* ctx = new Ctx{batch ? std::shared_ptr<const void>(batch) : host, shape};
    DLTensor t{const_cast<void*>(data),
               {device_type(), device_id()},
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
    std::shared_ptr<const void> owner;  // the device copy, or the host buffer
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

// ---- format 3's typed columns ------------------------------------------------

py::dtype NumpyDType(ElementType t) {
  switch (t) {
    case ElementType::kBFloat16:  // numpy has none: the raw bits
      return py::dtype("uint16");
    default:
      return py::dtype(std::string(ElementTypeName(t)));
  }
}

DLDataType DlpackDType(ElementType t) {
  const auto bits = uint8_t(8 * ElementTypeBytes(t));
  switch (t) {
    case ElementType::kInt32:
    case ElementType::kInt64:
      return {kDLInt, bits, 1};
    case ElementType::kFloat16:
    case ElementType::kFloat32:
    case ElementType::kFloat64:
      return {kDLFloat, bits, 1};
    case ElementType::kBFloat16:
      return {kDLBfloat, bits, 1};
    default:
      return {kDLUInt, bits, 1};
  }
}

// `shape` elements of `t` at `data` in the host buffer: a view, except where
// Output asks for bfloat16 through DLPack or for unsigned types widened.
py::object HostArray(const Batch& b, const Output& out, const py::capsule& owner,
                     const std::byte* data, ElementType t, const std::vector<int64_t>& shape) {
  if (t == ElementType::kBFloat16 && !out.from_dlpack.is_none()) {
    DeviceArray a{nullptr, data, shape, DlpackDType(t), b.memory()};
    return out.from_dlpack(py::cast(std::move(a)));
  }
  py::array view(NumpyDType(t), std::vector<py::ssize_t>(shape.begin(), shape.end()),
                 const_cast<std::byte*>(data), owner);
  if (out.widen_unsigned && (t == ElementType::kUInt16 || t == ElementType::kUInt32)) {
    view = view.attr("astype")(t == ElementType::kUInt16 ? "int32" : "int64");  // a copy
  }
  return Out(out, view);
}

// (N, *item_shape).
std::vector<int64_t> FixedShape(const Batch::FixedColumn& c, size_t n) {
  std::vector<int64_t> shape{int64_t(n)};
  shape.insert(shape.end(), c.item_shape.begin(), c.item_shape.end());
  return shape;
}

// A ragged column's data array: (N, longest, *row_shape) padded, else
// (rows, *row_shape).
std::vector<int64_t> RaggedShape(const Batch::RaggedColumn& c, size_t n) {
  std::vector<int64_t> shape{int64_t(n), int64_t(c.max_rows)};
  if (!c.padded) shape = {c.offsets.empty() ? 0 : c.offsets.back()};
  shape.insert(shape.end(), c.row_shape.begin(), c.row_shape.end());
  return shape;
}

// NAME_lengths (padded) or NAME_offsets: the key of the layout's index.
std::string RaggedIndexKey(const Batch::RaggedColumn& c) {
  return c.name + (c.padded ? "_lengths" : "_offsets");
}

void AddTypedColumns(const Batch& b, const Output& out, const py::capsule& owner, py::dict& d) {
  const size_t n = b.size();
  for (const auto& c : b.fixed_columns()) {
    d[py::str(c.name)] = HostArray(b, out, owner, c.data.data(), c.element, FixedShape(c, n));
  }
  for (const auto& c : b.ragged_columns()) {
    d[py::str(c.name)] = HostArray(b, out, owner, c.data.data(), c.element, RaggedShape(c, n));
    d[py::str(RaggedIndexKey(c))] =
        c.padded ? Out(out, c.lengths, owner) : Out(out, c.offsets, owner);
  }
}

// A str column as a list of str, a json one as a list of parsed values
// (json.loads of each; a value that does not parse is a ValueError naming
// the field and the sample's place in the batch).
py::object TextColumn(const Batch::BytesColumn& c, size_t n) {
  const auto* base = reinterpret_cast<const char*>(c.data.data());
  py::list values(n);
  const bool json = c.type == format::FieldType::kJson;
  py::object loads;
  if (json) loads = py::module_::import("json").attr("loads");
  for (size_t i = 0; i < n; ++i) {
    const char* p = base + c.offsets[i];
    const auto len = py::ssize_t(c.offsets[i + 1] - c.offsets[i]);
    py::object v;
    if (json) {
      try {
        v = loads(py::bytes(p, size_t(len)));
      } catch (py::error_already_set& e) {
        throw py::value_error("json field '" + c.name + "', sample " + std::to_string(i) +
                              " of the batch: " + std::string(py::str(e.value())));
      }
    } else {
      v = py::reinterpret_steal<py::object>(PyUnicode_DecodeUTF8(p, len, "strict"));
      if (!v) throw py::error_already_set();
    }
    PyList_SET_ITEM(values.ptr(), py::ssize_t(i), v.release().ptr());
  }
  return values;
}

template <typename T>
py::object DeviceOut(const Output& out, const Batch& b, const T* host, std::vector<int64_t> shape,
                     DLDataType dtype) {
  DeviceArray a{b.device(), b.device_pointer(host), std::move(shape), dtype};
  py::object o = py::cast(std::move(a));
  return out.array.is_none() ? o : out.array(o);
}

// BatchDict's layout, every array on the device.
}  // namespace

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
    const DLDataType t = c.dtype == ImageDType::kUInt8      ? DLDataType{kDLUInt, 8, 1}
                         : c.dtype == ImageDType::kBFloat16 ? DLDataType{kDLBfloat, 16, 1}
                             : DLDataType{kDLFloat, uint8_t(8 * ImageDTypeSize(c.dtype)), 1};
    d[py::str(c.name)] = DeviceOut(out, b, c.data.data(), ImageShape(c, size_t(n)), t);
  }
  for (const auto& c : b.fixed_columns()) {
    d[py::str(c.name)] =
        DeviceOut(out, b, c.data.data(), FixedShape(c, size_t(n)), DlpackDType(c.element));
  }
  for (const auto& c : b.ragged_columns()) {
    d[py::str(c.name)] =
        DeviceOut(out, b, c.data.data(), RaggedShape(c, size_t(n)), DlpackDType(c.element));
    d[py::str(RaggedIndexKey(c))] =
        c.padded ? DeviceOut(out, b, c.lengths.data(), {n}, {kDLInt, 64, 1})
                 : DeviceOut(out, b, c.offsets.data(), {n + 1}, {kDLInt, 64, 1});
  }
  for (const auto& c : b.bytes_columns()) {
    if (c.type != format::FieldType::kBytes) {  // lists, from the host copy
      d[py::str(c.name)] = TextColumn(c, size_t(n));
      continue;
    }
    py::object offsets = DeviceOut(out, b, c.offsets.data(), {n + 1}, u64);
    py::object data = DeviceOut(out, b, c.data.data(), {int64_t(c.data.size())}, {kDLUInt, 8, 1});
    d[py::str(c.name)] = out.bytes_column.is_none() ? py::object(py::make_tuple(offsets, data))
                                                    : out.bytes_column(offsets, data);
  }
  return d;
}


void BindBatches(py::module_& m) {
  py::class_<DeviceArray>(m, "_DeviceArray")
      .def("__dlpack__", &DeviceArray::Dlpack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none())
      .def("__dlpack_device__", &DeviceArray::DlpackDevice)
      .def_property_readonly("shape",
                             [](const DeviceArray& a) { return py::tuple(py::cast(a.shape)); })
      .def_property_readonly("device", [](const DeviceArray& a) { return a.device_id(); })
      .def("__len__", [](const DeviceArray& a) { return a.shape.empty() ? 0 : a.shape[0]; })
      .def("__repr__", [](const DeviceArray& a) {
        std::string shape;
        for (int64_t x : a.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(x);
        return "<stoker device array (" + shape + ") on " + a.Where() + ">";
      });
  m.def("_built_with_cuda", &BuiltWithCuda);
}

}  // namespace stoker::python
