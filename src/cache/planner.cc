#include "cache/planner.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include "cache/jobs.h"

namespace stoker::cache_internal {
namespace {

// The nice value of the thread preparing the next epoch's order (the
// loader's threads run at 0): about a tenth of a core's share where they
// want every core.
constexpr int kPreparerNice = 10;

}  // namespace

Planner::~Planner() { JoinPreparer(); }

void Planner::JoinPreparer() {
  if (preparer_.joinable()) preparer_.join();
}

Result<std::shared_ptr<const NeedOrder>> Planner::Order(const PlanOptions& plan,
                                                        uint32_t ranks_per_node, uint64_t epoch,
                                                        uint64_t position) {
  if (orders_) {
    return orders_->Get(dataset_id_, shard_samples_, plan, ranks_per_node, epoch, position);
  }
  STOKER_ASSIGN_OR_RETURN(NeedOrder o, NeedOrder::Compute(dataset_id_, shard_samples_, plan,
                                                          ranks_per_node, epoch, position));
  return std::make_shared<const NeedOrder>(std::move(o));
}

Status Planner::Begin(const PlanOptions& plan, uint64_t epoch, uint64_t position,
                      uint32_t job) {
  const OrderKey key = MakeOrderKey(dataset_id_, shard_samples_.size(), plan, ranks_per_node_,
                                    epoch, position);
  std::shared_ptr<const NeedOrder> cur;
  {
    std::unique_lock lock(mu_);
    if (prepared_ && prepared_->key == key) {  // the last epoch's next: this one's
      cv_.wait(lock, [&] { return prepared_->done; });
      cur = prepared_->order;
    }
  }
  JoinPreparer();  // done, or (a jump to another epoch) no longer wanted
  auto next = std::make_shared<Prepared>();
  next->key = MakeOrderKey(dataset_id_, shard_samples_.size(), plan, ranks_per_node_, epoch + 1, 0);
  // Nothing prepared (the first epoch, a resume, a jump): both now, as the
  // epoch's start waits anyway. Else only the next epoch's remains, to be
  // made while this epoch runs.
  const bool both_now = cur == nullptr;
  if (both_now) {
    STOKER_ASSIGN_OR_RETURN(cur, Order(plan, ranks_per_node_, epoch, position));
    // An error here (one this epoch's order would have met first) leaves
    // next empty.
    auto o = Order(plan, ranks_per_node_, epoch + 1, 0);
    next->done = true;
    if (o.ok()) next->order = std::move(*o);
  }
  uint64_t begun;
  {
    std::lock_guard lock(mu_);
    // The last epoch's orders go now, before the next one's is made: no
    // more than this epoch's and the next's are alive at once.
    view_.cur = std::move(cur);
    view_.next = next->order;
    view_.epoch = epoch;
    view_.job = job;
    view_.generation++;
    changes_++;
    prepared_ = next;
    begun = ++begun_;
  }
  cv_.notify_all();
  if (both_now) return Status::Ok();
  preparer_ = std::thread([this, next, plan, epoch, begun] {
    // Background work: behind the loader's threads for the cores (the
    // next epoch's start finds it done unless the epoch is shorter than
    // computing one order, then it waits for it).
    (void)setpriority(PRIO_PROCESS, pid_t(gettid()), kPreparerNice);
    auto o = Order(plan, ranks_per_node_, epoch + 1, 0);
    {
      std::lock_guard lock(mu_);
      next->done = true;
      if (o.ok()) next->order = *o;
      if (o.ok() && begun_ == begun) {
        view_.next = *o;
        view_.generation++;
        changes_++;
      }
    }
    cv_.notify_all();
  });
  return Status::Ok();
}

void Planner::AwaitNext() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !prepared_ || prepared_->done; });
}

void Planner::Unplanned() {
  std::lock_guard lock(mu_);
  view_.cur = view_.next = nullptr;
  view_.generation++;
  changes_++;
  begun_++;
}

Status Planner::SetOthers(const std::vector<std::pair<uint32_t, JobSlot>>& slots) {
  std::vector<Other> others;
  Status failed;
  bool changed;
  {
    std::lock_guard lock(mu_);
    changed = slots.size() != others_.size();
  }
  for (const auto& [job, slot] : slots) {
    Other o{slot, {}};
    {
      std::lock_guard lock(mu_);
      for (const Other& had : others_) {
        if (had.view.job == job && had.slot.identity == slot.identity &&
            had.slot.epoch == slot.epoch && had.slot.position == slot.position) {
          o.view = had.view;
        }
      }
    }
    if (!o.view.cur) {  // new, or in another epoch: its orders, outside the lock
      changed = true;
      const PlanOptions plan = PlanOfJob(slot);
      // Mapped from that job's files, where its processes wrote them.
      auto cur = Order(plan, slot.ranks_per_node, slot.epoch, slot.position);
      auto next = Order(plan, slot.ranks_per_node, slot.epoch + 1, 0);
      if (!cur.ok() || !next.ok()) {  // a plan this process cannot follow: left out
        failed = cur.ok() ? next.status() : cur.status();
        continue;
      }
      o.view.cur = std::move(*cur);
      o.view.next = std::move(*next);
      o.view.epoch = slot.epoch;
      o.view.job = job;
    }
    others.push_back(std::move(o));
  }
  if (!changed) return failed;
  std::lock_guard lock(mu_);
  others_ = std::move(others);
  view_.others.clear();
  for (const Other& o : others_) view_.others.push_back(o.view);
  view_.generation++;
  return failed;
}

Planner::View Planner::Current() const {
  std::lock_guard lock(mu_);
  return view_;
}

bool Planner::WaitForChange(uint64_t* seen, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return stop_ || (view_ && changes_ != *seen); });
  *seen = changes_;
  return !stop_;
}

void Planner::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  JoinPreparer();
}

void Planner::OnRead(const View& v, FolderTables& t, uint32_t s) {
  const NeedOrder& c = *v.cur;
  const uint32_t step = c.RankFirst(c.local_rank(), s);
  if (step == kNoStep) return;  // not this rank's shard in this epoch
  RankProgress& p = t.Progress(v.job, c.local_rank());
  if (p.epoch_tag != Tag(v)) p = {Tag(v), 0};
  p.step = std::max(p.step, step);
  ReadMarks& m = t.Marks(v.job, s);
  if (m.epoch_tag != Tag(v)) m = {Tag(v), 0};
  m.mask |= uint64_t(1) << c.local_rank();
  bool done = true;
  for (uint32_t r = 0; r < c.ranks() && done; ++r) {
    done = c.RankFirst(r, s) == kNoStep || (m.mask >> r & 1);
  }
  {
    std::lock_guard lock(mu_);
    changes_++;
  }
  cv_.notify_all();
  if (done) t.At(s).soon = 0;
}

uint64_t Planner::NextUse(const View& v, const FolderTables& t, uint32_t s, bool after_mine,
                          bool* this_epoch) {
  bool now = false;
  uint64_t best = JobNextUse(v, t, s, after_mine, &now);
  for (const JobView& o : v.others) {
    bool theirs = false;
    best = std::min(best, JobNextUse(o, t, s, false, &theirs));
    now = now || theirs;
  }
  if (this_epoch) *this_epoch = now;
  return best;
}

uint64_t Planner::JobNextUse(const JobView& v, const FolderTables& t, uint32_t s,
                             bool after_mine, bool* this_epoch) {
  const NeedOrder& c = *v.cur;
  const ReadMarks& m = t.Marks(v.job, s);
  uint64_t read = m.epoch_tag == Tag(v) ? m.mask : 0;
  if (after_mine) read |= uint64_t(1) << c.local_rank();
  uint64_t best = kNever;
  for (uint32_t r = 0; r < c.ranks(); ++r) {
    const uint32_t step = c.RankFirst(r, s);
    if (step == kNoStep || (read >> r & 1)) continue;
    const RankProgress& p = t.Progress(v.job, r);
    if (p.epoch_tag > Tag(v)) continue;  // it has moved on to a later epoch
    const uint64_t at = p.epoch_tag == Tag(v) ? p.step : 0;
    best = std::min<uint64_t>(best, step > at ? step - at : 0);
  }
  if (this_epoch) *this_epoch = best != kNever;
  if (best != kNever || !v.next) return best;
  // Needed next in the next epoch: the reads each rank has left in this one,
  // then its reads there until s.
  for (uint32_t r = 0; r < c.ranks() && r < v.next->ranks(); ++r) {
    const uint32_t there = v.next->RankFirst(r, s);
    if (there == kNoStep) continue;
    const RankProgress& p = t.Progress(v.job, r);
    const uint64_t at = p.epoch_tag == Tag(v) ? p.step + 1 : 0;
    const uint64_t left = c.RankOrder(r).size() > at ? c.RankOrder(r).size() - at : 0;
    best = std::min<uint64_t>(best, left + there + 1);
  }
  return best;
}

std::vector<uint32_t> Planner::Ahead(const View& v, const FolderTables& t, uint32_t n,
                                       AheadMemo* memo) {
  const NeedOrder& c = *v.cur;
  // From the slowest rank's place in the node's order (the first step of the
  // shard it reads now).
  uint64_t slowest = kNever;
  for (uint32_t r = 0; r < c.ranks(); ++r) {
    const RankProgress& p = t.Progress(v.job, r);
    const auto order = c.RankOrder(r);
    if (order.empty()) continue;
    const uint32_t k = p.epoch_tag == Tag(v) ? std::min<uint32_t>(p.step, order.size() - 1) : 0;
    slowest = std::min(slowest, c.FirstStep(order[k]));
  }
  if (slowest == kNever) slowest = 0;
  const uint64_t dropped = t.dataset().dropped;
  if (memo->generation != v.generation || memo->dropped != dropped) {
    *memo = {v.generation, dropped, c.sequence().size(), false};
  }
  std::vector<std::pair<uint64_t, uint32_t>> found;
  const auto seq = c.sequence();
  const size_t from = size_t(
      std::lower_bound(seq.begin(), seq.end(), slowest,
                       [&](uint32_t x, uint64_t at) { return c.FirstStep(x) < at; }) -
      seq.begin());
  // A shard absent and needed no more this epoch stays so; one present or
  // being fetched stays so until `dropped` moves.
  size_t i = from, last_absent = from;
  for (; i < memo->clean_from && found.size() < n; ++i) {
    const uint32_t s = seq[i];
    if (t.At(s).state != kAbsent) continue;
    bool now;
    const uint64_t use = JobNextUse(v, t, s, false, &now);
    if (now) {
      found.emplace_back(use, s);
      last_absent = i + 1;
    }
  }
  if (i >= memo->clean_from) memo->clean_from = last_absent;
  if (v.next && !memo->next_clean) {
    size_t k = 0;
    bool absent = false;
    for (; k < v.next->sequence().size() && found.size() < n; ++k) {
      const uint32_t s = v.next->sequence()[k];
      if (t.At(s).state != kAbsent) continue;
      absent = true;  // needed this epoch now, it may be needed only in the next later
      bool now;
      const uint64_t use = JobNextUse(v, t, s, false, &now);
      if (!now && use != kNever) found.emplace_back(use, s);
    }
    memo->next_clean = k == v.next->sequence().size() && !absent;
  }
  std::sort(found.begin(), found.end());
  std::vector<uint32_t> out;
  for (const auto& f : found) out.push_back(f.second);
  return out;
}

}  // namespace stoker::cache_internal
