#include "cache/need_order.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace stoker::cache_internal {

int64_t NeedOrder::IndexOf(uint32_t shard) const {
  if (shard >= index_of.size() || index_of[shard] == UINT32_MAX) return -1;
  return index_of[shard];
}

Result<NeedOrder> NeedOrder::Compute(uint64_t dataset_id, std::span<const uint32_t> shard_samples,
                                     const PlanOptions& plan, uint32_t ranks_per_node,
                                     uint64_t epoch, uint64_t position) {
  const uint32_t world = std::max(1u, plan.world_size);
  if (ranks_per_node == 0) ranks_per_node = plan.ranks_per_node;
  const uint32_t per_node = ranks_per_node == 0 ? world : std::min(ranks_per_node, world);
  const uint32_t node = plan.rank / per_node;
  const uint32_t first_rank = node * per_node;
  const uint32_t end_rank = std::min(world, first_rank + per_node);

  if (end_rank - first_rank > kMaxNodeRanks) {
    return InvalidArgument("cache: " + std::to_string(end_rank - first_rank) +
                           " ranks on one node; the planned cache tells at most " +
                           std::to_string(kMaxNodeRanks) + " apart");
  }
  NeedOrder o;
  o.ranks = end_rank - first_rank;
  o.local_rank = plan.rank - first_rank;
  o.rank_first.assign(size_t(o.ranks) * shard_samples.size(), kNoStep);
  o.rank_order.resize(o.ranks);
  o.readers.assign(shard_samples.size(), 0);
  std::vector<uint32_t> seen_by(shard_samples.size(), UINT32_MAX);
  o.first_step.assign(shard_samples.size(), kNever);
  o.last_step.assign(shard_samples.size(), 0);
  // One order for the node's ranks (EpochPlan::ForRank shares it); each
  // rank's need is per window visit: every shard of a window it visits is
  // needed from the visit's first step to its last, the granularity the
  // loader reads at (loader/schedule.h). O(ranks x shards), nothing per sample.
  PlanOptions first_po = plan;
  first_po.rank = first_rank;
  STOKER_ASSIGN_OR_RETURN(EpochPlan node_plan,
                          EpochPlan::Make(dataset_id, shard_samples, first_po, epoch, position));
  for (uint32_t r = first_rank; r < end_rank; ++r) {
    STOKER_ASSIGN_OR_RETURN(EpochPlan p, node_plan.ForRank(r));
    o.steps = std::max(o.steps, p.rank_samples());
    auto& order = o.rank_order[r - first_rank];
    for (const RankVisit& v : p.RankVisits()) {
      for (uint32_t k = v.first_slot; k < v.end_slot; ++k) {
        const uint32_t s = p.ShardAtSlot(k);
        // A rank whose padding wraps around visits the first windows again,
        // and reads their shards again: each visit is a read.
        o.readers[s]++;
        if (seen_by[s] != r) {
          seen_by[s] = r;
          o.rank_first[size_t(r - first_rank) * shard_samples.size() + s] = uint32_t(order.size());
          order.push_back(s);
        }
        o.first_step[s] = std::min(o.first_step[s], v.first_step);
        o.last_step[s] = std::max(o.last_step[s], v.last_step);
      }
    }
  }
  // By first step, ties by shard number: sorting (step, shard) pairs reads
  // them in place, where a comparator looking up first_step misses cache.
  std::vector<std::pair<uint64_t, uint32_t>> by_step;
  for (uint32_t s = 0; s < shard_samples.size(); ++s) {
    if (o.first_step[s] != kNever) by_step.emplace_back(o.first_step[s], s);
  }
  std::sort(by_step.begin(), by_step.end());
  o.sequence.reserve(by_step.size());
  for (const auto& [step, s] : by_step) o.sequence.push_back(s);
  o.index_of.assign(shard_samples.size(), UINT32_MAX);
  for (uint32_t i = 0; i < o.sequence.size(); ++i) o.index_of[o.sequence[i]] = i;
  return o;
}

}  // namespace stoker::cache_internal
