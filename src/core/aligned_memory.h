// Aligned memory, the one facility every module uses (internal): buffers
// for direct I/O (4 KiB-aligned, kDirectIoAlignment), growable scratch
// buffers that a worker reuses, and page-aligned anonymous mappings for
// large blocks (a checkpoint's staging area, restored tensors).
//
// Thread safety: none of these is safe for concurrent use; each belongs to
// one thread at a time (or is only read once filled).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "stoker/status.h"

namespace stoker::internal {

// std::aligned_alloc of `bytes` rounded up to a multiple of `alignment` (a
// power of two), freed with std::free; null when out of memory.
struct FreeDeleter {
  void operator()(void* p) const;
};
using AlignedPtr = std::unique_ptr<std::byte, FreeDeleter>;
AlignedPtr AllocateAligned(size_t bytes, size_t alignment);

// The same for `part`, what the memory is for ("checkpoint restore's read
// buffer"): NoSpace naming the bytes and the part when there is none, so
// that a worker thread returns it as a Status instead of throwing.
Result<AlignedPtr> Allocate(size_t bytes, size_t alignment, std::string_view part);

// The NoSpace of a failed allocation: "out of memory: 4194304 bytes for
// loader batch buffer".
Status OutOfMemory(size_t bytes, std::string_view part);

// Tests only: a hook Allocate asks before each allocation; true makes that
// one fail as if the system had no memory (NoSpace). Null (the default): no
// hook. A function pointer set by the test itself, not an environment
// variable, so nothing outside a test program can turn it on. Safe to set
// while other threads allocate; the hook itself must be thread-safe.
using AllocationFailureHook = bool (*)(size_t bytes, std::string_view part);
void SetAllocationFailureHookForTesting(AllocationFailureHook hook);

// A reusable buffer that grows to the largest size asked for and keeps it.
// Not zeroed: every byte is written before it is read.
class ScratchBuffer {
 public:
  explicit ScratchBuffer(size_t alignment = 4096) : alignment_(alignment) {}
  // At least `n` bytes, aligned; NoSpace naming `n` and `part` (what the
  // buffer is for, see Allocate) when out of memory, the buffer then empty.
  Result<std::byte*> Get(size_t n, std::string_view part);
  size_t size() const { return size_; }

 private:
  size_t alignment_;
  AlignedPtr data_;
  size_t size_ = 0;
};

// Page-aligned anonymous memory (mmap), whole 2 MiB blocks, unmapped on
// destruction.
class MappedMemory {
 public:
  MappedMemory() = default;
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;
  ~MappedMemory();

  // With `huge_pages`, asks for transparent huge pages (MADV_HUGEPAGE): 512
  // times fewer faults, but the first touch may stall on compaction
  // (defrag=madvise, Debian's default), and on VMs that return free memory
  // to the host (virtio-balloon free page reporting, which reports 2 MiB
  // blocks) a fresh huge page is exactly what the host has taken back; what
  // each costs where is in docs/benchmarks.md ("Checkpoints"). Memory that
  // is allocated once and reused (a staging area) asks for them; memory
  // used once (restored tensors) leaves the choice to the system's policy.
  static Result<std::unique_ptr<MappedMemory>> Make(size_t bytes, bool huge_pages);

  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace stoker::internal
