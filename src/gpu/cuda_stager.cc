// The stager on the CUDA runtime: one non-blocking stream, a bounded pool of
// device blocks, and the copies in flight with the host buffers they read.
//
// Who holds a device block: the DeviceBatch handed to the consumer, and the
// in-flight entry until the copy's event has completed. When both have let
// go, the block returns to the pool's free list carrying the events recorded
// on the consumer's streams at release; Acquire reuses it only once those
// have completed (cudaEventQuery), and otherwise prefers a new block while
// the budget allows, as PyTorch's caching allocator does with record_stream.
//
// The pool's state (the Core) is shared by the Stager and every block, so a
// batch may outlive its loader; the last owner frees the memory.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

#include "gpu/cuda_util.h"
#include "gpu/stager.h"

namespace stoker::gpu {
namespace {

std::atomic<uint64_t> g_fail_countdown{0};
std::atomic<int> g_fail_error{0};

struct Block {
  void* ptr = nullptr;
  size_t capacity = 0;
  // Timing events around the block's latest copy. Default flags (spin, then
  // yield): the stager waits on `done` only when every block is in flight,
  // where a sleeping wait's wake-up (milliseconds on one VM seen) would stall
  // the copy engine; 1 MiB copies ran at 0.4 GB/s with cudaEventBlockingSync.
  cudaEvent_t start = nullptr, done = nullptr;
  // Recorded on each consumer stream when its batch was released.
  std::vector<cudaEvent_t> fences;
  size_t fences_used = 0;
};

class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(int device, cudaStream_t stream, uint64_t budget, bool async_alloc)
      : device_(device), stream_(stream), budget_(budget), async_alloc_(async_alloc) {}

  ~Core() {
    DeviceGuard guard(device_);
    for (auto& b : free_) Destroy(b.get());
    (void)cudaStreamSynchronize(stream_);  // the stream-ordered frees above
    (void)cudaStreamDestroy(stream_);
  }

  struct InFlight {
    std::shared_ptr<Block> block;
    std::shared_ptr<const void> keep_alive;
  };

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // A block of at least `bytes`, ready to be written on the stream.
  Result<std::unique_ptr<Block>> Acquire(size_t bytes, const std::function<bool()>& cancelled) {
    // 1/8 slack, as the host batch pool: batch sizes vary with their samples.
    size_t want = bytes + bytes / 8;
    if (want > budget_) want = bytes;
    if (bytes > budget_) {
      return NoSpace(DeviceName(device_) + ": a batch of " + std::to_string(bytes) +
                     " bytes does not fit in the device memory budget of " +
                     std::to_string(budget_) + " bytes (raise device_memory_budget)");
    }
    while (true) {
      std::vector<InFlight> landed;  // destroyed after the lock is released
      std::unique_lock lock(mu_);
      STOKER_RETURN_IF_ERROR(ReapLocked(&landed));
      // Best fit among free blocks whose consumers are done with them.
      size_t best = free_.size(), pending = free_.size(), small = free_.size();
      for (size_t i = 0; i < free_.size(); ++i) {
        STOKER_ASSIGN_OR_RETURN(bool idle, FencesDone(*free_[i]));
        if (!idle) {
          if (pending == free_.size()) pending = i;
        } else if (free_[i]->capacity >= bytes) {
          if (best == free_.size() || free_[i]->capacity < free_[best]->capacity) best = i;
        } else if (small == free_.size()) {
          small = i;
        }
      }
      if (best != free_.size()) {
        std::unique_ptr<Block> b = std::move(free_[best]);
        free_.erase(free_.begin() + static_cast<ptrdiff_t>(best));
        b->fences_used = 0;
        return b;
      }
      if (allocated_ + want <= budget_) return NewBlock(want);
      if (small != free_.size()) {  // too small for this batch: make room
        Destroy(free_[small].get());
        free_.erase(free_.begin() + static_cast<ptrdiff_t>(small));
        continue;
      }
      if (cancelled && cancelled()) return Cancelled("stopped while waiting for device memory");
      if (pending != free_.size()) {
        // A released block whose consumer has not finished with it: wait for
        // that one event (never the whole device).
        Block* b = free_[pending].get();
        const cudaEvent_t fence = b->fences[b->fences_used - 1];
        lock.unlock();
        STOKER_RETURN_IF_ERROR(CudaStatus(device_, "cudaEventSynchronize(consumer fence)",
                                          cudaEventSynchronize(fence)));
        continue;
      }
      if (!in_flight_.empty()) {
        // Blocks held by copies in flight come back when they land.
        const cudaEvent_t done = in_flight_.front().block->done;
        lock.unlock();
        STOKER_RETURN_IF_ERROR(
            CudaStatus(device_, "cudaEventSynchronize(copy)", cudaEventSynchronize(done)));
        continue;
      }
      // Everything is held by live batches: wait for one to be released.
      waiting_ = true;
      cv_.wait_for(lock, std::chrono::milliseconds(20));
      waiting_ = false;
    }
  }

  void Track(InFlight f, size_t bytes) {
    std::lock_guard lock(mu_);
    in_flight_.push_back(std::move(f));
    copies_++;
    bytes_ += bytes;
  }

  // Blocks come back here when their last holder lets go.
  void Release(Block* b) {
    std::lock_guard lock(mu_);
    free_.emplace_back(b);
    cv_.notify_all();
  }

  Status Drain() {
    DeviceGuard guard(device_);
    Status st = CudaStatus(device_, "cudaStreamSynchronize", cudaStreamSynchronize(stream_));
    std::vector<InFlight> landed;
    std::lock_guard lock(mu_);
    Status reaped = ReapLocked(&landed);
    if (!st.ok() || !reaped.ok()) {
      // The stream failed: nothing more will land. Let every host buffer go.
      while (!in_flight_.empty()) {
        landed.push_back(std::move(in_flight_.front()));
        in_flight_.pop_front();
      }
    }
    return st.ok() ? reaped : st;
  }

  Status sticky() const {
    std::lock_guard lock(mu_);
    return sticky_;
  }

  StagerStats stats() const {
    std::lock_guard lock(mu_);
    StagerStats s;
    s.copies = copies_;
    s.bytes = bytes_;
    s.copy_time = copy_time_;
    s.device_bytes = allocated_;
    s.peak_device_bytes = peak_;
    return s;
  }

  bool waiting() const { return waiting_.load(); }

 private:
  // Moves the copies that have landed, oldest first, to `landed`, adding up
  // their device time. Copies on one stream land in order.
  Status ReapLocked(std::vector<InFlight>* landed) {
    while (!in_flight_.empty()) {
      Block* b = in_flight_.front().block.get();
      const cudaError_t q = cudaEventQuery(b->done);
      if (q == cudaErrorNotReady) break;
      if (q != cudaSuccess) {
        if (sticky_.ok()) sticky_ = CudaStatus(device_, "cudaMemcpyAsync (completion)", q);
        return sticky_;
      }
      float ms = 0;
      if (cudaEventElapsedTime(&ms, b->start, b->done) == cudaSuccess) {
        copy_time_ += std::chrono::nanoseconds(static_cast<int64_t>(double(ms) * 1e6));
      }
      landed->push_back(std::move(in_flight_.front()));
      in_flight_.pop_front();
    }
    return Status::Ok();
  }

  Result<bool> FencesDone(const Block& b) {
    for (size_t i = 0; i < b.fences_used; ++i) {
      const cudaError_t q = cudaEventQuery(b.fences[i]);
      if (q == cudaErrorNotReady) return false;
      STOKER_RETURN_IF_ERROR(CudaStatus(device_, "cudaEventQuery(consumer fence)", q));
    }
    return true;
  }

  Result<std::unique_ptr<Block>> NewBlock(size_t bytes) {
    auto b = std::make_unique<Block>();
    void* p = nullptr;
    // Stream-ordered: neither allocation nor free synchronises the device.
    const cudaError_t err =
        async_alloc_ ? cudaMallocAsync(&p, bytes, stream_) : cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it for the next call
      return CudaStatus(device_,
                        std::string(async_alloc_ ? "cudaMallocAsync(" : "cudaMalloc(") +
                            std::to_string(bytes) + " bytes)",
                        err);
    }
    b->ptr = p;
    b->capacity = bytes;
    allocated_ += bytes;
    peak_ = std::max(peak_, allocated_);
    cudaError_t e = cudaEventCreateWithFlags(&b->start, cudaEventDefault);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&b->done, cudaEventDefault);
    if (e != cudaSuccess) {
      Destroy(b.get());
      return CudaStatus(device_, "cudaEventCreateWithFlags", e);
    }
    return b;
  }

  void Destroy(Block* b) {
    if (b->ptr != nullptr) {
      // A consumer may still be reading it: the free waits for its fences.
      for (size_t i = 0; i < b->fences_used; ++i) {
        (void)cudaStreamWaitEvent(stream_, b->fences[i], 0);
      }
      (void)(async_alloc_ ? cudaFreeAsync(b->ptr, stream_) : cudaFree(b->ptr));
      allocated_ -= b->capacity;
    }
    if (b->start) (void)cudaEventDestroy(b->start);
    if (b->done) (void)cudaEventDestroy(b->done);
    for (cudaEvent_t f : b->fences) (void)cudaEventDestroy(f);
    b->ptr = nullptr;
  }

  const int device_;
  const cudaStream_t stream_;
  const uint64_t budget_;
  const bool async_alloc_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Block>> free_;
  std::deque<InFlight> in_flight_;
  uint64_t allocated_ = 0, peak_ = 0;
  uint64_t copies_ = 0, bytes_ = 0;
  std::chrono::nanoseconds copy_time_{0};
  Status sticky_;
  std::atomic<bool> waiting_{false};
};

cudaStream_t ToStream(CudaStreamHandle h) {
  return reinterpret_cast<cudaStream_t>(h);  // 1 and 2 are cudaStreamLegacy/PerThread
}

class DeviceBatchImpl final : public DeviceBatch {
 public:
  DeviceBatchImpl(std::shared_ptr<Block> block, int device, size_t size)
      : block_(std::move(block)), device_(device), size_(size) {}

  // Records a fence on every consumer stream, then lets the block go.
  ~DeviceBatchImpl() override {
    std::lock_guard lock(mu_);
    Block& b = *block_;
    for (cudaStream_t s : consumers_) {
      if (b.fences_used == b.fences.size()) {
        DeviceGuard guard(device_);
        cudaEvent_t e = nullptr;
        if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync) !=
            cudaSuccess) {
          continue;  // cannot fence: nothing sane left to do in a destructor
        }
        b.fences.push_back(e);
      }
      if (cudaEventRecord(b.fences[b.fences_used], s) == cudaSuccess) b.fences_used++;
    }
  }

  int device() const override { return device_; }
  const std::byte* data() const override { return static_cast<const std::byte*>(block_->ptr); }
  size_t size() const override { return size_; }

  Status WaitOn(CudaStreamHandle stream) override {
    const cudaStream_t s = ToStream(stream);
    STOKER_RETURN_IF_ERROR(
        CudaStatus(device_, "cudaStreamWaitEvent", cudaStreamWaitEvent(s, block_->done, 0)));
    std::lock_guard lock(mu_);
    if (std::find(consumers_.begin(), consumers_.end(), s) == consumers_.end()) {
      consumers_.push_back(s);
    }
    return Status::Ok();
  }

  Status Synchronize() override {
    return CudaStatus(device_, "cudaEventSynchronize", cudaEventSynchronize(block_->done));
  }

  Result<bool> Ready() const override {
    const cudaError_t q = cudaEventQuery(block_->done);
    if (q == cudaErrorNotReady) return false;
    STOKER_RETURN_IF_ERROR(CudaStatus(device_, "cudaEventQuery", q));
    return true;
  }

 private:
  std::shared_ptr<Block> block_;
  const int device_;
  const size_t size_;
  std::mutex mu_;
  std::vector<cudaStream_t> consumers_;
};

class StagerImpl final : public Stager {
 public:
  explicit StagerImpl(std::shared_ptr<Core> core)
      : core_(std::move(core)), pinned_(std::make_shared<std::atomic<uint64_t>>(0)) {}

  ~StagerImpl() override { (void)core_->Drain(); }

  int device() const override { return core_->device(); }

  Result<std::shared_ptr<void>> Pin(void* p, size_t n) override {
    const int device = core_->device();
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaSetDevice", cudaSetDevice(device)));
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaHostRegister(" + std::to_string(n) + " bytes)",
                                      cudaHostRegister(p, n, cudaHostRegisterDefault)));
    *pinned_ += n;
    auto counter = pinned_;
    return std::shared_ptr<void>(p, [counter, n](void* q) {
      (void)cudaHostUnregister(q);
      *counter -= n;
    });
  }

  Result<std::shared_ptr<DeviceBatch>> Copy(std::span<const std::byte> host,
                                            std::shared_ptr<const void> keep_alive,
                                            const std::function<bool()>& cancelled,
                                            const AfterCopy& then) override {
    const int device = core_->device();
    STOKER_RETURN_IF_ERROR(core_->sticky());
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaSetDevice", cudaSetDevice(device)));
    const std::string call = "cudaMemcpyAsync(" + std::to_string(host.size()) + " bytes to device)";
    if (g_fail_countdown.load() > 0 && g_fail_countdown.fetch_sub(1) == 1) {
      return CudaStatus(device, call, static_cast<cudaError_t>(g_fail_error.load()));
    }
    STOKER_ASSIGN_OR_RETURN(std::unique_ptr<Block> block, core_->Acquire(host.size(), cancelled));
    std::shared_ptr<Core> core = core_;
    std::shared_ptr<Block> shared(block.release(), [core](Block* b) { core->Release(b); });
    const cudaStream_t s = core_->stream();
    STOKER_RETURN_IF_ERROR(
        CudaStatus(device, "cudaEventRecord", cudaEventRecord(shared->start, s)));
    if (!host.empty()) {
      STOKER_RETURN_IF_ERROR(CudaStatus(
          device, call,
          cudaMemcpyAsync(shared->ptr, host.data(), host.size(), cudaMemcpyHostToDevice, s)));
    }
    // The work `then` queues reads the host buffer too (and the copy is in
    // flight): even when it fails, the buffer is held until `done`.
    const Status after = then ? then(reinterpret_cast<CudaStreamHandle>(s),
                                     static_cast<std::byte*>(shared->ptr))
                              : Status::Ok();
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaEventRecord", cudaEventRecord(shared->done, s)));
    core_->Track({shared, std::move(keep_alive)}, host.size());
    STOKER_RETURN_IF_ERROR(after);
    return std::shared_ptr<DeviceBatch>(
        std::make_shared<DeviceBatchImpl>(std::move(shared), device, host.size()));
  }

  Status Drain() override { return core_->Drain(); }

  StagerStats stats() const override {
    StagerStats s = core_->stats();
    s.pinned_bytes = pinned_->load();
    return s;
  }

  bool waiting_for_memory() const override { return core_->waiting(); }

 private:
  std::shared_ptr<Core> core_;
  std::shared_ptr<std::atomic<uint64_t>> pinned_;
};

}  // namespace

Result<std::unique_ptr<Stager>> Stager::Open(const StagerOptions& options) {
  const int device = options.device;
  STOKER_RETURN_IF_ERROR(GetCudaDevice(device).status());
  STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaSetDevice", cudaSetDevice(device)));
  int pools = 0;
  (void)cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device);
  cudaStream_t stream = nullptr;
  STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaStreamCreateWithFlags",
                                    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  auto core = std::make_shared<Core>(device, stream, options.memory_budget, pools != 0);
  return std::unique_ptr<Stager>(std::make_unique<StagerImpl>(std::move(core)));
}

void InjectCopyFailure(uint64_t nth, int cuda_error) {
  g_fail_error = cuda_error;
  g_fail_countdown = nth;
}

}  // namespace stoker::gpu
