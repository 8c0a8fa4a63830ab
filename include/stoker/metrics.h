// Metrics: counters and histograms of every part, the per-step timeline, and
// how a process publishes them for the node's `stoker exporter`.
//
// What is measured, and where:
//   store       MeteringStore, a StoreWrapper: operations, bytes, errors by
//               code, latency, labelled by backend and pool only.
//   loader      MeterLoader, a Loader decorator: the time each Next() blocks
//               (data wait, a histogram) and the bytes it hands out, counted
//               with relaxed atomics; everything else (bytes read, samples,
//               batches, retries, H2D bytes and seconds) is read from
//               Loader::stats() when the metrics are collected, so the hot
//               path pays nothing for it.
//   checkpoint  MeterCheckpointer, a Checkpointer decorator: saves, their
//               stall (the caller's wait), bytes, seconds and failures; its
//               store under a MeteringStore (metrics::OpenCheckpointer).
//   steps       StepTimeline: which phase (data, h2d, compute, comm,
//               checkpoint) each instant of a training step went to.
//
// Publishing: Enable() starts one thread that, every interval, renders this
// process's metrics in Prometheus's text format (with `job` and `rank`
// labels) and writes them atomically (write a temporary file, rename) to
// DIR/<pid>.prom, DIR being /dev/shm/stoker-metrics by default. `stoker
// exporter` serves the files of the live processes of the node, merged; a
// file whose process is gone is removed by the exporter (docs/architecture.md
// says why files and not sockets). A child of fork() publishes nothing.
//
// Names follow Prometheus's conventions: prefix stoker_, base units
// (_seconds, _bytes), counters end in _total; labels are of bounded
// cardinality (never a shard, sample or object name).
//
// Thread safety: every function and class here is safe for concurrent use.
// Nothing on a hot path (a store read, a loader's Next, a timeline interval)
// takes a lock: counters and histograms are relaxed atomics.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/checkpoint.h"
#include "stoker/loader.h"
#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker::metrics {

// ---- primitives: lock-free, for hot paths -----------------------------------

// A histogram with fixed bucket bounds (upper bounds, ascending; +Inf is
// implicit). Observe is a few relaxed atomic adds: no lock, no allocation.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  // per bucket (not cumulative), bounds.size() + 1
    uint64_t count = 0;
    double sum = 0;
  };
  Snapshot Read() const;
  const std::vector<double>& bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

// Bucket bounds for durations: 100 us .. 60 s, about x2.5 apart.
const std::vector<double>& LatencyBuckets();

// ---- publishing ---------------------------------------------------------------

struct Options {
  // Folder of the exposition files. Default: $STOKER_METRICS_DIR, else
  // /dev/shm/stoker-metrics (memory, per node, visible to the exporter).
  std::string dir;
  // How often the file is rewritten. Default: 1 s (Prometheus scrapes every
  // 15 s by default; a file is at most this old when read). Keep it under
  // 3 s: the exporter takes a file of a pid it cannot see that is older than
  // that, and any file older than 60 s, for a process that is gone.
  std::chrono::milliseconds interval{1000};
  // The `job` label. Default: $STOKER_JOB, else $SLURM_JOB_ID, else
  // $TORCHELASTIC_RUN_ID, else "stoker".
  std::string job;
  // The `rank` label. Default: -1 = from the launcher's variables (RANK,
  // OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID), else 0.
  int64_t rank = -1;
};

// Starts publishing (idempotent: a second call changes nothing and returns
// OK). Fails when the folder cannot be created or written, naming it.
Status Enable(const Options& options = {});
// Stops publishing and removes this process's file. Idempotent.
void Disable();
// True between Enable and Disable. Code that decides whether to meter a new
// store or loader asks this.
bool Enabled();
// Where this process's file is ("" when not enabled).
std::string PublishedPath();

// This process's metrics now, in Prometheus's text format (0.0.4), with
// `labels` (name, value pairs) added to every series.
std::string Exposition(std::span<const std::pair<std::string, std::string>> labels = {});

// ---- stores -------------------------------------------------------------------

// A store that counts what goes through it: stoker_store_operations_total,
// stoker_store_read_bytes_total, stoker_store_written_bytes_total,
// stoker_store_errors_total (by op and code), stoker_store_operation_seconds
// (by op). Labels: backend (Store::Describe().kind: posix, rados, memory;
// other for a store of the caller's own) and pool (RADOS; "" else).
// It forwards every call, OpenReader and the deferred Puts included (a
// reader it opens is metered too), and local_reads() is the target's, so
// the loader takes the same read path through it.
std::shared_ptr<Store> MeteringStore(std::shared_ptr<Store> target);

// ---- loaders ------------------------------------------------------------------

// A loader that is watched: while it lives, its stats() are added to the
// process's stoker_loader_* counters at every collection (as deltas, so the
// counters only grow, also across loaders), and the time each Next() blocks
// is a histogram (stoker_loader_data_wait_seconds) and a `data` interval of
// the StepTimeline. Everything else is forwarded.
std::unique_ptr<Loader> MeterLoader(std::unique_ptr<Loader> loader);

// Loader::Open, metered when Enabled(): the store under a MeteringStore, the
// loader under MeterLoader. When only the StepTimeline is active, the loader
// alone is metered (for the data wait); otherwise plain Loader::Open.
Result<std::unique_ptr<Loader>> OpenLoader(std::string_view uri, const LoaderOptions& options);

// ---- checkpoints --------------------------------------------------------------

// A checkpointer that is metered. Each Save and SaveAsync counts in
// stoker_checkpoint_saves_total, and the time it kept its caller waiting (a
// Save: all of it; a SaveAsync: the checks and the copy into the staging
// area) in stoker_checkpoint_stall_seconds and as a `checkpoint` interval of
// the StepTimeline. When the save ends (a SaveAsync: when its background
// write does, seen through SaveHandle::OnDone, not when someone waits) it
// counts in stoker_checkpoint_completed_total, _written_bytes_total (its
// tensors' bytes: what the checkpoint holds for this rank) and
// stoker_checkpoint_save_seconds (from its start), or in
// stoker_checkpoint_failures_total; a save refused for its arguments is a
// failure too. Everything else is forwarded, unmetered.
std::unique_ptr<Checkpointer> MeterCheckpointer(std::unique_ptr<Checkpointer> checkpointer);

// stoker::OpenCheckpointer, metered: the store under a MeteringStore when
// Enabled() (the checkpoint's traffic in stoker_store_*, labelled by backend
// and pool like a loader's), the checkpointer under MeterCheckpointer always
// (counting a save costs a few atomic adds, and the counts are there when
// metrics are enabled later, as the StepTimeline's stalls are).
Result<std::unique_ptr<Checkpointer>> OpenCheckpointer(std::string_view uri,
                                                       const CheckpointerOptions& options = {});

// Work a caller does for a save before it calls Save or SaveAsync (the
// Python skin's flattening of a state dict and its copy of GPU tensors to
// the host) is part of the training loop's wait: while a SaveStartedAt
// lives, a metered save that this thread starts counts its stall and its
// seconds from `begin` (steady clock) instead of from its call. Scopes nest.
class SaveStartedAt {
 public:
  explicit SaveStartedAt(Clock::time_point begin);
  ~SaveStartedAt();
  SaveStartedAt(const SaveStartedAt&) = delete;
  SaveStartedAt& operator=(const SaveStartedAt&) = delete;

 private:
  Clock::time_point previous_;
};

// For a checkpoint system of the caller's own (not a Checkpointer): a save
// has begun and returned control to the training loop after
// `stall_seconds` (the whole save when synchronous; the snapshot when
// asynchronous).
void RecordCheckpointStall(double stall_seconds);
// A save has ended: `bytes` of tensors in `seconds` from its start; ok
// false when it failed (counted in stoker_checkpoint_failures_total).
void RecordCheckpointEnd(bool ok, uint64_t bytes, double seconds);

// ---- the step timeline --------------------------------------------------------

enum class Phase : int { kData = 0, kH2d, kCompute, kComm, kCheckpoint };
inline constexpr int kPhases = 5;
std::string_view PhaseName(Phase p);

// One step's breakdown: seconds per phase (disjoint), the rest in `other`;
// they sum to `seconds`, the step's wall time.
struct StepRecord {
  uint64_t step = 0;
  double start = 0;  // seconds since the epoch (system clock)
  double seconds = 0;
  std::array<double, kPhases> phase{};
  double other = 0;
  uint64_t samples = 0;  // delivered by metered loaders during the step
  uint64_t bytes = 0;
  // Loaders' copy-engine H2D time during the step: overlapped with the rest,
  // so reported beside the breakdown, not in it.
  double h2d_copy_seconds = 0;
  double gpu_utilization = -1;  // 0..1 of the GPU set by SetGpu; -1: none
};

// Where a training step's time goes. Parts of the program report intervals
// of a phase (a metered loader's Next is `data`; stoker.save's stall is
// `checkpoint`; the Python API adds compute and comm); Mark() ends a step.
// Intervals may overlap: each instant of the step is given to one phase, the
// first in the order comm, checkpoint, h2d, data, compute that covers it
// (an all-reduce running under backward counts as comm), and the instants
// no interval covers are `other`. So the phases sum to the step's time.
class StepTimeline {
 public:
  // The process's timeline.
  static StepTimeline& Get();
  // Starts timing: the first step begins now. With `run_log`, every step is
  // appended to that file as one JSON line (for `stoker report`). Restarting
  // ends the previous log.
  Status Start(const std::string& run_log = "");
  void Stop();
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // Adds an interval of a phase, in steady-clock time. Ignored when inactive.
  // Lock-free, from any thread.
  void Add(Phase phase, Clock::time_point begin, Clock::time_point end);
  // Samples and bytes delivered to the step (metered loaders call this).
  void AddDelivered(uint64_t samples, uint64_t bytes);
  // Ends the current step now and begins the next; returns the ended step.
  StepRecord Mark();
  // Sum of the steps so far, per phase (seconds), and the step count.
  StepRecord Totals() const;
  // NVML device index whose utilisation each step records (-1: none).
  void SetGpu(int index);

 private:
  StepTimeline();
  struct Impl;
  std::atomic<bool> active_{false};
  const std::shared_ptr<Impl> impl_;
};

// ---- a report -----------------------------------------------------------------

// Reads a run log (StepTimeline's JSON lines, one rank's: each rank keeps
// its own) and writes one self-contained HTML page: plots as inline SVG
// (stacked step breakdown, throughput, data-wait share, GPU utilisation
// against data wait when recorded, checkpoint stalls) and a summary table.
// A malformed line is InvalidArgument naming the file and line.
Status WriteReport(const std::string& run_log, const std::string& html_path);

}  // namespace stoker::metrics
