// The node's need order: when the ranks of one node first and last need each
// shard in an epoch, computed from the epoch plan alone (every rank can
// compute every rank's order). The planned cache prefetches along it and
// evicts the shard whose next use is furthest away (Belady).
//
// Thread safety: a NeedOrder is immutable after Compute; share it freely.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "stoker/plan.h"
#include "stoker/status.h"

namespace stoker::cache_internal {

inline constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
inline constexpr uint32_t kNoStep = std::numeric_limits<uint32_t>::max();
// Ranks of one node the planned cache tells apart (a bit each in the table's
// read marks). Default nodes hold 4 or 8 GPUs, one rank each.
inline constexpr uint32_t kMaxNodeRanks = 64;

struct NeedOrder {
  // Per shard: the first and last step (the index of a sample within a rank's
  // share of the epoch) at which any rank of the node needs it; kNever when
  // no rank of the node needs it this epoch.
  std::vector<uint64_t> first_step;
  std::vector<uint64_t> last_step;
  // Shards the node needs, by first step (ties by shard number).
  std::vector<uint32_t> sequence;
  // Steps in the epoch (the largest rank share).
  uint64_t steps = 0;
  // Per shard: how many reads of it the node's ranks make this epoch: one
  // per rank visit of its window (EpochPlan::RankVisits; a rank reads a
  // window's shards once per visit, however many of their samples it takes,
  // and padding that wraps around visits the first windows again): that many
  // reads make it done for the epoch.
  std::vector<uint32_t> readers;
  // Shard -> its index in `sequence`, or UINT32_MAX.
  std::vector<uint32_t> index_of;
  // The node's ranks (at most kMaxNodeRanks), and which of them this
  // process is (0-based within the node).
  uint32_t ranks = 0;
  uint32_t local_rank = 0;
  // Per local rank r and shard s, at [r * shards + s]: where s comes in
  // rank r's reads (the k-th shard it reads this epoch), or kNoStep. Ranks
  // drift apart within an epoch, so a shard's next use is the soonest of the
  // ranks that have not read it yet, each counted in reads from where it is
  // (the planned eviction's key; reads, not samples, as ranks read shards at
  // about the same rate, whatever their samples per shard).
  std::vector<uint32_t> rank_first;
  uint32_t RankFirst(uint32_t r, uint32_t shard) const {
    return rank_first[size_t(r) * first_step.size() + shard];
  }
  // Per local rank: its shards in the order it reads them.
  std::vector<std::vector<uint32_t>> rank_order;
  // index_of[shard] as a signed value: -1 when the node does not need it.
  int64_t IndexOf(uint32_t shard) const;

  // The node of `plan.rank` holds ranks [node * ranks_per_node, ...);
  // ranks_per_node 0 = every rank.
  static Result<NeedOrder> Compute(uint64_t dataset_id, std::span<const uint32_t> shard_samples,
                                   const PlanOptions& plan, uint32_t ranks_per_node, uint64_t epoch,
                                   uint64_t position);
};

}  // namespace stoker::cache_internal
