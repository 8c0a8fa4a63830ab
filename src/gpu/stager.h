// The stager: copies host batch buffers into pooled device memory on its own
// stream (internal; used by the loader and by `bench h2d`).
//
// One non-blocking stream per stager, so copies neither wait for nor hold up
// the consumer's work on the legacy default stream. A copy's host buffer is
// kept alive until the copy's event says it has landed, so a pinned buffer
// is never handed back to its pool (and rewritten) while the DMA still reads
// it. Device blocks come from a pool bounded by `memory_budget`: a released
// block is reused only once the events recorded on its consumers' streams
// have completed; when every block is held by live batches, Copy waits.
//
// Thread safety: Copy, Drain and Pin are called from one thread at a time
// (the loader's copier thread); stats() and waiting_for_memory() from any
// thread. DeviceBatch objects and pin tokens may outlive the stager.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "stoker/gpu.h"
#include "stoker/status.h"

namespace stoker::gpu {

struct StagerOptions {
  int device = 0;
  // Device bytes the pool may hold, free or in use. Default: 1 GiB.
  uint64_t memory_budget = 1ull << 30;
};

struct StagerStats {
  uint64_t copies = 0;
  uint64_t bytes = 0;
  // Sum of each copy's duration on the device (its events), for copies that
  // have landed: the time the copy engine was busy for this stager.
  std::chrono::nanoseconds copy_time{0};
  uint64_t device_bytes = 0;       // allocated by the pool now
  uint64_t peak_device_bytes = 0;  // the most it held
  uint64_t pinned_bytes = 0;       // host bytes pinned by Pin, not yet unpinned
};

class Stager {
 public:
  // Checks the device (exists, in range) and creates the stream. Errors name
  // the device and the call.
  static Result<std::unique_ptr<Stager>> Open(const StagerOptions& options);

  // Waits for this stager's copies (its stream alone), then releases their
  // host buffers. Device blocks held by live batches stay valid.
  virtual ~Stager() = default;

  virtual int device() const = 0;

  // Pins [p, p + n) for DMA (cudaHostRegister). The memory stays pinned until
  // the returned token is destroyed, which must happen before it is freed.
  virtual Result<std::shared_ptr<void>> Pin(void* p, size_t n) = 0;

  // Starts copying `host` into a device block of the pool. `keep_alive` holds
  // the host memory and is released once the copy has landed. Blocks while
  // the budget is held by live batches, polling `cancelled` (Cancelled when
  // it returns true). NoSpace when one copy is larger than the budget or the
  // device is out of memory.
  // `then`, when given, queues more work on the stager's stream after the
  // copy and before the batch counts as landed (the GPU decode writes its
  // images into the block there); its error fails the copy.
  using AfterCopy = std::function<Status(CudaStreamHandle stream, std::byte* device)>;
  virtual Result<std::shared_ptr<DeviceBatch>> Copy(std::span<const std::byte> host,
                                                    std::shared_ptr<const void> keep_alive,
                                                    const std::function<bool()>& cancelled,
                                                    const AfterCopy& then = {}) = 0;

  // Waits for every copy issued so far and releases their host buffers;
  // returns the first asynchronous error a copy reported, if any.
  virtual Status Drain() = 0;

  virtual StagerStats stats() const = 0;

  // True while Copy waits for a block that only a live batch can give back.
  virtual bool waiting_for_memory() const = 0;
};

// Fault injection for tests: the `nth` Copy from now (1 = the next) of any
// stager fails as if cudaMemcpyAsync had returned `cuda_error`. 0 disarms.
void InjectCopyFailure(uint64_t nth, int cuda_error);

}  // namespace stoker::gpu
