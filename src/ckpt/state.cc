// Saved states: the structure document (docs/checkpoint.md §8), read by key
// path and built from C++.
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/records.h"
#include "stoker/checkpoint.h"

namespace stoker {

namespace {

using Json = nlohmann::ordered_json;

// The document's identity (§8): the Python package wrote it first, hence
// the name; C++ writes the same.
constexpr std::string_view kStructureFormat = "stoker.python.state";
constexpr int kStructureVersion = 1;

const char* const kTensorTags[] = {"tensor", "parameter", "ndarray"};
const char* const kScalarTags[] = {"float", "complex", "bytes", "dtype", "device", "size", "np"};

// A tag node: an object of one key (a tensor may add "requires_grad").
std::string TagOf(const Json& node) {
  if (!node.is_object() || node.empty()) return "";
  if (node.size() == 2 && node.contains("requires_grad")) {
    for (const char* t : kTensorTags) {
      if (node.contains(t)) return t;
    }
    return "";
  }
  return node.size() == 1 ? node.begin().key() : "";
}

// JSON parsed with integers beyond 64 bits kept exact (ExactSax, below);
// discarded (null) when it is no JSON.
Json ParseExact(const char* begin, const char* end);

// A scalar's JSON text; an exact big integer's digits.
std::string ScalarText(const Json& node) {
  if (!node.is_binary()) return node.dump();
  return std::string(node.get_binary().begin(), node.get_binary().end());
}

std::string ScalarType(const Json& node) {
  if (node.is_null()) return "none";
  if (node.is_boolean()) return "bool";
  if (node.is_number_integer() || node.is_binary()) return "int";
  if (node.is_number()) return "float";
  if (node.is_string()) return "str";
  return "";
}

// A dict key as a path component, as the Python package names tensors: a
// string as it is, an int in decimal, None/True/False as Python spells them,
// anything else as its JSON.
std::string KeyComponent(const Json& key) {
  if (key.is_string()) return key.get<std::string>();
  if (key.is_number_integer()) return key.dump();
  if (key.is_null()) return "None";
  if (key.is_boolean()) return key.get<bool>() ? "True" : "False";
  return key.dump();
}

class Walker {
 public:
  Walker(std::string_view where, std::vector<StateEntry>* out) : where_(where), out_(out) {}

  Status Walk(const Json& node, const std::string& path, int depth) {
    if (depth > 60) return Bad("nested deeper than 60 containers");
    StateEntry e;
    e.path = path;
    e.depth = depth;
    if (std::string type = ScalarType(node); !type.empty()) {
      e.type = type;
      e.value = ScalarText(node);
      out_->push_back(std::move(e));
      return Status::Ok();
    }
    if (node.is_array()) return Items(node, "list", path, depth);
    const std::string tag = TagOf(node);
    if (tag.empty()) return Bad("an object that is no tag: " + node.dump().substr(0, 80));
    const Json& body = node.at(tag);
    for (const char* t : kTensorTags) {
      if (tag != t) continue;
      if (!body.is_string()) return Bad("a " + tag + " whose name is no string");
      e.type = tag;
      e.tensor = body.get<std::string>();
      out_->push_back(std::move(e));
      return Status::Ok();
    }
    if (tag == "tuple") {
      if (!body.is_array()) return Bad("a tuple that is no array");
      return Items(body, "tuple", path, depth);
    }
    if (tag == "dict" || tag == "odict") return Dict(body, tag, path, depth);
    for (const char* t : kScalarTags) {
      if (tag != t) continue;
      e.type = tag == "np" ? "numpy" : tag;
      e.value = body.dump();
      out_->push_back(std::move(e));
      return Status::Ok();
    }
    return Bad("unknown tag '" + tag + "'");
  }

 private:
  Status Items(const Json& items, const char* type, const std::string& path, int depth) {
    out_->push_back({path, type, "", "", items.size(), depth});
    for (size_t i = 0; i < items.size(); ++i) {
      STOKER_RETURN_IF_ERROR(Walk(items[i], Join(path, std::to_string(i)), depth + 1));
    }
    return Status::Ok();
  }

  Status Dict(const Json& items, const std::string& type, const std::string& path, int depth) {
    if (!items.is_array()) return Bad("a " + type + " that is no array of pairs");
    out_->push_back({path, type, "", "", items.size(), depth});
    for (const Json& kv : items) {
      if (!kv.is_array() || kv.size() != 2) return Bad("a " + type + " item that is no pair");
      STOKER_RETURN_IF_ERROR(Walk(kv[1], Join(path, KeyComponent(kv[0])), depth + 1));
    }
    return Status::Ok();
  }

  static std::string Join(const std::string& path, const std::string& part) {
    return path.empty() ? part : path + "." + part;
  }
  Status Bad(const std::string& why) const {
    return Corruption(std::string(where_) + ": state structure: " + why);
  }

  std::string_view where_;
  std::vector<StateEntry>* out_;
};

}  // namespace

Result<StateStructure> StateStructure::Parse(std::span<const std::byte> document,
                                             std::string_view where) {
  const auto* text = reinterpret_cast<const char*>(document.data());
  Json doc = ParseExact(text, text + document.size());
  if (!doc.is_object() || !doc.contains("format") || doc["format"] != kStructureFormat) {
    return Corruption(std::string(where) + ": not a stoker state structure (no \"format\": \"" +
                      std::string(kStructureFormat) + "\")");
  }
  if (!doc.contains("version") || !doc["version"].is_number_unsigned()) {
    return Corruption(std::string(where) + ": state structure without a version");
  }
  if (doc["version"].get<uint64_t>() != kStructureVersion) {
    return Unsupported(std::string(where) + ": state structure version " + doc["version"].dump() +
                       " (this stoker reads version " + std::to_string(kStructureVersion) + ")");
  }
  if (!doc.contains("root")) return Corruption(std::string(where) + ": state structure: no root");
  StateStructure s;
  STOKER_RETURN_IF_ERROR(Walker(where, &s.entries_).Walk(doc["root"], "", 0));
  return s;
}

Result<StateEntry> StateStructure::Find(std::string_view path) const {
  for (const StateEntry& e : entries_) {
    if (e.path == path) return e;
  }
  const StateEntry* nearest = entries_.empty() ? nullptr : &entries_.front();
  for (const StateEntry& e : entries_) {
    if (e.items > 0 && path.starts_with(e.path + ".") && e.path.size() > nearest->path.size()) {
      nearest = &e;
    }
  }
  std::string near;
  if (nearest != nullptr) {
    near = " (the nearest is " + (nearest->path.empty() ? "the root" : "'" + nearest->path + "'") +
           ", a " + nearest->type + " of " + std::to_string(nearest->items) + ")";
  }
  return NotFound("no value at key path '" + std::string(path) + "'" + near);
}

// ---- StateBuilder -----------------------------------------------------------

struct StateBuilder::Impl {
  Json root = Json{{"dict", Json::array()}};
  std::vector<TensorRef> tensors;
  std::string document;

  // The dict node's items array at the components before the last one,
  // created as needed; InvalidArgument when a value is in the way.
  Result<Json*> Parent(const std::vector<std::string>& parts, std::string_view path) {
    Json* items = &root["dict"];
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      Json* next = nullptr;
      for (Json& kv : *items) {
        if (kv[0] == parts[i]) next = &kv[1];
      }
      if (next == nullptr) {
        items->push_back(Json::array({parts[i], Json{{"dict", Json::array()}}}));
        next = &items->back()[1];
      }
      if (TagOf(*next) != "dict") {
        return InvalidArgument("state key path '" + std::string(path) + "': '" + parts[i] +
                               "' holds a value, not a dict");
      }
      items = &(*next)["dict"];
    }
    return items;
  }

  Status Set(std::string_view path, Json value) {
    std::vector<std::string> parts;
    for (size_t b = 0;;) {
      const size_t e = std::min(path.find('.', b), path.size());
      parts.emplace_back(path.substr(b, e - b));
      if (parts.back().empty()) {
        return InvalidArgument("state key path '" + std::string(path) + "': empty component");
      }
      if (e == path.size()) break;
      b = e + 1;
    }
    STOKER_ASSIGN_OR_RETURN(Json * items, Parent(parts, path));
    for (const Json& kv : *items) {
      if (kv[0] == parts.back()) {
        return InvalidArgument("state key path '" + std::string(path) + "' is set already");
      }
    }
    items->push_back(Json::array({parts.back(), std::move(value)}));
    return Status::Ok();
  }
};

StateBuilder::StateBuilder() : impl_(std::make_unique<Impl>()) {}
StateBuilder::~StateBuilder() = default;
StateBuilder::StateBuilder(StateBuilder&&) noexcept = default;
StateBuilder& StateBuilder::operator=(StateBuilder&&) noexcept = default;

Status StateBuilder::SetTensor(std::string_view path, DType dtype, std::vector<int64_t> shape,
                               std::span<const std::byte> data) {
  if (path == kStructureTensor) return InvalidArgument("'stoker:structure' is reserved");
  STOKER_RETURN_IF_ERROR(impl_->Set(path, Json{{"tensor", std::string(path)}}));
  impl_->tensors.push_back({std::string(path), dtype, std::move(shape), data});
  return Status::Ok();
}
Status StateBuilder::SetInt(std::string_view path, int64_t v) { return impl_->Set(path, v); }
Status StateBuilder::SetBool(std::string_view path, bool v) { return impl_->Set(path, v); }
Status StateBuilder::SetString(std::string_view path, std::string_view v) {
  return impl_->Set(path, std::string(v));
}
Status StateBuilder::SetFloat(std::string_view path, double v) {
  if (std::isfinite(v)) return impl_->Set(path, v);
  return impl_->Set(path, Json{{"float", std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"}});
}

std::vector<TensorRef> StateBuilder::Tensors() {
  Json doc = {{"format", kStructureFormat}, {"version", kStructureVersion}, {"root", impl_->root}};
  impl_->document = doc.dump();
  std::vector<TensorRef> out = impl_->tensors;
  out.push_back({std::string(kStructureTensor),
                 DType::kUInt8,
                 {int64_t(impl_->document.size())},
                 std::as_bytes(std::span(impl_->document))});
  return out;
}

// ---- reading from a checkpoint ------------------------------------------------

Result<StateStructure> ReadStateStructure(Checkpointer& c, std::string_view name, uint32_t rank) {
  STOKER_ASSIGN_OR_RETURN(CheckpointManifest m, c.ReadManifest(name));
  const std::string where = c.uri() + ": checkpoint " + m.name + " rank " + std::to_string(rank);
  if (rank >= m.ranks.size()) {
    return InvalidArgument(where + ": the checkpoint has " + std::to_string(m.ranks.size()) +
                           " rank(s)");
  }
  const TensorInfo* doc = nullptr;
  for (const TensorInfo& t : m.ranks[rank].tensors) {
    if (t.name == kStructureTensor) doc = &t;
  }
  if (doc == nullptr) {
    return NotFound(where + ": saved without a structure (a flat set of tensors)");
  }
  std::string bytes(doc->bytes, '\0');
  TensorDestination dst{doc->name, std::as_writable_bytes(std::span(bytes))};
  RestoreOptions o;
  o.rank = rank;
  STOKER_RETURN_IF_ERROR(c.RestoreInto(m.name, {&dst, 1}, o).status());
  return StateStructure::Parse(std::as_bytes(std::span(bytes)), where);
}

Result<TensorInfo> RestoreStatePath(Checkpointer& c, std::string_view name, std::string_view path,
                                    std::span<std::byte> dst, uint32_t rank) {
  STOKER_ASSIGN_OR_RETURN(CheckpointManifest m, c.ReadManifest(name));
  STOKER_ASSIGN_OR_RETURN(StateStructure s, ReadStateStructure(c, m.name, rank));
  auto e = s.Find(path);
  if (!e.ok()) return e.status().WithContext(c.uri() + ": checkpoint " + m.name);
  if (e->tensor.empty()) {
    return InvalidArgument(c.uri() + ": checkpoint " + m.name + ": key path '" + std::string(path) +
                           "' holds a " + e->type + ", not a tensor");
  }
  TensorDestination d{e->tensor, dst};
  RestoreOptions o;
  o.rank = rank;
  STOKER_ASSIGN_OR_RETURN(CheckpointManifest got, c.RestoreInto(m.name, {&d, 1}, o));
  for (const TensorInfo& t : got.ranks[rank].tensors) {
    if (t.name == e->tensor) return t;
  }
  return Internal("restored tensor '" + e->tensor + "' is not in its manifest");
}

}  // namespace stoker

// ---- states as trees: EncodeState, LoadState ------------------------------------

namespace stoker {
namespace {

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

// Parses JSON as nlohmann does, except that an integer too large for 64
// bits stays exact: a binary value holding its digits (JSON itself has no
// binary values, so nothing else becomes one).
class ExactSax {
 public:
  using string_t = std::string;
  bool null() { return Add(nullptr); }
  bool boolean(bool v) { return Add(v); }
  bool number_integer(int64_t v) { return Add(v); }
  bool number_unsigned(uint64_t v) { return Add(v); }
  bool number_float(double v, const std::string& text) {
    if (text.find_first_of(".eE") == std::string::npos) {
      return Add(Json::binary(std::vector<uint8_t>(text.begin(), text.end())));
    }
    return Add(v);
  }
  bool string(std::string& v) { return Add(std::move(v)); }
  bool binary(Json::binary_t&) { return false; }
  bool start_object(size_t) { return Open(Json::object()); }
  bool key(std::string& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() { return Close(); }
  bool start_array(size_t) { return Open(Json::array()); }
  bool end_array() { return Close(); }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
  Json root;

 private:
  Json* Place(Json v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    Json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    return &(top[key_] = std::move(v));
  }
  bool Add(Json v) {
    Place(std::move(v));
    return true;
  }
  bool Open(Json v) {
    stack_.push_back(Place(std::move(v)));
    return stack_.size() <= 256;  // a state node nests at most 3 JSON levels, 60 of them
  }
  bool Close() {
    stack_.pop_back();
    return true;
  }
  std::vector<Json*> stack_;
  std::string key_;
};

}  // namespace

namespace {

Json ParseExact(const char* begin, const char* end) {
  ExactSax sax;
  if (!Json::sax_parse(begin, end, &sax)) return nullptr;
  return std::move(sax.root);
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
      out_->tensors.push_back({v.text, v.dtype, v.shape, v.data});
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
                         std::as_bytes(std::span(out.document))});
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
  TensorDestination d{std::string(kStructureTensor), std::as_writable_bytes(std::span(structure))};
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
