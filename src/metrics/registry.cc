// The process's metrics: lock-free primitives, the registry, and its
// rendering as Prometheus families (serialised by prometheus-cpp).
#include "metrics/registry.h"

#include <prometheus/text_serializer.h>

#include <algorithm>
#include <sstream>

namespace stoker::metrics {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)),
      counts_(std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1)) {}

void Histogram::Observe(double value) {
  // The bounds are few (<= 20): a linear scan beats a branchy search.
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(value, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds = bounds_;
  s.counts.resize(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                               0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                               1,      2.5,     5,      10,    30,     60};
  return kBuckets;
}

std::string_view StoreOpName(StoreOp op) {
  static constexpr std::string_view kNames[] = {"read", "write", "stat", "list", "remove"};
  return kNames[static_cast<int>(op)];
}

namespace {

// Label values of Status codes: stable, lower case, no spaces.
std::string_view CodeLabel(int code) {
  static constexpr std::string_view kNames[kCodes] = {
      "ok",         "invalid_argument", "not_found",    "already_exists", "permission_denied",
      "corruption", "unsupported",      "io_error",     "timed_out",      "unavailable",
      "no_space",   "cancelled",        "out_of_range", "internal"};
  return code >= 0 && code < kCodes ? kNames[code] : "unknown";
}

double Seconds(std::chrono::nanoseconds ns) { return std::chrono::duration<double>(ns).count(); }

// now - last for a counter that only grows while one loader lives; a value
// that went down (a reset) counts from zero.
uint64_t Delta(uint64_t now, uint64_t last) { return now >= last ? now - last : now; }

}  // namespace

StoreCounters::StoreCounters(std::string b, std::string p)
    : backend(std::move(b)), pool(std::move(p)) {
  for (auto& h : seconds) h = std::make_unique<Histogram>(LatencyBuckets());
}

void StoreCounters::Done(StoreOp op, Clock::time_point begin, const Status& status,
                         uint64_t bytes) {
  const int i = static_cast<int>(op);
  ops[i].fetch_add(1, std::memory_order_relaxed);
  if (!status.ok()) {
    const int code = std::clamp(static_cast<int>(status.code()), 0, kCodes - 1);
    errors[i * kCodes + code].fetch_add(1, std::memory_order_relaxed);
  } else if (op == StoreOp::kRead) {
    read_bytes.fetch_add(bytes, std::memory_order_relaxed);
  } else if (op == StoreOp::kWrite) {
    written_bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  seconds[i]->Observe(std::chrono::duration<double>(Clock::now() - begin).count());
}

Registry& Registry::Get() {
  static Registry* r = new Registry();  // never destroyed: used by exit-time flushes
  return *r;
}

std::shared_ptr<StoreCounters> Registry::Store(const std::string& backend,
                                               const std::string& pool) {
  std::lock_guard lock(mu_);
  for (auto& s : stores_) {
    if (s->backend == backend && s->pool == pool) return s;
  }
  stores_.push_back(std::make_shared<StoreCounters>(backend, pool));
  return stores_.back();
}

void Registry::Watch(const std::shared_ptr<LoaderWatch>& w) {
  std::lock_guard lock(mu_);
  std::erase_if(loaders_, [](const auto& p) { return p.expired(); });
  loaders_.push_back(w);
}

void Registry::Fold(LoaderWatch& w, const LoaderStats& now) {
  std::lock_guard lock(mu_);
  const LoaderStats& last = w.last;
  shards_read_ += Delta(now.shards_read, last.shards_read);
  bytes_read_ += Delta(now.bytes_read, last.bytes_read);
  samples_ += Delta(now.samples_delivered, last.samples_delivered);
  batches_ += Delta(now.batches_delivered, last.batches_delivered);
  retries_ += Delta(now.read_retries, last.read_retries);
  h2d_bytes_ += Delta(now.h2d_bytes, last.h2d_bytes);
  remote_bytes_ += Delta(now.remote_bytes, last.remote_bytes);
  cache_bytes_ += Delta(now.cache_bytes, last.cache_bytes);
  cache_hits_ += Delta(now.cache_hits, last.cache_hits);
  cache_misses_ += Delta(now.cache_misses, last.cache_misses);
  cache_fetch_waits_ += Delta(now.cache_fetch_waits, last.cache_fetch_waits);
  cache_evictions_ += Delta(now.cache_evictions, last.cache_evictions);
  cache_refetches_ += Delta(now.cache_refetches, last.cache_refetches);
  h2d_seconds_ +=
      Seconds(now.h2d_time >= last.h2d_time ? now.h2d_time - last.h2d_time : now.h2d_time);
  w.last = now;
}

std::vector<std::shared_ptr<LoaderWatch>> Registry::LiveWatches() {
  std::vector<std::shared_ptr<LoaderWatch>> watches;
  std::lock_guard lock(mu_);
  for (auto& p : loaders_) {
    if (auto w = p.lock()) watches.push_back(std::move(w));
  }
  return watches;
}

double Registry::H2dSecondsNow() {
  const std::vector<std::shared_ptr<LoaderWatch>> watches = LiveWatches();
  for (auto& w : watches) {
    std::lock_guard lock(w->mu);
    if (w->loader != nullptr) Fold(*w, w->loader->stats());
  }
  std::lock_guard lock(mu_);
  return h2d_seconds_;
}

std::vector<MetricFamily> Registry::Collect() {
  Families f;
  // Loaders first: reading their stats takes each watch's lock, then ours.
  uint64_t buffer_bytes = 0, device_bytes = 0, pinned_bytes = 0, live = 0;
  const std::vector<std::shared_ptr<LoaderWatch>> watches = LiveWatches();
  for (auto& w : watches) {
    std::lock_guard lock(w->mu);
    if (w->loader == nullptr) continue;
    const LoaderStats s = w->loader->stats();
    Fold(*w, s);
    ++live;
    buffer_bytes += s.peak_buffer_bytes;
    device_bytes += s.device_bytes;
    pinned_bytes += s.pinned_bytes;
  }
  std::lock_guard lock(mu_);
  f.Gauge("stoker_loaders", "Loaders open in this process.", double(live));
  f.Counter("stoker_loader_shards_read_total", "Shards read by the loaders.", double(shards_read_));
  f.Counter("stoker_loader_read_bytes_total",
            "Bytes the loaders read from storage (whole shards, or records with headers and "
            "indexes).",
            double(bytes_read_));
  f.Counter("stoker_loader_delivered_samples_total", "Samples delivered by Next().",
            double(samples_));
  f.Counter("stoker_loader_delivered_batches_total", "Batches delivered by Next().",
            double(batches_));
  f.Counter("stoker_loader_delivered_bytes_total", "Bytes of the batches delivered by Next().",
            double(delivered_bytes.load(std::memory_order_relaxed)));
  f.Counter("stoker_loader_read_retries_total", "Reads tried again after a retryable error.",
            double(retries_));
  f.Hist("stoker_loader_data_wait_seconds", "Time each Next() blocked waiting for its batch.",
         data_wait);
  f.Counter("stoker_loader_h2d_bytes_total", "Bytes the loaders copied to GPU memory.",
            double(h2d_bytes_));
  f.Counter("stoker_loader_remote_bytes_total",
            "Bytes the loaders read from the remote store (the node cache's fetches when there "
            "is one).",
            double(remote_bytes_));
  f.Counter("stoker_loader_cache_served_bytes_total",
            "Bytes the node cache served from its folder.", double(cache_bytes_));
  f.Counter("stoker_loader_cache_hits_total", "Shard reads the node cache served.",
            double(cache_hits_));
  f.Counter("stoker_loader_cache_misses_total", "Shard reads the node cache had to fetch.",
            double(cache_misses_));
  f.Counter("stoker_loader_cache_fetch_waits_total",
            "Shard reads that waited for another process's fetch.", double(cache_fetch_waits_));
  f.Counter("stoker_loader_cache_evictions_total", "Shards the node cache evicted.",
            double(cache_evictions_));
  f.Counter("stoker_loader_cache_refetches_total", "Bad cache files dropped and fetched again.",
            double(cache_refetches_));
  f.Counter("stoker_loader_h2d_seconds_total",
            "Time the loaders' host-to-device copies kept the copy engine busy.", h2d_seconds_);
  f.Gauge("stoker_loader_peak_buffer_bytes",
          "Peak bytes in the open loaders' shard and batch "
          "buffers.",
          double(buffer_bytes));
  f.Gauge("stoker_loader_device_bytes", "GPU memory the open loaders' batch pools hold.",
          double(device_bytes));
  f.Gauge("stoker_loader_pinned_bytes", "Host memory the open loaders hold pinned.",
          double(pinned_bytes));

  for (const auto& s : stores_) {
    for (int op = 0; op < kStoreOps; ++op) {
      std::vector<ClientMetric::Label> l = {{"backend", s->backend},
                                            {"op", std::string(StoreOpName(StoreOp(op)))},
                                            {"pool", s->pool}};
      f.Counter("stoker_store_operations_total", "Store operations, failed ones included.",
                double(s->ops[op].load(std::memory_order_relaxed)), l);
      // Latency only of operations that happened: a histogram is 21 series.
      if (s->ops[op].load(std::memory_order_relaxed) > 0) {
        f.Hist("stoker_store_operation_seconds", "Latency of store operations.", *s->seconds[op],
               l);
      }
      for (int code = 1; code < kCodes; ++code) {
        // Only codes that happened: 13 series per operation would be most of
        // a node's budget.
        const uint64_t n = s->errors[op * kCodes + code].load(std::memory_order_relaxed);
        if (n == 0) continue;
        auto le = l;
        le.insert(le.begin() + 1, {"code", std::string(CodeLabel(code))});
        f.Counter("stoker_store_errors_total", "Failed store operations, by status code.",
                  double(n), le);
      }
    }
    std::vector<ClientMetric::Label> l = {{"backend", s->backend}, {"pool", s->pool}};
    f.Counter("stoker_store_read_bytes_total", "Bytes read from the store.",
              double(s->read_bytes.load(std::memory_order_relaxed)), l);
    f.Counter("stoker_store_written_bytes_total", "Bytes written to the store.",
              double(s->written_bytes.load(std::memory_order_relaxed)), l);
  }

  f.Counter("stoker_checkpoint_saves_total", "Checkpoint saves started.", double(ckpt_started));
  f.Counter("stoker_checkpoint_completed_total", "Checkpoint saves committed.", double(ckpt_ok));
  f.Counter("stoker_checkpoint_failures_total", "Checkpoint saves that failed.",
            double(ckpt_failed));
  f.Counter("stoker_checkpoint_written_bytes_total", "Bytes of tensors in committed saves.",
            double(ckpt_bytes));
  f.Hist("stoker_checkpoint_save_seconds", "Time from a save's start to its end.", ckpt_seconds);
  f.Hist("stoker_checkpoint_stall_seconds",
         "Time a save kept the training loop waiting (async: the snapshot).", ckpt_stall);

  f.Hist("stoker_step_seconds", "Wall time of training steps (StepTimeline).", step_seconds);
  for (int p = 0; p <= kPhases; ++p) {
    f.Counter("stoker_step_phase_seconds_total",
              "Time of training steps given to each phase (they sum to the steps' time).",
              phase_seconds[p].load(std::memory_order_relaxed),
              {{"phase", p < kPhases ? std::string(PhaseName(Phase(p))) : "other"}});
  }
  return f.Take();
}

std::string Exposition(std::span<const std::pair<std::string, std::string>> labels) {
  auto families = Registry::Get().Collect();
  for (auto& family : families) {
    for (auto& m : family.metric) {
      for (const auto& [k, v] : labels) m.label.push_back({k, v});
      std::sort(m.label.begin(), m.label.end());
    }
  }
  return Serialize(families);
}

std::string Serialize(const std::vector<MetricFamily>& families) {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, families);
  return out.str();
}

void RecordCheckpointStall(double stall_seconds) {
  auto& r = Registry::Get();
  r.ckpt_started.fetch_add(1, std::memory_order_relaxed);
  r.ckpt_stall.Observe(stall_seconds);
}

void RecordCheckpointEnd(bool ok, uint64_t bytes, double seconds) {
  auto& r = Registry::Get();
  if (ok) {
    r.ckpt_ok.fetch_add(1, std::memory_order_relaxed);
    r.ckpt_bytes.fetch_add(bytes, std::memory_order_relaxed);
    r.ckpt_seconds.Observe(seconds);
  } else {
    r.ckpt_failed.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace stoker::metrics
