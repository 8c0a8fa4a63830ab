// The jobs planning one dataset's cache on a node. Two jobs reading the same
// dataset with different plans (a seed sweep, two world sizes) read it in
// different orders; with one set of progress and read marks between them the
// planned eviction's keys were neither's (two jobs through a half-size
// cache: 1.8x the optimum). Each job takes a slot in the dataset table,
// keyed by its plan (JobSlot): its own progress and marks, and its plan, from
// which every other job's processes compute its order and count its needs
// in their eviction keys (Planner::NextUse).
//
// A slot is held by a shared OFD lock on its byte of jobs.lock for as long
// as a process of the job runs; the kernel drops it when they die, and a new
// job may then take the slot (cleared). A job finding every slot held by
// another live job evicts least recently used, and says so once.
//
// Thread safety: Claim and Others run under the folder lock.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cache/folder.h"
#include "stoker/plan.h"

namespace stoker::cache_internal {

// A job's slot for `plan` in `epoch` from `position`; `ranks_per_node` is
// the cache's option (0: the plan's). identity: the plan without the epoch
// and without which of the node's ranks (never 0).
JobSlot MakeJobSlot(const PlanOptions& plan, uint32_t ranks_per_node, uint64_t epoch,
                    uint64_t position);
// The plan of the job in `slot` (rank: one of its node's).
PlanOptions PlanOfJob(const JobSlot& slot);

class JobSlots {
 public:
  explicit JobSlots(std::string lock_path) : path_(std::move(lock_path)) {}

  // This process's job's slot: the one with its identity, else a free one
  // or one whose processes are all gone (cleared), held from now on; its
  // epoch and position recorded. -1: every slot is another live job's.
  Result<int> Claim(const FolderTables& t, const JobSlot& mine);
  // The other live jobs' slots, by slot index.
  std::vector<std::pair<uint32_t, JobSlot>> Others(const FolderTables& t) const;

 private:
  bool Alive(uint32_t j) const;

  const std::string path_;
  ByteLock held_;
  int slot_ = -1;
};

}  // namespace stoker::cache_internal
