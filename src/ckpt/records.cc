// Checkpoint manifest and part records: encoding and validation.
// docs/checkpoint.md §2, §3.
#include "ckpt/records.h"

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "ckpt/reshard.h"
#include "core/file_util.h"
#include "format/coding.h"
#include "format/framed_json.h"
#include "stoker/format.h"

namespace stoker {

namespace {

struct DTypeEntry {
  DType type;
  std::string_view name;
  size_t size;
};

// docs/checkpoint.md §3.3.
constexpr std::array<DTypeEntry, 17> kDTypes{{
    {DType::kBool, "bool", 1},
    {DType::kUInt8, "uint8", 1},
    {DType::kInt8, "int8", 1},
    {DType::kInt16, "int16", 2},
    {DType::kUInt16, "uint16", 2},
    {DType::kInt32, "int32", 4},
    {DType::kUInt32, "uint32", 4},
    {DType::kInt64, "int64", 8},
    {DType::kUInt64, "uint64", 8},
    {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat32, "float32", 4},
    {DType::kFloat64, "float64", 8},
    {DType::kComplex64, "complex64", 8},
    {DType::kComplex128, "complex128", 16},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1},
    {DType::kFloat8E5M2, "float8_e5m2", 1},
}};

constexpr std::string_view kStepNamePrefix = "step-";  // StepCheckpointName

}  // namespace

std::string_view DTypeName(DType t) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.type == t) return e.name;
  }
  return "unknown";
}

size_t DTypeSize(DType t) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.type == t) return e.size;
  }
  return 0;
}

Result<DType> ParseDType(std::string_view name) {
  for (const DTypeEntry& e : kDTypes) {
    if (e.name == name) return e.type;
  }
  return InvalidArgument("unknown dtype '" + std::string(name) + "'");
}

Status ValidateCheckpointName(std::string_view name) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("checkpoint name '" + std::string(name) + "': " + why +
                           " (names match [A-Za-z0-9][A-Za-z0-9._-]{0,127})");
  };
  if (name.empty()) return bad("empty");
  if (name.size() > 128) return bad("longer than 128 bytes");
  auto alnum = [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
  };
  if (!alnum(name[0])) return bad("must start with a letter or digit");
  for (char c : name) {
    if (!alnum(c) && c != '.' && c != '_' && c != '-') {
      return bad(c == '/' ? "contains '/'" : "contains a character outside [A-Za-z0-9._-]");
    }
  }
  if (name == ckpt::kLatestKey) return bad("'latest' is the pointer's own name");
  return Status::Ok();
}

std::string StepCheckpointName(uint64_t step) {
  char digits[24];
  std::snprintf(digits, sizeof digits, "%012llu", static_cast<unsigned long long>(step));
  return std::string(kStepNamePrefix) + digits;
}

std::optional<uint64_t> ParseStepCheckpointName(std::string_view name) {
  if (!name.starts_with(kStepNamePrefix)) return std::nullopt;
  const std::string_view digits = name.substr(kStepNamePrefix.size());
  if (digits.size() < 12 || digits.size() > 20) return std::nullopt;
  uint64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t d = uint64_t(c - '0');
    if (step > (UINT64_MAX - d) / 10) return std::nullopt;
    step = step * 10 + d;
  }
  // One spelling per step: no zeros beyond the padding.
  if (StepCheckpointName(step) != name) return std::nullopt;
  return step;
}

uint64_t CheckpointManifest::bytes() const {
  uint64_t n = 0;
  for (const RankPart& r : ranks) n += r.bytes();
  return n;
}

size_t CheckpointManifest::tensor_count() const {
  size_t n = 0;
  for (const RankPart& r : ranks) n += r.tensors.size();
  return n;
}

namespace ckpt {

using format::internal::Checker;
using format::internal::DecodeFramed;
using format::internal::EncodeFramed;
using format::internal::FramedFormat;
using format::internal::Hex16;
using format::internal::Indexed;
using format::internal::ParseHex16;
using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr FramedFormat kManifestFrame{.magic = "STOKER-CHECKPOINT ",
                                      .what = "stoker checkpoint manifest",
                                      .version_name = "checkpoint format",
                                      .max_version = kCheckpointFormatVersion,
                                      .max_depth = kMaxCheckpointJsonDepth,
                                      .max_body_bytes = kMaxManifestBodyBytes};
constexpr FramedFormat kPartFrame{.magic = "STOKER-CKPT-PART ",
                                  .what = "stoker checkpoint part record",
                                  .version_name = "checkpoint format",
                                  .max_version = kCheckpointFormatVersion,
                                  .max_depth = kMaxCheckpointJsonDepth};

// Shape entries above this are refused, so products are checked cheaply.
constexpr uint64_t kMaxDim = 1ull << 62;

std::string Padded(uint64_t v, int width) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*llu", width, static_cast<unsigned long long>(v));
  return buf;
}

// §3.4: a tensor's layout, in a part body of format 2.
ojson LayoutJson(const TensorLayout& l) {
  ojson j;
  j["global_shape"] = l.global_shape;
  if (l.kind == TensorLayout::Kind::kBox) {
    j["offsets"] = l.offsets;
  } else {
    j["flat_start"] = l.flat_start;
  }
  return j;
}

ojson RankBody(const RankPart& r) {
  ojson j;
  j["rank"] = r.rank;
  auto& tensors = j["tensors"] = ojson::array();
  for (const TensorInfo& t : r.tensors) {
    ojson tj = {{"name", t.name},
                {"dtype", DTypeName(t.dtype)},
                {"shape", t.shape},
                {"offset", t.offset},
                {"bytes", t.bytes}};
    if (t.layout.kind != TensorLayout::Kind::kWhole) tj["layout"] = LayoutJson(t.layout);
    tensors.push_back(std::move(tj));
  }
  auto& chunks = j["chunks"] = ojson::array();
  for (const ChunkInfo& c : r.chunks) {
    if (c.block_hashes.empty()) {
      chunks.push_back({{"key", c.key}, {"bytes", c.bytes}, {"hash", Hex16(c.hash)}});
      continue;
    }
    std::string blocks;
    blocks.reserve(c.block_hashes.size() * 16);
    for (uint64_t h : c.block_hashes) blocks += Hex16(h);
    chunks.push_back(
        {{"key", c.key}, {"bytes", c.bytes}, {"block_bytes", c.block_bytes}, {"blocks", blocks}});
  }
  return j;
}

// §3.4's checks of tensor `t`'s layout object `lj` (at `path`).
Status DecodeLayout(const json& lj, const std::string& path, const Checker& c, TensorInfo* t) {
  if (!lj.is_object()) return c.TypeError(path, "an object", lj);
  const json* gs;
  STOKER_RETURN_IF_ERROR(c.GetArray(lj, "global_shape", path + ".global_shape", &gs));
  TensorLayout& l = t->layout;
  for (const json& d : *gs) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 62)) {
      return c.Error(path + ".global_shape", "an entry is not an unsigned integer <= 2^62");
    }
    l.global_shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  const int64_t global = Numel(l.global_shape);
  if (global < 0) return c.Error(path + ".global_shape", "too many elements");
  const bool box = lj.contains("offsets"), flat = lj.contains("flat_start");
  if (box == flat) return c.Error(path, "needs exactly one of offsets and flat_start");
  if (flat) {
    l.kind = TensorLayout::Kind::kFlat;
    STOKER_RETURN_IF_ERROR(
        c.GetUnsigned(lj, "flat_start", path + ".flat_start", UINT64_MAX, &l.flat_start));
    if (t->shape.size() != 1) return c.Error(path, "a flat piece has a 1-D shape");
    if (l.flat_start > static_cast<uint64_t>(global) ||
        static_cast<uint64_t>(t->shape[0]) > static_cast<uint64_t>(global) - l.flat_start) {
      return c.Error(path, "elements [" + std::to_string(l.flat_start) + ", " +
                               std::to_string(l.flat_start + t->shape[0]) + ") run past the " +
                               std::to_string(global) + " of the global tensor");
    }
    return Status::Ok();
  }
  l.kind = TensorLayout::Kind::kBox;
  const json* offsets;
  STOKER_RETURN_IF_ERROR(c.GetArray(lj, "offsets", path + ".offsets", &offsets));
  if (offsets->size() != l.global_shape.size() || t->shape.size() != l.global_shape.size()) {
    return c.Error(path, "offsets, global_shape and the tensor's shape differ in length");
  }
  for (size_t d = 0; d < offsets->size(); ++d) {
    const json& o = (*offsets)[d];
    if (!o.is_number_unsigned() || o.get<uint64_t>() > (1ull << 62)) {
      return c.Error(path + ".offsets",
                     "entry " + std::to_string(d) + " is not an unsigned integer");
    }
    l.offsets.push_back(static_cast<int64_t>(o.get<uint64_t>()));
    if (l.offsets[d] + t->shape[d] > l.global_shape[d]) {
      return c.Error(path, "dimension " + std::to_string(d) + ": [" + std::to_string(l.offsets[d]) +
                               ", " + std::to_string(l.offsets[d] + t->shape[d]) +
                               ") runs past the global " + std::to_string(l.global_shape[d]));
    }
  }
  return Status::Ok();
}

std::string Dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

// Empty when `key` may be a chunk of checkpoint `name` (§3.2), else why not.
std::string ChunkKeyProblem(std::string_view key, std::string_view name) {
  const std::string prefix = std::string(name) + "/";
  if (!key.starts_with(prefix)) return "not under '" + prefix + "'";
  if (key.size() > 1024) return "longer than 1024 bytes";
  for (std::string_view part : internal::SplitPath(key)) {
    if (part.empty()) return "empty path component";
    if (part.front() == '.') return "path component '" + std::string(part) + "' starts with '.'";
  }
  for (char c : key) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return "control character";
  }
  if (key == ManifestKey(name)) return "names the manifest";
  return {};
}

// §3.1's rank fields of `obj` (at JSON path `path`) into `r`; §3.2's checks.
Status DecodeRank(const json& obj, const std::string& path, std::string_view name, const Checker& c,
                  uint32_t version, RankPart* r) {
  const std::string p = path.empty() ? "" : path + ".";
  if (!obj.is_object()) return c.TypeError(path.empty() ? "body" : path, "an object", obj);
  uint64_t u;
  STOKER_RETURN_IF_ERROR(c.GetUnsigned(obj, "rank", p + "rank", UINT32_MAX, &u));
  r->rank = static_cast<uint32_t>(u);

  const json* chunks;
  STOKER_RETURN_IF_ERROR(c.GetArray(obj, "chunks", p + "chunks", &chunks));
  uint64_t stream = 0;
  std::unordered_set<std::string> keys;
  for (size_t j = 0; j < chunks->size(); ++j) {
    const std::string cp = p + Indexed("chunks", j);
    const json& cj = (*chunks)[j];
    if (!cj.is_object()) return c.TypeError(cp, "an object", cj);
    ChunkInfo ci;
    const std::string* s;
    STOKER_RETURN_IF_ERROR(c.GetString(cj, "key", cp + ".key", &s));
    if (std::string why = ChunkKeyProblem(*s, name); !why.empty()) {
      return c.Error(cp + ".key", "'" + *s + "': " + why);
    }
    if (!keys.insert(*s).second) return c.Error(cp + ".key", "'" + *s + "' listed twice");
    ci.key = *s;
    STOKER_RETURN_IF_ERROR(c.GetUnsigned(cj, "bytes", cp + ".bytes", kMaxChunkBytes, &ci.bytes));
    if (ci.bytes == 0) return c.Error(cp + ".bytes", "0 (a chunk holds at least one byte)");
    if (version >= 2 && cj.contains("blocks")) {
      // §4.1: one checksum per block.
      STOKER_RETURN_IF_ERROR(c.GetUnsigned(cj, "block_bytes", cp + ".block_bytes",
                                           kMaxChecksumBlockBytes, &ci.block_bytes));
      if (ci.block_bytes < kMinChecksumBlockBytes) {
        return c.Error(cp + ".block_bytes", std::to_string(ci.block_bytes) + " (4 KiB .. 64 MiB)");
      }
      STOKER_RETURN_IF_ERROR(c.GetString(cj, "blocks", cp + ".blocks", &s));
      const uint64_t count = (ci.bytes + ci.block_bytes - 1) / ci.block_bytes;
      if (s->size() != count * 16) {
        return c.Error(cp + ".blocks", std::to_string(s->size()) + " hex digits, " +
                                           std::to_string(count) + " blocks need " +
                                           std::to_string(count * 16));
      }
      ci.block_hashes.resize(count);
      for (uint64_t b = 0; b < count; ++b) {
        if (!ParseHex16(std::string_view(*s).substr(b * 16, 16), &ci.block_hashes[b])) {
          return c.Error(cp + ".blocks",
                         "block " + std::to_string(b) + " is not 16 lowercase hex digits");
        }
      }
    } else {
      STOKER_RETURN_IF_ERROR(c.GetString(cj, "hash", cp + ".hash", &s));
      if (!ParseHex16(*s, &ci.hash)) {
        return c.Error(cp + ".hash", "'" + *s + "' is not 16 lowercase hex digits");
      }
    }
    ci.offset = stream;
    stream += ci.bytes;
    r->chunks.push_back(std::move(ci));
  }

  const json* tensors;
  STOKER_RETURN_IF_ERROR(c.GetArray(obj, "tensors", p + "tensors", &tensors));
  std::unordered_set<std::string> names;
  uint64_t next = 0;
  for (size_t i = 0; i < tensors->size(); ++i) {
    const std::string tp = p + Indexed("tensors", i);
    const json& tj = (*tensors)[i];
    if (!tj.is_object()) return c.TypeError(tp, "an object", tj);
    TensorInfo t;
    t.rank = r->rank;
    const std::string* s;
    STOKER_RETURN_IF_ERROR(c.GetString(tj, "name", tp + ".name", &s));
    if (std::string why = TensorNameProblem(*s); !why.empty()) {
      return c.Error(tp + ".name", why);
    }
    if (!names.insert(*s).second) return c.Error(tp + ".name", "'" + *s + "' appears twice");
    t.name = *s;
    STOKER_RETURN_IF_ERROR(c.GetString(tj, "dtype", tp + ".dtype", &s));
    auto dt = ParseDType(*s);
    if (!dt.ok()) return c.Error(tp + ".dtype", dt.status().message());
    t.dtype = *dt;
    const json* shape;
    STOKER_RETURN_IF_ERROR(c.GetArray(tj, "shape", tp + ".shape", &shape));
    // Element count, refusing overflow: each dim <= 2^62 and the product
    // stays below 2^63 / 16.
    unsigned __int128 count = 1;
    for (size_t d = 0; d < shape->size(); ++d) {
      const json& dj = (*shape)[d];
      if (!dj.is_number_unsigned() || dj.get<uint64_t>() > kMaxDim) {
        return c.Error(tp + ".shape",
                       "entry " + std::to_string(d) + " is not an unsigned integer <= 2^62");
      }
      count *= dj.get<uint64_t>();
      if (count > (static_cast<unsigned __int128>(1) << 58)) {
        return c.Error(tp + ".shape", "too many elements");
      }
      t.shape.push_back(static_cast<int64_t>(dj.get<uint64_t>()));
    }
    STOKER_RETURN_IF_ERROR(c.GetUnsigned(tj, "offset", tp + ".offset", UINT64_MAX, &t.offset));
    STOKER_RETURN_IF_ERROR(c.GetUnsigned(tj, "bytes", tp + ".bytes", UINT64_MAX, &t.bytes));
    const uint64_t want = static_cast<uint64_t>(count) * DTypeSize(t.dtype);
    if (t.bytes != want) {
      return c.Error(tp + ".bytes", std::to_string(t.bytes) + ", but shape and dtype make " +
                                        std::to_string(want));
    }
    if (tj.contains("layout")) {
      if (version < 2) return c.Error(tp + ".layout", "a layout needs checkpoint format 2");
      STOKER_RETURN_IF_ERROR(DecodeLayout(tj["layout"], tp + ".layout", c, &t));
    }
    if (t.offset != next) {
      return c.Error(tp + ".offset", std::to_string(t.offset) + ", expected " +
                                         std::to_string(next) + " (tensors lie back to back)");
    }
    next += t.bytes;
    if (next > stream) {
      return c.Error(tp + ".bytes", "the tensor ends at byte " + std::to_string(next) +
                                        " of the stream, past its chunks' " +
                                        std::to_string(stream) + " bytes");
    }
    r->tensors.push_back(std::move(t));
  }
  if (next != stream) {
    return c.Error(p + "chunks", "the chunks hold " + std::to_string(stream) +
                                     " bytes, the tensors " + std::to_string(next));
  }
  return Status::Ok();
}

// The fields part records and manifests share.
Status DecodeCommon(const json& root, uint32_t header_version, std::string_view name,
                    const Checker& c, std::string* attempt, uint32_t* world_size) {
  STOKER_RETURN_IF_ERROR(c.CheckFormatVersion(root, header_version));
  uint64_t u;
  const std::string* s;
  STOKER_RETURN_IF_ERROR(c.GetString(root, "name", "name", &s));
  if (*s != name)
    return c.Error("name", "'" + *s + "', but it lies under '" + std::string(name) + "'");
  STOKER_RETURN_IF_ERROR(c.GetUnsigned(root, "world_size", "world_size", kMaxCheckpointRanks, &u));
  if (u == 0) return c.Error("world_size", "0");
  *world_size = static_cast<uint32_t>(u);
  STOKER_RETURN_IF_ERROR(c.GetString(root, "attempt", "attempt", &s));
  *attempt = *s;
  return Status::Ok();
}

}  // namespace

std::string ManifestKey(std::string_view name) {
  return std::string(name) + std::string(kManifestSuffix);
}

std::string PartKey(std::string_view name, uint32_t rank) {
  return std::string(name) + "/rank-" + Padded(rank, 5) + ".part";
}

std::string ChunkKey(std::string_view name, uint32_t rank, uint64_t chunk) {
  return std::string(name) + "/rank-" + Padded(rank, 5) + "/" + Padded(chunk, 6) + ".chunk";
}

std::string TensorNameProblem(std::string_view name) {
  if (name.empty()) return "empty tensor name";
  if (name.size() > kMaxTensorNameBytes) {
    return "tensor name longer than " + std::to_string(kMaxTensorNameBytes) + " bytes";
  }
  for (char c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return "tensor name '" + std::string(name) + "' has a control character";
    }
  }
  // Names are never object keys; still, refuse what reads as a path out of
  // its place, so no tool that maps names to files can be led out.
  if (name.front() == '/') return "tensor name '" + std::string(name) + "' starts with '/'";
  for (std::string_view part : internal::SplitPath(name)) {
    if (part == "..") return "tensor name '" + std::string(name) + "' has a '..' path component";
  }
  return {};
}

uint32_t VersionFor(std::span<const RankPart> parts, uint32_t wanted) {
  for (const RankPart& r : parts) {
    for (const TensorInfo& t : r.tensors) {
      if (t.layout.kind != TensorLayout::Kind::kWhole) return 2;
    }
    for (const ChunkInfo& c : r.chunks) {
      if (!c.block_hashes.empty()) return 2;
    }
  }
  return wanted;
}

std::string EncodePart(const PartRecord& p) {
  const uint32_t version = VersionFor({&p.part, 1}, p.format_version);
  ojson j;
  j["format_version"] = version;
  j["name"] = p.name;
  j["world_size"] = p.world_size;
  j["attempt"] = p.attempt;
  ojson r = RankBody(p.part);
  for (auto it = r.begin(); it != r.end(); ++it) j[it.key()] = it.value();
  return EncodeFramed(kPartFrame, version, Dump(j));
}

Result<PartRecord> DecodePart(std::span<const std::byte> data, std::string_view where,
                              std::string_view name) {
  uint32_t version;
  json root;
  STOKER_RETURN_IF_ERROR(DecodeFramed(data, where, kPartFrame, &version, &root));
  Checker c(where);
  PartRecord p;
  p.name = std::string(name);
  STOKER_RETURN_IF_ERROR(DecodeCommon(root, version, name, c, &p.attempt, &p.world_size));
  p.format_version = version;
  STOKER_RETURN_IF_ERROR(DecodeRank(root, "", name, c, version, &p.part));
  if (p.part.rank >= p.world_size) {
    return c.Error("rank", std::to_string(p.part.rank) + " is not below world_size " +
                               std::to_string(p.world_size));
  }
  return p;
}

namespace {

// The manifest's `metadata` (docs/checkpoint.md §2.1): {"step": N or null,
// "user": the caller's object}, in that order (the bytes stoker.save wrote
// before the envelope moved into C++).
ojson MetadataEnvelope(const CheckpointManifest& m) {
  ojson envelope = ojson::object();
  envelope["step"] = m.step ? ojson(*m.step) : ojson(nullptr);
  envelope["user"] = ojson::parse(m.metadata_json, nullptr, /*allow_exceptions=*/false);
  return envelope;
}

// Its inverse. An object that is not an envelope (written by the C++ API
// before it had one) is the user's metadata as a whole, and its step that
// object's "step" where that is an unsigned integer (as stoker's Python
// package read such manifests).
void ReadMetadataEnvelope(const ojson& metadata, CheckpointManifest* m) {
  m->step.reset();
  if (!metadata.is_object()) {
    m->metadata_json = Dump(metadata);
    return;
  }
  bool envelope = metadata.contains("user") && metadata.at("user").is_object();
  for (const auto& [key, value] : metadata.items()) {
    if (key == "step") {
      envelope = envelope && (value.is_null() || value.is_number_unsigned());
    } else if (key != "user") {
      envelope = false;
    }
  }
  m->metadata_json = Dump(envelope ? metadata.at("user") : metadata);
  if (metadata.contains("step") && metadata.at("step").is_number_unsigned()) {
    m->step = metadata.at("step").get<uint64_t>();
  }
}

}  // namespace

std::string EncodeCheckpointManifest(const CheckpointManifest& m) {
  const uint32_t version =
      VersionFor(m.ranks, m.format_version == 0 ? kCheckpointFormatVersion : m.format_version);
  ojson j;
  j["format_version"] = version;
  j["name"] = m.name;
  j["sequence"] = m.sequence;
  j["created_by"] = m.created_by;
  j["created_unix_ms"] = m.created_unix_ms;
  j["world_size"] = m.world_size;
  j["attempt"] = m.attempt;
  j["metadata"] = MetadataEnvelope(m);
  auto& ranks = j["ranks"] = ojson::array();
  for (const RankPart& r : m.ranks) ranks.push_back(RankBody(r));
  return EncodeFramed(kManifestFrame, version, Dump(j));
}

Result<CheckpointManifest> DecodeCheckpointManifest(std::span<const std::byte> data,
                                                    std::string_view where, std::string_view name) {
  uint32_t version;
  json root;
  STOKER_RETURN_IF_ERROR(DecodeFramed(data, where, kManifestFrame, &version, &root));
  Checker c(where);
  CheckpointManifest m;
  m.format_version = version;
  m.name = std::string(name);
  STOKER_RETURN_IF_ERROR(DecodeCommon(root, version, name, c, &m.attempt, &m.world_size));
  STOKER_RETURN_IF_ERROR(c.GetUnsigned(root, "sequence", "sequence", UINT64_MAX, &m.sequence));
  const std::string* s;
  STOKER_RETURN_IF_ERROR(c.GetString(root, "created_by", "created_by", &s));
  m.created_by = *s;
  const json* v;
  STOKER_RETURN_IF_ERROR(c.Get(root, "created_unix_ms", "created_unix_ms", &v));
  if (!v->is_number_integer()) return c.TypeError("created_unix_ms", "an integer", *v);
  m.created_unix_ms = v->get<int64_t>();
  STOKER_RETURN_IF_ERROR(c.Get(root, "metadata", "metadata", &v));
  if (!v->is_object()) return c.TypeError("metadata", "an object", *v);
  {
    // Parsed again keeping key order (json sorts keys; callers may rely on
    // the order they wrote, e.g. a state dict's).
    std::string_view text(reinterpret_cast<const char*>(data.data()), data.size());
    ojson o = ojson::parse(text.substr(text.find('\n') + 1), nullptr, /*allow_exceptions=*/false);
    ReadMetadataEnvelope(o.is_object() && o.contains("metadata")
                             ? o["metadata"]
                             : ojson::parse(v->dump(-1, ' ', false, json::error_handler_t::replace),
                                            nullptr, /*allow_exceptions=*/false),
                         &m);
  }
  const json* ranks;
  STOKER_RETURN_IF_ERROR(c.GetArray(root, "ranks", "ranks", &ranks));
  if (ranks->size() != m.world_size) {
    return c.Error("ranks", std::to_string(ranks->size()) + " entries, world_size is " +
                                std::to_string(m.world_size));
  }
  for (size_t i = 0; i < ranks->size(); ++i) {
    RankPart r;
    STOKER_RETURN_IF_ERROR(DecodeRank((*ranks)[i], Indexed("ranks", i), name, c, version, &r));
    if (r.rank != i) {
      return c.Error(Indexed("ranks", i) + ".rank",
                     std::to_string(r.rank) + ", expected " + std::to_string(i));
    }
    m.ranks.push_back(std::move(r));
  }
  return m;
}

}  // namespace ckpt
}  // namespace stoker
