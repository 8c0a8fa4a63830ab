#include "core/aligned_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <new>
#include <string>

namespace stoker::internal {

void FreeDeleter::operator()(void* p) const { std::free(p); }

AlignedPtr AllocateAligned(size_t bytes, size_t alignment) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  return AlignedPtr(static_cast<std::byte*>(std::aligned_alloc(alignment, rounded)));
}

std::byte* ScratchBuffer::Get(size_t n) {
  if (n > size_) {
    data_.reset();  // the old block goes first: no peak of both
    AlignedPtr p = AllocateAligned(n, alignment_);
    if (p == nullptr) {
      size_ = 0;
      throw std::bad_alloc();
    }
    data_ = std::move(p);
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
