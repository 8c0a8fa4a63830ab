// `stoker bench h2d`: host<->device copy bandwidth, pinned and pageable, over
// a sweep of sizes, and stoker's own staging path next to the best plain
// cudaMemcpyAsync of the same run (CUDA builds).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "gpu/cuda_util.h"
#include "gpu/stager.h"
#include "gpu/h2d_bench.h"
#include "stoker/gpu.h"

namespace stoker {
namespace {

using gpu::CudaStatus;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The buffers and the stream of one sweep, freed however it ends.
struct Resources {
  int device = 0;
  void* pinned = nullptr;
  void* pageable = nullptr;
  void* dev = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  ~Resources() {
    if (stream) (void)cudaStreamSynchronize(stream);
    if (pinned) (void)cudaFreeHost(pinned);
    std::free(pageable);
    if (dev) (void)cudaFree(dev);
    if (start) (void)cudaEventDestroy(start);
    if (stop) (void)cudaEventDestroy(stop);
    if (stream) (void)cudaStreamDestroy(stream);
  }
};

// `count` back-to-back copies of `bytes`, timed with events; GB/s.
Result<double> TimeCopies(Resources& r, void* dst, const void* src, size_t bytes, uint64_t count,
                          cudaMemcpyKind kind) {
  const int d = r.device;
  const std::string call = std::string("cudaMemcpyAsync(") + std::to_string(bytes) + " bytes)";
  STOKER_RETURN_IF_ERROR(CudaStatus(d, "cudaEventRecord", cudaEventRecord(r.start, r.stream)));
  for (uint64_t i = 0; i < count; ++i) {
    STOKER_RETURN_IF_ERROR(CudaStatus(d, call, cudaMemcpyAsync(dst, src, bytes, kind, r.stream)));
  }
  STOKER_RETURN_IF_ERROR(CudaStatus(d, "cudaEventRecord", cudaEventRecord(r.stop, r.stream)));
  STOKER_RETURN_IF_ERROR(CudaStatus(d, "cudaEventSynchronize", cudaEventSynchronize(r.stop)));
  float ms = 0;
  STOKER_RETURN_IF_ERROR(
      CudaStatus(d, "cudaEventElapsedTime", cudaEventElapsedTime(&ms, r.start, r.stop)));
  return ms > 0 ? double(bytes) * double(count) / (double(ms) * 1e-3) / 1e9 : 0.0;
}

// The loader's path: Copy() of a registered buffer into pooled device
// blocks, each batch dropped at once (as a consumer that is done with it),
// from the first Copy to the last one landed, on the host clock.
Result<double> TimeStager(gpu::Stager& stager, const void* src, size_t bytes, uint64_t count) {
  const auto t0 = std::chrono::steady_clock::now();
  std::span<const std::byte> host(static_cast<const std::byte*>(src), bytes);
  for (uint64_t i = 0; i < count; ++i) {
    STOKER_ASSIGN_OR_RETURN(auto batch, stager.Copy(host, nullptr, nullptr));
  }
  STOKER_RETURN_IF_ERROR(stager.Drain());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s > 0 ? double(bytes) * double(count) / s / 1e9 : 0.0;
}

}  // namespace

Result<H2dReport> BenchH2d(const H2dBenchOptions& o) {
  H2dReport report;
  STOKER_ASSIGN_OR_RETURN(report.device, GetCudaDevice(o.device));
  if (o.sizes.empty()) return InvalidArgument("bench h2d: no sizes");
  const uint64_t max_size = *std::max_element(o.sizes.begin(), o.sizes.end());
  if (max_size == 0) return InvalidArgument("bench h2d: sizes must be positive");
  const uint32_t repeats = std::max(1u, o.repeats);
  const int d = o.device;

  Resources r;
  r.device = d;
  STOKER_RETURN_IF_ERROR(CudaStatus(d, "cudaSetDevice", cudaSetDevice(d)));
  STOKER_RETURN_IF_ERROR(CudaStatus(d, "cudaStreamCreateWithFlags",
                                    cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking)));
  STOKER_RETURN_IF_ERROR(CudaStatus(d, "cudaEventCreate", cudaEventCreate(&r.start)));
  STOKER_RETURN_IF_ERROR(CudaStatus(d, "cudaEventCreate", cudaEventCreate(&r.stop)));
  const std::string bytes = "(" + std::to_string(max_size) + " bytes)";
  STOKER_RETURN_IF_ERROR(
      CudaStatus(d, "cudaMallocHost" + bytes, cudaMallocHost(&r.pinned, max_size)));
  STOKER_RETURN_IF_ERROR(CudaStatus(d, "cudaMalloc" + bytes, cudaMalloc(&r.dev, max_size)));
  r.pageable = std::aligned_alloc(4096, (max_size + 4095) / 4096 * 4096);
  if (r.pageable == nullptr) return NoSpace("bench h2d: no host memory for " + bytes);
  // Touched (and not zero) so that no copy meets a fresh page or zero page.
  std::memset(r.pinned, 0x5a, max_size);
  std::memset(r.pageable, 0xa5, max_size);
  STOKER_RETURN_IF_ERROR(CudaStatus(d, "cudaMemset", cudaMemset(r.dev, 0x3c, max_size)));

  struct Kind {
    const char* direction;
    const char* memory;
    void* host;
    cudaMemcpyKind kind;
  };
  const Kind kinds[] = {{"h2d", "pinned", r.pinned, cudaMemcpyHostToDevice},
                        {"h2d", "pageable", r.pageable, cudaMemcpyHostToDevice},
                        {"d2h", "pinned", r.pinned, cudaMemcpyDeviceToHost},
                        {"d2h", "pageable", r.pageable, cudaMemcpyDeviceToHost}};
  for (const Kind& k : kinds) {
    for (const uint64_t size : o.sizes) {
      const uint64_t count = std::max<uint64_t>(1, o.bytes_per_run / size);
      void* dst = k.kind == cudaMemcpyHostToDevice ? r.dev : k.host;
      const void* src = k.kind == cudaMemcpyHostToDevice ? k.host : r.dev;
      STOKER_RETURN_IF_ERROR(TimeCopies(r, dst, src, size, 1, k.kind).status());  // warm-up
      std::vector<double> runs;
      for (uint32_t i = 0; i < repeats; ++i) {
        STOKER_ASSIGN_OR_RETURN(double gbps, TimeCopies(r, dst, src, size, count, k.kind));
        runs.push_back(gbps);
      }
      report.results.push_back({k.direction, k.memory, size, Median(runs),
                                *std::max_element(runs.begin(), runs.end()), runs});
    }
  }

  if (o.stoker_path) {
    // A buffer pinned the way the loader pins batch buffers (registered).
    std::unique_ptr<void, decltype(&std::free)> host(
        std::aligned_alloc(4096, (max_size + 4095) / 4096 * 4096), &std::free);
    if (!host) return NoSpace("bench h2d: no host memory for " + bytes);
    std::memset(host.get(), 0x69, max_size);
    for (const uint64_t size : o.sizes) {
      if (size < (1u << 20)) continue;
      gpu::StagerOptions so;
      so.device = d;
      so.memory_budget = 4 * (size + size / 8);  // a few batches in flight, as the loader
      STOKER_ASSIGN_OR_RETURN(auto stager, gpu::Stager::Open(so));
      STOKER_ASSIGN_OR_RETURN(auto pin, stager->Pin(host.get(), max_size));
      const uint64_t count = std::max<uint64_t>(1, o.bytes_per_run / size);
      STOKER_RETURN_IF_ERROR(TimeStager(*stager, host.get(), size, 4).status());  // warm-up
      std::vector<double> runs;
      for (uint32_t i = 0; i < repeats; ++i) {
        STOKER_ASSIGN_OR_RETURN(double gbps, TimeStager(*stager, host.get(), size, count));
        runs.push_back(gbps);
      }
      report.results.push_back(
          {"h2d", "stoker", size, Median(runs), *std::max_element(runs.begin(), runs.end()), runs});
    }
  }

  for (const auto& m : report.results) {
    double* best = nullptr;
    const bool h2d = m.direction == "h2d";
    if (m.memory == "pinned") best = h2d ? &report.h2d_pinned_gbps : &report.d2h_pinned_gbps;
    if (m.memory == "pageable") best = h2d ? &report.h2d_pageable_gbps : &report.d2h_pageable_gbps;
    if (m.memory == "stoker") best = &report.h2d_stoker_gbps;
    *best = std::max(*best, m.gbps);
  }
  return report;
}

}  // namespace stoker
