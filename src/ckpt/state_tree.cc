// Saved states as trees (EncodeState, LoadState in stoker/checkpoint.h): the
// §8 document written from a StateValue tree and read back into one.
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/records.h"
#include "ckpt/state_json.h"
#include "stoker/checkpoint.h"

namespace stoker {
namespace {

using state_json::Json;
using state_json::kStructureFormat;
using state_json::kStructureVersion;
using state_json::ParseExact;
using state_json::TagOf;

using Kind = StateValue::Kind;

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string Base64(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    if (i + 2 < in.size()) v |= uint8_t(in[i + 2]);
    for (size_t k = 0; k < 4; ++k) {
      out += i + k <= in.size() ? kBase64[(v >> (18 - 6 * k)) & 63] : '=';
    }
  }
  return out;
}

Result<std::string> Unbase64(std::string_view in, std::string_view where) {
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const char* p = std::strchr(kBase64, c);
    if (c == '\0' || p == nullptr) return Corruption(std::string(where) + ": bytes not in base64");
    v = (v << 6) | uint32_t(p - kBase64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((v >> bits) & 0xff);
    }
  }
  return out;
}

// ---- encoding

std::string JsonText(const std::string& s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string FloatText(double v) {
  if (std::isfinite(v)) return Json(v).dump();
  return std::string("{\"float\":\"") + (std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf") + "\"}";
}

class Encoder {
 public:
  explicit Encoder(EncodedState* out) : out_(out) { names_.insert(std::string(kStructureTensor)); }

  Status Value(StateValue& v, std::vector<std::string>& path, std::string& doc, int depth) {
    if (depth > 60) return InvalidArgument("state: nested deeper than 60 containers");
    switch (v.kind) {
      case Kind::kNone:
        doc += "null";
        return Status::Ok();
      case Kind::kBool:
        doc += v.flag ? "true" : "false";
        return Status::Ok();
      case Kind::kInt:
        if (v.text.empty() || v.text.find_first_not_of("-0123456789") != std::string::npos) {
          return InvalidArgument("state: int '" + v.text + "' is not decimal digits");
        }
        doc += v.text;
        return Status::Ok();
      case Kind::kFloat:
        doc += FloatText(v.real);
        return Status::Ok();
      case Kind::kStr:
        doc += JsonText(v.text);
        return Status::Ok();
      case Kind::kBytes:
        doc += "{\"bytes\":\"" + Base64(v.text) + "\"}";
        return Status::Ok();
      case Kind::kComplex:
        doc += "{\"complex\":[" + FloatText(v.real) + "," + FloatText(v.imag) + "]}";
        return Status::Ok();
      case Kind::kDType:
        doc += "{\"dtype\":" + JsonText(v.text) + "}";
        return Status::Ok();
      case Kind::kDevice:
        doc += "{\"device\":" + JsonText(v.text) + "}";
        return Status::Ok();
      case Kind::kNumpy:
        if (v.items.size() != 1) return InvalidArgument("state: a numpy scalar without a value");
        doc += "{\"np\":[" + JsonText(v.text) + ",";
        STOKER_RETURN_IF_ERROR(Value(v.items[0], path, doc, depth + 1));
        doc += "]}";
        return Status::Ok();
      case Kind::kSize:
      case Kind::kList:
      case Kind::kTuple:
        return Items(v, path, doc, depth);
      case Kind::kDict:
      case Kind::kODict:
        return Dict(v, path, doc, depth);
      case Kind::kTensor:
      case Kind::kParameter:
      case Kind::kNdarray:
        return Tensor(v, path, doc);
    }
    return InvalidArgument("state: a value of unknown kind");
  }

 private:
  Status Items(StateValue& v, std::vector<std::string>& path, std::string& doc, int depth) {
    doc += v.kind == Kind::kSize ? "{\"size\":[" : v.kind == Kind::kTuple ? "{\"tuple\":[" : "[";
    for (size_t i = 0; i < v.items.size(); ++i) {
      if (i > 0) doc += ",";
      path.push_back(std::to_string(i));
      Status s = Value(v.items[i], path, doc, depth + 1);
      path.pop_back();
      STOKER_RETURN_IF_ERROR(s);
    }
    doc += v.kind == Kind::kList ? "]" : "]}";
    return Status::Ok();
  }

  Status Dict(StateValue& v, std::vector<std::string>& path, std::string& doc, int depth) {
    if (v.items.size() % 2 != 0) return InvalidArgument("state: a dict with an odd item count");
    doc += v.kind == Kind::kODict ? "{\"odict\":[" : "{\"dict\":[";
    std::vector<std::string> none;
    for (size_t i = 0; i < v.items.size(); i += 2) {
      doc += i > 0 ? ",[" : "[";
      STOKER_RETURN_IF_ERROR(Value(v.items[i], none, doc, depth + 1));
      doc += ",";
      path.push_back(v.items[i].component);
      Status s = Value(v.items[i + 1], path, doc, depth + 1);
      path.pop_back();
      STOKER_RETURN_IF_ERROR(s);
      doc += "]";
    }
    doc += "]}";
    return Status::Ok();
  }

  Status Tensor(StateValue& v, const std::vector<std::string>& path, std::string& doc) {
    auto tied = v.tie.empty() ? ties_.end() : ties_.find(v.tie);
    if (tied != ties_.end()) {
      v.text = tied->second;
    } else {
      v.text = Name(path);
      if (!v.tie.empty()) ties_.emplace(v.tie, v.text);
      out_->tensors.push_back({v.text, v.dtype, v.shape, v.data, v.layout, v.device, v.stream});
      out_->tensor_bytes += v.data.size();
    }
    if (v.kind == Kind::kNdarray) {
      doc += "{\"ndarray\":" + JsonText(v.text) + "}";
    } else if (v.kind == Kind::kParameter) {
      doc += "{\"parameter\":" + JsonText(v.text) +
             ",\"requires_grad\":" + (v.flag ? "true" : "false") + "}";
    } else {
      doc += "{\"tensor\":" + JsonText(v.text) + (v.flag ? ",\"requires_grad\":true}" : "}");
    }
    return Status::Ok();
  }

  // The dotted key path, made a valid unique tensor name (§8).
  std::string Name(const std::vector<std::string>& path) {
    std::string base;
    for (const std::string& p : path) base += (base.empty() && &p == &path[0] ? "" : ".") + p;
    if (path.empty()) base = "state";
    for (char& c : base) {
      if (uint8_t(c) < 0x20 || c == 0x7f) c = '?';
    }
    constexpr size_t kRoom = kMaxTensorNameBytes - 16;  // for "~N"
    if (base.size() > kRoom) {
      size_t cut = kRoom;
      while (cut > 0 && (uint8_t(base[cut]) & 0xc0) == 0x80) --cut;  // a whole UTF-8 character
      base.resize(cut);
    }
    if (base.empty()) base = "tensor";
    std::string name = base;
    for (int n = 2; !names_.insert(name).second; ++n) name = base + "~" + std::to_string(n);
    return name;
  }

  EncodedState* out_;
  std::unordered_set<std::string> names_;
  std::unordered_map<std::string, std::string> ties_;
};

// ---- decoding

class Decoder {
 public:
  Decoder(std::string where, const RankPart& part) : where_(std::move(where)) {
    for (const TensorInfo& t : part.tensors) infos_.emplace(t.name, &t);
  }

  Result<StateValue> Value(const Json& node, int depth) {
    if (depth > 60) return Bad("nested deeper than 60 containers");
    StateValue v;
    switch (node.type()) {
      case Json::value_t::null:
        return v;
      case Json::value_t::boolean:
        v.kind = Kind::kBool;
        v.flag = node.get<bool>();
        return v;
      case Json::value_t::number_integer:
      case Json::value_t::number_unsigned:
        v.kind = Kind::kInt;
        v.text = node.dump();
        return v;
      case Json::value_t::binary:
        v.kind = Kind::kInt;
        v.text.assign(node.get_binary().begin(), node.get_binary().end());
        return v;
      case Json::value_t::number_float:
        v.kind = Kind::kFloat;
        v.real = node.get<double>();
        return v;
      case Json::value_t::string:
        v.kind = Kind::kStr;
        v.text = node.get<std::string>();
        return v;
      case Json::value_t::array:
        v.kind = Kind::kList;
        STOKER_RETURN_IF_ERROR(Items(node, &v, depth));
        return v;
      default:
        return Tagged(node, depth);
    }
  }

 private:
  // An object node: a tag (§8's table).
  Result<StateValue> Tagged(const Json& node, int depth) {
    StateValue v;
    const std::string tag = TagOf(node);
    if (tag.empty()) return Bad("unknown entry " + node.dump().substr(0, 200));
    const Json& body = node.at(tag);
    if (tag == "tensor" || tag == "parameter" || tag == "ndarray") {
      return Tensor(tag, body, node.value("requires_grad", false));
    }
    if (tag == "dict" || tag == "odict") {
      v.kind = tag == "dict" ? Kind::kDict : Kind::kODict;
      if (!body.is_array()) return Bad("a " + tag + " that is no array of pairs");
      for (const Json& kv : body) {
        if (!kv.is_array() || kv.size() != 2) return Bad("a " + tag + " item that is no pair");
        STOKER_ASSIGN_OR_RETURN(StateValue key, Value(kv[0], depth + 1));
        if (key.kind >= Kind::kTensor) return Bad("tensor '" + key.text + "' used as a dict key");
        v.items.push_back(std::move(key));
        STOKER_ASSIGN_OR_RETURN(StateValue value, Value(kv[1], depth + 1));
        v.items.push_back(std::move(value));
      }
      return v;
    }
    if (tag == "tuple" || tag == "size") {
      v.kind = tag == "tuple" ? Kind::kTuple : Kind::kSize;
      if (!body.is_array()) return Bad("a " + tag + " that is no array");
      STOKER_RETURN_IF_ERROR(Items(body, &v, depth));
      return v;
    }
    if (tag == "float" && body.is_string()) {
      const std::string f = body.get<std::string>();
      if (f != "nan" && f != "inf" && f != "-inf") return Bad("float '" + f + "'");
      v.kind = Kind::kFloat;
      v.real = f == "nan" ? std::nan("") : f == "inf" ? HUGE_VAL : -HUGE_VAL;
      return v;
    }
    if (tag == "complex" && body.is_array() && body.size() == 2) {
      v.kind = Kind::kComplex;
      STOKER_ASSIGN_OR_RETURN(StateValue re, Value(body[0], depth + 1));
      STOKER_ASSIGN_OR_RETURN(StateValue im, Value(body[1], depth + 1));
      v.real = re.kind == Kind::kInt ? std::stod(re.text) : re.real;
      v.imag = im.kind == Kind::kInt ? std::stod(im.text) : im.real;
      return v;
    }
    if ((tag == "bytes" || tag == "dtype" || tag == "device") && body.is_string()) {
      v.kind = tag == "bytes" ? Kind::kBytes : tag == "dtype" ? Kind::kDType : Kind::kDevice;
      if (tag != "bytes") {
        v.text = body.get<std::string>();
        return v;
      }
      STOKER_ASSIGN_OR_RETURN(v.text, Unbase64(body.get<std::string>(), where_));
      return v;
    }
    if (tag == "np" && body.is_array() && body.size() == 2 && body[0].is_string()) {
      v.kind = Kind::kNumpy;
      v.text = body[0].get<std::string>();
      STOKER_ASSIGN_OR_RETURN(StateValue value, Value(body[1], depth + 1));
      v.items.push_back(std::move(value));
      return v;
    }
    return Bad("unknown entry " + node.dump().substr(0, 200));
  }

  Status Items(const Json& items, StateValue* v, int depth) {
    for (const Json& item : items) {
      STOKER_ASSIGN_OR_RETURN(StateValue x, Value(item, depth + 1));
      v->items.push_back(std::move(x));
    }
    return Status::Ok();
  }

  Result<StateValue> Tensor(const std::string& tag, const Json& name, bool requires_grad) {
    if (!name.is_string()) return Bad("a " + tag + " whose name is no string");
    StateValue v;
    v.kind = tag == "tensor"      ? Kind::kTensor
             : tag == "parameter" ? Kind::kParameter
                                  : Kind::kNdarray;
    v.text = name.get<std::string>();
    v.flag = requires_grad;
    auto it = infos_.find(v.text);
    if (it == infos_.end() || v.text == kStructureTensor) {
      return InvalidArgument(where_ + ": the state names tensor '" + v.text +
                             "', which the checkpoint does not hold");
    }
    v.dtype = it->second->dtype;
    v.shape = it->second->shape;
    v.layout = it->second->layout;
    return v;
  }

  Status Bad(const std::string& why) const {
    return Corruption(where_ + ": state structure: " + why);
  }

  std::string where_;
  std::unordered_map<std::string_view, const TensorInfo*> infos_;
};

// A rank's state: its structure decoded, or a dict of its tensors by name.
Result<StateValue> RankRoot(const RankPart& part, std::span<const std::byte> structure,
                            const std::string& where) {
  if (structure.data() == nullptr) {
    StateValue root;
    root.kind = Kind::kDict;
    for (const TensorInfo& t : part.tensors) {
      StateValue key, value;
      key.kind = Kind::kStr;
      key.text = key.component = t.name;
      value.kind = Kind::kTensor;
      value.text = t.name;
      value.dtype = t.dtype;
      value.shape = t.shape;
      value.layout = t.layout;
      root.items.push_back(std::move(key));
      root.items.push_back(std::move(value));
    }
    return root;
  }
  const auto* text = reinterpret_cast<const char*>(structure.data());
  Json doc = ParseExact(text, text + structure.size());
  if (!doc.is_object() || doc.value("format", "") != kStructureFormat) {
    return Corruption(where + ": tensor 'stoker:structure' is not a stoker state structure");
  }
  const Json& version = doc["version"];
  if (!version.is_number_unsigned() || version.get<uint64_t>() != kStructureVersion) {
    return Unsupported(where + ": state structure version " + version.dump() +
                       " is not supported (this stoker reads version " +
                       std::to_string(kStructureVersion) + ")");
  }
  if (!doc.contains("root")) return Corruption(where + ": state structure: no root");
  return Decoder(where, part).Value(doc["root"], 0);
}

// Points the tree's tensors at their bytes, by name.
using TensorBytes = std::unordered_map<std::string, std::pair<std::span<const std::byte>, int64_t>>;

void Attach(StateValue& v, const TensorBytes& data) {
  if (v.kind >= Kind::kTensor) {
    auto it = data.find(v.text);
    if (it != data.end()) std::tie(v.data, v.destination) = it->second;
  }
  for (StateValue& item : v.items) Attach(item, data);
}

const TensorInfo* StructureOf(const RankPart& part) {
  for (const TensorInfo& t : part.tensors) {
    if (t.name == kStructureTensor) return &t;
  }
  return nullptr;
}

}  // namespace

Result<EncodedState> EncodeState(StateValue& root) {
  EncodedState out;
  std::string doc = "{\"format\":\"" + std::string(kStructureFormat) +
                    "\",\"version\":" + std::to_string(kStructureVersion) + ",\"root\":";
  std::vector<std::string> path;
  STOKER_RETURN_IF_ERROR(Encoder(&out).Value(root, path, doc, 0));
  doc += "}";
  out.document = std::move(doc);
  out.tensors.push_back({std::string(kStructureTensor),
                         DType::kUInt8,
                         {int64_t(out.document.size())},
                         std::as_bytes(std::span(out.document)),
                         {}});
  return out;
}

namespace {

using Bytes = std::pair<std::span<const std::byte>, int64_t>;

// Rank ro.rank of out->manifest: its document restored (rank and world size
// checked on the way), the plan asked, its destinations read, the rest
// restored into new memory.
Status LoadPlanned(Checkpointer& c, RestoreOptions ro, const StatePlan& plan,
                   const std::string& where, LoadedState* out) {
  const CheckpointManifest& m = out->manifest;
  const RankPart* planned = nullptr;
  for (const RankPart& p : m.ranks) {
    if (p.rank == ro.rank) planned = &p;
  }
  const TensorInfo* doc = planned ? StructureOf(*planned) : nullptr;
  std::string structure(doc ? doc->bytes : 0, '\0');
  TensorDestination d{
      std::string(kStructureTensor), std::as_writable_bytes(std::span(structure)), {}, {}, {}};
  if (doc != nullptr) {
    STOKER_RETURN_IF_ERROR(c.RestoreInto(m.name, {&d, 1}, ro).status());
  } else {
    ro.only = {"\n"};  // no such tensor: only the checks run, and then NotFound
    Status s = c.Restore(m.name, ro).status();
    if (s.code() != Code::kNotFound || planned == nullptr) return s;
  }
  auto bytes = doc ? std::as_bytes(std::span(structure)) : std::span<const std::byte>();
  STOKER_ASSIGN_OR_RETURN(StateValue root, RankRoot(*planned, bytes, where));
  std::vector<TensorDestination> dst;
  STOKER_RETURN_IF_ERROR(plan(root, m, &dst));
  if (!dst.empty()) STOKER_RETURN_IF_ERROR(c.RestoreInto(m.name, dst, ro).status());
  TensorBytes data;
  for (size_t i = 0; i < dst.size(); ++i) data.emplace(dst[i].name, Bytes{dst[i].data, int64_t(i)});
  ro.only.clear();
  for (const TensorInfo& t : planned->tensors) {
    if (t.name != kStructureTensor && !data.contains(t.name)) ro.only.push_back(t.name);
  }
  if (!ro.only.empty()) {
    STOKER_ASSIGN_OR_RETURN(Restored r, c.Restore(m.name, ro));
    out->memory = r.memory;
    for (const RestoredTensor& t : r.tensors) data.emplace(t.info.name, Bytes{t.data, -1});
  }
  Attach(root, data);
  out->ranks = {ro.rank};
  out->roots.push_back(std::move(root));
  return Status::Ok();
}

// The ranks `ro` selects, restored into new memory in one restore.
Status LoadRanks(Checkpointer& c, const std::string& name, const RestoreOptions& ro,
                 LoadedState* out) {
  STOKER_ASSIGN_OR_RETURN(Restored r, c.Restore(name, ro));
  out->manifest = std::move(r.manifest);
  out->memory = r.memory;
  const std::string where = c.uri() + ": checkpoint " + out->manifest.name;
  TensorBytes data;
  for (const RankPart& p : out->manifest.ranks) {
    if (!ro.all_ranks && p.rank != ro.rank) continue;
    data.clear();  // names repeat across ranks
    for (const RestoredTensor& t : r.tensors) {
      if (t.info.rank == p.rank) data.emplace(t.info.name, Bytes{t.data, -1});
    }
    const TensorInfo* doc = StructureOf(p);
    auto bytes = doc ? data.at(doc->name).first : std::span<const std::byte>();
    const std::string rank_where = ro.all_ranks ? where + " rank " + std::to_string(p.rank) : where;
    STOKER_ASSIGN_OR_RETURN(StateValue root, RankRoot(p, bytes, rank_where));
    Attach(root, data);
    out->ranks.push_back(p.rank);
    out->roots.push_back(std::move(root));
  }
  return Status::Ok();
}

}  // namespace

Result<LoadedState> LoadState(Checkpointer& c, std::string_view name,
                              const StateLoadOptions& options, const StatePlan& plan) {
  LoadedState out;
  const std::string wanted = name.empty() ? "latest" : std::string(name);
  RestoreOptions ro{options.rank, options.world_size, options.all_ranks, {}};
  // The manifest is read first only where it decides what to restore: for a
  // plan, and for a one-rank checkpoint that may load as rank 0 of any job.
  const bool any_world = options.any_world_if_single && !options.all_ranks &&
                         !(options.rank == 0 && options.world_size == 1);
  if (plan || any_world) {
    STOKER_ASSIGN_OR_RETURN(out.manifest, c.ReadManifest(wanted));
    if (any_world && out.manifest.world_size == 1) ro = {};
  }
  if (options.reshard && plan && !options.all_ranks) {
    // §6.1: this rank's part where the checkpoint has it, else rank 0's.
    ro.world_size = 0;
    if (ro.rank >= out.manifest.world_size) ro.rank = 0;
  }
  if (!plan) {
    STOKER_RETURN_IF_ERROR(LoadRanks(c, any_world ? out.manifest.name : wanted, ro, &out));
    return out;
  }
  const std::string where = c.uri() + ": checkpoint " + out.manifest.name;
  if (options.all_ranks) return InvalidArgument(where + ": a plan loads one rank");
  STOKER_RETURN_IF_ERROR(LoadPlanned(c, ro, plan, where, &out));
  return out;
}

}  // namespace stoker
