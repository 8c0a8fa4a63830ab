#include "cache/jobs.h"

namespace stoker::cache_internal {
namespace {

uint64_t Mix(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 0x100000001b3ull;  // FNV-1a
  }
  return h;
}

}  // namespace

JobSlot MakeJobSlot(const PlanOptions& plan, uint32_t ranks_per_node, uint64_t epoch,
                    uint64_t position) {
  JobSlot j{};
  j.seed = plan.seed;
  j.epoch = epoch;
  j.position = position;
  j.window = plan.shuffle_window_shards;
  j.batch_size = plan.batch_size;
  j.world_size = plan.world_size;
  j.rank = plan.rank;
  j.ranks_per_node = ranks_per_node;
  j.plan_ranks_per_node = plan.ranks_per_node;
  j.flags = (plan.shuffle ? 1u : 0u) | (plan.drop_last ? 2u : 0u) | (plan.node_affinity ? 4u : 0u);
  const uint32_t per_node = ranks_per_node ? ranks_per_node : plan.ranks_per_node;
  const uint32_t node = per_node ? plan.rank / per_node : 0;
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t v : {j.seed, uint64_t(j.window), uint64_t(j.batch_size), uint64_t(j.world_size),
                     uint64_t(j.ranks_per_node), uint64_t(j.plan_ranks_per_node),
                     uint64_t(j.flags), uint64_t(node)}) {
    h = Mix(h, v);
  }
  j.identity = h ? h : 1;
  return j;
}

PlanOptions PlanOfJob(const JobSlot& j) {
  PlanOptions p;
  p.seed = j.seed;
  p.shuffle = j.flags & 1;
  p.drop_last = j.flags & 2;
  p.node_affinity = j.flags & 4;
  p.shuffle_window_shards = j.window;
  p.batch_size = j.batch_size;
  p.world_size = j.world_size;
  p.rank = j.rank;
  p.ranks_per_node = j.plan_ranks_per_node;
  return p;
}

bool JobSlots::Alive(uint32_t j) const {
  ByteLock probe;  // exclusive: granted only when no process holds it shared
  auto got = probe.Lock(path_, j, /*exclusive=*/true, /*wait=*/false);
  return !got.ok() || !*got;
}

Result<int> JobSlots::Claim(const FolderTables& t, const JobSlot& mine) {
  int found = -1;
  for (uint32_t j = 0; j < kTableJobs && found < 0; ++j) {
    if (t.Job(j).identity == mine.identity) found = int(j);
  }
  for (uint32_t j = 0; j < kTableJobs && found < 0; ++j) {
    if (t.Job(j).identity == 0 || !Alive(j)) {
      found = int(j);
      // A slot never taken since the table was cleared is clear.
      if (t.Job(j).identity != 0) t.ClearJob(j);
    }
  }
  if (found < 0) return -1;
  if (found != slot_) {
    STOKER_ASSIGN_OR_RETURN(bool got, held_.Lock(path_, uint64_t(found), false, /*wait=*/true));
    if (!got) return -1;
    slot_ = found;
  }
  t.Job(uint32_t(found)) = mine;
  return found;
}

std::vector<std::pair<uint32_t, JobSlot>> JobSlots::Others(const FolderTables& t) const {
  std::vector<std::pair<uint32_t, JobSlot>> out;
  for (uint32_t j = 0; j < kTableJobs; ++j) {
    if (int(j) == slot_ || t.Job(j).identity == 0 || !Alive(j)) continue;
    out.emplace_back(j, t.Job(j));
  }
  return out;
}

}  // namespace stoker::cache_internal
