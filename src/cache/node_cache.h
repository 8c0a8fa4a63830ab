// The node cache's implementation (include/stoker/cache.h): the read path
// (a hit, a wait on another fetcher, a fetch), ranged reads for per-sample
// loaders, and the planned prefetch thread. The parts it joins:
//   folder.h       the shared tables and the locks
//   shard_files.h  the cache files
//   space.h        the limit: reservations and eviction
//   planner.h      the planned policy's next-use key and prefetch order
//   shared_orders.h  the need orders, computed once per node, in files
//   ranking.h      eviction candidates, ranked once and kept between fetches
//   jobs.h         the jobs planning one dataset's cache, a slot each
//   cache_queue.h  the ReadQueue over the synchronous read path
//
// Thread safety: as every Store, safe for concurrent use.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cache/folder.h"
#include "cache/jobs.h"
#include "cache/planner.h"
#include "cache/ranking.h"
#include "cache/shared_orders.h"
#include "cache/shard_files.h"
#include "cache/space.h"
#include "stoker/cache.h"

namespace stoker::cache_internal {

// What a look in the cache found.
enum class Look { kHit, kMiss, kBad };

class NodeCacheImpl final : public NodeCache {
 public:
  NodeCacheImpl(std::shared_ptr<Store> remote, format::Manifest manifest, CacheOptions options);
  ~NodeCacheImpl() override;
  Status Init();

  // Shards are served whole from the cache folder, or (OpenReader) in
  // ranges from a cache file once the node has fetched them whole.
  StoreCapabilities capabilities() const override;
  StoreDescription Describe() const override {
    return DescribeWithLayer("node cache " + files_.dir());
  }
  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& o) override;
  Result<size_t> Read(std::string_view key, uint64_t offset, std::span<std::byte> dst) override;
  Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view key) override;

  Status BeginEpoch(const PlanOptions& plan, uint64_t epoch, uint64_t position) override;
  CacheStats stats() const override;
  const std::string& dataset_dir() const override { return files_.dir(); }

  // For the ranged reader: bytes delivered from a cache file.
  void CountCacheBytes(uint64_t n) { cache_bytes_ += n; }

 private:
  Status FolderError(Status st) const;
  Status ChooseCapacity();
  Status Reconcile();

  Result<size_t> ReadShard(uint32_t s, uint64_t offset, std::span<std::byte> dst);
  // A reader of shard s's cache file, pinned, after fetching it if absent;
  // of a copy in memory when the cache does not admit it.
  Result<std::unique_ptr<ObjectReader>> OpenShardReader(uint32_t s);
  // Shard s whole into dst through the cache; `deliver`: dst is what the
  // caller reads (a hit counts its bytes as served from the cache).
  Status GetWhole(uint32_t s, std::span<std::byte> dst, bool prefetch, bool deliver = true);
  Look TryHit(uint32_t s, std::span<std::byte> dst, ino_t* inode);
  void DropBad(uint32_t s, ino_t inode);
  Status Fetch(uint32_t s, std::span<std::byte> dst, bool prefetch);
  Status Verify(uint32_t s, std::span<const std::byte> data, bool samples) const;
  bool AsWritten(uint32_t s, const struct stat& st) const;
  // Under the folder lock: reserves s for a read (or a prefetch) as the
  // policy says.
  bool Reserve(uint32_t s, bool prefetch);
  void Touch(uint32_t s, bool whole);
  void PrefetchLoop();

  format::Manifest manifest_;
  CacheOptions options_;
  // The shard a key names, or -1: from the key itself (ShardTable::Find),
  // or, for a v1 manifest's keys of their own, from own_keys_.
  int64_t ShardOfKey(std::string_view key) const;
  std::map<std::string, uint32_t, std::less<>> own_keys_;
  bool planned_ = true;
  std::string fetch_lock_path_, pin_lock_path_;
  ShardFiles files_;
  FolderTables tables_;
  std::optional<Space> space_;
  std::optional<JobSlots> jobs_;  // under the folder lock
  EvictionRanking ranking_;  // under the folder lock
  uint64_t largest_shard_ = 0;
  // The limit holds every shard of the dataset, on a local file system: per-
  // sample reads of the cache files are cheap (capabilities()).
  bool holds_dataset_locally_ = false;
  std::unique_ptr<SharedOrders> orders_;  // outlives planner_ (declared before)
  Planner planner_;
  std::thread prefetcher_;
  std::atomic<uint64_t> epoch_{0};

  std::atomic<uint64_t> remote_bytes_{0}, cache_bytes_{0}, hits_{0}, misses_{0}, fetch_waits_{0},
      prefetches_{0}, evictions_{0}, refetches_{0};
  std::atomic<bool> bad_said_{false}, write_said_{false}, jobs_said_{false};
};

}  // namespace stoker::cache_internal
