#include "cache/ranking.h"

#include <algorithm>
#include <limits>

namespace stoker::cache_internal {
namespace {

constexpr uint32_t kGone = std::numeric_limits<uint32_t>::max();

}  // namespace

bool EvictionRanking::Stale(const Planner::View& v, const FolderTables& t) const {
  if (bool(v) != planned_) return true;
  if (!planned_) return false;  // LRU: kept until it runs out (a used shard is dropped)
  // A small ranking costs little to build: built for every fetch once the
  // node has read anything since.
  const uint64_t refresh = order_.size() < 256 ? 0 : order_.size() / 32;
  return v.generation != generation_ || t.header().tick - built_tick_ > refresh;
}

void EvictionRanking::Build(const Planner::View& v, const FolderTables& t) {
  order_.clear();
  planned_ = bool(v);
  for (uint32_t x = 0; x < t.shards(); ++x) {
    const Entry& e = t.At(x);
    if (e.state != kPresent) continue;
    if (planned_) {
      bool now;
      const uint64_t use = Planner::NextUse(v, t, x, false, &now);
      order_.push_back({x, use, !now, false});
    } else {
      order_.push_back({x, e.last_use, false, true});
    }
  }
  if (planned_) {
    // Not needed again this epoch first, then the rest; each furthest first.
    std::sort(order_.begin(), order_.end(), [](const Candidate& a, const Candidate& b) {
      return a.far != b.far ? a.far : a.rank > b.rank;
    });
    far_end_ = size_t(std::find_if(order_.begin(), order_.end(),
                                   [](const Candidate& c) { return !c.far; }) -
                      order_.begin());
  } else {
    std::sort(order_.begin(), order_.end(),
              [](const Candidate& a, const Candidate& b) { return a.rank < b.rank; });
    far_end_ = order_.size();
  }
  far_at_ = 0;
  near_at_ = far_end_;
  generation_ = v.generation;
  built_tick_ = t.header().tick;
  built_ = true;
  builds_++;
}

std::vector<Candidate> EvictionRanking::Take(const Planner::View& v, const FolderTables& t,
                                             const std::vector<uint64_t>& shard_bytes, uint32_t s,
                                             uint64_t mine, uint64_t need) {
  bool fresh = false;
  if (!built_ || Stale(v, t)) {
    Build(v, t);
    fresh = true;
  }
  std::vector<Candidate> out;
  uint64_t got = 0;
  // Two more than the bytes need, for a candidate a reader holds (pinned:
  // Space skips it) or another process evicts first.
  size_t spare = 0;
  auto enough = [&] { return got >= need && spare >= 2; };
  // Walks [*at, end): false when it stops at a shard needed no later than s
  // (the ones after it in this part are about as near: the read is declined
  // there, as MIN declines it).
  auto walk = [&](size_t* at, size_t end) {
    for (size_t i = *at; i < end && !enough(); ++i) {
      Candidate& c = order_[i];
      if (c.shard != kGone && c.shard != s) {
        const Entry& e = t.At(c.shard);
        if (e.state != kPresent || (!planned_ && e.last_use != c.rank)) {
          c.shard = kGone;  // evicted, or used since (LRU: it is recent now)
        } else if (planned_) {
          bool now;
          const uint64_t use = Planner::NextUse(v, t, c.shard, false, &now);
          if (use <= mine) return false;
          out.push_back({c.shard, use, !now, false});
          if (got >= need) spare++;
          got += shard_bytes[c.shard];
        } else {
          out.push_back(c);
          if (got >= need) spare++;
          got += shard_bytes[c.shard];
        }
      }
      if (i == *at && c.shard == kGone) ++*at;
    }
    return true;
  };
  for (int pass = 0; pass < 2; ++pass) {
    const bool far_ran_out = walk(&far_at_, far_end_);
    const bool ran_out = walk(&near_at_, order_.size()) && far_ran_out;
    if (got >= need || !ran_out || fresh) break;
    out.clear();  // ran out on an old ranking: once more on a new one
    got = 0;
    spare = 0;
    Build(v, t);
    fresh = true;
  }
  return out;
}

}  // namespace stoker::cache_internal
