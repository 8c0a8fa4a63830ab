// Fuzzes ShardView::ParseStandalone (docs/format.md §3.4) with arbitrary
// bytes, then every accessor and VerifySample over all samples.
//
// Each input is tried as is, and padded to a multiple of 4096 with its
// checksums fixed (so that mutations reach the index checks and the
// accessors instead of dying on the header hash). Properties checked beyond
// "no crash, no out-of-bounds read, no UB": errors are Corruption/Unsupported
// naming the shard; a shard accepted standalone is accepted by Parse against
// the expectation it implies; and a shard whose every sample and padding
// verify is exactly what ShardBuilder writes for those samples (the encoding
// is canonical).
#include <vector>

#include "fuzz_util.h"
#include "stoker/format.h"

namespace stoker::fuzz {
namespace {

constexpr std::string_view kKey = "fuzz/shard.stks";

void Exercise(std::span<const std::byte> in) {
  auto v = format::ShardView::ParseStandalone(in, kKey);
  if (!v.ok()) {
    CheckParseError(v.status(), kKey);
    return;
  }
  const uint32_t n = v->sample_count(), fc = v->field_count();
  bool all_ok = v->VerifyPadding().ok();
  uint64_t payload = 0;
  for (uint32_t i = 0; i < n; ++i) {
    auto rec = v->Record(i);
    uint64_t sum = 0;
    for (uint32_t f = 0; f < fc; ++f) {
      auto field = v->Field(i, f);
      // Touch every byte (ASan checks reads, not spans) through the hash.
      (void)format::Hash64(field);
      if (field.data() < rec.data() || field.data() + field.size() > rec.data() + rec.size()) {
        Violated("field outside its record", std::to_string(i));
      }
      sum += field.size();
      (void)v->Int64(i, f);
    }
    if (sum != rec.size()) Violated("record size", std::to_string(i));
    payload += rec.size();
    Status s = v->VerifySample(i);
    if (!s.ok()) {
      CheckParseError(s, kKey);
      all_ok = false;
    }
  }
  (void)v->Field(n, 0);
  (void)v->Record(n);

  format::ShardExpectation e;
  e.key = kKey;
  e.shard_number = v->shard_number();
  e.dataset_id = v->dataset_id();
  e.field_count = fc;
  e.samples = n;
  e.bytes = in.size();
  e.index_hash = v->index_hash();
  auto p = format::ShardView::Parse(in, e);
  if (!p.ok()) Violated("Parse refuses what ParseStandalone accepts", p.status().ToString());

  if (!all_ok) return;
  std::vector<format::FieldSpec> fields(fc);
  for (uint32_t f = 0; f < fc; ++f)
    fields[f] = {"f" + std::to_string(f), format::FieldType::kBytes};
  format::ShardBuilder b(fields, v->dataset_id(), v->shard_number());
  std::vector<format::FieldValue> values(fc);
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t f = 0; f < fc; ++f) values[f].bytes = v->Field(i, f);
    if (!b.Add(values).ok()) Violated("ShardBuilder refuses a parsed sample", std::to_string(i));
  }
  if (b.payload_bytes() != payload) Violated("payload", "");
  uint64_t ih;
  std::vector<std::byte> rebuilt = b.Finish(&ih);
  if (ih != v->index_hash() || rebuilt.size() != in.size() ||
      std::memcmp(rebuilt.data(), in.data(), in.size()) != 0) {
    Violated("a fully verified shard is not what ShardBuilder writes", "");
  }
}

}  // namespace
}  // namespace stoker::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stoker::fuzz;
  std::span<const std::byte> in(reinterpret_cast<const std::byte*>(data), size);
  Exercise(in);
  if (size >= stoker::format::kShardHeaderBytes && size <= (1u << 20)) {
    constexpr size_t kA = stoker::format::kShardAlignment;
    std::vector<std::byte> b((size + kA - 1) / kA * kA);
    std::memcpy(b.data(), data, size);
    SealShard(b);
    Exercise(b);
  }
  return 0;
}
