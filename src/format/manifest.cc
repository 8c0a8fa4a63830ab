// The manifest: encoding and validation. docs/format.md §2, §5.2.
#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <nlohmann/json.hpp>
#include <random>
#include <unordered_set>

#include "core/file_util.h"
#include "format/coding.h"
#include "format/framed_json.h"
#include "stoker/format.h"

namespace stoker::format {

using internal::Hex16;
using internal::HexBytes;
using internal::LoadLE;
using namespace internal;  // framed JSON helpers

namespace {

using json = nlohmann::json;

constexpr FramedFormat kFramed{.magic = "STOKER-DATASET ",
                               .what = "stoker manifest",
                               .version_name = "format",
                               .max_version = kFormatVersion,
                               .max_depth = kMaxJsonDepth};

// ---- small parsers ----------------------------------------------------------

bool ParseIdHex(std::string_view s, DatasetId* out) {
  if (s.size() != 2 * out->size()) return false;
  for (size_t i = 0; i < out->size(); ++i) {
    int hi = HexValue(s[2 * i]);
    int lo = HexValue(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

// Empty when `key` is a valid shard key (§2.4), else what is wrong with it.
std::string KeyProblem(std::string_view key) {
  if (key.empty()) return "empty key";
  if (key.size() > kMaxKeyBytes) return "longer than " + std::to_string(kMaxKeyBytes) + " bytes";
  for (char c : key) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == '/';
    if (!ok) return "character not in [A-Za-z0-9._/-]";
  }
  if (key.front() == '/') return "leading '/'";
  if (key.back() == '/') return "trailing '/'";
  for (std::string_view part : stoker::internal::SplitPath(key)) {
    if (part.empty()) return "empty path component";
    if (part == "." || part == "..") return "'" + std::string(part) + "' path component";
  }
  if (key == kManifestKey) return "names the manifest";
  return {};
}

// §2.2: bytes and int64 in every version, the typed fields from format 3.
bool ParseFieldType(std::string_view s, uint32_t version, FieldType* t) {
  constexpr FieldType kAll[] = {FieldType::kBytes,  FieldType::kInt64, FieldType::kFloat32,
                                FieldType::kFloat64, FieldType::kString, FieldType::kJson,
                                FieldType::kArray};
  for (FieldType k : kAll) {
    if (FieldTypeName(k) != s) continue;
    if (version < 3 && k != FieldType::kBytes && k != FieldType::kInt64) return false;
    *t = k;
    return true;
  }
  return false;
}

// §2.2: an array field's `dtype` and `shape` (format 3).
Status DecodeArray(const json& f, const Checker& c, const std::string& path, FieldSpec* spec) {
  const std::string* s;
  STOKER_RETURN_IF_ERROR(c.GetString(f, "dtype", path + ".dtype", &s));
  if (!ParseDType(*s, &spec->dtype)) return c.Error(path + ".dtype", "unknown dtype '" + *s + "'");
  const json* shape;
  STOKER_RETURN_IF_ERROR(c.GetArray(f, "shape", path + ".shape", &shape));
  if (shape->size() > kMaxArrayDims) {
    return c.Error(path + ".shape", std::to_string(shape->size()) + " dimensions, at most " +
                                        std::to_string(kMaxArrayDims));
  }
  for (size_t d = 0; d < shape->size(); ++d) {
    const json& v = (*shape)[d];
    if (v.is_null()) {
      spec->shape.push_back(kVariableDim);
    } else if (v.is_number_unsigned() && v.get<uint64_t>() >= 1 &&
               v.get<uint64_t>() <= kMaxShardBytes) {
      spec->shape.push_back(static_cast<int64_t>(v.get<uint64_t>()));
    } else {
      return c.Error(path + ".shape[" + std::to_string(d) + "]",
                     "expected null or an integer 1.." + std::to_string(kMaxShardBytes));
    }
  }
  if (Status st = CheckSchema(std::span(spec, 1)); !st.ok()) {
    return c.Error(path + ".shape", st.message());
  }
  return Status::Ok();
}

// §2.2: fields[j] beyond its name.
Status DecodeFieldType(const json& f, const Checker& c, const std::string& path, uint32_t version,
                       FieldSpec* spec) {
  const std::string* s;
  STOKER_RETURN_IF_ERROR(c.GetString(f, "type", path + ".type", &s));
  if (!ParseFieldType(*s, version, &spec->type)) {
    return c.Error(path + ".type", "unknown field type '" + *s + "'");
  }
  const bool array = spec->type == FieldType::kArray;
  if (array) STOKER_RETURN_IF_ERROR(DecodeArray(f, c, path, spec));
  if (!array && (f.contains("dtype") || f.contains("shape"))) {
    return c.Error(path, "a " + *s + " field has no dtype or shape");
  }
  if (version >= 3 && f.contains("ext")) {
    STOKER_RETURN_IF_ERROR(c.GetString(f, "ext", path + ".ext", &s));
    spec->ext = *s;
    if (Status st = CheckSchema(std::span(spec, 1)); !st.ok()) {
      return c.Error(path + ".ext", st.message());
    }
  }
  // §3.5: a token field's block sums; checked against the other fields once
  // all are read (DecodeBody).
  if (version >= 3 && f.contains("block_sums_of")) {
    STOKER_RETURN_IF_ERROR(c.GetString(f, "block_sums_of", path + ".block_sums_of", &s));
    spec->block_sums_of = *s;
    uint64_t b;
    STOKER_RETURN_IF_ERROR(
        c.GetUnsigned(f, "block_bytes", path + ".block_bytes", kMaxTokenBlockBytes, &b));
    spec->block_bytes = static_cast<uint32_t>(b);
  } else if (version >= 3 && f.contains("block_bytes")) {
    return c.Error(path + ".block_bytes", "block_bytes without block_sums_of");
  }
  return Status::Ok();
}

// §2.5: a v1 manifest's `shards` array, checked as §2.4 says, into m->shards.
Status DecodeShardsV1(const json& root, const Checker& c, uint64_t entry_bytes, Manifest* m) {
  const json* arr;
  const std::string* s;
  uint64_t u;
  STOKER_RETURN_IF_ERROR(c.GetArray(root, "shards", "shards", &arr));
  if (arr->size() > UINT32_MAX) return c.Error("shards", "more than 2^32-1 shards");
  m->shards.reserve(arr->size());
  std::unordered_set<std::string> keys;
  keys.reserve(arr->size());
  uint64_t next_sample = 0;  // running sum of samples
  uint64_t record_area = 0;  // Σ(bytes - 64 - samples * entry_bytes)
  for (size_t i = 0; i < arr->size(); ++i) {
    const json& sj = (*arr)[i];
    std::string path = Indexed("shards", i);
    if (!sj.is_object()) return c.TypeError(path, "an object", sj);
    ShardInfo info;

    STOKER_RETURN_IF_ERROR(c.GetString(sj, "key", path + ".key", &s));
    if (std::string problem = KeyProblem(*s); !problem.empty()) {
      return c.Error(path + ".key", "bad key '" + *s + "': " + problem);
    }
    info.key = *s;

    STOKER_RETURN_IF_ERROR(c.GetUnsigned(sj, "bytes", path + ".bytes", UINT64_MAX, &info.bytes));
    if (info.bytes % kShardAlignment != 0) {
      return c.Error(path + ".bytes", std::to_string(info.bytes) + " is not a multiple of " +
                                          std::to_string(kShardAlignment));
    }
    if (info.bytes < kShardAlignment || info.bytes > kMaxShardBytes) {
      return c.Error(path + ".bytes", std::to_string(info.bytes) + " is outside " +
                                          std::to_string(kShardAlignment) + ".." +
                                          std::to_string(kMaxShardBytes));
    }

    STOKER_RETURN_IF_ERROR(c.GetUnsigned(sj, "samples", path + ".samples", UINT32_MAX, &u));
    info.samples = static_cast<uint32_t>(u);
    const uint64_t max_samples = (info.bytes - kShardHeaderBytes) / entry_bytes;
    if (u < 1 || u > max_samples) {
      return c.Error(path + ".samples", std::to_string(u) + " is outside 1.." +
                                            std::to_string(max_samples) + " for a shard of " +
                                            std::to_string(info.bytes) + " bytes");
    }

    STOKER_RETURN_IF_ERROR(
        c.GetUnsigned(sj, "first_sample", path + ".first_sample", UINT64_MAX, &info.first_sample));
    if (info.first_sample != next_sample) {
      return c.Error(path + ".first_sample", std::to_string(info.first_sample) + ", expected " +
                                                 std::to_string(next_sample) +
                                                 " (the sum of the samples before it)");
    }

    STOKER_RETURN_IF_ERROR(c.GetString(sj, "index_hash", path + ".index_hash", &s));
    if (!ParseHex16(*s, &info.index_hash)) {
      return c.Error(path + ".index_hash", "'" + *s + "' is not 16 lowercase hex digits");
    }

    // Cannot overflow in practice (each term < 2^32, fewer than 2^32 shards),
    // but the input is untrusted.
    if (__builtin_add_overflow(next_sample, info.samples, &next_sample) ||
        __builtin_add_overflow(record_area,
                               info.bytes - kShardHeaderBytes - info.samples * entry_bytes,
                               &record_area)) {
      return c.Error(path, "totals overflow");
    }
    if (!keys.insert(info.key).second) {
      return c.Error(path + ".key", "duplicate key '" + info.key + "'");
    }
    m->shards.push_back(info);
  }

  if (m->sample_count != next_sample) {
    return c.Error("sample_count", std::to_string(m->sample_count) + ", but the shards hold " +
                                       std::to_string(next_sample));
  }
  if (m->payload_bytes > record_area) {
    return c.Error("payload_bytes", std::to_string(m->payload_bytes) +
                                        " does not fit in the shards' record areas (" +
                                        std::to_string(record_area) + " bytes)");
  }
  return Status::Ok();
}

// §2.2: a v2 manifest's `shard_table`, into m->table.
Status DecodeTableRef(const json& root, const Checker& c, Manifest* m) {
  const json* t;
  STOKER_RETURN_IF_ERROR(c.Get(root, "shard_table", "shard_table", &t));
  if (!t->is_object()) return c.TypeError("shard_table", "an object", *t);
  const std::string* s;
  STOKER_RETURN_IF_ERROR(c.GetString(*t, "key", "shard_table.key", &s));
  if (std::string problem = KeyProblem(*s); !problem.empty()) {
    return c.Error("shard_table.key", "bad key '" + *s + "': " + problem);
  }
  m->table.key = *s;
  STOKER_RETURN_IF_ERROR(
      c.GetUnsigned(*t, "records", "shard_table.records", UINT32_MAX, &m->table.records));
  STOKER_RETURN_IF_ERROR(
      c.GetUnsigned(*t, "bytes", "shard_table.bytes", UINT64_MAX, &m->table.bytes));
  // Each record takes 24 bytes and its block checksum at least 8/2^20: the
  // header and the records are a lower bound (§7.1).
  const uint64_t least = kShardTableHeaderBytes + m->table.records * kShardTableRecordBytes;
  if (m->table.bytes < least) {
    return c.Error("shard_table.bytes", std::to_string(m->table.bytes) + " is less than " +
                                            std::to_string(least) + " for " +
                                            std::to_string(m->table.records) + " records");
  }
  STOKER_RETURN_IF_ERROR(c.GetString(*t, "header_hash", "shard_table.header_hash", &s));
  if (!ParseHex16(*s, &m->table.header_hash)) {
    return c.Error("shard_table.header_hash", "'" + *s + "' is not 16 lowercase hex digits");
  }
  return Status::Ok();
}

// §2.6: a dataset of parts (format 3, optional "parts"). Part j's prefix is
// a valid key, the prefixes ascend (so that a key finds its part), each part
// has >= 1 shard and together they have the table's records.
Status DecodeParts(const json& root, const Checker& c, uint32_t version, Manifest* m) {
  if (version < 3 || !root.contains("parts")) return Status::Ok();
  const json* arr;
  STOKER_RETURN_IF_ERROR(c.GetArray(root, "parts", "parts", &arr));
  std::vector<PartRef> parts;
  uint64_t total = 0;
  for (size_t j = 0; j < arr->size(); ++j) {
    const json& pj = (*arr)[j];
    const std::string path = Indexed("parts", j);
    if (!pj.is_object()) return c.TypeError(path, "an object", pj);
    PartRef p;
    const std::string* s;
    STOKER_RETURN_IF_ERROR(c.GetString(pj, "prefix", path + ".prefix", &s));
    if (std::string problem = KeyProblem(*s); !problem.empty()) {
      return c.Error(path + ".prefix", "bad prefix '" + *s + "': " + problem);
    }
    if (!parts.empty() && *s <= parts.back().prefix) {
      return c.Error(path + ".prefix", "'" + *s + "' does not come after '" +
                                           parts.back().prefix + "'");
    }
    p.prefix = *s;
    STOKER_RETURN_IF_ERROR(c.GetString(pj, "dataset_id", path + ".dataset_id", &s));
    if (!ParseIdHex(*s, &p.dataset_id)) {
      return c.Error(path + ".dataset_id", "'" + *s + "' is not 32 lowercase hex digits");
    }
    uint64_t n;
    STOKER_RETURN_IF_ERROR(c.GetUnsigned(pj, "shards", path + ".shards", UINT32_MAX, &n));
    if (n == 0) return c.Error(path + ".shards", "a part has at least one shard");
    p.shards = static_cast<uint32_t>(n);
    total += n;
    parts.push_back(std::move(p));
  }
  if (total != m->table.records) {
    return c.Error("parts", "the parts hold " + std::to_string(total) +
                                " shards, shard_table.records is " +
                                std::to_string(m->table.records));
  }
  m->shards.SetParts(std::move(parts));
  return Status::Ok();
}

// §2.4, "consistency of the totals": what needs no shard list (the rest is
// checked against the shards: DecodeShardsV1, ShardTableReader::Finish).
Status CheckTotals(const Checker& c, uint64_t min_record, const Manifest& m) {
  uint64_t least_payload;
  if (__builtin_mul_overflow(m.sample_count, min_record, &least_payload) ||
      m.payload_bytes < least_payload) {
    return c.Error("payload_bytes", std::to_string(m.payload_bytes) + " is less than " +
                                        std::to_string(min_record) + " bytes per sample");
  }
  if (m.max_sample_bytes > m.payload_bytes) {
    return c.Error("max_sample_bytes", std::to_string(m.max_sample_bytes) +
                                           " is larger than payload_bytes " +
                                           std::to_string(m.payload_bytes));
  }
  uint64_t most_payload;
  if (!__builtin_mul_overflow(m.sample_count, m.max_sample_bytes, &most_payload) &&
      m.payload_bytes > most_payload) {
    return c.Error("max_sample_bytes",
                   std::to_string(m.max_sample_bytes) + " times " + std::to_string(m.sample_count) +
                       " samples is less than payload_bytes " + std::to_string(m.payload_bytes));
  }
  if (m.sample_count > 0 && m.max_sample_bytes < min_record) {
    return c.Error("max_sample_bytes", std::to_string(m.max_sample_bytes) +
                                           " is less than the smallest record (" +
                                           std::to_string(min_record) + " bytes)");
  }
  return Status::Ok();
}

Status DecodeBody(const json& root, uint32_t header_version, std::string_view where, Manifest* m) {
  Checker c(where);
  STOKER_RETURN_IF_ERROR(c.CheckFormatVersion(root, header_version));
  m->format_version = header_version;

  const std::string* s;
  STOKER_RETURN_IF_ERROR(c.GetString(root, "dataset_id", "dataset_id", &s));
  if (!ParseIdHex(*s, &m->dataset_id)) {
    return c.Error("dataset_id", "'" + *s + "' is not 32 lowercase hex digits");
  }

  STOKER_RETURN_IF_ERROR(c.GetString(root, "created_by", "created_by", &s));
  m->created_by = *s;

  // fields
  const json* arr;
  STOKER_RETURN_IF_ERROR(c.GetArray(root, "fields", "fields", &arr));
  if (arr->empty() || arr->size() > kMaxFields) {
    return c.Error("fields", std::to_string(arr->size()) + " fields, expected 1.." +
                                 std::to_string(kMaxFields));
  }
  uint64_t min_record = 0;  // the fixed-length fields' bytes
  for (size_t j = 0; j < arr->size(); ++j) {
    const json& f = (*arr)[j];
    std::string path = Indexed("fields", j);
    if (!f.is_object()) return c.TypeError(path, "an object", f);
    FieldSpec spec;
    STOKER_RETURN_IF_ERROR(c.GetString(f, "name", path + ".name", &s));
    if (!ValidFieldName(*s)) {
      return c.Error(path + ".name", "'" + *s + "' is not [A-Za-z0-9_]{1,64}");
    }
    spec.name = *s;
    for (size_t k = 0; k < j; ++k) {
      if (m->fields[k].name == spec.name) {
        return c.Error(path + ".name", "duplicate field name '" + spec.name + "'");
      }
    }
    STOKER_RETURN_IF_ERROR(DecodeFieldType(f, c, path, header_version, &spec));
    min_record += spec.FixedBytes();
    m->fields.push_back(std::move(spec));
  }
  for (size_t j = 0; j < m->fields.size(); ++j) {
    if (std::string why = BlockSumsProblem(m->fields, j); !why.empty()) {
      const char* key = why.starts_with("block_bytes") ? ".block_bytes"
                        : why.starts_with("a block-sums") ? ".type"
                                                           : ".block_sums_of";
      return c.Error(Indexed("fields", j) + key, why);
    }
  }
  const uint64_t entry_bytes = IndexEntryBytes(static_cast<uint32_t>(m->fields.size()));

  // classes
  STOKER_RETURN_IF_ERROR(c.GetArray(root, "classes", "classes", &arr));
  m->classes.reserve(arr->size());
  for (size_t j = 0; j < arr->size(); ++j) {
    const json& v = (*arr)[j];
    if (!v.is_string()) return c.TypeError(Indexed("classes", j), "a string", v);
    m->classes.push_back(v.get<std::string>());
  }

  STOKER_RETURN_IF_ERROR(
      c.GetUnsigned(root, "sample_count", "sample_count", UINT64_MAX, &m->sample_count));
  STOKER_RETURN_IF_ERROR(
      c.GetUnsigned(root, "payload_bytes", "payload_bytes", UINT64_MAX, &m->payload_bytes));
  STOKER_RETURN_IF_ERROR(c.GetUnsigned(root, "max_sample_bytes", "max_sample_bytes", UINT64_MAX,
                                       &m->max_sample_bytes));

  if (header_version == 1) {
    STOKER_RETURN_IF_ERROR(DecodeShardsV1(root, c, entry_bytes, m));
  } else {
    STOKER_RETURN_IF_ERROR(DecodeTableRef(root, c, m));
    STOKER_RETURN_IF_ERROR(DecodeParts(root, c, header_version, m));
  }
  return CheckTotals(c, min_record, *m);
}

Result<Manifest> DecodeManifestImpl(std::span<const std::byte> data, std::string_view where) {
  uint32_t version;
  json root;
  STOKER_RETURN_IF_ERROR(DecodeFramed(data, where, kFramed, &version, &root));
  Manifest m;
  STOKER_RETURN_IF_ERROR(DecodeBody(root, version, where, &m));
  return m;
}
}  // namespace

// ---- public -----------------------------------------------------------------

std::string Manifest::IdHex() const { return HexBytes(dataset_id.data(), dataset_id.size()); }

uint64_t Manifest::Id64() const {
  // §5.2: the first 8 bytes, little-endian.
  return LoadLE<uint64_t>(reinterpret_cast<const std::byte*>(dataset_id.data()));
}

int Manifest::FieldIndex(std::string_view name) const {
  for (size_t i = 0; i < fields.size(); ++i) {
    if (fields[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

namespace {

// The body's keys before the shards, common to v1 and v2 (§2.2).
nlohmann::ordered_json BodyHead(const Manifest& m, uint32_t version) {
  nlohmann::ordered_json j;
  j["format_version"] = version;
  j["dataset_id"] = m.IdHex();
  j["created_by"] = m.created_by;
  auto& fields = j["fields"] = nlohmann::ordered_json::array();
  for (const FieldSpec& f : m.fields) {
    nlohmann::ordered_json fj = {{"name", f.name}, {"type", FieldTypeName(f.type)}};
    if (f.type == FieldType::kArray) {
      fj["dtype"] = DTypeName(f.dtype);
      auto& shape = fj["shape"] = nlohmann::ordered_json::array();
      for (int64_t d : f.shape) {
        if (d == kVariableDim) {
          shape.push_back(nullptr);
        } else {
          shape.push_back(d);
        }
      }
    }
    if (!f.ext.empty()) fj["ext"] = f.ext;
    if (!f.block_sums_of.empty()) {
      fj["block_sums_of"] = f.block_sums_of;
      fj["block_bytes"] = f.block_bytes;
    }
    fields.push_back(std::move(fj));
  }
  j["classes"] = m.classes;
  j["sample_count"] = m.sample_count;
  j["payload_bytes"] = m.payload_bytes;
  j["max_sample_bytes"] = m.max_sample_bytes;
  return j;
}

std::string Frame(const nlohmann::ordered_json& j, uint32_t version) {
  // error_handler_t::replace: invalid UTF-8 in a string becomes U+FFFD
  // instead of an exception (§2.2).
  std::string body = j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return EncodeFramed(kFramed, version, body);
}

}  // namespace

std::string EncodeManifest(const Manifest& m) {
  const auto& parts = m.shards.parts();
  const uint32_t version = parts.empty() ? FormatVersionFor(m.fields) : 3;
  nlohmann::ordered_json j = BodyHead(m, version);
  j["shard_table"] = {{"key", m.table.key},
                      {"records", m.table.records},
                      {"bytes", m.table.bytes},
                      {"header_hash", Hex16(m.table.header_hash)}};
  if (!parts.empty()) {
    auto& pj = j["parts"] = nlohmann::ordered_json::array();
    for (const PartRef& p : parts) {
      pj.push_back({{"prefix", p.prefix},
                    {"dataset_id", HexBytes(p.dataset_id.data(), p.dataset_id.size())},
                    {"shards", p.shards}});
    }
  }
  return Frame(j, version);
}

std::string EncodeManifestV1(const Manifest& m) {
  nlohmann::ordered_json j = BodyHead(m, 1);
  auto& shards = j["shards"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < m.shards.size(); ++i) {
    shards.push_back({{"key", m.shards.key(i)},
                      {"bytes", m.shards.bytes(i)},
                      {"samples", m.shards.samples(i)},
                      {"first_sample", m.shards.first_sample(i)},
                      {"index_hash", Hex16(m.shards.index_hash(i))}});
  }
  return Frame(j, 1);
}

Result<Manifest> DecodeManifest(std::span<const std::byte> data, std::string_view where) {
  // No exception may escape (STYLE.md rule 4); the parser is exception-free
  // by construction, this is the belt to its braces (bad_alloc included).
  try {
    return DecodeManifestImpl(data, where);
  } catch (const std::bad_alloc&) {
    return Internal(std::string(where) + ": out of memory decoding the manifest");
  } catch (const std::exception& e) {
    return Corruption(std::string(where) + ": " + e.what());
  } catch (...) {
    return Corruption(std::string(where) + ": unknown error decoding the manifest");
  }
}

DatasetId NewDatasetId() {
  DatasetId id{};
  size_t got = 0;
  while (got < id.size()) {
    ssize_t n = getrandom(id.data() + got, id.size() - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      break;  // ENOSYS on an ancient kernel: fall back below
    }
  }
  if (got < id.size()) {
    std::random_device rd;
    for (size_t i = got; i < id.size(); ++i) id[i] = static_cast<uint8_t>(rd());
  }
  return id;
}

namespace {
// What every shard of `m` must agree with, as shard `shard_number`.
ShardExpectation DatasetExpectation(const Manifest& m, uint32_t shard_number) {
  ShardExpectation e;
  e.shard_number = shard_number;
  e.dataset_id = m.dataset_id;
  // A part's shards carry its own id and numbers (§2.6).
  uint32_t local;
  if (const int32_t p = m.shards.PartOf(shard_number, &local); p >= 0) {
    e.shard_number = local;
    e.dataset_id = m.shards.parts()[p].dataset_id;
  }
  e.field_count = static_cast<uint32_t>(m.fields.size());
  e.fields = m.fields;
  return e;
}
}  // namespace

ShardExpectation ExpectationFor(const Manifest& m, uint32_t shard_number, const ShardInfo& shard) {
  ShardExpectation e = DatasetExpectation(m, shard_number);
  e.key = shard.key;
  e.samples = shard.samples;
  e.bytes = shard.bytes;
  e.index_hash = shard.index_hash;
  e.first_sample = shard.first_sample;
  return e;
}

ShardExpectation ExpectationFor(const Manifest& m, uint32_t shard_number) {
  if (shard_number >= m.shards.size()) return DatasetExpectation(m, shard_number);
  return ExpectationFor(m, shard_number, m.shards[shard_number]);
}

}  // namespace stoker::format
