// Need orders shared by the processes of a node through the cache folder:
// the first process to want an order (a job's plan on this node, an epoch, a
// position: OrderKey) computes it once and writes it as an order file
// (need_order.h's layout), which the node's other processes map. Every rank
// of a node used to compute every rank's order for this epoch and the next
// (8 ranks on 2 cores at 10^6 shards: 6.6 s to start an epoch).
//
//   DS_DIR/order-<job identity, hex>-<epoch>   an order file, complete: made
//                                  under a temporary name, then renamed
//   DS_DIR/.order-<pid>-<n>        one being written (removed when its
//                                  writer is found gone: RemoveOrphans)
//   DS_DIR/order.lock              byte (identity + epoch) % kOrderLocks:
//                                  held (OFD) by the process computing it
//
// A file is taken only if its header names the same key and its checksum
// holds: one left by another run (another position, an older layout) or cut
// short (a power cut: files are not synced) is computed again and replaced.
// A process waiting for another's order waits on that lock, which the kernel
// drops when the holder dies; after kOrderWait it computes its own. Writing
// a file fails quietly (a full disk): the order is then kept in memory.
//
// Thread safety: safe for concurrent use (two threads of a process wanting
// one order wait for each other as two processes do).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "cache/need_order.h"

namespace stoker::cache_internal {

// How long a process waits for another to write an order before it
// computes its own. Default: 30 s, about 15 times what one order of 10^7
// shards took on the build VM (2 s, 8 ranks); a computing process that dies
// frees its lock at once, so this bounds only a live but stuck one.
inline constexpr std::chrono::milliseconds kOrderWait{30000};
inline constexpr uint64_t kOrderLocks = 4096;

class SharedOrders {
 public:
  explicit SharedOrders(std::string ds_dir, std::chrono::milliseconds wait = kOrderWait)
      : dir_(std::move(ds_dir)), wait_(wait) {}

  // The order of `plan`'s node (NeedOrder::Compute's arguments): mapped from
  // its file, else computed (here, or by the process holding its lock) and
  // written there.
  Result<std::shared_ptr<const NeedOrder>> Get(uint64_t dataset_id,
                                               std::span<const uint32_t> shard_samples,
                                               const PlanOptions& plan, uint32_t ranks_per_node,
                                               uint64_t epoch, uint64_t position);

  std::string Path(const OrderKey& key) const;
  std::string LockPath() const { return dir_ + "/order.lock"; }
  // The byte of LockPath() that the process computing `key`'s order holds.
  static uint64_t LockByte(const OrderKey& key) {
    return (key.job.identity + key.job.epoch) % kOrderLocks;
  }
  // Orders this object computed and wrote, and mapped from another's file.
  uint64_t written() const { return written_; }
  uint64_t mapped() const { return mapped_; }

 private:
  // The file's order, or nullptr when it is missing, another key's or bad.
  std::shared_ptr<const NeedOrder> TryMap(const OrderKey& key, uint32_t local_rank);
  // Computes the order into a new file, renamed to its name; nullptr when
  // the file cannot be written (then the caller computes it in memory).
  Result<std::shared_ptr<const NeedOrder>> Publish(const NeedOrderBuilder& b);

  const std::string dir_;
  const std::chrono::milliseconds wait_;
  std::atomic<uint64_t> written_{0}, mapped_{0}, tmp_counter_{0};
};

}  // namespace stoker::cache_internal
