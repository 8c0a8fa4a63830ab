#include "core/aligned_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>

namespace stoker::internal {

void FreeDeleter::operator()(void* p) const { std::free(p); }

AlignedPtr AllocateAligned(size_t bytes, size_t alignment) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  return AlignedPtr(static_cast<std::byte*>(std::aligned_alloc(alignment, rounded)));
}

namespace {
std::atomic<AllocationFailureHook> g_failure_hook{nullptr};
}  // namespace

void SetAllocationFailureHookForTesting(AllocationFailureHook hook) { g_failure_hook = hook; }

Status OutOfMemory(size_t bytes, std::string_view part) {
  return NoSpace("out of memory: " + std::to_string(bytes) + " bytes for " + std::string(part));
}

Result<AlignedPtr> Allocate(size_t bytes, size_t alignment, std::string_view part) {
  const AllocationFailureHook hook = g_failure_hook.load(std::memory_order_relaxed);
  if (hook != nullptr && hook(bytes, part)) return OutOfMemory(bytes, part);
  AlignedPtr p = AllocateAligned(bytes, alignment);
  if (p == nullptr) return OutOfMemory(bytes, part);
  return p;
}

Result<std::byte*> ScratchBuffer::Get(size_t n, std::string_view part) {
  if (n > size_) {
    data_.reset();  // the old block goes first: no peak of both
    size_ = 0;
    STOKER_ASSIGN_OR_RETURN(data_, Allocate(n, alignment_, part));
    size_ = (n + alignment_ - 1) / alignment_ * alignment_;
  }
  return data_.get();
}

MappedMemory::~MappedMemory() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

Result<std::unique_ptr<MappedMemory>> MappedMemory::Make(size_t bytes, bool huge_pages) {
  auto m = std::make_unique<MappedMemory>();
  if (bytes == 0) return m;
  constexpr size_t kHugePage = 2ull << 20;
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return ErrnoToStatus(errno, "mmap of " + std::to_string(bytes) + " bytes");
  if (huge_pages) (void)::madvise(p, size, MADV_HUGEPAGE);  // a hint only
  m->data_ = static_cast<std::byte*>(p);
  m->size_ = size;
  return m;
}

}  // namespace stoker::internal
