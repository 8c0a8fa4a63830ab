// The node cache (include/stoker/cache.h): opening the folder, the epoch's
// plan, the counters. The read path is in fetch.cc and ranged_reads.cc, the
// policy's decisions in policy.cc.
#include "cache/node_cache.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "cache/cache_queue.h"
#include "store/posix_internal.h"
#include "store/store_internal.h"

namespace stoker {
namespace cache_internal {
namespace {

constexpr uint64_t kMinMargin = 256ull << 20;

std::vector<uint32_t> ShardSamples(const format::Manifest& m) {
  std::vector<uint32_t> out;
  out.reserve(m.shards.size());
  for (size_t i = 0; i < m.shards.size(); ++i) out.push_back(m.shards.samples(i));
  return out;
}

}  // namespace

NodeCacheImpl::NodeCacheImpl(std::shared_ptr<Store> remote, format::Manifest manifest,
                             CacheOptions options)
    : NodeCache(std::move(remote)),
      manifest_(std::move(manifest)),
      options_(std::move(options)),
      planner_(manifest_.Id64(), ShardSamples(manifest_), options_.ranks_per_node) {
  if (manifest_.shards.has_own_keys()) {
    for (uint32_t i = 0; i < manifest_.shards.size(); ++i) {
      own_keys_.emplace(manifest_.shards.key(i), i);
    }
  }
  planned_ = options_.policy == "planned";
}

int64_t NodeCacheImpl::ShardOfKey(std::string_view key) const {
  if (own_keys_.empty()) return manifest_.shards.Find(key);
  auto it = own_keys_.find(key);
  return it == own_keys_.end() ? -1 : int64_t{it->second};
}

NodeCacheImpl::~NodeCacheImpl() {
  planner_.Stop();
  if (prefetcher_.joinable()) prefetcher_.join();
}

Status NodeCacheImpl::FolderError(Status st) const {
  if (st.ok()) return st;
  return Status(st.code(), "cache folder " + options_.dir + ": " + st.message());
}

Status NodeCacheImpl::Init() {
  const std::string& dir = options_.dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return FolderError(ErrnoToStatus(ec.value(), "create " + dir));
  const std::string ds_dir = dir + "/" + manifest_.IdHex();
  std::filesystem::create_directories(ds_dir, ec);
  if (ec) return FolderError(ErrnoToStatus(ec.value(), "create " + ds_dir));
  if (access(ds_dir.c_str(), W_OK) != 0) {
    return FolderError(ErrnoToStatus(errno, "write to " + ds_dir));
  }
  files_ = ShardFiles(ds_dir);
  fetch_lock_path_ = ds_dir + "/fetch.lock";
  pin_lock_path_ = ds_dir + "/pin.lock";
  jobs_.emplace(ds_dir + "/jobs.lock");
  STOKER_RETURN_IF_ERROR(FolderError(CheckOfdLocks(fetch_lock_path_)));
  STOKER_RETURN_IF_ERROR(FolderError(tables_.Open(dir, ds_dir, manifest_.shards.size())));
  STOKER_RETURN_IF_ERROR(ChooseCapacity());
  STOKER_RETURN_IF_ERROR(FolderError(files_.Probe()));
  STOKER_RETURN_IF_ERROR(Reconcile());
  orders_ = std::make_unique<SharedOrders>(ds_dir);
  planner_.ShareThrough(orders_.get());
  if (planned_) prefetcher_ = std::thread([this] { PrefetchLoop(); });
  return Status::Ok();
}

Status NodeCacheImpl::ChooseCapacity() {
  struct statvfs v;
  if (statvfs(options_.dir.c_str(), &v) != 0) {
    return FolderError(ErrnoToStatus(errno, "statvfs " + options_.dir));
  }
  uint64_t largest = 0;
  std::vector<uint64_t> bytes;
  bytes.reserve(manifest_.shards.size());
  for (size_t i = 0; i < manifest_.shards.size(); ++i) {
    largest = std::max(largest, manifest_.shards.bytes(i));
    bytes.push_back(manifest_.shards.bytes(i));
  }
  const uint64_t free_bytes = uint64_t(v.f_bavail) * v.f_frsize;
  uint64_t used, capacity;
  {
    FolderTables::Locked l(tables_);
    used = tables_.header().used;
  }
  if (options_.capacity_bytes != 0) {
    capacity = options_.capacity_bytes;
  } else {
    const uint64_t total = uint64_t(v.f_blocks) * v.f_frsize;
    const uint64_t margin = std::max(kMinMargin, total / 20);
    capacity = free_bytes + used > margin ? free_bytes + used - margin : 0;
  }
  if (capacity < largest || free_bytes + used < largest) {
    return NoSpace("cache folder " + options_.dir + ": no room for one shard (" +
                   std::to_string(largest >> 10) + " KiB): " + std::to_string(free_bytes >> 10) +
                   " KiB free on its file system, limit " + std::to_string(capacity >> 10) +
                   " KiB");
  }
  largest_shard_ = largest;
  uint64_t dataset = 0;
  for (uint64_t b : bytes) dataset += b;
  holds_dataset_locally_ = capacity >= dataset && posix::IsLocalFileSystem(options_.dir);
  space_.emplace(&tables_, &files_, pin_lock_path_, std::move(bytes), capacity, &evictions_);
  return Status::Ok();
}

// After a restart or a killed fetcher: entries being fetched whose fetcher
// is gone, present entries whose file is gone, temporary files nobody
// writes any more.
Status NodeCacheImpl::Reconcile() {
  // A table made just now holds no entries to check.
  Result<std::vector<uint32_t>> held = std::vector<uint32_t>{};
  if (!tables_.fresh()) held = tables_.NotAbsent();
  STOKER_RETURN_IF_ERROR(FolderError(held.status()));
  for (uint32_t s : *held) {
    ByteLock fetch;
    STOKER_ASSIGN_OR_RETURN(bool got, fetch.Lock(fetch_lock_path_, s, true, /*wait=*/false));
    if (!got) continue;  // a live fetcher
    FolderTables::Locked l(tables_);
    space_->FixStale(s);
  }
  return FolderError(files_.RemoveOrphans([&](uint32_t s) {
    ByteLock fetch;
    auto got = fetch.Lock(fetch_lock_path_, s, true, /*wait=*/false);
    return got.ok() && *got;
  }));
}

StoreCapabilities NodeCacheImpl::capabilities() const {
  // A per-sample read goes through OpenReader, which fetches the shard whole
  // first, then reads ranges of the cache file. Where the cache can hold
  // the whole dataset on a local disk, that is what "auto" picks: each rank
  // reads its own records, not every shard of its windows whole. Through a
  // smaller cache, a per-sample reader's short holds are not yet planned
  // for (docs/benchmarks.md: up to twice the optimum's remote bytes), so
  // "auto" keeps whole-shard reads there.
  StoreCapabilities c = StoreWrapper::capabilities();
  c.local_reads = holds_dataset_locally_;
  // A shard's reader maps its cache file (or the copy in memory of one the
  // cache would not admit), whatever the store behind.
  c.mapped_reads = true;
  return c;
}

Result<std::unique_ptr<ReadQueue>> NodeCacheImpl::NewReadQueue(const ReadQueueOptions& o) {
  STOKER_RETURN_IF_ERROR(store_internal::ValidateQueueOptions(o));
  return std::unique_ptr<ReadQueue>(new CacheQueue(this, o.depth));
}

Result<size_t> NodeCacheImpl::Read(std::string_view key, uint64_t offset,
                                   std::span<std::byte> dst) {
  const int64_t s = ShardOfKey(key);
  if (s < 0) return target()->Read(key, offset, dst);
  return ReadShard(uint32_t(s), offset, dst);
}

Status NodeCacheImpl::BeginEpoch(const PlanOptions& plan, uint64_t epoch, uint64_t position) {
  epoch_ = epoch;
  if (!planned_) return Status::Ok();
  Result<int> job = -1;
  {
    FolderTables::Locked l(tables_);
    job = jobs_->Claim(tables_, MakeJobSlot(plan, options_.ranks_per_node, epoch, position));
  }
  STOKER_RETURN_IF_ERROR(FolderError(job.status()));
  if (*job < 0) {
    if (!jobs_said_.exchange(true)) {
      std::fprintf(stderr,
                   "stoker: cache folder %s: %u other jobs with other plans already plan this "
                   "dataset's cache; this one evicts least recently used\n",
                   options_.dir.c_str(), kTableJobs);
    }
    planner_.Unplanned();
    return Status::Ok();
  }
  return planner_.Begin(plan, epoch, position, uint32_t(*job));
}

CacheStats NodeCacheImpl::stats() const {
  CacheStats s;
  s.remote_bytes = remote_bytes_;
  s.cache_bytes = cache_bytes_;
  s.hits = hits_;
  s.misses = misses_;
  s.fetch_waits = fetch_waits_;
  s.prefetches = prefetches_;
  s.evictions = evictions_;
  s.refetches = refetches_;
  s.used_bytes = __atomic_load_n(&tables_.header().used, __ATOMIC_RELAXED);
  s.capacity_bytes = space_->capacity();
  return s;
}

namespace {

// The cache switched off (CacheOptions::fallback_uncached): every read goes
// to the remote store; only the counters of remote bytes are kept.
class UncachedNodeCache final : public NodeCache {
 public:
  UncachedNodeCache(std::shared_ptr<Store> remote, std::string dir)
      : NodeCache(std::move(remote)), dir_(std::move(dir)) {}
  Status BeginEpoch(const PlanOptions&, uint64_t, uint64_t) override { return Status::Ok(); }
  CacheStats stats() const override {
    CacheStats s;
    s.uncached = true;
    return s;
  }
  const std::string& dataset_dir() const override { return dir_; }
  StoreDescription Describe() const override {
    return DescribeWithLayer("node cache " + dir_ + " (off)");
  }

 private:
  std::string dir_;
};

}  // namespace
}  // namespace cache_internal

Result<std::shared_ptr<NodeCache>> OpenNodeCache(std::shared_ptr<Store> remote,
                                                 const format::Manifest& manifest,
                                                 const CacheOptions& options) {
  if (options.dir.empty()) return InvalidArgument("cache: no folder given (CacheOptions::dir)");
  if (options.policy != "planned" && options.policy != "lru") {
    return InvalidArgument("cache policy '" + options.policy + "' is not \"planned\" or \"lru\"");
  }
  auto cache = std::make_shared<cache_internal::NodeCacheImpl>(remote, manifest, options);
  Status st = cache->Init();
  if (st.ok()) return std::shared_ptr<NodeCache>(std::move(cache));
  if (!options.fallback_uncached) return st;
  std::fprintf(stderr, "stoker: %s; reading %s uncached\n", st.ToString().c_str(),
               remote->uri().c_str());
  return std::shared_ptr<NodeCache>(
      std::make_shared<cache_internal::UncachedNodeCache>(remote, options.dir));
}

}  // namespace stoker
