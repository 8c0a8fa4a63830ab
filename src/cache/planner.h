// The planned policy's view of the node: the need order of this epoch and
// the next (need_order.h) of this process's job and of the other jobs
// planning the same dataset's cache (jobs.h), this rank's place in the node,
// and from the folder's tables each job's ranks' progress and which of them
// have read a shard, so that a shard's next use is the soonest of the ranks
// of any job that still need it, each from where it is (ranks drift apart
// within an epoch: one rank's progress says little about the others').
//
// Begin takes this epoch's order from the one prepared during the last epoch
// (as that epoch's next) and prepares the next epoch's in the background, at
// a low priority: until it is there, View::next is empty (a shard not needed
// this epoch counts as needed never). With nothing prepared (the first epoch,
// a resume) it computes both. Orders are shared by the node's processes
// through the cache folder (shared_orders.h) when ShareThrough names it.
//
// Thread safety: Begin, Unplanned, Current and SetOthers may be called from any
// thread; the functions that take a FolderTables run under its lock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cache/folder.h"
#include "cache/need_order.h"
#include "cache/shared_orders.h"

namespace stoker::cache_internal {

class Planner {
 public:
  Planner(uint64_t dataset_id, std::vector<uint32_t> shard_samples, uint32_t ranks_per_node)
      : dataset_id_(dataset_id),
        shard_samples_(std::move(shard_samples)),
        ranks_per_node_(ranks_per_node) {}
  ~Planner();
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  // Orders from now on from `orders` (the cache folder's, outliving this);
  // none (the default): computed by this process in memory of its own.
  // Before the first Begin.
  void ShareThrough(SharedOrders* orders) { orders_ = orders; }

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

  // This process's epoch, its job in table slot `job`: this epoch's order
  // now (prepared, or computed), the next's in the background if this one's
  // was prepared, else now too.
  Status Begin(const PlanOptions& plan, uint64_t epoch, uint64_t position, uint32_t job);
  // Blocks until the next epoch's order that Begin started is there (or
  // failed); for tests, which want a View with both.
  void AwaitNext();
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
  // Ends WaitForChange and waits for the next epoch's order, if one is
  // being computed.
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
  // The next epoch's order, computed by `preparer_`.
  struct Prepared {
    OrderKey key;
    std::shared_ptr<const NeedOrder> order;  // null when it failed
    bool done = false;
  };

  Result<std::shared_ptr<const NeedOrder>> Order(const PlanOptions& plan, uint32_t ranks_per_node,
                                                 uint64_t epoch, uint64_t position);
  void JoinPreparer();

  const uint64_t dataset_id_;
  const std::vector<uint32_t> shard_samples_;
  const uint32_t ranks_per_node_;
  SharedOrders* orders_ = nullptr;
  std::thread preparer_;  // joined by Begin and Stop (called by one thread)
  mutable std::mutex mu_;
  std::shared_ptr<Prepared> prepared_;
  uint64_t begun_ = 0;  // Begin and Unplanned calls: the preparer's result is for the last
  std::condition_variable cv_;
  View view_;
  std::vector<Other> others_;
  uint64_t changes_ = 0;
  bool stop_ = false;
};

}  // namespace stoker::cache_internal
