// The loader's schedule: what one epoch of one rank needs from storage,
// computed once from the plan before anything is read (internal).
//
// The rank reads the plan's windows in order (EpochPlan::RankVisits): each
// visit of a window is one use of each of its shards, alive from the visit's
// first batch to its last. Shard uses are listed in read order; a batch needs
// the uses of the visits its steps fall in, a contiguous range. Memory is
// O(shards) (a use per shard per visit), nothing per sample: a sample's use
// is found from its step and its shard's slot. Immutable once built, so every
// stage reads it without locks.
#pragma once

#include <cstdint>
#include <vector>

#include "stoker/format.h"
#include "stoker/plan.h"

namespace stoker {

// One shard this rank reads in the epoch.
struct ShardUse {
  uint32_t shard = 0;
  uint64_t first_batch = 0;
  uint64_t last_batch = 0;
  uint32_t batches = 0;  // batches that wait on it (last - first + 1)
};

// Uses [begin, end) of `Schedule::uses`, iterable.
struct UseRange {
  struct Iterator {
    uint32_t u;
    uint32_t operator*() const { return u; }
    Iterator& operator++() {
      ++u;
      return *this;
    }
    bool operator!=(const Iterator& o) const { return u != o.u; }
  };
  uint32_t first = 0, last = 0;
  Iterator begin() const { return {first}; }
  Iterator end() const { return {last}; }
  size_t size() const { return last - first; }
};

struct Schedule {
  std::vector<ShardUse> uses;  // in read order
  // The rank's window visits, and the index of each one's first use.
  std::vector<RankVisit> visits;
  std::vector<uint32_t> visit_use;
  uint64_t batch_size = 1;
  uint64_t rank_samples = 0;

  // The uses batch b waits on.
  UseRange BatchUses(uint64_t b) const;
  // The use that holds step j's sample, whose shard is at `slot` of the plan.
  uint32_t UseOf(uint64_t j, uint32_t slot) const;

  // The most uses alive at any one batch (a use is alive from its first batch
  // to its last): the shard slots the source needs to never wait on itself.
  uint64_t MaxLiveShards() const;
};

Schedule BuildSchedule(const EpochPlan& plan);

}  // namespace stoker
