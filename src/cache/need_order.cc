#include "cache/need_order.h"

#include <algorithm>
#include <string>

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

  // Sample id -> shard.
  std::vector<uint32_t> shard_of;
  for (uint32_t s = 0; s < shard_samples.size(); ++s)
    shard_of.insert(shard_of.end(), shard_samples[s], s);

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
  for (uint32_t r = first_rank; r < end_rank; ++r) {
    PlanOptions po = plan;
    po.rank = r;
    STOKER_ASSIGN_OR_RETURN(EpochPlan p,
                            EpochPlan::Make(dataset_id, shard_samples, po, epoch, position));
    o.steps = std::max(o.steps, p.rank_samples());
    for (uint64_t j = 0; j < p.rank_samples(); ++j) {
      const uint64_t id = p.RankSample(j);
      if (id >= shard_of.size()) continue;
      const uint32_t s = shard_of[id];
      if (seen_by[s] != r) {
        seen_by[s] = r;
        o.readers[s]++;
        auto& order = o.rank_order[r - first_rank];
        o.rank_first[size_t(r - first_rank) * shard_samples.size() + s] = uint32_t(order.size());
        order.push_back(s);
      }
      o.first_step[s] = std::min(o.first_step[s], j);
      o.last_step[s] = std::max(o.last_step[s], j);
    }
    // Node affinity gives every rank of the node the same part: one plan
    // per rank is still needed for the strided share.
  }
  for (uint32_t s = 0; s < shard_samples.size(); ++s) {
    if (o.first_step[s] != kNever) o.sequence.push_back(s);
  }
  std::stable_sort(o.sequence.begin(), o.sequence.end(),
                   [&](uint32_t a, uint32_t b) { return o.first_step[a] < o.first_step[b]; });
  o.index_of.assign(shard_samples.size(), UINT32_MAX);
  for (uint32_t i = 0; i < o.sequence.size(); ++i) o.index_of[o.sequence[i]] = i;
  return o;
}

}  // namespace stoker::cache_internal
