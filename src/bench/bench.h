// Measurement: the per-file baseline loader, process usage, loader and
// emulated-training runs. Used by `stoker bench`, `stoker demo` and bench/.
//
// The per-file loader is the peer stoker is compared with: each sample
// opened and read as its own file, as torchvision's ImageFolder with a
// DataLoader does, with the same worker count, the same collation and the
// same decode code as the Loader, so a comparison measures the I/O pattern
// and nothing else.
//
// Internal to the bench module (src/bench/), not part of the library API.
//
// Thread safety: a PerFileLoader is used by one thread at a time, like a
// Loader; the functions are reentrant.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stoker/loader.h"
#include "stoker/pack.h"

namespace stoker {

// CPU time (user + system) of this process, and its resident set size.
struct ProcessUsage {
  double cpu_seconds = 0;
  double kernel_cpu_seconds = 0;  // of cpu_seconds, in the kernel
  uint64_t page_faults = 0;       // minor and major
  uint64_t rss_bytes = 0;
  uint64_t peak_rss_bytes = 0;  // VmHWM: since start or the last ResetPeakRss
};
ProcessUsage GetProcessUsage();
// Resets the kernel's peak-RSS mark (writes 5 to /proc/self/clear_refs);
// false where the kernel does not allow it.
bool ResetPeakRss();

// An emulated storage round trip: a fixed latency that every operation pays
// on top of its local cost, as each metadata or data request to a network
// file system or object store does. Counts the operations that paid it, so
// tests and reports can check that both sides of a comparison paid per
// operation. Thread-safe.
class RoundTrip {
 public:
  explicit RoundTrip(std::chrono::microseconds latency) : latency_(latency) {}
  // Counts one operation and sleeps for the latency (no CPU, as a wait on
  // the network takes none).
  void Pay();
  // Counts one operation whose latency the caller waits for itself (an
  // asynchronous read held until its due time).
  void Count() { operations_.fetch_add(1, std::memory_order_relaxed); }
  std::chrono::microseconds latency() const { return latency_; }
  uint64_t operations() const { return operations_.load(std::memory_order_relaxed); }

 private:
  const std::chrono::microseconds latency_;
  std::atomic<uint64_t> operations_{0};
};

// A store whose every operation pays `round_trip` (see RoundTrip): Read,
// ReadAll, Stat, List, Put, Remove, and each request submitted to a read
// queue, which completes no earlier than the latency after the target store
// completed it (requests in flight wait out their round trips together, as
// asynchronous requests to a network store do).
std::shared_ptr<Store> NewLatencyStore(std::shared_ptr<Store> target,
                                       std::shared_ptr<RoundTrip> round_trip);

class PerFileLoader {
 public:
  // Uses batch_size, shuffle, seed, threads, prefetch_batches and decode
  // from `options`; fields are "image" (bytes) and "label" (int64), as pack
  // makes them. The order is a full shuffle (a DataLoader's RandomSampler).
  // With `round_trip`, each file's open + read pays it once (the emulated
  // network file system of `stoker demo`). With `files`, each source path
  // is a key of that store, read whole (one object per sample, as per-file
  // reads from an object store are), instead of a local file.
  static Result<std::unique_ptr<PerFileLoader>> Open(PackSources sources,
                                                     const LoaderOptions& options,
                                                     std::shared_ptr<RoundTrip> round_trip = {},
                                                     std::shared_ptr<Store> files = {});
  virtual ~PerFileLoader() = default;
  virtual Status StartEpoch(uint64_t epoch) = 0;
  // OutOfRange at the end of the epoch.
  virtual Result<Batch> Next() = 0;
  virtual uint64_t num_batches() const = 0;
  // Bytes read from files so far.
  virtual uint64_t bytes_read() const = 0;
};

// What a loader run measured.
struct LoaderRun {
  uint64_t samples = 0;
  uint64_t batches = 0;
  uint64_t bytes = 0;       // payload bytes delivered (decoded bytes with decode)
  uint64_t bytes_read = 0;  // bytes read from storage
  double seconds = 0;
  double first_batch_seconds = 0;
  double cpu_seconds = 0;
  double kernel_cpu_seconds = 0;  // of cpu_seconds: system calls, page faults
  uint64_t page_faults = 0;
  uint64_t peak_rss_bytes = 0;
  double samples_per_second() const { return seconds > 0 ? samples / seconds : 0; }
  double mb_per_second() const { return seconds > 0 ? bytes_read / seconds / 1e6 : 0; }
  double cpu_seconds_per_gb() const { return bytes_read ? cpu_seconds / (bytes_read / 1e9) : 0; }
};

// Pulls batches from `next` until it returns OutOfRange or `max_samples`
// (0 = no limit) have been delivered, and measures. `bytes_read` tells the
// bytes read from storage so far (for MB/s).
Result<LoaderRun> MeasureLoader(const std::function<Result<Batch>()>& next, uint64_t max_samples,
                                const std::function<uint64_t()>& bytes_read);

// An emulated training job, as MLPerf Storage's DLIO does: every step takes
// a batch, then "computes" for a fixed time (a sleep standing in for the
// accelerator, which needs no CPU).
struct TrainRun {
  uint64_t steps = 0;
  uint64_t samples = 0;
  double wall_seconds = 0;
  double compute_seconds = 0;  // steps x compute time
  double wait_seconds = 0;     // time blocked in next()
  double samples_per_second() const { return wall_seconds > 0 ? samples / wall_seconds : 0; }
  double data_wait_share() const { return wall_seconds > 0 ? wait_seconds / wall_seconds : 0; }
  double accelerator_utilisation() const {
    return wall_seconds > 0 ? compute_seconds / wall_seconds : 0;
  }
};
Result<TrainRun> EmulateTraining(const std::function<Result<Batch>()>& next,
                                 std::chrono::microseconds compute_per_step, uint64_t max_steps);

// The accelerators a loader keeps busy, as MLPerf Storage measures it: N
// emulated accelerators (ranks on this node, one thread and one loader
// each) each run the emulated training job; the trial passes when their
// accelerator utilisation (the share of wall time not spent waiting for a
// batch, summed over ranks; a compute sleep that overruns on a loaded
// machine counts as busy, not against the loader) is at least the
// threshold.
struct AcceleratorTrial {
  uint32_t accelerators = 0;
  double utilisation = 0;         // all ranks: (wall - data wait) / wall
  double min_utilisation = 0;     // the least busy rank
  double compute_share = 0;       // all ranks: nominal compute time / wall
  double samples_per_second = 0;  // all ranks together
  double wall_seconds = 0;
  std::vector<TrainRun> ranks;
};

// Runs `accelerators` ranks at once. Each rank calls open(rank) on its own
// thread to get its batch source, runs `warmup_steps` steps (not measured:
// loader start and first reads), then `steps` measured steps of
// `compute_per_step` each.
using BatchSource = std::function<Result<Batch>()>;
Result<AcceleratorTrial> RunAccelerators(uint32_t accelerators,
                                         const std::function<Result<BatchSource>(uint32_t)>& open,
                                         std::chrono::microseconds compute_per_step,
                                         uint32_t warmup_steps, uint32_t steps);

struct AcceleratorSearch {
  std::vector<AcceleratorTrial> trials;  // in the order run
  uint32_t supported = 0;                // largest passing count; 0 if none
};

// Tries 1, 2, 4, ... accelerators (never more than `max_accelerators`),
// stopping at the first count whose utilisation is below `threshold`: more
// ranks only add load, so a count that fails is not followed by one that
// passes, and the search never runs a trial it does not need.
Result<AcceleratorSearch> SearchAccelerators(
    const std::function<Result<AcceleratorTrial>(uint32_t)>& trial, double threshold,
    uint32_t max_accelerators);

// Writes an ImageFolder tree of synthetic JPEGs under `root`
// (root/class_NN/img_NNNNNN.jpg): varied sizes (about 100 KB, 250-700 px a
// side), smooth shapes plus texture so they compress like photographs, the
// same bytes for the same seed. Unsupported without libturbojpeg.
struct SynthOptions {
  uint32_t images = 3000;
  uint32_t classes = 10;
  uint64_t seed = 1;
  uint32_t threads = 0;  // 0 = cores
  // Target mean JPEG size. Default: 100 KB, an ImageNet photo's size.
  uint32_t mean_bytes = 100000;
};
Result<uint64_t> SynthesizeImageFolder(const std::string& root, const SynthOptions& options);

// `stoker bench scale`'s datasets: the manifest and shard table of
// `samples` samples of `sample_bytes` bytes (one bytes field, "data") over
// `shards` shards, written to `dst` as the writer writes them, without the
// shards, which NewSyntheticShardStore makes on read (ShardBuilder, the
// same bytes on every read). O(shards) time and table bytes.
struct ScaleDatasetOptions {
  uint64_t samples = 0;
  uint64_t shards = 0;
  uint32_t sample_bytes = 8;
};
Result<format::Manifest> WriteScaleDataset(Store& dst, const ScaleDatasetOptions& options);
// `target` holding a dataset of WriteScaleDataset, with its shards made on
// read: each read of a shard builds it (O(its samples)). Keeps O(1) memory.
// Shard keys are read-only (PermissionDenied); the rest goes to `target`.
Result<std::shared_ptr<Store>> NewSyntheticShardStore(std::shared_ptr<Store> target);

}  // namespace stoker
