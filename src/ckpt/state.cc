// Saved states: the structure document (docs/checkpoint.md §8), read by key
// path and built from C++.
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
using state_json::kTensorTags;
using state_json::ParseExact;
using state_json::TagOf;

const char* const kScalarTags[] = {"float", "complex", "bytes", "dtype", "device", "size", "np"};

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
  impl_->tensors.push_back({std::string(path), dtype, std::move(shape), data, {}});
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
                 std::as_bytes(std::span(impl_->document)),
                 {}});
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
  TensorDestination dst{doc->name, std::as_writable_bytes(std::span(bytes)), {}, {}, {}};
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
  TensorDestination d{e->tensor, dst, {}, {}, {}};
  RestoreOptions o;
  o.rank = rank;
  STOKER_ASSIGN_OR_RETURN(CheckpointManifest got, c.RestoreInto(m.name, {&d, 1}, o));
  for (const TensorInfo& t : got.ranks[rank].tensors) {
    if (t.name == e->tensor) return t;
  }
  return Internal("restored tensor '" + e->tensor + "' is not in its manifest");
}

}  // namespace stoker
