// The node cache: a store wrapper that keeps whole shards in a folder on the
// node's local disk, so that a shard is fetched from the remote store once
// per node, not once per rank, and every rank and job on the node reading the
// same dataset reads it from there.
//
// No daemon: the processes that open the same folder share it through the
// folder itself (docs/architecture.md says why).
//   - One fetcher per shard: a fetcher holds an exclusive OFD lock on the
//     shard's byte of a lock file; the others block on that lock in the
//     kernel (no polling) and find the shard there when it is released. A
//     fetcher that dies loses its lock with its file descriptors: the next
//     waiter takes the lock, sees no file and fetches the shard itself.
//   - A shard file is written under a temporary name and renamed, and every
//     hit is checked against the manifest (header and index; every sample's
//     checksum too when the file is not as the cache wrote it, see
//     CacheOptions::verify_samples) before a byte of it is delivered: a bad
//     cache file is dropped, counted and fetched again. After a restart the
//     files are reused.
//   - Space: a table in the folder (mmap'd, under a folder lock) holds what
//     each process fetched and keeps; a fetch reserves its bytes before it
//     starts, so the folder never holds more than the limit (temporary files
//     included).
//   - Planned prefetch and eviction: the order is a pure function of
//     (dataset, seed, epoch, world), so BeginEpoch computes in which order
//     each rank of the node reads the shards, this epoch and the next. The
//     table keeps each rank's progress and which ranks have read each shard,
//     so a shard's next use is the soonest of the ranks that still need it,
//     each counted from where it is (ranks drift apart). Eviction removes the
//     shard needed furthest away (Belady), and a read whose shard is needed
//     later than every cached one is served without caching it (as the
//     offline optimum, MIN, declines it). A prefetch thread fetches the
//     shards needed next into free room only: evicting for a prefetch takes
//     a shard still needed where a little later one the ranks have finished
//     would do. Shards being read are pinned (a shared lock) and never
//     evicted. "lru" evicts the least recently used shard instead and does
//     not prefetch: the conventional cache, for comparison.
// Datasets are kept apart by dataset id: each has a sub-folder of its own,
// under the folder's one limit. A fetch that finds no room evicts, in
// order: its own shards not needed again this epoch, then (least recently
// used first) its own LRU shards and other datasets' shards their processes
// do not expect to read soon, then its own nearer ones; another dataset's
// shards about to be read are never taken.
//
// What is cached: shard objects, whole-shard reads (offset 0, the manifest's
// size) through NewReadQueue or Read, and ranged reads through OpenReader
// (the loader's per-sample reads) or Read: the node fetches the shard whole
// once, and the ranges are read from the cache file, which stays pinned
// while a reader holds it. Every other key (the manifest) goes to the
// remote store, as do writes.
//
// Thread safety: safe for concurrent use, as every Store; BeginEpoch may be
// called while reads run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "stoker/format.h"
#include "stoker/plan.h"
#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker {

struct CacheOptions {
  // The cache folder (created if missing). Required.
  std::string dir;
  // Most bytes of shard files the folder holds, all datasets and processes
  // together. Default: 0 = what the folder holds now plus the free space of
  // its file system, less a margin of 5% of the file system (at least
  // 256 MiB), so a cache never fills its disk.
  uint64_t capacity_bytes = 0;
  // "planned" (prefetch along the node's order, Belady eviction) or "lru".
  // Default: "planned".
  std::string policy = "planned";
  // Ranks per node: the ranks [node * ranks_per_node, (node + 1) *
  // ranks_per_node) share this node's cache, node = rank / ranks_per_node.
  // Default: 0 = every rank of the world is on this node.
  uint32_t ranks_per_node = 0;
  // Shards the prefetch thread keeps fetched ahead of the node's reads
  // (planned only; into free room only, so none once the cache is full).
  // Default: 16 (64 MiB of 4 MiB shards: two shuffle windows of the
  // default 8).
  uint32_t prefetch_shards = 16;
  // Check every sample's checksum of a fetched shard before it is cached,
  // and of a cache file on a hit when the file is not the one the cache
  // wrote (its inode or ctime differ: changed or replaced behind its back),
  // so that it is dropped and fetched again rather than failing the
  // loader's own check. A hit on a file as written checks its header and
  // index (the loader checks each sample as it delivers it). Default: on.
  bool verify_samples = true;
  // When the folder cannot be used (not writable, no space, no OFD locks),
  // serve every read from the remote store and say so once on stderr,
  // instead of failing OpenNodeCache. Default: off (fail, naming the folder).
  bool fallback_uncached = false;
};

// What one NodeCache object did (this process's share of the node's work).
struct CacheStats {
  // Bytes read from the remote store for shards: fetches, and reads passed
  // through uncached (a shard the cache would not admit).
  uint64_t remote_bytes = 0;
  // Bytes delivered from cache files (whole shards, or the ranges read).
  uint64_t cache_bytes = 0;
  // Shard reads (and OpenReader opens of a shard) served from a cache file
  // that was there, fetched by another process or an earlier run, or by
  // this process's prefetch.
  uint64_t hits = 0;
  // Shard reads (and opens) that had to fetch (or pass through) themselves.
  uint64_t misses = 0;
  // Shard reads that waited for another fetcher of the same shard.
  uint64_t fetch_waits = 0;
  // Shards this process fetched ahead of its reads.
  uint64_t prefetches = 0;
  uint64_t evictions = 0;
  // Cache files found bad (truncated, changed), dropped and fetched again.
  uint64_t refetches = 0;
  // Bytes of shard files in the folder now (all processes), and the limit.
  uint64_t used_bytes = 0;
  uint64_t capacity_bytes = 0;
  // Whether the cache is off (fallback_uncached took effect).
  bool uncached = false;
};

class NodeCache : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  // Tells the cache the order of an epoch: `plan` as this rank's loader
  // makes it (seed, shuffle, window, world; its rank picks the node), from
  // global `position`. The cache computes the node's need order for this
  // epoch and the next, and prefetches along it (policy "planned").
  virtual Status BeginEpoch(const PlanOptions& plan, uint64_t epoch, uint64_t position) = 0;
  virtual CacheStats stats() const = 0;
  // The folder of this dataset's cache files.
  virtual const std::string& dataset_dir() const = 0;
};

// Opens (or creates) the cache folder `options.dir` for `manifest`'s dataset
// in front of `remote`. Errors name the folder: InvalidArgument for bad
// options, PermissionDenied when it cannot be written, NoSpace when its file
// system has no room for one shard, Unsupported when it has no OFD locks
// (unless options.fallback_uncached).
Result<std::shared_ptr<NodeCache>> OpenNodeCache(std::shared_ptr<Store> remote,
                                                 const format::Manifest& manifest,
                                                 const CacheOptions& options);

}  // namespace stoker
