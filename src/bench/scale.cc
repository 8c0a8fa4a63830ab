// The scale benchmark's datasets (bench.h, ScaleDataset): a manifest and a
// shard table written by the writer, and shards that a store wrapper makes
// on read with ShardBuilder, so that a dataset of 10^9 samples costs its
// table on disk, not its shards.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>

#include "bench/bench.h"
#include "stoker/format.h"

namespace stoker {
namespace {

constexpr std::string_view kShardPrefix = "shards/";
constexpr std::string_view kShardSuffix = ".stks";

// Sample i of a shard: `bytes` bytes of i, little-endian, repeated. The same
// in every shard, so shards of one sample count share their index hash.
void SampleBytes(uint32_t i, std::span<std::byte> out) {
  std::byte pattern[4];
  std::memcpy(pattern, &i, sizeof pattern);
  for (size_t k = 0; k < out.size(); ++k) out[k] = pattern[k % sizeof pattern];
}

// The shard layout WriteScaleDataset writes: `samples` spread over `shards`,
// the first samples % shards of them one sample larger.
uint32_t SamplesOfShard(uint64_t samples, uint64_t shards, uint64_t k) {
  return uint32_t(samples / shards + (k < samples % shards ? 1 : 0));
}

std::vector<std::byte> BuildShard(const format::Manifest& m, uint32_t shard, uint32_t samples,
                                  uint64_t* index_hash) {
  format::ShardBuilder b(m.fields, m.dataset_id, shard);
  std::vector<std::byte> value(m.max_sample_bytes);
  for (uint32_t i = 0; i < samples; ++i) {
    SampleBytes(i, value);
    const format::FieldValue v{value, 0};
    (void)b.Add(std::span<const format::FieldValue>(&v, 1));  // sizes checked by the caller
  }
  return b.Finish(index_hash);
}

// A read queue that serves every request on Submit, from its store's Read.
class SyncQueue final : public ReadQueue {
 public:
  explicit SyncQueue(Store* store) : store_(store) {}
  Status Submit(std::span<const ReadRequest> requests) override {
    for (const ReadRequest& r : requests) ready_.push_back(ReadNow(*store_, r));
    return Status::Ok();
  }
  Result<size_t> Wait(size_t, Deadline, std::vector<ReadCompletion>* out) override {
    if (out == nullptr) return InvalidArgument("ReadQueue::Wait: out is null");
    const size_t n = ready_.size();
    for (auto& c : ready_) out->push_back(std::move(c));
    ready_.clear();
    return n;
  }
  size_t Outstanding() const override { return ready_.size(); }

 private:
  Store* store_;
  std::vector<ReadCompletion> ready_;
};

class BytesReader final : public ObjectReader {
 public:
  explicit BytesReader(std::vector<std::byte> bytes) : bytes_(std::move(bytes)) {}
  Result<size_t> ReadV(uint64_t offset, std::span<const std::span<std::byte>> dsts) override {
    size_t done = 0;
    for (auto d : dsts) {
      if (offset >= bytes_.size()) break;
      const size_t n = std::min<uint64_t>(d.size(), bytes_.size() - offset);
      std::memcpy(d.data(), bytes_.data() + offset, n);
      offset += n;
      done += n;
    }
    return done;
  }

 private:
  std::vector<std::byte> bytes_;
};

// The dataset's manifest and table from `target`; its shards made on read.
// Read-only for shard keys; capabilities are those of a remote object store
// (no local or mapped reads), so the loader reads whole shards. Keeps the
// manifest without its table (the layout follows from the totals): O(1)
// memory, so that a rank's RSS is the loader's.
class SyntheticShardStore final : public StoreWrapper {
 public:
  SyntheticShardStore(std::shared_ptr<Store> target, format::Manifest m, uint64_t shards)
      : StoreWrapper(std::move(target)),
        m_(std::move(m)),
        shards_(shards),
        uri_("synthetic+" + target_uri()) {
    // Shards of one sample count have one size: the first and the last
    // shard's sizes cover both counts (SamplesOfShard).
    for (uint64_t k : {uint64_t{0}, shards_ - 1}) size_[k == 0 ? 0 : 1] = Make(uint32_t(k)).size();
  }

  const std::string& uri() const override { return uri_; }
  StoreCapabilities capabilities() const override {
    return {.exclusive_create = target()->capabilities().exclusive_create};
  }

  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions&) override {
    return std::unique_ptr<ReadQueue>(new SyncQueue(this));
  }
  Result<size_t> Read(std::string_view key, uint64_t offset, std::span<std::byte> dst) override {
    const int64_t k = ShardNumber(key);
    if (k < 0) return target()->Read(key, offset, dst);
    const std::vector<std::byte> bytes = Make(uint32_t(k));
    if (offset >= bytes.size()) return size_t{0};
    const size_t n = std::min<uint64_t>(dst.size(), bytes.size() - offset);
    std::memcpy(dst.data(), bytes.data() + offset, n);
    return n;
  }
  Result<std::vector<std::byte>> ReadAll(std::string_view key) override {
    const int64_t k = ShardNumber(key);
    if (k < 0) return target()->ReadAll(key);
    return Make(uint32_t(k));
  }
  Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view key) override {
    const int64_t k = ShardNumber(key);
    if (k < 0) return target()->OpenReader(key);
    return std::unique_ptr<ObjectReader>(new BytesReader(Make(uint32_t(k))));
  }
  Result<ObjectInfo> Stat(std::string_view key) override {
    const int64_t k = ShardNumber(key);
    if (k < 0) return target()->Stat(key);
    return ObjectInfo{std::string(key), SizeOf(uint64_t(k))};
  }
  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    STOKER_ASSIGN_OR_RETURN(std::vector<ObjectInfo> out, target()->List(prefix));
    for (uint64_t k = 0; k < shards_; ++k) {
      std::string key = format::ShardKey(uint32_t(k));
      if (key.starts_with(prefix)) out.push_back({std::move(key), SizeOf(k)});
    }
    std::sort(out.begin(), out.end(),
              [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
    return out;
  }
  Result<std::vector<std::string>> ListKeys(std::string_view prefix) override {
    STOKER_ASSIGN_OR_RETURN(std::vector<ObjectInfo> all, List(prefix));
    std::vector<std::string> keys;
    for (auto& o : all) keys.push_back(std::move(o.key));
    return keys;
  }
  using StoreWrapper::Put;
  Status Put(std::string_view key, std::span<const std::byte> d, const WriteOptions& o) override {
    if (ShardNumber(key) >= 0) return ReadOnly(key);
    return target()->Put(key, d, o);
  }
  Status Remove(std::string_view key) override {
    if (ShardNumber(key) >= 0) return ReadOnly(key);
    return target()->Remove(key);
  }

 private:
  const std::string& target_uri() const { return target()->uri(); }
  Status ReadOnly(std::string_view key) const {
    return PermissionDenied(uri_ + ": " + std::string(key) + ": synthetic shards are read-only");
  }
  // The shard number of a shard key of this dataset, or -1.
  int64_t ShardNumber(std::string_view key) const {
    if (!key.starts_with(kShardPrefix) || !key.ends_with(kShardSuffix)) return -1;
    const std::string_view digits =
        key.substr(kShardPrefix.size(), key.size() - kShardPrefix.size() - kShardSuffix.size());
    uint64_t k = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), k);
    if (ec != std::errc{} || end != digits.data() + digits.size() || k >= shards_) {
      return -1;
    }
    if (format::ShardKey(uint32_t(k)) != key) return -1;
    return int64_t(k);
  }
  uint64_t SizeOf(uint64_t k) const {
    const uint64_t samples = SamplesOfShard(m_.sample_count, shards_, k);
    return size_[samples == SamplesOfShard(m_.sample_count, shards_, 0) ? 0 : 1];
  }
  std::vector<std::byte> Make(uint32_t k) const {
    uint64_t hash = 0;
    return BuildShard(m_, k, SamplesOfShard(m_.sample_count, shards_, k), &hash);
  }

  format::Manifest m_;
  uint64_t shards_;
  std::string uri_;
  uint64_t size_[2] = {};  // bytes of a shard of the first's count, of the last's
};

}  // namespace

Result<format::Manifest> WriteScaleDataset(Store& dst, const ScaleDatasetOptions& o) {
  if (o.samples == 0 || o.shards == 0 || o.shards > o.samples) {
    return InvalidArgument("scale dataset: need 1 <= shards <= samples (got " +
                           std::to_string(o.shards) + " shards, " + std::to_string(o.samples) +
                           " samples)");
  }
  if (SamplesOfShard(o.samples, o.shards, 0) > UINT32_MAX - 1) {
    return InvalidArgument("scale dataset: more than 2^32-1 samples per shard");
  }
  format::Manifest m;
  m.dataset_id = format::NewDatasetId();
  m.fields = {{"data", format::FieldType::kBytes}};
  m.sample_count = o.samples;
  m.payload_bytes = o.samples * o.sample_bytes;
  m.max_sample_bytes = o.sample_bytes;
  m.created_by = "stoker bench scale";
  // Shards of one sample count are alike but for their number: one template
  // each gives their size and index hash.
  std::map<uint32_t, std::pair<uint64_t, uint64_t>> alike;  // samples -> (bytes, index hash)
  for (uint64_t k : {uint64_t{0}, o.shards - 1}) {
    const uint32_t samples = SamplesOfShard(o.samples, o.shards, k);
    uint64_t hash = 0;
    const uint64_t bytes = BuildShard(m, 0, samples, &hash).size();
    alike[samples] = {bytes, hash};
  }
  m.shards.reserve(o.shards);
  for (uint64_t k = 0; k < o.shards; ++k) {
    const uint32_t samples = SamplesOfShard(o.samples, o.shards, k);
    const auto& [bytes, hash] = alike.at(samples);
    m.shards.AppendNumbered(bytes, samples, hash);
  }
  // As the writer commits a dataset: the table, then the manifest naming it.
  const std::vector<std::byte> table = format::EncodeShardTable(m, &m.table);
  STOKER_RETURN_IF_ERROR(dst.Put(format::kShardTableKey, table));
  const std::string text = format::EncodeManifest(m);
  STOKER_RETURN_IF_ERROR(dst.Put(format::kManifestKey, std::as_bytes(std::span(text))));
  return m;
}

Result<std::shared_ptr<Store>> NewSyntheticShardStore(std::shared_ptr<Store> target) {
  STOKER_ASSIGN_OR_RETURN(std::vector<std::byte> raw, target->ReadAll(format::kManifestKey));
  STOKER_ASSIGN_OR_RETURN(format::Manifest m,
                          format::DecodeManifest(raw, target->uri() + "/" +
                                                          std::string(format::kManifestKey)));
  if (m.table.key.empty() || m.table.records == 0) {
    return InvalidArgument(target->uri() + ": not a dataset of `stoker bench scale`");
  }
  const uint64_t shards = m.table.records;
  return std::shared_ptr<Store>(new SyntheticShardStore(std::move(target), std::move(m), shards));
}

}  // namespace stoker
