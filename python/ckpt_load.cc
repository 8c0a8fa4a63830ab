// Loaded checkpoint state trees -> Python objects (ckpt_state.h): what
// stoker.load builds, into new memory, into a given state (load(into=...))
// or into new device tensors (map_location="cuda:N"). Saving is
// ckpt_state.cc.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <exception>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ckpt_state.h"
#include "ckpt_state_common.h"

namespace stoker::python {
namespace {

using namespace state;  // NOLINT(build/namespaces): the shared helpers

// ---- loading ------------------------------------------------------------------

// Builds Python values from a loaded tree: tensors over the restored memory
// (`owner` keeps it), moved to `device` unless it is None; tensors in
// `given` (load(into=...)) are those objects.
class Decoder {
 public:
  Decoder(py::object owner, py::object device, const std::string& where)
      : owner_(std::move(owner)), device_(std::move(device)), where_(where) {
    np_ = py::module_::import("numpy");
  }

  std::unordered_map<std::string, py::object> given;

  py::object Value(const StateValue& v) {
    switch (v.kind) {
      case Kind::kNone:
        return py::none();
      case Kind::kBool:
        return py::bool_(v.flag);
      case Kind::kInt:
        return py::reinterpret_steal<py::object>(PyLong_FromString(v.text.c_str(), nullptr, 10));
      case Kind::kFloat:
        return py::float_(v.real);
      case Kind::kStr:
        return py::str(v.text);
      case Kind::kBytes:
        return py::bytes(v.text);
      case Kind::kComplex:
        return py::reinterpret_steal<py::object>(PyComplex_FromDoubles(v.real, v.imag));
      case Kind::kDType:
        if (!py::hasattr(Torch(), v.text.c_str())) {
          throw py::type_error("the checkpoint holds torch dtype " + v.text +
                               ", which this torch (" + Str(Torch().attr("__version__")) +
                               ") does not have");
        }
        return Torch().attr(v.text.c_str());
      case Kind::kDevice:
        return Torch().attr("device")(v.text);
      case Kind::kSize:
        return Torch().attr("Size")(List(v));
      case Kind::kNumpy:
        if (!kNumpyNames.contains(v.text) || v.items.size() != 1) {
          throw py::value_error(where_ + ": state structure: numpy scalar of " + v.text);
        }
        return np_.attr("dtype")(v.text).attr("type")(Value(v.items[0]));
      case Kind::kList:
        return List(v);
      case Kind::kTuple:
        return py::tuple(List(v));
      case Kind::kDict:
      case Kind::kODict: {
        py::dict d;
        for (size_t i = 0; i + 1 < v.items.size(); i += 2)
          d[Value(v.items[i])] = Value(v.items[i + 1]);
        if (v.kind == Kind::kDict) return d;
        py::list pairs;
        for (auto [k, x] : d) pairs.append(py::make_tuple(k, x));
        return py::module_::import("collections").attr("OrderedDict")(pairs);
      }
      case Kind::kTensor:
      case Kind::kParameter:
      case Kind::kNdarray:
        break;
    }
    if (auto it = given.find(v.text); it != given.end()) return it->second;
    return AsPiece(v, [&]() -> py::object {
      if (v.kind == Kind::kNdarray) return Restored(v, true);
      py::object t = Restored(v, false);
      if (v.kind == Kind::kParameter) {
        return Torch().attr("nn").attr("Parameter")(t, py::arg("requires_grad") = v.flag);
      }
      return v.flag ? t.attr("requires_grad_")(true) : t;
    }());
  }

  // A piece saved with a layout comes back as a stoker.ShardedTensor.
  static py::object AsPiece(const StateValue& v, py::object local) {
    if (v.layout.kind == TensorLayout::Kind::kWhole) return local;
    py::object cls = CheckpointModule().attr("ShardedTensor");
    py::tuple global = py::cast(v.layout.global_shape);
    if (v.layout.kind == TensorLayout::Kind::kFlat) {
      return cls(local, global, py::none(), py::arg("flat_start") = v.layout.flat_start);
    }
    return cls(local, global, py::tuple(py::cast(v.layout.offsets)));
  }

  // A restored tensor (numpy array when `ndarray`, or for a dtype this torch
  // lacks) over its bytes; one object per name (tied tensors stay tied).
  py::object Restored(const StateValue& v, bool ndarray) {
    auto it = made_.find(v.text);
    if (it != made_.end()) return it->second;
    const std::string dtype(DTypeName(v.dtype));
    auto* p = reinterpret_cast<uint8_t*>(const_cast<std::byte*>(v.data.data()));
    py::array bytes = py::array_t<uint8_t>({v.data.size()}, {size_t{1}}, p, owner_);
    py::object out;
    if (ndarray || !py::hasattr(Torch(), dtype.c_str())) {
      if (!kNumpyNames.contains(dtype)) {
        throw py::type_error("tensor '" + v.text + "' has dtype " + dtype + ", which this torch (" +
                             Str(Torch().attr("__version__")) + ") does not have");
      }
      py::object nd = np_.attr("dtype")(dtype);
      // uint16/32/64 on a torch without them come back as numpy arrays.
      out = v.data.empty() ? np_.attr("empty")(0, nd) : bytes.attr("view")(nd);
      out = out.attr("reshape")(py::tuple(py::cast(v.shape)));
    } else {
      py::object tdtype = Torch().attr(dtype.c_str());
      if (v.data.empty()) {  // nothing to share; a view of 0 bytes cannot change its dtype
        out = Torch().attr("empty")(py::tuple(py::cast(v.shape)), py::arg("dtype") = tdtype);
      } else {
        out = Torch().attr("from_numpy")(bytes);
        if (dtype != "uint8") out = out.attr("view")(tdtype);
        out = out.attr("reshape")(py::tuple(py::cast(v.shape)));
      }
      if (!device_.is_none()) out = out.attr("to")(device_);
    }
    made_.emplace(v.text, out);
    return out;
  }

  py::object Torch() {
    if (!torch_) torch_ = py::module_::import("torch");
    return torch_;
  }

 private:
  py::list List(const StateValue& v) {
    py::list l;
    for (const StateValue& x : v.items) l.append(Value(x));
    return l;
  }

  py::object owner_, device_, np_, torch_;
  std::string where_;
  std::unordered_map<std::string, py::object> made_;
};

// ---- load(into=...) -------------------------------------------------------------

// Where the into= state takes each tensor, decided (by Plan, with the GIL)
// once the structure is known, before anything else is read.
class IntoPlan {
 public:
  IntoPlan(py::object into, std::string where) : into_(std::move(into)), where_(std::move(where)) {
    torch_ = py::module_::import("sys").attr("modules").attr("get")("torch");
    np_ = py::module_::import("numpy");
    piece_ = CheckpointModule().attr("_piece");
  }

  Status Plan(const StateValue& root, const CheckpointManifest& m, size_t part_tensors,
              std::vector<TensorDestination>* dst) {
    where_ += m.name;
    Targets(root, into_, "into");
    if (part_tensors > 0 && order_.empty()) {
      throw py::value_error(where_ +
                            ": load(into=...) found none of the checkpoint's tensors at "
                            "the same key paths in `into` (a " +
                            Str(into_.get_type().attr("__name__")) +
                            "); its state has the structure stoker.load returns");
    }
    for (const StateValue* t : order_) {
      for (const auto& [where, target] : targets_[t->text]) {
        if (py::object piece = piece_(target); !piece.is_none()) {
          PieceDestination(where, piece, *t, dst);
          given_[t->text] = target;
          continue;
        }
        auto [how, span] = Destination(where, target, *t);
        if ((how == kDirect || how == kDevice) && !direct_.contains(t->text)) {
          TensorDestination d{t->text, span, {}, {}, {}};
          if (how == kDevice) d.device = target.attr("device").attr("index").cast<int>();
          dst->push_back(std::move(d));
          direct_.emplace(t->text, target);
        } else if (how != kEmpty) {
          copies_.emplace_back(t->text, target);
        }
      }
      if (given_.contains(t->text)) continue;  // a piece
      auto d = direct_.find(t->text);
      given_[t->text] = d != direct_.end() ? d->second : targets_[t->text][0].second;
    }
    return Status::Ok();
  }

  // After the restore: the copies into destinations that could not be read
  // into; then the state, with `into`'s objects where they were filled.
  py::object Finish(Decoder& d, const StateValue& root) {
    for (const auto& [local, staging] : staged_) CopyInto(local, staging, d);
    std::unordered_map<std::string, const StateValue*> tensors;
    Index(root, &tensors);
    for (const auto& [name, target] : copies_) {
      auto direct = direct_.find(name);
      if (direct != direct_.end()) {
        if (!SameMemory(target, direct->second)) CopyInto(target, direct->second, d);
        continue;
      }
      CopyInto(target, d.Restored(*tensors.at(name), IsArray(target)), d);
    }
    d.given = given_;
    return d.Value(root);
  }

 private:
  enum How { kDirect, kCopy, kEmpty, kDevice };

  bool IsArray(py::handle x) const { return py::isinstance(x, np_.attr("ndarray")); }
  bool IsTensor(py::handle x) const {
    return !torch_.is_none() && py::isinstance(x, torch_.attr("Tensor"));
  }

  // Walks a structure value beside `target`, the into= value at the same
  // key path.
  void Targets(const StateValue& v, py::handle target, const std::string& where) {
    if (v.kind == Kind::kList || v.kind == Kind::kTuple) {
      if (!py::isinstance<py::list>(target) && !py::isinstance<py::tuple>(target)) return;
      const size_t n = std::min(v.items.size(), py::len(target));
      for (size_t i = 0; i < n; ++i) {
        Targets(v.items[i], target[py::int_(i)], where + "[" + std::to_string(i) + "]");
      }
    } else if (v.kind >= Kind::kTensor) {
      auto& dests = targets_[v.text];
      if (dests.empty()) order_.push_back(&v);
      dests.emplace_back(where, py::reinterpret_borrow<py::object>(target));
    } else if (v.kind == Kind::kDict || v.kind == Kind::kODict) {
      py::object mapping = py::module_::import("collections.abc").attr("Mapping");
      if (!py::isinstance(target, mapping)) return;
      Decoder keys(py::none(), py::none(), where_);
      for (size_t i = 0; i + 1 < v.items.size(); i += 2) {
        py::object key = keys.Value(v.items[i]);
        bool present = false;
        try {
          present = target.attr("__contains__")(key).cast<bool>();
        } catch (py::error_already_set& e) {
          if (!e.matches(PyExc_TypeError)) throw;  // an unhashable key cannot be in a dict
        }
        if (present) Targets(v.items[i + 1], target[key], where + "[" + Repr(key) + "]");
      }
    }
  }

  // A piece (ShardedTensor, DTensor) takes its part of global tensor `t`
  // (§6): read straight into its local where that is CPU memory in order,
  // else into CPU staging copied into it after the restore. The layout and
  // global shape are checked in C++, before anything is read.
  void PieceDestination(const std::string& where, py::handle piece, const StateValue& t,
                        std::vector<TensorDestination>* dst) {
    py::object local = piece.attr("local");
    const std::string dtype(DTypeName(t.dtype));
    const bool array = IsArray(local);
    const std::string have =
        array ? NumpyName(local.attr("dtype")) : TorchDTypeName(local.attr("dtype"));
    if (have != dtype) {
      throw py::value_error(
          Format("load(into=...): {} is a piece of {} elements, the checkpoint's tensor {!r} is {}",
                 py::make_tuple(where, local.attr("dtype"), t.text, dtype)));
    }
    TensorDestination d;
    d.name = t.text;
    d.layout = LayoutOf(piece);
    d.dtype = t.dtype;
    d.shape = py::list(local.attr("shape")).cast<std::vector<int64_t>>();
    StateValue shaped = t;
    shaped.shape = d.shape;
    py::object into = local;
    bool in_place;
    if (array) {
      py::object flags = local.attr("flags");
      if (!flags.attr("writeable").cast<bool>()) {
        throw py::value_error("load(into=...): " + where + " is a read-only numpy array");
      }
      in_place = flags.attr("c_contiguous").cast<bool>();
      if (!in_place) into = np_.attr("empty")(local.attr("shape"), local.attr("dtype"));
      d.data = Span(into.attr("__array_interface__")["data"][py::int_(0)], shaped);
    } else {
      const std::string type = Str(local.attr("device").attr("type"));
      in_place = (type == "cpu" || type == "cuda") && local.attr("is_contiguous")().cast<bool>() &&
                 !local.attr("is_conj")().cast<bool>() && !local.attr("is_neg")().cast<bool>();
      if (in_place && type == "cuda") d.device = local.attr("device").attr("index").cast<int>();
      if (!in_place) {
        into = torch_.attr("empty")(local.attr("shape"), py::arg("dtype") = local.attr("dtype"));
      }
      d.data = Span(into.attr("data_ptr")(), shaped);
    }
    if (!in_place) staged_.emplace_back(local, into);
    if (!d.data.empty()) dst->push_back(std::move(d));
  }

  // How `target` takes tensor `t`: read straight into its memory, restored
  // and then copied in (another device, a non-contiguous view), or nothing
  // to read. Raises naming both when they do not match.
  std::pair<How, std::span<std::byte>> Destination(const std::string& where, py::handle target,
                                                   const StateValue& t) {
    const std::string dtype(DTypeName(t.dtype));
    const py::list shape = py::cast(t.shape);
    if (IsTensor(target)) {
      if (TorchDTypeName(target.attr("dtype")) != dtype ||
          !py::list(target.attr("shape")).equal(shape)) {
        throw py::value_error(Format(
            "load(into=...): {} is a {} tensor of shape {}, the checkpoint's tensor {!r} is {} "
            "of shape {}",
            py::make_tuple(where, target.attr("dtype"), py::list(target.attr("shape")), t.text,
                           dtype, shape)));
      }
      if (target.attr("numel")().cast<int64_t>() == 0) return {kEmpty, {}};
      const std::string type = Str(target.attr("device").attr("type"));
      if ((type == "cpu" || type == "cuda") && target.attr("is_contiguous")().cast<bool>() &&
          !target.attr("is_conj")().cast<bool>() && !target.attr("is_neg")().cast<bool>() &&
          target.attr("layout").is(torch_.attr("strided"))) {
        // A CUDA tensor is filled through the pinned ring (§9); the restore
        // returns once its bytes have landed.
        return {type == "cpu" ? kDirect : kDevice, Span(target.attr("data_ptr")(), t)};
      }
      return {kCopy, {}};
    }
    if (IsArray(target)) {
      py::object td = target.attr("dtype");
      const bool native = td.equal(td.attr("newbyteorder")("="));
      if (!native || NumpyName(td) != dtype || !py::list(target.attr("shape")).equal(shape)) {
        throw py::value_error(Format(
            "load(into=...): {} is a numpy array of {} and shape {}, the checkpoint's tensor {!r} "
            "is {} of shape {}",
            py::make_tuple(where, td, py::list(target.attr("shape")), t.text, dtype, shape)));
      }
      py::object flags = target.attr("flags");
      if (!flags.attr("writeable").cast<bool>()) {
        throw py::value_error("load(into=...): " + where + " is a read-only numpy array");
      }
      if (target.attr("size").cast<int64_t>() == 0) return {kEmpty, {}};
      if (flags.attr("c_contiguous").cast<bool>()) {
        return {kDirect, Span(target.attr("__array_interface__")["data"][py::int_(0)], t)};
      }
      return {kCopy, {}};
    }
    throw py::type_error(Format(
        "load(into=...): {} is a {}, where the checkpoint holds tensor {!r} ({} of shape {})",
        py::make_tuple(where, target.get_type().attr("__name__"), t.text, dtype, shape)));
  }

  static std::span<std::byte> Span(py::handle address, const StateValue& t) {
    uint64_t n = DTypeSize(t.dtype);
    for (int64_t x : t.shape) n *= uint64_t(x);
    return {reinterpret_cast<std::byte*>(address.cast<uintptr_t>()), size_t(n)};
  }

  // Whether two destinations are the same view of the same memory (tied).
  bool SameMemory(py::handle a, py::handle b) const {
    if (IsArray(a) || IsArray(b)) {
      return IsArray(a) && IsArray(b) &&
             a.attr("__array_interface__").equal(b.attr("__array_interface__"));
    }
    for (const char* f : {"device", "dtype", "shape"}) {
      if (!a.attr(f).equal(b.attr(f))) return false;
    }
    return a.attr("data_ptr")().equal(b.attr("data_ptr")()) &&
           a.attr("stride")().equal(b.attr("stride")());
  }

  void CopyInto(py::handle dest, py::handle src, Decoder& d) {
    if (IsArray(dest)) {
      np_.attr("copyto")(dest, IsArray(src) ? src : src.attr("numpy")());
      return;
    }
    py::object torch = d.Torch();
    py::object no_grad = torch.attr("no_grad")();
    no_grad.attr("__enter__")();
    dest.attr("copy_")(IsArray(src) ? torch.attr("from_numpy")(src)
                                    : py::reinterpret_borrow<py::object>(src));
    no_grad.attr("__exit__")(py::none(), py::none(), py::none());
  }

  static void Index(const StateValue& v, std::unordered_map<std::string, const StateValue*>* out) {
    if (v.kind >= Kind::kTensor) out->emplace(v.text, &v);
    for (const StateValue& x : v.items) Index(x, out);
  }

  py::object into_, torch_, np_, piece_;
  std::vector<std::pair<py::object, py::object>> staged_;  // (piece's local, its CPU staging)
  std::string where_;
  std::vector<const StateValue*> order_;  // tensors in `into`, in structure order
  std::unordered_map<std::string, std::vector<std::pair<std::string, py::object>>> targets_;
  std::unordered_map<std::string, py::object> direct_, given_;
  std::vector<std::pair<std::string, py::object>> copies_;
};

// load(map_location="cuda:N"): every whole tensor of the state read
// straight into new memory of that device, through the pinned ring (§9),
// instead of restored on the host and moved with .to().
class DevicePlan {
 public:
  explicit DevicePlan(py::object device) : device_(std::move(device)) {
    torch_ = py::module_::import("torch");
  }

  Status Plan(const StateValue& root, std::vector<TensorDestination>* dst) {
    Walk(root, dst);
    return Status::Ok();
  }

  // The tensors made, as the state holds them (Parameters, requires_grad).
  std::unordered_map<std::string, py::object> Given(const StateValue& root) {
    std::unordered_map<std::string, py::object> out;
    Collect(root, &out);
    return out;
  }

 private:
  void Walk(const StateValue& v, std::vector<TensorDestination>* dst) {
    if ((v.kind == Kind::kTensor || v.kind == Kind::kParameter) &&
        v.layout.kind == TensorLayout::Kind::kWhole && !made_.contains(v.text)) {
      const std::string dtype(DTypeName(v.dtype));
      if (!py::hasattr(torch_, dtype.c_str())) return;  // restored on the host, as an array
      py::object t = torch_.attr("empty")(py::tuple(py::cast(v.shape)),
                                          py::arg("dtype") = torch_.attr(dtype.c_str()),
                                          py::arg("device") = device_);
      const size_t n = t.attr("numel")().cast<size_t>() * t.attr("element_size")().cast<size_t>();
      made_.emplace(v.text, t);
      if (n > 0) {
        TensorDestination d{
            v.text,
            {reinterpret_cast<std::byte*>(t.attr("data_ptr")().cast<uintptr_t>()), n},
            {},
            {},
            {}};
        d.device = device_.attr("index").is_none() ? 0 : device_.attr("index").cast<int>();
        dst->push_back(std::move(d));
      }
    }
    for (const StateValue& x : v.items) Walk(x, dst);
  }

  void Collect(const StateValue& v, std::unordered_map<std::string, py::object>* out) {
    if (auto it = made_.find(v.text); it != made_.end() && v.kind >= Kind::kTensor) {
      if (v.kind == Kind::kParameter) {
        (*out)[v.text] =
            torch_.attr("nn").attr("Parameter")(it->second, py::arg("requires_grad") = v.flag);
      } else {
        (*out)[v.text] = v.flag ? it->second.attr("requires_grad_")(true) : it->second;
      }
    }
    for (const StateValue& x : v.items) Collect(x, out);
  }

  py::object device_, torch_;
  std::unordered_map<std::string, py::object> made_;
};

py::object Device(py::handle map_location) {
  if (map_location.is_none()) return py::none();
  py::object torch = py::module_::import("torch");
  if (!py::isinstance<py::str>(map_location) &&
      !py::isinstance(map_location, torch.attr("device"))) {
    throw py::type_error(
        "map_location must be None, a device string like 'cuda:0' or a torch.device, not " +
        Str(map_location.get_type().attr("__name__")));
  }
  py::object device = torch.attr("device")(map_location);
  return Str(device.attr("type")) == "cpu" ? py::none() : device;
}

}  // namespace

py::object LoadPyState(const LoadRunner& run, const PyLoadArgs& args) {
  PyLoadArgs a = args;
  a.device = Device(args.device);
  if (!a.into.is_none() && a.options.all_ranks) {
    throw py::value_error(
        "load(into=...) restores this rank's part; it does not combine with "
        "all_ranks=True");
  }
  if (!a.into.is_none() && !a.device.is_none()) {
    throw py::value_error(
        "load(into=...) restores into the tensors where they are; "
        "map_location does not apply");
  }
  std::optional<IntoPlan> into;
  std::optional<DevicePlan> on_device;
  std::exception_ptr failed;  // the plan's Python error, raised once C++ returns
  StatePlan plan;
  if (a.into.is_none() && !a.device.is_none() && !a.options.all_ranks &&
      Str(a.device.attr("type")) == "cuda") {
    on_device.emplace(a.device);
    plan = [&](const StateValue& root, const CheckpointManifest&,
               std::vector<TensorDestination>* dst) -> Status {
      py::gil_scoped_acquire acquire;
      try {
        return on_device->Plan(root, dst);
      } catch (...) {
        failed = std::current_exception();
        return Cancelled("load(map_location=...): the device tensors could not be made");
      }
    };
  }
  if (!a.into.is_none()) {
    into.emplace(a.into, a.uri + ": checkpoint ");
    plan = [&](const StateValue& root, const CheckpointManifest& m,
               std::vector<TensorDestination>* dst) -> Status {
      py::gil_scoped_acquire acquire;
      try {
        size_t n = 0;
        for (const RankPart& p : m.ranks) {
          if (p.rank == (a.options.any_world_if_single && m.world_size == 1 ? 0 : a.options.rank)) {
            n = p.tensors.size();
          }
        }
        return into->Plan(root, m, n, dst);
      } catch (...) {
        failed = std::current_exception();
        return Cancelled("load(into=...): the destinations were refused");
      }
    };
  }
  Result<LoadedState> r =
      run([&](Checkpointer& c) { return LoadState(c, a.name, a.options, plan); });
  if (failed) std::rethrow_exception(failed);
  if (!r.ok()) ThrowStatus(r.status());
  const py::capsule owner(new std::shared_ptr<void>(r->memory),
                          [](void* p) { delete static_cast<std::shared_ptr<void>*>(p); });
  const std::string where = a.uri + ": checkpoint " + r->manifest.name;
  Decoder d(owner, a.device, where);
  if (into) return into->Finish(d, r->roots.at(0));
  if (on_device) {
    d.given = on_device->Given(r->roots.at(0));
    return d.Value(r->roots[0]);
  }
  if (!a.options.all_ranks) return r->roots.empty() ? py::dict() : d.Value(r->roots[0]);
  py::list out;
  for (uint32_t rank = 0; rank < r->manifest.world_size; ++rank) {
    auto it = std::find(r->ranks.begin(), r->ranks.end(), rank);
    Decoder of_rank(owner, a.device, where);  // tensor names repeat across ranks
    out.append(it == r->ranks.end() ? py::dict() : of_rank.Value(r->roots[it - r->ranks.begin()]));
  }
  return out;
}


}  // namespace stoker::python
