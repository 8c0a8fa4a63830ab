#include "loader/batch_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdlib>

namespace stoker {

namespace {
// Blocks of this size and more are 2 MiB aligned and asked to be backed by
// transparent huge pages: a fresh 4 MiB shard buffer then costs 2 page
// faults instead of 1024, which shows in the first epoch of every job.
constexpr size_t kHugePage = 2 << 20;

// Slack blocks are rounded up to one of 8 sizes per power of two, so batches
// of similar size share blocks instead of each wanting one a little larger.
size_t SizeClass(size_t bytes) {
  if (bytes < (64 << 10)) return bytes;
  const size_t step = (size_t{1} << (std::bit_width(bytes) - 1)) / 8;
  return AlignUp(bytes, step);
}
}  // namespace

Result<std::unique_ptr<BatchMemory>> BatchMemory::Make(size_t capacity, size_t alignment,
                                                       std::string_view part) {
  std::unique_ptr<BatchMemory> m(new BatchMemory());
  m->capacity_ = AlignUp(capacity, alignment);
  if (m->capacity_ >= kHugePage) {
    m->capacity_ = AlignUp(m->capacity_, kHugePage);
    alignment = std::max(alignment, kHugePage);
  }
  STOKER_ASSIGN_OR_RETURN(m->memory_, internal::Allocate(m->capacity_, alignment, part));
  m->data_ = m->memory_.get();
  if (m->capacity_ >= kHugePage) {
    (void)::madvise(m->data_, m->capacity_, MADV_HUGEPAGE);  // a hint only
  }
  return m;
}

BatchMemory::~BatchMemory() {
  pin_.reset();  // memory must be unpinned before it is freed
  memory_.reset();
}

Result<std::shared_ptr<BatchMemory>> BufferPool::Get(size_t bytes, std::string_view part) {
  std::unique_ptr<BatchMemory> block;
  {
    std::lock_guard lock(mu_);
    // Best fit among the free blocks, so big blocks are kept for big batches.
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i]->capacity() >= bytes &&
          (best == free_.size() || free_[i]->capacity() < free_[best]->capacity())) {
        best = i;
      }
    }
    if (best != free_.size()) {
      block = std::move(free_[best]);
      free_.erase(free_.begin() + static_cast<ptrdiff_t>(best));
    } else if (!free_.empty()) {
      // None fits: drop the smallest free one so the total stays bounded;
      // keeping the largest makes the blocks settle on the largest batch.
      size_t smallest = 0;
      for (size_t i = 1; i < free_.size(); ++i) {
        if (free_[i]->capacity() < free_[smallest]->capacity()) smallest = i;
      }
      allocated_ -= free_[smallest]->capacity();
      free_.erase(free_.begin() + static_cast<ptrdiff_t>(smallest));
    }
  }
  if (!block) {
    STOKER_ASSIGN_OR_RETURN(
        block, BatchMemory::Make(slack_ ? SizeClass(bytes + bytes / 8) : bytes, alignment_, part));
    uint64_t now = allocated_ += block->capacity();
    uint64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  block->set_size(bytes);
  std::weak_ptr<BufferPool> weak = weak_from_this();
  return std::shared_ptr<BatchMemory>(block.release(), [weak](BatchMemory* m) {
    if (auto pool = weak.lock()) {
      pool->Return(m);
    } else {
      delete m;
    }
  });
}

void BufferPool::Return(BatchMemory* m) {
  std::lock_guard lock(mu_);
  if (free_.size() < max_free_) {
    free_.emplace_back(m);
  } else {
    allocated_ -= m->capacity();
    delete m;
  }
}

}  // namespace stoker
