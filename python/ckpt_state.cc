// Python objects -> the C++ state trees of saved checkpoints (ckpt_state.h):
// what stoker.save walks. Loading is ckpt_load.cc.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ckpt_state.h"
#include "ckpt_state_common.h"

namespace stoker::python {
namespace {

using namespace state;  // NOLINT(build/namespaces): the shared helpers

// ---- saving -------------------------------------------------------------------

class Encoder {
 public:
  explicit Encoder(PyEncodedState* out) : out_(out) {
    py::object modules = py::module_::import("sys").attr("modules");
    if (modules.contains("torch")) torch_ = modules["torch"];  // else no tensors
    np_ = py::module_::import("numpy");
    odict_ = py::module_::import("collections").attr("OrderedDict");
    py::object ckpt = CheckpointModule();
    sharded_ = ckpt.attr("ShardedTensor");
    piece_ = ckpt.attr("_piece");
    dtensor_ = ckpt.attr("_dtensor_type")();
  }

  StateValue Encode(py::handle value, const std::string& where) {
    StateValue v;
    PyObject* p = value.ptr();
    if (value.is_none()) return v;
    if (PyBool_Check(p)) {
      v.kind = Kind::kBool;
      v.flag = p == Py_True;
      return v;
    }
    if (PyUnicode_CheckExact(p)) {
      Py_ssize_t n = 0;
      const char* utf8 = PyUnicode_AsUTF8AndSize(p, &n);
      if (utf8 == nullptr) {  // a lone surrogate: no UTF-8, no JSON string
        PyErr_Clear();
        throw py::type_error("cannot save " + where +
                             ": a str that is not valid Unicode (a lone surrogate)");
      }
      return Text(Kind::kStr, std::string(utf8, size_t(n)));
    }
    if (PyLong_CheckExact(p)) return Text(Kind::kInt, Str(value));
    if (PyFloat_CheckExact(p)) {
      v.kind = Kind::kFloat;
      v.real = PyFloat_AS_DOUBLE(p);
      return v;
    }
    py::handle type = value.get_type();
    if (type.is(sharded_)) return Piece(value, where);
    if (torch_) {
      if (py::isinstance(value, torch_.attr("Tensor"))) {
        if (!dtensor_.is_none() && py::isinstance(value, dtensor_)) {
          return Piece(piece_(value), where);
        }
        return Tensor(value, where);
      }
      if (type.is(torch_.attr("Size"))) {
        v.kind = Kind::kSize;
        for (py::handle x : value) v.items.push_back(Text(Kind::kInt, Str(x)));
        return v;
      }
      if (type.is(torch_.attr("dtype"))) {
        v = Text(Kind::kDType, TorchDTypeName(value));
        if (v.text.empty()) {
          throw py::type_error(where + " is " + Str(value) +
                               ", a torch dtype a checkpoint does not store");
        }
        return v;
      }
      if (type.is(torch_.attr("device"))) return Text(Kind::kDevice, Str(value));
    }
    if (PyDict_CheckExact(p) || type.is(odict_) || PyList_CheckExact(p) || PyTuple_CheckExact(p)) {
      return Container(value, where);
    }
    if (PyComplex_CheckExact(p)) {
      v.kind = Kind::kComplex;
      v.real = PyComplex_RealAsDouble(p);
      v.imag = PyComplex_ImagAsDouble(p);
      return v;
    }
    if (PyBytes_CheckExact(p)) return Text(Kind::kBytes, value.cast<std::string>());
    if (py::isinstance(value, np_.attr("ndarray")) &&
        (type.is(np_.attr("ndarray")) || type.is(np_.attr("memmap")))) {
      return Ndarray(value, where);
    }
    if (py::isinstance(value, np_.attr("generic")) && !NumpyName(value.attr("dtype")).empty()) {
      v = Text(Kind::kNumpy, NumpyName(value.attr("dtype")));
      v.items.push_back(Encode(value.attr("item")(), where));
      return v;
    }
    throw py::type_error("cannot save " + where + ": a " + Str(type.attr("__module__")) + "." +
                         Str(type.attr("__qualname__")) +
                         ", which a stoker checkpoint does not store (it stores tensors, numpy "
                         "arrays, dicts, lists, tuples, None, bool, int, float, complex, str, "
                         "bytes, torch dtypes and devices)");
  }

 private:
  static StateValue Text(Kind kind, std::string text) {
    StateValue v;
    v.kind = kind;
    v.text = std::move(text);
    return v;
  }

  StateValue Container(py::handle value, const std::string& where) {
    if (!active_.insert(value.ptr()).second) {
      throw py::type_error("cannot save " + where + ": it contains itself");
    }
    if (active_.size() > kMaxDepth) {  // as the document's readers allow
      active_.erase(value.ptr());
      throw py::value_error("cannot save " + where + ": nested deeper than " +
                            std::to_string(kMaxDepth) + " containers");
    }
    StateValue v;
    try {
      if (PyDict_Check(value.ptr())) {
        v.kind = value.get_type().is(odict_) ? Kind::kODict : Kind::kDict;
        // items(): an OrderedDict's own order (move_to_end), not its dict's.
        for (py::handle item : value.attr("items")()) {
          py::object k = item[py::int_(0)], x = item[py::int_(1)];
          if ((torch_ && py::isinstance(k, torch_.attr("Tensor"))) ||
              py::isinstance(k, np_.attr("ndarray"))) {
            throw py::type_error("cannot save " + where + ": a tensor as a dict key");
          }
          StateValue key = Encode(k, "a key of " + where);
          key.component = PyUnicode_CheckExact(k.ptr()) ? Str(k)
                          : PyLong_CheckExact(k.ptr())  ? Str(k)
                                                        : Repr(k);
          v.items.push_back(std::move(key));
          v.items.push_back(Encode(x, where + "[" + Repr(k) + "]"));
        }
      } else {
        v.kind = PyList_CheckExact(value.ptr()) ? Kind::kList : Kind::kTuple;
        size_t i = 0;
        for (py::handle x : value) {
          v.items.push_back(Encode(x, where + "[" + std::to_string(i++) + "]"));
        }
      }
    } catch (...) {
      active_.erase(value.ptr());
      throw;
    }
    active_.erase(value.ptr());
    return v;
  }

  StateValue Tensor(py::handle value, const std::string& where) {
    if (!value.attr("layout").is(torch_.attr("strided"))) {
      throw py::type_error("cannot save " + where + ": a " + Str(value.attr("layout")) +
                           " tensor (only dense ones)");
    }
    const bool quantized = value.attr("is_quantized").cast<bool>();
    if (quantized || Str(value.attr("device").attr("type")) == "meta") {
      throw py::type_error("cannot save " + where + ": a " +
                           std::string(quantized ? "quantized" : "meta") + " tensor");
    }
    StateValue v;
    const std::string dtype = TorchDTypeName(value.attr("dtype"));
    if (dtype.empty()) {
      throw py::type_error("cannot save " + where + ": dtype " + Str(value.attr("dtype")) +
                           " has no checkpoint type");
    }
    v.kind = py::isinstance(value, torch_.attr("nn").attr("Parameter")) ? Kind::kParameter
                                                                        : Kind::kTensor;
    v.flag = value.attr("requires_grad").cast<bool>();
    v.dtype = ParseDType(dtype).value();
    if (value.attr("numel")().cast<int64_t>() > 0) {  // the same view of the same memory
      v.tie = Str(py::make_tuple(Str(value.attr("device")), value.attr("data_ptr")(),
                                 value.attr("dtype"), value.attr("shape"), value.attr("stride")()));
    }
    auto seen = v.tie.empty() ? ties_.end() : ties_.find(v.tie);
    if (seen != ties_.end()) {  // stored once, by EncodeState; no second copy
      v.shape = seen->second.shape;
      v.data = seen->second.data;
      return v;
    }
    py::object t = value.attr("detach")();
    const std::string device = Str(t.attr("device").attr("type"));
    if (device == "cuda") {
      // Copied by the checkpointer itself (docs/checkpoint.md §9), after an
      // event on the current stream, where conj/neg/contiguous below queue
      // their work too. `keep` holds the tensor until the copies landed
      // (SaveHandle.wait_staged), so its memory is never freed, nor reused
      // by the caching allocator, while a copy still reads it.
      v.device = t.attr("device").attr("index").cast<int>();
      v.stream = reinterpret_cast<void*>(torch_.attr("cuda")
                                             .attr("current_stream")(t.attr("device"))
                                             .attr("cuda_stream")
                                             .cast<uintptr_t>());
    } else if (device != "cpu") {
      t = t.attr("to")("cpu");
    }
    if (t.attr("is_conj")().cast<bool>()) t = t.attr("resolve_conj")();
    if (t.attr("is_neg")().cast<bool>()) t = t.attr("resolve_neg")();
    if (!t.attr("is_contiguous")().cast<bool>()) t = t.attr("contiguous")();
    v.shape = t.attr("shape").cast<std::vector<int64_t>>();
    const auto nbytes = t.attr("numel")().cast<size_t>() * t.attr("element_size")().cast<size_t>();
    v.data = {reinterpret_cast<const std::byte*>(t.attr("data_ptr")().cast<uintptr_t>()), nbytes};
    out_->keep.append(t);
    if (!v.tie.empty()) ties_.emplace(v.tie, v);
    return v;
  }

  // A piece of a global tensor: its local tensor (or array), with its layout.
  StateValue Piece(py::handle piece, const std::string& where) {
    py::object local = piece.attr("local");
    const bool tensor = torch_ && py::isinstance(local, torch_.attr("Tensor"));
    if (!tensor && !py::isinstance(local, np_.attr("ndarray"))) {
      throw py::type_error("cannot save " + where + ": a ShardedTensor whose local is a " +
                           Str(local.get_type().attr("__name__")));
    }
    StateValue v = tensor ? Tensor(local, where) : Ndarray(local, where);
    v.layout = LayoutOf(piece);
    return v;
  }

  StateValue Ndarray(py::handle value, const std::string& where) {
    py::object dtype = value.attr("dtype");
    const std::string name = NumpyName(dtype);
    if (name.empty())
      throw py::type_error("cannot save " + where + ": a numpy array of " + Str(dtype));
    py::array a =
        np_.attr("ascontiguousarray")(value, py::arg("dtype") = dtype.attr("newbyteorder")("="));
    StateValue v = Text(Kind::kNdarray, "");
    v.dtype = ParseDType(name).value();
    v.shape.assign(a.shape(), a.shape() + a.ndim());
    v.data = {static_cast<const std::byte*>(a.data()), size_t(a.nbytes())};
    out_->keep.append(a);
    return v;
  }

  static constexpr size_t kMaxDepth = 60;
  PyEncodedState* out_;
  py::object torch_, np_, odict_, sharded_, piece_, dtensor_;
  std::unordered_set<PyObject*> active_;  // the containers being walked (cycles)
  std::unordered_map<std::string, StateValue> ties_;
};

}  // namespace

std::shared_ptr<PyEncodedState> EncodePyState(py::handle state) {
  auto out = std::make_shared<PyEncodedState>();
  out->root = Encoder(out.get()).Encode(state, "state");
  Result<EncodedState> e = EncodeState(out->root);
  if (!e.ok()) ThrowStatus(e.status());
  out->encoded = std::move(e).value();
  return out;
}


}  // namespace stoker::python
