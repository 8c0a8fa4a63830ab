// Pooled, aligned memory behind batches and shard reads (internal).
//
// A BufferPool hands out aligned blocks and takes them back; a block given
// back after its pool is gone is simply freed, so a Batch may outlive its
// Loader. Thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "core/aligned_memory.h"
#include "stoker/loader.h"

namespace stoker {

// 64 bytes: a cache line, and what DLPack consumers and SIMD loads like.
inline constexpr size_t kColumnAlignment = 64;

inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

class BufferPool;
class GpuDecodeList;  // loader/gpu_decode.h

// One aligned block. Owned by a shared_ptr whose deleter returns it to the pool.
class BatchMemory {
 public:
  // A block of at least `capacity` bytes; NoSpace naming the bytes and
  // `part` (what it is for, core/aligned_memory.h) when out of memory.
  static Result<std::unique_ptr<BatchMemory>> Make(size_t capacity, size_t alignment,
                                                   std::string_view part);
  ~BatchMemory();
  BatchMemory(const BatchMemory&) = delete;
  BatchMemory& operator=(const BatchMemory&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  // Bytes of the block in use by its current holder.
  size_t size() const { return size_; }
  void set_size(size_t n) { size_ = n; }
  // GPU delivery: a token that keeps the block pinned for DMA, released
  // (unpinned) before the memory is freed. Used by one holder at a time.
  void set_pin(std::shared_ptr<void> pin) { pin_ = std::move(pin); }
  bool pinned() const { return pin_ != nullptr; }
  // The GPU decode: the images of the batch in this block that the device
  // stage decodes (null for none). Set by its builder, one batch at a time.
  void set_gpu_decode(std::shared_ptr<GpuDecodeList> l) { gpu_decode_ = std::move(l); }
  const std::shared_ptr<GpuDecodeList>& gpu_decode() const { return gpu_decode_; }

 private:
  BatchMemory() = default;

  std::shared_ptr<void> pin_;
  std::shared_ptr<GpuDecodeList> gpu_decode_;
  internal::AlignedPtr memory_;  // what data_ points into
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
  size_t size_ = 0;
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // Keeps at most `max_free` free blocks. With `slack`, a new block gets 1/8
  // more than asked, since batch sizes vary with their samples' sizes.
  BufferPool(size_t alignment, size_t max_free, bool slack)
      : alignment_(alignment), max_free_(max_free), slack_(slack) {}

  // A block of at least `bytes`, reused when a free one is large enough;
  // NoSpace naming the bytes and `part` (what the block is for: "loader
  // batch buffer") when a new one cannot be allocated.
  Result<std::shared_ptr<BatchMemory>> Get(size_t bytes, std::string_view part);

  // Bytes currently allocated by this pool (free or in use).
  uint64_t allocated_bytes() const { return allocated_.load(); }
  uint64_t peak_bytes() const { return peak_.load(); }

 private:
  void Return(BatchMemory* m);

  const size_t alignment_;
  const size_t max_free_;
  const bool slack_;
  std::mutex mu_;
  std::vector<std::unique_ptr<BatchMemory>> free_;
  std::atomic<uint64_t> allocated_{0};
  std::atomic<uint64_t> peak_{0};
};

}  // namespace stoker
