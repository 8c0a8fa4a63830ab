// The loader's schedule: what one epoch of one rank needs from storage,
// computed once from the plan before anything is read (internal).
//
// Shard uses are listed in order of first use, which is the order the shard
// source reads them in; each use knows its first and last batch, and each
// batch the uses it needs. Immutable once built, so every stage reads it
// without locks.
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
  uint32_t batches = 0;  // batches that take samples from it
};

struct Schedule {
  std::vector<ShardUse> uses;  // in order of first use: the read order
  // For each of this rank's samples j: its index into `uses`, and its index
  // within its shard.
  std::vector<uint32_t> use_of_sample;
  std::vector<uint32_t> local_of_sample;
  // The distinct uses of each batch.
  std::vector<std::vector<uint32_t>> batch_uses;

  // The most uses alive at any one batch (a use is alive from its first batch
  // to its last): the shard slots the source needs to never wait on itself.
  uint64_t MaxLiveShards() const;
};

Schedule BuildSchedule(const EpochPlan& plan, const format::Manifest& manifest);

}  // namespace stoker
