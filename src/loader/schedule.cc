#include "loader/schedule.h"

#include <algorithm>

namespace stoker {
namespace {

// The visit that holds step j (visits partition the steps, in order).
size_t VisitOf(const std::vector<RankVisit>& visits, uint64_t j) {
  auto it = std::upper_bound(visits.begin(), visits.end(), j,
                             [](uint64_t step, const RankVisit& v) { return step < v.first_step; });
  return size_t(it - visits.begin()) - 1;
}

}  // namespace

UseRange Schedule::BatchUses(uint64_t b) const {
  const uint64_t first = b * batch_size;
  if (first >= rank_samples || visits.empty()) return {};
  const uint64_t last = std::min(rank_samples, first + batch_size) - 1;
  const size_t lo = VisitOf(visits, first), hi = VisitOf(visits, last);
  return {visit_use[lo], visit_use[hi] + (visits[hi].end_slot - visits[hi].first_slot)};
}

uint32_t Schedule::UseOf(uint64_t j, uint32_t slot) const {
  const size_t v = VisitOf(visits, j);
  return visit_use[v] + (slot - visits[v].first_slot);
}

uint64_t Schedule::MaxLiveShards() const {
  // Uses come in visit order, so both their first and their last batches
  // ascend: the most alive at once is found at some use's first batch, with
  // two pointers.
  uint64_t best = 0;
  size_t ended = 0;
  for (size_t i = 0; i < uses.size();) {
    const uint64_t b = uses[i].first_batch;
    size_t started = i;
    while (started < uses.size() && uses[started].first_batch == b) ++started;
    while (ended < started && uses[ended].last_batch < b) ++ended;
    best = std::max<uint64_t>(best, started - ended);
    i = started;
  }
  return best;
}

Schedule BuildSchedule(const EpochPlan& p) {
  Schedule s;
  s.batch_size = p.batch_size();
  s.rank_samples = p.rank_samples();
  s.visits = p.RankVisits();
  s.visit_use.reserve(s.visits.size());
  for (const RankVisit& v : s.visits) {
    s.visit_use.push_back(uint32_t(s.uses.size()));
    const uint64_t first_batch = v.first_step / s.batch_size;
    const uint64_t last_batch = v.last_step / s.batch_size;
    for (uint32_t k = v.first_slot; k < v.end_slot; ++k) {
      s.uses.push_back(
          {p.ShardAtSlot(k), first_batch, last_batch, uint32_t(last_batch - first_batch + 1)});
    }
  }
  return s;
}

}  // namespace stoker
