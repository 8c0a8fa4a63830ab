// The loader's statistics as its stages count them (internal): relaxed
// atomics, so no stage takes a lock to count; Loader::stats() sums them.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace stoker {

struct LoaderCounters {
  std::atomic<uint64_t> shards_read{0};
  std::atomic<uint64_t> bytes_read{0};
  std::atomic<uint64_t> samples_delivered{0};
  std::atomic<uint64_t> batches_delivered{0};
  std::atomic<uint64_t> read_retries{0};  // counted by the RetryingStore
  std::atomic<uint64_t> wait_ns{0};
  std::atomic<uint64_t> decode_skipped{0};
  std::atomic<uint64_t> shared_batches{0};
  // Images decoded by each backend (DecodeOptions::device), counted when
  // decoded.
  std::atomic<uint64_t> decoded_hardware{0};
  std::atomic<uint64_t> decoded_cuda{0};
  std::atomic<uint64_t> decoded_cpu{0};
  // The device stage's copier thread: time blocked for the workers' next
  // batch, time in the GPU decode (of it, waiting for the GPU's own work),
  // and the CPU time the thread was given.
  std::atomic<uint64_t> copier_wait_ns{0};
  std::atomic<uint64_t> gpu_decode_ns{0};
  std::atomic<uint64_t> gpu_decode_wait_ns{0};
  std::atomic<uint64_t> copier_cpu_ns{0};

  static void Add(std::atomic<uint64_t>& c, uint64_t n) {
    c.fetch_add(n, std::memory_order_relaxed);
  }
  // Adds the nanoseconds since `start` (a steady-clock time).
  static void AddSince(std::atomic<uint64_t>& c, std::chrono::steady_clock::time_point start) {
    Add(c, uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count()));
  }
};

}  // namespace stoker
