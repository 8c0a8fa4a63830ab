// This dataset's eviction candidates, ranked once and kept between fetches.
//
// Ranking every present shard at every fetch costs O(shards x ranks) under
// the folder lock: a 30,000-shard dataset through a half-size cache spent 16
// of its 17 s an epoch there (8 ranks, docs/benchmarks.md). The order moves
// slowly: a rank's progress lowers the next use of all the shards it still
// needs alike, so among them the order holds, and the shards it finishes
// move to the back of the epoch. So the ranking is built in full, then
// taken from front to back, each candidate's key read afresh before it is
// offered (a candidate gone, or, under LRU, used since, is dropped), and
// built again once the node has made a 32nd of the ranking's length in
// reads (or the epoch's plan changed, or it ran out). Below 256 present
// shards it is built again at every fetch the node has read since, as
// before.
//
// Thread safety: every call runs under the folder lock.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/folder.h"
#include "cache/planner.h"
#include "cache/space.h"

namespace stoker::cache_internal {

class EvictionRanking {
 public:
  // Candidates among this dataset's present shards, in the policy's order,
  // with fresh keys, whose bytes cover `need` (or all there are): under the
  // planned policy (`v` set) only shards the node needs later than `mine`
  // (the key of the shard being reserved, s); under LRU (no `v`) the least
  // recently used.
  std::vector<Candidate> Take(const Planner::View& v, const FolderTables& t,
                              const std::vector<uint64_t>& shard_bytes, uint32_t s, uint64_t mine,
                              uint64_t need);
  // Times the ranking was built in full.
  uint64_t builds() const { return builds_; }

 private:
  void Build(const Planner::View& v, const FolderTables& t);
  bool Stale(const Planner::View& v, const FolderTables& t) const;

  std::vector<Candidate> order_;  // far (furthest first), then near; or LRU, oldest first
  size_t far_end_ = 0;            // where the near ones begin
  size_t far_at_ = 0, near_at_ = 0;
  bool built_ = false;
  bool planned_ = false;
  uint64_t generation_ = 0;
  uint64_t built_tick_ = 0;
  uint64_t builds_ = 0;
};

}  // namespace stoker::cache_internal
