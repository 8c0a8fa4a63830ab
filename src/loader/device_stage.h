// The loader's optional device stage (internal, LoaderOptions::device):
// one copier thread takes built batches in plan order from the assembly's
// queue, pins each batch buffer the first time it is used, starts its copy
// on the stager's stream without waiting for it, and puts it in a queue of
// its own for Next(). Taking device memory in plan order, in the order the
// consumer gives it back, keeps the bounded device pool deadlock-free.
//
// Thread safety: Start, Stop and Take from the loader's thread.
#pragma once

#include <atomic>
#include <thread>

#include "gpu/stager.h"
#include "loader/gpu_decode.h"
#include "loader/ordered_queue.h"
#include "stoker/loader.h"

namespace stoker {

class DeviceStage final {
 public:
  // `gpu_decode` (may be null): decodes the images each batch left for the
  // GPU, after its copy, on the stager's stream; it counts into `counters`.
  DeviceStage(gpu::Stager& stager, int device, OrderedQueue<Result<Batch>>& built,
              uint64_t num_batches, uint32_t capacity, GpuDecode* gpu_decode = nullptr,
              LoaderCounters* counters = nullptr)
      : stager_(stager),
        gpu_decode_(gpu_decode),
        counters_(counters),
        device_(device),
        built_(built),
        num_batches_(num_batches),
        copied_(capacity) {}
  ~DeviceStage() { Stop(); }

  void Start() {
    copier_ = std::thread([this] { CopierLoop(); });
  }
  // Joins the copier. Stop the built queue first: the copier may wait on it.
  void Stop();

  // Batch `index` with its copy started. When the copier waits for device
  // memory for this very batch, only batches the consumer holds can free
  // some: after a grace period that is NoSpace, not a hang. With
  // `unbuilt_deadline` (per-sample reads), a batch not built by then is
  // `not_built`'s error.
  Result<Batch> Take(uint64_t index, Deadline unbuilt_deadline, const Status& not_built);

 private:
  void CopierLoop();
  Result<Batch> ToDevice(Batch batch);

  gpu::Stager& stager_;
  GpuDecode* const gpu_decode_;
  LoaderCounters* const counters_;
  const int device_;
  OrderedQueue<Result<Batch>>& built_;
  const uint64_t num_batches_;
  OrderedQueue<Result<Batch>> copied_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_copy_{0};  // the batch the copier works on or waits for
  std::thread copier_;
};

}  // namespace stoker
