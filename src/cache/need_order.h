// The node's need order: when the ranks of one node first need each shard in
// an epoch, and where each shard comes in each rank's reads, computed from the
// epoch plan alone (every rank can compute every rank's order). The planned
// cache prefetches along it and evicts the shard whose next use is furthest
// away (Belady).
//
// Its cost is per shard, nothing per sample, and not per rank where ranks read
// the same windows (the usual case: with the global shuffle every rank of a
// node visits every window). It is laid out as one block of bytes (the order
// file, below), built in slot order: the only write in random shard order is
// the slot of each shard, once per order. The processes of a node share one
// block through the cache folder (shared_orders.h), each mapping it.
//
// Thread safety: a NeedOrder is immutable once made; share it freely.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "cache/folder.h"
#include "stoker/plan.h"
#include "stoker/status.h"

namespace stoker::cache_internal {

inline constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
inline constexpr uint32_t kNoStep = std::numeric_limits<uint32_t>::max();
// Ranks of one node the planned cache tells apart (a bit each in the table's
// read marks). Default nodes hold 4 or 8 GPUs, one rank each.
inline constexpr uint32_t kMaxNodeRanks = 64;

// What an order is computed for: the dataset (its id and shard count) and
// the job's plan on one node (MakeJobSlot, with `rank` the node's first rank,
// so that every rank of the node has the same key), its epoch and position.
struct OrderKey {
  uint64_t dataset_id = 0;
  uint64_t shards = 0;
  JobSlot job{};
  bool operator==(const OrderKey& o) const;
};
// The key of `plan`'s node (ranks_per_node: the cache's option, 0 = the
// plan's, and without either every rank is on one node).
OrderKey MakeOrderKey(uint64_t dataset_id, uint64_t shards, const PlanOptions& plan,
                      uint32_t ranks_per_node, uint64_t epoch, uint64_t position);

// The order file (one NeedOrder's bytes; native byte order, it never leaves
// the node). A header of kOrderHeaderBytes, then, each array 8-byte aligned:
//   u64 first_step[slots]      per slot: the first step (an index into a
//                              rank's share) at which a rank needs its shard,
//                              kNever when none does
//   u32 slot_of[shards]        per shard: its slot in the epoch's shard order
//   u32 sequence[needed]       the shards the node needs, by first step (ties
//                              by shard number)
//   per group of ranks g (ranks whose visits read the same slots in the same
//   order share one):
//     u32 rank_first[slots]    per slot: where its shard comes in the ranks'
//                              reads (the k-th shard they read), or kNoStep
//     u32 rank_order[reads_g]  the shards in the order they read them
inline constexpr uint64_t kOrderMagic = 0x3130524f414b5453ull;  // "STKAOR01"
inline constexpr uint64_t kOrderHeaderBytes = 1024;

class NeedOrder {
 public:
  // Steps in the epoch (the largest rank share).
  uint64_t steps() const { return steps_; }
  // The node's ranks (at most kMaxNodeRanks), and which of them this process
  // is (0-based within the node).
  uint32_t ranks() const { return ranks_; }
  uint32_t local_rank() const { return local_rank_; }
  uint64_t shards() const { return slot_of_.size(); }
  // Rank groups: ranks reading the same slots in the same order share their
  // per-slot array (one with the global shuffle, however many ranks).
  uint32_t groups() const { return uint32_t(rank_first_.size()); }

  // The first step at which any rank of the node needs `shard` (every shard
  // of a window a rank visits is needed from the visit's first step, the
  // granularity the loader reads at: loader/schedule.h); kNever when no
  // rank of the node needs it this epoch.
  uint64_t FirstStep(uint32_t shard) const { return first_step_[slot_of_[shard]]; }
  // Shards the node needs, by first step (ties by shard number).
  std::span<const uint32_t> sequence() const { return sequence_; }
  // Where `shard` comes in rank r's reads (the k-th shard it reads this
  // epoch), or kNoStep. Ranks drift apart within an epoch, so a shard's next
  // use is the soonest of the ranks that have not read it yet, each counted
  // in reads from where it is (the planned eviction's key; reads, not
  // samples, as ranks read shards at about the same rate, whatever their
  // samples per shard).
  uint32_t RankFirst(uint32_t r, uint32_t shard) const {
    return rank_first_[group_of_[r]][slot_of_[shard]];
  }
  // Rank r's shards in the order it reads them (each once).
  std::span<const uint32_t> RankOrder(uint32_t r) const { return rank_order_[group_of_[r]]; }
  const OrderKey& key() const { return key_; }

  // The order of `plan.rank`'s node, computed here (in memory of its own).
  // The node of `plan.rank` holds ranks [node * ranks_per_node, ...);
  // ranks_per_node 0 = the plan's (and without either, every rank).
  static Result<NeedOrder> Compute(uint64_t dataset_id, std::span<const uint32_t> shard_samples,
                                   const PlanOptions& plan, uint32_t ranks_per_node, uint64_t epoch,
                                   uint64_t position);
  // An order over bytes laid out as above (an order file), checked: its
  // header against `key`, its sizes against each other and its checksum.
  // `backing` keeps the bytes alive. A mismatch is Corruption naming what.
  static Result<NeedOrder> FromBytes(std::span<const std::byte> bytes,
                                     std::shared_ptr<const void> backing, const OrderKey& key,
                                     uint32_t local_rank);

 private:
  friend class NeedOrderBuilder;
  OrderKey key_;
  uint64_t steps_ = 0;
  uint32_t ranks_ = 0, local_rank_ = 0;
  std::span<const uint64_t> first_step_;
  std::span<const uint32_t> slot_of_, sequence_;
  std::vector<uint32_t> group_of_;
  std::vector<std::span<const uint32_t>> rank_first_, rank_order_;
  std::shared_ptr<const void> backing_;
};

// Computes one need order into bytes of the order file's layout, in two
// steps: Make (the plan and each rank's visits, O(ranks x windows)), which
// gives the size, then Write into memory the caller provides (a mapped file
// to share, or memory of its own).
class NeedOrderBuilder {
 public:
  static Result<NeedOrderBuilder> Make(uint64_t dataset_id, std::span<const uint32_t> shard_samples,
                                       const PlanOptions& plan, uint32_t ranks_per_node,
                                       uint64_t epoch, uint64_t position);
  uint64_t bytes() const { return bytes_; }
  const OrderKey& key() const { return key_; }
  uint32_t local_rank() const { return local_rank_; }
  // Fills `out` (bytes() long, any content) with the order file's bytes.
  void Write(std::span<std::byte> out) const;
  // The order in memory of its own.
  Result<NeedOrder> Build() const;

 private:
  NeedOrderBuilder() = default;
  struct Group {
    // The group's visits (EpochPlan::RankVisits), with each visit's first
    // step the earliest of its ranks'.
    std::vector<RankVisit> visits;
    uint64_t reads = 0;  // distinct slots the visits read
  };
  // Slot -> shard, from the node's plan, which goes once the visits are
  // known (it is 20 B per shard; this, 4).
  std::vector<uint32_t> shard_at_;
  OrderKey key_;
  uint32_t ranks_ = 0, local_rank_ = 0;
  uint64_t steps_ = 0, needed_ = 0, bytes_ = 0;
  std::vector<Group> groups_;
  std::vector<uint32_t> group_of_;
};

}  // namespace stoker::cache_internal
