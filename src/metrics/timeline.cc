// The step timeline: intervals of phases in, one disjoint breakdown per step
// out (to the registry's counters and, as JSON lines, to the run log).
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>

#include "metrics/nvml.h"
#include "metrics/registry.h"

namespace stoker::metrics {

std::string_view PhaseName(Phase p) {
  static constexpr std::string_view kNames[kPhases] = {"data", "h2d", "compute", "comm",
                                                       "checkpoint"};
  return kNames[static_cast<int>(p)];
}

namespace {

// Which phase owns an instant that several intervals cover: communication
// under backward is communication; a checkpoint stall is a stall whatever
// else is timed around it.
constexpr Phase kPriority[kPhases] = {Phase::kComm, Phase::kCheckpoint, Phase::kH2d, Phase::kData,
                                      Phase::kCompute};

double Sec(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double WallNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct StepTimeline::Impl {
  struct Interval {
    Phase phase;
    Clock::time_point begin, end;
  };
  // Intervals come in through a ring that any thread adds to without a lock
  // (a metered loader's Next, the DDP hook's callbacks); Mark drains it.
  // A producer claims a slot with fetch_add and publishes it by writing the
  // slot's sequence number last; a slot overwritten before Mark drains it
  // (more than kRing intervals in one step) is dropped.
  static constexpr uint64_t kRing = 1024;
  struct Slot {
    std::atomic<uint64_t> seq{0};  // claim index + 1 once written
    std::atomic<int> phase{0};
    std::atomic<int64_t> begin{0}, end{0};
  };
  std::unique_ptr<Slot[]> ring = std::make_unique<Slot[]>(kRing);
  std::atomic<uint64_t> head{0};
  uint64_t tail = 0;  // under mu

  std::mutex mu;  // Start, Stop, Mark, SetGpu, Totals: the training loop's calls
  std::vector<Interval> intervals;

  void Drain() {
    const uint64_t h = head.load(std::memory_order_acquire);
    for (uint64_t i = tail; i < h; ++i) {
      Slot& slot = ring[i % kRing];
      // A producer between its claim and its publication: a few instructions.
      uint64_t seq;
      for (int spin = 0; (seq = slot.seq.load(std::memory_order_acquire)) < i + 1; ++spin) {
        if (spin > 1000) break;
      }
      if (seq != i + 1) continue;  // not written yet, or overwritten by a later one
      const Interval iv{
          Phase(slot.phase.load(std::memory_order_relaxed)),
          Clock::time_point(Clock::duration(slot.begin.load(std::memory_order_relaxed))),
          Clock::time_point(Clock::duration(slot.end.load(std::memory_order_relaxed)))};
      if (slot.seq.load(std::memory_order_acquire) != seq) continue;  // overwritten meanwhile
      intervals.push_back(iv);
    }
    tail = h;
  }
  Clock::time_point step_begin;
  double step_begin_wall = 0;
  uint64_t step = 0;
  std::atomic<uint64_t> samples{0}, bytes{0};
  double h2d_copy_last = 0;
  FILE* log = nullptr;
  StepRecord totals;
  int gpu = -1;
  Nvml* nvml = nullptr;
};

StepTimeline::StepTimeline() : impl_(std::make_shared<Impl>()) {}

StepTimeline& StepTimeline::Get() {
  static StepTimeline* t = new StepTimeline();  // never destroyed, like the registry
  return *t;
}

Status StepTimeline::Start(const std::string& run_log) {
  Stop();
  FILE* log = nullptr;
  if (!run_log.empty()) {
    log = std::fopen(run_log.c_str(), "a");
    if (log == nullptr) return ErrnoToStatus(errno, "open run log " + run_log);
  }
  const double h2d = Registry::Get().H2dSecondsNow();
  std::lock_guard lock(impl_->mu);
  Impl& t = *impl_;
  t.intervals.clear();
  t.tail = t.head.load(std::memory_order_acquire);
  t.step = 0;
  t.samples = 0;
  t.bytes = 0;
  t.totals = {};
  t.log = log;
  t.step_begin = Clock::now();
  t.step_begin_wall = WallNow();
  t.h2d_copy_last = h2d;
  active_.store(true);
  return Status::Ok();
}

void StepTimeline::Stop() {
  active_.store(false);
  std::lock_guard lock(impl_->mu);
  if (impl_->log) std::fclose(impl_->log);
  impl_->log = nullptr;
}

void StepTimeline::Add(Phase phase, Clock::time_point begin, Clock::time_point end) {
  if (!active() || end <= begin) return;
  Impl& t = *impl_;
  const uint64_t i = t.head.fetch_add(1, std::memory_order_relaxed);
  Impl::Slot& slot = t.ring[i % Impl::kRing];
  slot.phase.store(static_cast<int>(phase), std::memory_order_relaxed);
  slot.begin.store(begin.time_since_epoch().count(), std::memory_order_relaxed);
  slot.end.store(end.time_since_epoch().count(), std::memory_order_relaxed);
  slot.seq.store(i + 1, std::memory_order_release);
}

void StepTimeline::AddDelivered(uint64_t samples, uint64_t bytes) {
  if (!active()) return;
  impl_->samples.fetch_add(samples, std::memory_order_relaxed);
  impl_->bytes.fetch_add(bytes, std::memory_order_relaxed);
}

void StepTimeline::SetGpu(int index) {
  std::lock_guard lock(impl_->mu);
  impl_->gpu = index;
  if (index >= 0 && impl_->nvml == nullptr) {
    std::string warning;
    impl_->nvml = Nvml::Load("libnvidia-ml.so.1", &warning);
  }
}

StepRecord StepTimeline::Mark() {
  StepRecord rec;
  if (!active()) return rec;
  Impl& t = *impl_;
  const auto end = Clock::now();
  const double h2d_now = Registry::Get().H2dSecondsNow();
  std::lock_guard lock(t.mu);
  t.Drain();
  rec.step = ++t.step;
  rec.start = t.step_begin_wall;
  rec.seconds = Sec(end - t.step_begin);

  // Elementary segments between every boundary inside the step; each goes
  // to the first phase in kPriority that covers it.
  std::vector<Clock::time_point> cuts = {t.step_begin, end};
  std::vector<Impl::Interval> kept;  // parts past `end`, for the next step
  for (auto& iv : t.intervals) {
    iv.begin = std::max(iv.begin, t.step_begin);
    if (iv.end > end) kept.push_back({iv.phase, end, iv.end});
    iv.end = std::min(iv.end, end);
    if (iv.end <= iv.begin) continue;
    cuts.push_back(iv.begin);
    cuts.push_back(iv.end);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  double covered = 0;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    const auto a = cuts[i], b = cuts[i + 1];
    int best = kPhases;
    for (const auto& iv : t.intervals) {
      if (iv.begin > a || iv.end < b || iv.end <= iv.begin) continue;
      const int rank = int(std::find(kPriority, kPriority + kPhases, iv.phase) - kPriority);
      best = std::min(best, rank);
    }
    if (best == kPhases) continue;
    rec.phase[static_cast<int>(kPriority[best])] += Sec(b - a);
    covered += Sec(b - a);
  }
  rec.other = std::max(0.0, rec.seconds - covered);
  t.intervals = std::move(kept);
  rec.samples = t.samples.exchange(0, std::memory_order_relaxed);
  rec.bytes = t.bytes.exchange(0, std::memory_order_relaxed);
  rec.h2d_copy_seconds = std::max(0.0, h2d_now - t.h2d_copy_last);
  t.h2d_copy_last = h2d_now;
  if (t.nvml != nullptr && t.gpu >= 0) {
    auto u = t.nvml->Utilization(t.gpu);
    if (u.ok()) rec.gpu_utilization = *u;
  }
  t.step_begin = end;
  t.step_begin_wall = WallNow();

  auto& r = Registry::Get();
  r.step_seconds.Observe(rec.seconds);
  for (int p = 0; p < kPhases; ++p) r.phase_seconds[p].fetch_add(rec.phase[p]);
  r.phase_seconds[kPhases].fetch_add(rec.other);
  t.totals.step = rec.step;
  t.totals.seconds += rec.seconds;
  for (int p = 0; p < kPhases; ++p) t.totals.phase[p] += rec.phase[p];
  t.totals.other += rec.other;
  t.totals.samples += rec.samples;
  t.totals.bytes += rec.bytes;
  t.totals.h2d_copy_seconds += rec.h2d_copy_seconds;

  if (t.log) {
    nlohmann::json j = {{"step", rec.step},
                        {"start", rec.start},
                        {"seconds", rec.seconds},
                        {"other", rec.other},
                        {"samples", rec.samples},
                        {"bytes", rec.bytes},
                        {"h2d_copy_seconds", rec.h2d_copy_seconds}};
    for (int p = 0; p < kPhases; ++p) j[std::string(PhaseName(Phase(p)))] = rec.phase[p];
    if (rec.gpu_utilization >= 0) j["gpu_utilization"] = rec.gpu_utilization;
    const std::string line = j.dump() + "\n";
    std::fwrite(line.data(), 1, line.size(), t.log);
    std::fflush(t.log);
  }
  return rec;
}

StepRecord StepTimeline::Totals() const {
  std::lock_guard lock(impl_->mu);
  return impl_->totals;
}

}  // namespace stoker::metrics
