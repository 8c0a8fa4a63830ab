// How much memory the loader takes, and how it splits it (internal).
//
// Memory goes to shard slots (each the size of the largest shard, or of the
// largest header + index with per-sample reads) and to batches built ahead.
// The schedule fixes the slots one epoch needs at the least (its most shards
// alive at one batch); the rest is overlap: reads ahead and batches ahead.
//
// An explicit LoaderOptions::memory_budget is obeyed: a plan that does not fit
// is refused, naming what it needs. memory_budget 0 (automatic) sizes from the
// plan and the machine instead; see PlanMemory.
#pragma once

#include <cstdint>

#include "stoker/status.h"

namespace stoker {

// Automatic budget: at most this share of the memory available
// (/proc/meminfo MemAvailable) for the overlap, and never more than
// kAutoBudgetCap for it...
inline constexpr uint64_t kAutoBudgetShareDivisor = 4;  // a quarter
inline constexpr uint64_t kAutoBudgetCap = 16ull << 30;
// ...while what one batch and the schedule's shards need at the least may
// take up to this share of it (the rest stays for the training process).
inline constexpr uint64_t kAutoBudgetMaxPercent = 80;

struct MemoryNeeds {
  uint64_t budget = 0;            // LoaderOptions::memory_budget; 0: automatic
  uint64_t slot_bytes = 0;        // one shard slot
  uint64_t live_shards = 0;       // Schedule::MaxLiveShards
  uint64_t reads_ahead = 0;       // shard slots worth having beyond live_shards
  uint64_t batch_bytes = 0;       // the largest batch the layout can produce
  uint32_t prefetch = 1;          // LoaderOptions::prefetch_batches (at least 1)
  uint64_t max_sample_bytes = 0;  // for messages
  uint64_t batch_size = 0;        // for messages
};

struct MemoryPlan {
  uint64_t budget = 0;    // what the loader may hold in shard and batch buffers
  uint64_t slots = 0;     // shard slots, at least live_shards
  uint32_t prefetch = 1;  // batches built ahead (shrunk to fit when automatic)
};

// `available`: the machine's available memory (MachineAvailableMemory()).
// Explicit budget: InvalidArgument "memory_budget N MiB is too small ..."
// when the slots the schedule needs do not fit. Automatic: the plan's full
// overlap, within a bounded share of `available`; when that is not enough,
// fewer reads ahead and a shallower prefetch, down to one batch ahead;
// InvalidArgument naming the sample size and the memory needed only when the
// least the schedule needs exceeds kAutoBudgetMaxPercent of `available`.
Result<MemoryPlan> PlanMemory(const MemoryNeeds& needs, uint64_t available);

// MemAvailable from /proc/meminfo; else physical pages x page size.
uint64_t MachineAvailableMemory();

}  // namespace stoker
