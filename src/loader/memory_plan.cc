#include "loader/memory_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

namespace stoker {
namespace {

std::string MiB(uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

Result<MemoryPlan> PlanExplicit(const MemoryNeeds& n) {
  MemoryPlan p;
  p.budget = n.budget;
  p.prefetch = n.prefetch;
  const uint64_t reserve = n.batch_bytes * (n.prefetch + 1);
  p.slots = n.budget > reserve && n.slot_bytes ? (n.budget - reserve) / n.slot_bytes : 0;
  if (n.slot_bytes == 0) p.slots = n.live_shards;
  if (p.slots < n.live_shards) {
    return InvalidArgument(
        "memory_budget " + std::to_string(n.budget >> 20) + " MiB is too small: this plan keeps " +
        std::to_string(n.live_shards) + " shards of up to " + std::to_string(n.slot_bytes >> 10) +
        " KiB alive at once; it needs at least " + MiB(n.live_shards * n.slot_bytes + reserve) +
        " (or a smaller shuffle_window_shards, batch_size or prefetch_batches; memory_budget 0 "
        "sizes it automatically)");
  }
  p.slots = std::min(p.slots, n.live_shards + n.reads_ahead);
  return p;
}

}  // namespace

Result<MemoryPlan> PlanMemory(const MemoryNeeds& n, uint64_t available) {
  if (n.budget != 0) return PlanExplicit(n);
  const uint64_t floor_bytes = n.live_shards * n.slot_bytes;
  const uint64_t least = floor_bytes + 2 * n.batch_bytes;  // one batch ahead, one consumed
  const uint64_t most = available / 100 * kAutoBudgetMaxPercent;
  if (least > most) {
    return InvalidArgument("samples of up to " + MiB(n.max_sample_bytes) +
                           " need more memory than this machine has " + "available: a batch of " +
                           std::to_string(n.batch_size) + " takes up to " + MiB(n.batch_bytes) +
                           " and the shards it reads from " + MiB(floor_bytes) +
                           "; with one batch ahead that is " + MiB(least) + ", over " +
                           std::to_string(kAutoBudgetMaxPercent) + "% of the " + MiB(available) +
                           " available (use a smaller batch_size or shuffle_window_shards)");
  }
  const uint64_t share = std::min(available / kAutoBudgetShareDivisor, kAutoBudgetCap);
  MemoryPlan p;
  p.prefetch = n.prefetch;
  // Shrink the overlap until it fits the share: reads ahead first, then
  // batches ahead; never below what the schedule needs.
  uint64_t ahead = n.reads_ahead;
  auto total = [&] {
    return (n.live_shards + ahead) * n.slot_bytes + n.batch_bytes * (p.prefetch + 1);
  };
  while (total() > share && ahead > 0) ahead /= 2;
  while (total() > share && p.prefetch > 1) p.prefetch--;
  p.slots = n.live_shards + ahead;
  p.budget = std::max(total(), least);
  return p;
}

uint64_t MachineAvailableMemory() {
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
        found = true;
        break;
      }
    }
    std::fclose(f);
    if (found) return uint64_t(kib) << 10;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : (4ull << 30);
}

}  // namespace stoker
