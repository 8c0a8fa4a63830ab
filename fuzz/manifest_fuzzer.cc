// Fuzzes DecodeManifest (docs/format.md §2.4) with arbitrary bytes.
//
// Each input is tried three ways: as a whole manifest; as a body behind a
// valid header line (so that mutations reach the JSON and schema checks
// instead of dying on the checksum); and, when it has a first line, with that
// line replaced by a valid one. Properties checked beyond "no crash, no leak,
// no UB": errors are Corruption/Unsupported naming the manifest, and an
// accepted manifest re-encodes (in its own format version) to one that
// decodes to the same value and re-encodes byte for byte the same.
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "stoker/format.h"

namespace stoker::fuzz {
namespace {

constexpr std::string_view kWhere = "fuzz://manifest";

bool Same(const format::Manifest& a, const format::Manifest& b) {
  if (a.format_version != b.format_version || a.dataset_id != b.dataset_id ||
      a.created_by != b.created_by || a.classes != b.classes || a.sample_count != b.sample_count ||
      a.payload_bytes != b.payload_bytes || a.max_sample_bytes != b.max_sample_bytes ||
      a.fields.size() != b.fields.size() || a.shards.size() != b.shards.size() ||
      a.table.key != b.table.key || a.table.records != b.table.records ||
      a.table.bytes != b.table.bytes || a.table.header_hash != b.table.header_hash) {
    return false;
  }
  for (size_t i = 0; i < a.fields.size(); ++i) {
    if (a.fields[i].name != b.fields[i].name || a.fields[i].type != b.fields[i].type) return false;
  }
  for (size_t i = 0; i < a.shards.size(); ++i) {
    const auto &x = a.shards[i], &y = b.shards[i];
    if (x.key != y.key || x.bytes != y.bytes || x.samples != y.samples ||
        x.first_sample != y.first_sample || x.index_hash != y.index_hash) {
      return false;
    }
  }
  return true;
}

void Exercise(std::string_view text) {
  auto m = format::DecodeManifest(AsSpan(text), kWhere);
  if (!m.ok()) {
    CheckParseError(m.status(), kWhere);
    return;
  }
  // A v1 manifest lists its shards; a v2 one names its table.
  auto encode = [](const format::Manifest& x) {
    return x.table.key.empty() ? format::EncodeManifestV1(x) : format::EncodeManifest(x);
  };
  const std::string again = encode(*m);
  auto m2 = format::DecodeManifest(AsSpan(again), kWhere);
  if (!m2.ok()) Violated("re-encoded manifest does not decode", m2.status().ToString());
  if (!Same(*m, *m2)) Violated("re-encoded manifest decodes differently", again);
  if (encode(*m2) != again) Violated("encoding is not stable", again);

  // Helpers on a validated manifest.
  (void)m->IdHex();
  (void)m->Id64();
  for (const auto& f : m->fields) {
    if (m->FieldIndex(f.name) < 0) Violated("FieldIndex", f.name);
  }
  for (uint64_t s : {uint64_t{0}, m->sample_count / 2, m->sample_count ? m->sample_count - 1 : 0,
                     m->sample_count}) {
    int64_t i = m->ShardOf(s);
    if (s >= m->sample_count) {
      if (i != -1) Violated("ShardOf past the end", std::to_string(s));
      continue;
    }
    if (i < 0) Violated("ShardOf in range", std::to_string(s));
    const auto& info = m->shards[static_cast<size_t>(i)];
    if (s < info.first_sample || s - info.first_sample >= info.samples) {
      Violated("ShardOf wrong shard", std::to_string(s));
    }
  }
  for (uint32_t i = 0; i < m->shards.size() && i < 16; ++i) {
    auto e = format::ExpectationFor(*m, i);
    if (e.key != m->shards[i].key || e.field_count != m->fields.size()) {
      Violated("ExpectationFor", std::to_string(i));
    }
  }
}

}  // namespace
}  // namespace stoker::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stoker::fuzz;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  Exercise(in);
  Exercise(SealManifest(in));
  if (size_t nl = in.find('\n'); nl != std::string_view::npos && nl < 128) {
    Exercise(SealManifest(in.substr(nl + 1)));
  }
  return 0;
}
