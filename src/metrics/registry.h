// The process's metrics, shared by the files of src/metrics (not public).
//
// Hot paths touch only atomics: the store's per-operation counters, the data
// wait histogram, the delivered bytes. Loaders' stats are read when the
// metrics are collected (Registry::Collect), under the registry's mutex.
#pragma once

#include <prometheus/metric_family.h>

#include <array>
#include <atomic>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "stoker/loader.h"
#include "stoker/metrics.h"

namespace stoker::metrics {

// Store operations, as labelled in stoker_store_*{op=...}.
enum class StoreOp : int { kRead = 0, kWrite, kStat, kList, kRemove };
inline constexpr int kStoreOps = 5;
inline constexpr int kCodes = 14;  // Code::kOk .. Code::kInternal

// The counters of one (backend, pool).
struct StoreCounters {
  StoreCounters(std::string b, std::string p);
  std::string backend, pool;
  std::array<std::atomic<uint64_t>, kStoreOps> ops{};
  std::array<std::atomic<uint64_t>, kStoreOps * kCodes> errors{};
  std::atomic<uint64_t> read_bytes{0}, written_bytes{0};
  std::array<std::unique_ptr<Histogram>, kStoreOps> seconds;

  // One finished operation that began at `begin`.
  void Done(StoreOp op, Clock::time_point begin, const Status& status, uint64_t bytes);
};

// A live loader, as the collector sees it. The MeteredLoader that owns the
// loader clears `loader` (under `mu`) before destroying it.
struct LoaderWatch {
  std::mutex mu;
  Loader* loader = nullptr;
  LoaderStats last;  // what has been added to the totals
};

class Registry {
 public:
  static Registry& Get();

  std::shared_ptr<StoreCounters> Store(const std::string& backend, const std::string& pool);
  void Watch(const std::shared_ptr<LoaderWatch>& w);
  // Adds what `now` holds beyond `w.last` to the totals; `w.mu` is held.
  void Fold(LoaderWatch& w, const LoaderStats& now);
  // The watches of loaders still alive (taken under mu_, used without it).
  std::vector<std::shared_ptr<LoaderWatch>> LiveWatches();

  Histogram data_wait{LatencyBuckets()};
  std::atomic<uint64_t> delivered_bytes{0};

  // Checkpoints.
  std::atomic<uint64_t> ckpt_started{0}, ckpt_ok{0}, ckpt_failed{0}, ckpt_bytes{0};
  Histogram ckpt_seconds{LatencyBuckets()};
  Histogram ckpt_stall{LatencyBuckets()};

  // Steps.
  Histogram step_seconds{LatencyBuckets()};
  std::array<std::atomic<double>, kPhases + 1> phase_seconds{};  // + other

  std::vector<prometheus::MetricFamily> Collect();
  // The open loaders' H2D copy seconds so far plus those of closed ones.
  double H2dSecondsNow();

 private:
  Registry() = default;
  std::mutex mu_;
  std::vector<std::shared_ptr<StoreCounters>> stores_;
  std::vector<std::weak_ptr<LoaderWatch>> loaders_;
  // Loader totals, sums of the deltas folded in.
  uint64_t shards_read_ = 0, bytes_read_ = 0, samples_ = 0, batches_ = 0, retries_ = 0;
  uint64_t h2d_bytes_ = 0;
  // The node cache (LoaderStats::remote_bytes, cache_*).
  uint64_t remote_bytes_ = 0, cache_bytes_ = 0, cache_hits_ = 0, cache_misses_ = 0;
  uint64_t cache_fetch_waits_ = 0, cache_evictions_ = 0, cache_refetches_ = 0;
  double h2d_seconds_ = 0;
};

std::string_view StoreOpName(StoreOp op);

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Families being built, found by name so that several sources add to one.
class Families {
 public:
  MetricFamily& Family(const std::string& name, const std::string& help, MetricType type) {
    auto [it, added] = index_.try_emplace(name, out_.size());
    if (added) out_.push_back(MetricFamily{name, help, type, {}});
    return out_[it->second];
  }
  void Counter(const std::string& name, const std::string& help, double value,
               std::vector<ClientMetric::Label> labels = {}) {
    ClientMetric m;
    m.label = std::move(labels);
    m.counter.value = value;
    Family(name, help, MetricType::Counter).metric.push_back(std::move(m));
  }
  void Gauge(const std::string& name, const std::string& help, double value,
             std::vector<ClientMetric::Label> labels = {}) {
    ClientMetric m;
    m.label = std::move(labels);
    m.gauge.value = value;
    Family(name, help, MetricType::Gauge).metric.push_back(std::move(m));
  }
  void Hist(const std::string& name, const std::string& help, const Histogram& h,
            std::vector<ClientMetric::Label> labels = {}) {
    const Histogram::Snapshot s = h.Read();
    ClientMetric m;
    m.label = std::move(labels);
    m.histogram.sample_count = s.count;
    m.histogram.sample_sum = s.sum;
    uint64_t cumulative = 0;
    for (size_t i = 0; i < s.counts.size(); ++i) {
      cumulative += s.counts[i];
      m.histogram.bucket.push_back({cumulative, i < s.bounds.size()
                                                    ? s.bounds[i]
                                                    : std::numeric_limits<double>::infinity()});
    }
    Family(name, help, MetricType::Histogram).metric.push_back(std::move(m));
  }
  std::vector<MetricFamily> Take() { return std::move(out_); }

 private:
  std::map<std::string, size_t> index_;
  std::vector<MetricFamily> out_;
};

// Serialises families in Prometheus's text format (prometheus-cpp).
std::string Serialize(const std::vector<MetricFamily>& families);

}  // namespace stoker::metrics
