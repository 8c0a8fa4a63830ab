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
  uint64_t rss_bytes = 0;
  uint64_t peak_rss_bytes = 0;  // VmHWM: since start or the last ResetPeakRss
};
ProcessUsage GetProcessUsage();
// Resets the kernel's peak-RSS mark (writes 5 to /proc/self/clear_refs);
// false where the kernel does not allow it.
bool ResetPeakRss();

class PerFileLoader {
 public:
  // Uses batch_size, shuffle, seed, threads, prefetch_batches and decode
  // from `options`; fields are "image" (bytes) and "label" (int64), as pack
  // makes them. The order is a full shuffle (a DataLoader's RandomSampler).
  static Result<std::unique_ptr<PerFileLoader>> Open(PackSources sources,
                                                     const LoaderOptions& options);
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

}  // namespace stoker
