// The host<->device copy benchmark behind `stoker bench h2d` (internal to
// the gpu and bench tooling, not part of the library's API):
// cuda_h2d_bench.cc with CUDA, no_cuda.cc without.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stoker/gpu.h"

namespace stoker {

// Host<->device copy bandwidth, the way nvbandwidth measures it: for each
// size, back-to-back cudaMemcpyAsync on one stream between a host buffer and
// a device buffer, timed with events around the run.
struct H2dBenchOptions {
  int device = 0;
  // Copy sizes. Default: 64 KiB to 256 MiB in steps of 4x.
  std::vector<uint64_t> sizes = {64ull << 10, 256ull << 10, 1ull << 20,  4ull << 20,
                                 16ull << 20, 64ull << 20,  256ull << 20};
  // Bytes copied per timed run (copies per run = this / size, at least 1).
  // Default: 1 GiB: long enough that the events' resolution is noise.
  uint64_t bytes_per_run = 1ull << 30;
  // Timed runs per size; the figure is their median. Default: 5.
  uint32_t repeats = 5;
  // Also time stoker's own path (the loader's: a pinned-by-registration
  // batch buffer copied by its stager into pooled device memory, one event
  // per copy) at each size of at least 1 MiB. Default: on.
  bool stoker_path = true;
};

struct H2dMeasurement {
  std::string direction;  // "h2d" or "d2h"
  std::string memory;     // "pinned", "pageable" or "stoker" (the loader's path)
  uint64_t bytes = 0;     // one copy's size
  double gbps = 0;        // median of the runs, 1e9 bytes per second
  double best_gbps = 0;   // fastest run
  std::vector<double> runs;  // each timed run's GB/s, in order (for the spread)
};

struct H2dReport {
  CudaDeviceInfo device;
  std::vector<H2dMeasurement> results;
  // Over all sizes: the fastest median of each kind.
  double h2d_pinned_gbps = 0, d2h_pinned_gbps = 0;
  double h2d_pageable_gbps = 0, d2h_pageable_gbps = 0;
  double h2d_stoker_gbps = 0;
};

// Runs the sweep on one device. Errors name the device and the CUDA call.
Result<H2dReport> BenchH2d(const H2dBenchOptions& options);

}  // namespace stoker
