// The planned policy's view of the node: the need order of this epoch and
// the next (need_order.h) of this process's job and of the other jobs
// planning the same dataset's cache (jobs.h), this rank's place in the node,
// and from the folder's tables each job's ranks' progress and which of them
// have read a shard, so that a shard's next use is the soonest of the ranks
// of any job that still need it, each from where it is (ranks drift apart
// within an epoch: one rank's progress says little about the others').
//
// Thread safety: Begin, Unplanned, Current and SetOthers may be called from any
// thread; the functions that take a FolderTables run under its lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "cache/folder.h"
#include "cache/need_order.h"

namespace stoker::cache_internal {

class Planner {
 public:
  Planner(uint64_t dataset_id, std::vector<uint32_t> shard_samples, uint32_t ranks_per_node)
      : dataset_id_(dataset_id),
        shard_samples_(std::move(shard_samples)),
        ranks_per_node_(ranks_per_node) {}

  // One job's orders in one epoch, and its slot in the table.
  struct JobView {
    std::shared_ptr<const NeedOrder> cur, next;
    uint64_t epoch = 0;
    uint32_t job = 0;
  };
  // This process's job's orders (cur, next, epoch, job) and the other
  // jobs', fixed for one decision.
  struct View : JobView {
    std::vector<JobView> others;
    uint64_t generation = 0;
    explicit operator bool() const { return cur != nullptr; }
  };

  // This process's epoch, its job in table slot `job`.
  Status Begin(const PlanOptions& plan, uint64_t epoch, uint64_t position, uint32_t job);
  // No slot for this job: Current() is empty (the cache evicts LRU).
  void Unplanned();
  View Current() const;
  // The other jobs' orders, computed from their slots (jobs.h); a job whose
  // epoch or plan is unchanged keeps the orders it has. A job whose plan
  // cannot be followed (NeedOrder::Compute's error, returned) is left out.
  Status SetOthers(const std::vector<std::pair<uint32_t, JobSlot>>& slots);
  // Blocks until the plan or this rank's progress changes since `seen` (or
  // `timeout`, or Stop); false once stopped.
  bool WaitForChange(uint64_t* seen, std::chrono::milliseconds timeout);
  void Stop();

  // Under the folder lock: this rank has read shard s.
  void OnRead(const View& v, FolderTables& t, uint32_t s);
  // Under the folder lock: steps until the node's ranks of any job next
  // need s (the Belady key); without this rank's own need when `after_mine`
  // (a read in hand: its next use after this one). *this_epoch: whether a
  // rank still needs s in its job's epoch (else its use is a next epoch's,
  // or kNever).
  static uint64_t NextUse(const View& v, const FolderTables& t, uint32_t s, bool after_mine,
                          bool* this_epoch = nullptr);
  // The same for one job's ranks.
  static uint64_t JobNextUse(const JobView& v, const FolderTables& t, uint32_t s,
                             bool after_mine, bool* this_epoch);
  // What the last Ahead saw, so that the next need not scan again what
  // cannot have changed while the table's `dropped` count stood still: no
  // shard this epoch's ranks need was absent from `clean_from` on in the
  // node's sequence, nor (next_clean) one the next epoch's ranks need.
  // Without it a cache holding every shard scanned both epochs' sequences
  // at every read (100,000 shards: 9.4 s an epoch, 8 ranks).
  struct AheadMemo {
    uint64_t generation = ~uint64_t(0);
    uint64_t dropped = 0;
    size_t clean_from = 0;
    bool next_clean = false;
  };
  // Under the folder lock: up to n shards not in the cache that this job's
  // ranks on the node need next, soonest first (this epoch's, then the
  // next's).
  static std::vector<uint32_t> Ahead(const View& v, const FolderTables& t, uint32_t n,
                                     AheadMemo* memo);

 private:
  static uint32_t Tag(const JobView& v) { return uint32_t(v.epoch + 1); }

  struct Other {
    JobSlot slot;
    JobView view;
  };

  const uint64_t dataset_id_;
  const std::vector<uint32_t> shard_samples_;
  const uint32_t ranks_per_node_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  View view_;
  std::vector<Other> others_;
  uint64_t changes_ = 0;
  bool stop_ = false;
};

}  // namespace stoker::cache_internal
