#include "cache/need_order.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cache/jobs.h"
#include "stoker/format.h"

namespace stoker::cache_internal {
namespace {

// The order file's header (need_order.h); the rest of its kOrderHeaderBytes
// are zero.
struct OrderHeader {
  uint64_t magic;
  uint64_t bytes;     // the whole file's
  uint64_t checksum;  // Hash64 of the header (this field 0) and the arrays
  uint64_t dataset_id;
  uint64_t shards;
  uint64_t steps;
  uint64_t needed;  // the sequence's length
  uint32_t ranks;
  uint32_t groups;
  JobSlot job;
  uint32_t group_of[kMaxNodeRanks];  // per local rank: its group
  uint64_t reads[kMaxNodeRanks];     // per group: its rank_order's length
};
static_assert(sizeof(OrderHeader) <= kOrderHeaderBytes);

uint64_t Align8(uint64_t n) { return (n + 7) & ~uint64_t(7); }

// Where each array of an order file lies.
struct Layout {
  uint64_t first_step = 0, slot_of = 0, sequence = 0;
  uint64_t rank_first[kMaxNodeRanks] = {}, rank_order[kMaxNodeRanks] = {};
  uint64_t bytes = 0;
};

Layout LayoutOf(uint64_t shards, uint64_t needed, uint32_t groups, const uint64_t* reads) {
  Layout l;
  uint64_t at = kOrderHeaderBytes;
  l.first_step = at;
  at += 8 * shards;
  l.slot_of = at;
  at += Align8(4 * shards);
  l.sequence = at;
  at += Align8(4 * needed);
  for (uint32_t g = 0; g < groups; ++g) {
    l.rank_first[g] = at;
    at += Align8(4 * shards);
    l.rank_order[g] = at;
    at += Align8(4 * reads[g]);
  }
  l.bytes = at;
  return l;
}

uint64_t Checksum(std::span<const std::byte> bytes) {
  OrderHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  h.checksum = 0;
  format::Hash64Stream s;
  s.Update(std::as_bytes(std::span(&h, 1)));
  s.Update(bytes.subspan(sizeof h));
  return s.Digest();
}

// Distinct slots in `ranges` ([first, end) pairs).
uint64_t Covered(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  if (!std::is_sorted(ranges.begin(), ranges.end())) std::sort(ranges.begin(), ranges.end());
  uint64_t n = 0;
  uint32_t reach = 0;  // slots below it are counted
  for (const auto& [first, end] : ranges) {
    const uint32_t from = std::max(first, reach);
    if (end > from) {
      n += end - from;
      reach = end;
    }
  }
  return n;
}

void AppendRanges(const std::vector<RankVisit>& visits,
                  std::vector<std::pair<uint32_t, uint32_t>>* out) {
  for (const RankVisit& v : visits) out->emplace_back(v.first_slot, v.end_slot);
}

bool SameSlots(const std::vector<RankVisit>& a, const std::vector<RankVisit>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first_slot != b[i].first_slot || a[i].end_slot != b[i].end_slot) return false;
  }
  return true;
}

struct NodeRanks {
  uint32_t first = 0, end = 0;
};

NodeRanks NodeOf(const PlanOptions& plan, uint32_t ranks_per_node) {
  const uint32_t world = std::max(1u, plan.world_size);
  if (ranks_per_node == 0) ranks_per_node = plan.ranks_per_node;
  const uint32_t per_node = ranks_per_node == 0 ? world : std::min(ranks_per_node, world);
  const uint32_t first = plan.rank / per_node * per_node;
  return {first, std::min(world, first + per_node)};
}

}  // namespace

bool OrderKey::operator==(const OrderKey& o) const {
  return dataset_id == o.dataset_id && shards == o.shards &&
         std::memcmp(&job, &o.job, sizeof job) == 0;
}

OrderKey MakeOrderKey(uint64_t dataset_id, uint64_t shards, const PlanOptions& plan,
                      uint32_t ranks_per_node, uint64_t epoch, uint64_t position) {
  PlanOptions first = plan;
  first.rank = NodeOf(plan, ranks_per_node).first;
  OrderKey k;
  k.dataset_id = dataset_id;
  k.shards = shards;
  k.job = MakeJobSlot(first, ranks_per_node, epoch, position);
  return k;
}

Result<NeedOrderBuilder> NeedOrderBuilder::Make(uint64_t dataset_id,
                                                std::span<const uint32_t> shard_samples,
                                                const PlanOptions& plan, uint32_t ranks_per_node,
                                                uint64_t epoch, uint64_t position) {
  const NodeRanks node = NodeOf(plan, ranks_per_node);
  if (node.end - node.first > kMaxNodeRanks) {
    return InvalidArgument("cache: " + std::to_string(node.end - node.first) +
                           " ranks on one node; the planned cache tells at most " +
                           std::to_string(kMaxNodeRanks) + " apart");
  }
  // One order for the node's ranks (EpochPlan::ForRank shares it); each
  // rank's need is per window visit. O(ranks x windows), nothing per sample.
  PlanOptions first_po = plan;
  first_po.rank = node.first;
  STOKER_ASSIGN_OR_RETURN(EpochPlan node_plan,
                          EpochPlan::Make(dataset_id, shard_samples, first_po, epoch, position));
  NeedOrderBuilder b;
  b.key_ = MakeOrderKey(dataset_id, shard_samples.size(), plan, ranks_per_node, epoch, position);
  b.ranks_ = node.end - node.first;
  b.local_rank_ = plan.rank - node.first;
  std::vector<std::pair<uint32_t, uint32_t>> all;
  for (uint32_t r = node.first; r < node.end; ++r) {
    STOKER_ASSIGN_OR_RETURN(EpochPlan p, node_plan.ForRank(r));
    b.steps_ = std::max(b.steps_, p.rank_samples());
    std::vector<RankVisit> visits = p.RankVisits();
    uint32_t g = 0;
    while (g < b.groups_.size() && !SameSlots(b.groups_[g].visits, visits)) ++g;
    if (g == b.groups_.size()) {
      b.groups_.push_back({std::move(visits), 0});
    } else {
      auto& mine = b.groups_[g].visits;
      for (size_t i = 0; i < mine.size(); ++i) {
        mine[i].first_step = std::min(mine[i].first_step, visits[i].first_step);
      }
    }
    b.group_of_.push_back(g);
  }
  for (Group& g : b.groups_) {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    AppendRanges(g.visits, &ranges);
    g.reads = Covered(ranges);
    AppendRanges(g.visits, &all);
  }
  b.needed_ = Covered(std::move(all));
  b.shard_at_.resize(shard_samples.size());
  for (uint32_t k = 0; k < b.shard_at_.size(); ++k) b.shard_at_[k] = node_plan.ShardAtSlot(k);
  uint64_t reads[kMaxNodeRanks] = {};
  for (size_t g = 0; g < b.groups_.size(); ++g) reads[g] = b.groups_[g].reads;
  b.bytes_ = LayoutOf(shard_samples.size(), b.needed_, uint32_t(b.groups_.size()), reads).bytes;
  return b;
}

void NeedOrderBuilder::Write(std::span<std::byte> out) const {
  const uint64_t shards = key_.shards;
  const uint32_t groups = uint32_t(groups_.size());
  OrderHeader h{};
  h.magic = kOrderMagic;
  h.bytes = bytes_;
  h.dataset_id = key_.dataset_id;
  h.shards = shards;
  h.steps = steps_;
  h.needed = needed_;
  h.ranks = ranks_;
  h.groups = groups;
  h.job = key_.job;
  for (uint32_t r = 0; r < ranks_; ++r) h.group_of[r] = group_of_[r];
  for (uint32_t g = 0; g < groups; ++g) h.reads[g] = groups_[g].reads;
  const Layout l = LayoutOf(shards, needed_, groups, h.reads);
  std::byte* base = out.data();
  std::memset(base, 0, kOrderHeaderBytes);
  auto* first_step = reinterpret_cast<uint64_t*>(base + l.first_step);
  auto* slot_of = reinterpret_cast<uint32_t*>(base + l.slot_of);
  auto* sequence = reinterpret_cast<uint32_t*>(base + l.sequence);
  std::fill(first_step, first_step + shards, kNever);
  // The one write per shard in shard order; all else goes in slot order.
  for (uint32_t k = 0; k < shards; ++k) slot_of[shard_at_[k]] = k;
  // With one group whose visits begin at rising steps (the usual case), the
  // sequence is its reads' order with each visit's new shards sorted: a
  // shard's first step is that of the first visit that reads it.
  bool rising = groups == 1;
  for (size_t i = 1; rising && i < groups_[0].visits.size(); ++i) {
    rising = groups_[0].visits[i].first_step > groups_[0].visits[i - 1].first_step;
  }
  for (uint32_t g = 0; g < groups; ++g) {
    auto* rank_first = reinterpret_cast<uint32_t*>(base + l.rank_first[g]);
    auto* rank_order = reinterpret_cast<uint32_t*>(base + l.rank_order[g]);
    std::fill(rank_first, rank_first + shards, kNoStep);
    uint32_t n = 0;
    for (const RankVisit& v : groups_[g].visits) {
      const uint32_t run = n;
      for (uint32_t k = v.first_slot; k < v.end_slot; ++k) {
        first_step[k] = std::min(first_step[k], v.first_step);
        // A rank whose padding wraps around visits the first windows again:
        // their shards come where it first reads them.
        if (rank_first[k] != kNoStep) continue;
        rank_first[k] = n;
        rank_order[n++] = shard_at_[k];
      }
      if (rising) {
        std::copy(rank_order + run, rank_order + n, sequence + run);
        std::sort(sequence + run, sequence + n);
      }
    }
  }
  if (!rising) {
    // By first step, ties by shard number: sorting (step, shard) pairs reads
    // them in place.
    std::vector<std::pair<uint64_t, uint32_t>> by_step;
    by_step.reserve(needed_);
    for (uint32_t k = 0; k < shards; ++k) {
      if (first_step[k] != kNever) by_step.emplace_back(first_step[k], shard_at_[k]);
    }
    std::sort(by_step.begin(), by_step.end());
    for (size_t i = 0; i < by_step.size(); ++i) sequence[i] = by_step[i].second;
  }
  // The pads after arrays of an odd count of u32 (checksummed too).
  auto pad = [&](uint64_t at, uint64_t count) {
    std::memset(base + at + 4 * count, 0, Align8(4 * count) - 4 * count);
  };
  pad(l.slot_of, shards);
  pad(l.sequence, needed_);
  for (uint32_t g = 0; g < groups; ++g) {
    pad(l.rank_first[g], shards);
    pad(l.rank_order[g], h.reads[g]);
  }
  std::memcpy(base, &h, sizeof h);
  h.checksum = Checksum(out);
  std::memcpy(base, &h, sizeof h);
}

Result<NeedOrder> NeedOrder::FromBytes(std::span<const std::byte> bytes,
                                       std::shared_ptr<const void> backing, const OrderKey& key,
                                       uint32_t local_rank) {
  if (bytes.size() < kOrderHeaderBytes) {
    return Corruption(std::to_string(bytes.size()) + " bytes, less than an order's header");
  }
  OrderHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kOrderMagic) return Corruption("not a need order of this version (magic)");
  if (h.bytes != bytes.size()) {
    return Corruption("its header says " + std::to_string(h.bytes) + " bytes, it has " +
                      std::to_string(bytes.size()));
  }
  OrderKey had;
  had.dataset_id = h.dataset_id;
  had.shards = h.shards;
  had.job = h.job;
  if (!(had == key)) {
    return Corruption("the order of another plan, epoch or position (epoch " +
                      std::to_string(h.job.epoch) + ", position " + std::to_string(h.job.position) +
                      ")");
  }
  if (h.ranks == 0 || h.ranks > kMaxNodeRanks || h.groups == 0 || h.groups > h.ranks ||
      local_rank >= h.ranks || h.needed > h.shards) {
    return Corruption("ranks " + std::to_string(h.ranks) + ", groups " + std::to_string(h.groups) +
                      ", needed " + std::to_string(h.needed) + ": out of range");
  }
  for (uint32_t r = 0; r < h.ranks; ++r) {
    if (h.group_of[r] >= h.groups) return Corruption("rank " + std::to_string(r) + "'s group");
  }
  for (uint32_t g = 0; g < h.groups; ++g) {
    if (h.reads[g] > h.shards) return Corruption("group " + std::to_string(g) + "'s reads");
  }
  if (LayoutOf(h.shards, h.needed, h.groups, h.reads).bytes != h.bytes) {
    return Corruption("its arrays do not add up to its size");
  }
  if (Checksum(bytes) != h.checksum) return Corruption("checksum mismatch");
  NeedOrder o;
  o.key_ = key;
  o.steps_ = h.steps;
  o.ranks_ = h.ranks;
  o.local_rank_ = local_rank;
  const Layout l = LayoutOf(h.shards, h.needed, h.groups, h.reads);
  const std::byte* base = bytes.data();
  o.first_step_ = {reinterpret_cast<const uint64_t*>(base + l.first_step), h.shards};
  o.slot_of_ = {reinterpret_cast<const uint32_t*>(base + l.slot_of), h.shards};
  o.sequence_ = {reinterpret_cast<const uint32_t*>(base + l.sequence), h.needed};
  o.group_of_.assign(h.group_of, h.group_of + h.ranks);
  for (uint32_t g = 0; g < h.groups; ++g) {
    o.rank_first_.emplace_back(reinterpret_cast<const uint32_t*>(base + l.rank_first[g]),
                               h.shards);
    o.rank_order_.emplace_back(reinterpret_cast<const uint32_t*>(base + l.rank_order[g]),
                               h.reads[g]);
  }
  o.backing_ = std::move(backing);
  return o;
}

Result<NeedOrder> NeedOrderBuilder::Build() const {
  // Not value-initialised: Write fills every byte.
  std::shared_ptr<std::byte[]> bytes(new std::byte[bytes_]);
  const std::span<std::byte> span(bytes.get(), bytes_);
  Write(span);
  return NeedOrder::FromBytes(span, std::move(bytes), key_, local_rank_);
}

Result<NeedOrder> NeedOrder::Compute(uint64_t dataset_id, std::span<const uint32_t> shard_samples,
                                     const PlanOptions& plan, uint32_t ranks_per_node,
                                     uint64_t epoch, uint64_t position) {
  STOKER_ASSIGN_OR_RETURN(NeedOrderBuilder b,
                          NeedOrderBuilder::Make(dataset_id, shard_samples, plan, ranks_per_node,
                                                 epoch, position));
  return b.Build();
}

}  // namespace stoker::cache_internal
