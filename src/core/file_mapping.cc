#include "core/file_mapping.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>

namespace stoker::internal {

FileMapping::~FileMapping() {
  if (data_ != nullptr) munmap(const_cast<std::byte*>(data_), size_);
}

Result<std::span<const std::byte>> FileMapping::Get(int fd, const std::string& path) {
  std::lock_guard lock(mu_);
  if (mapped_) return std::span<const std::byte>(data_, size_);
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoToStatus(errno, "fstat " + path);
  if (!S_ISREG(st.st_mode)) {
    return Unsupported(path + " is not a regular file: it cannot be mapped");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    // MAP_SHARED: the page cache's pages themselves, no private copy. No
    // MAP_POPULATE: the readers' first loads fault pages in, in parallel,
    // a 64 KiB window at a time (the kernel's fault-around).
    void* p = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      size_ = 0;
      return ErrnoToStatus(errno, "mmap " + path);
    }
    data_ = static_cast<const std::byte*>(p);
  }
  mapped_ = true;
  return std::span<const std::byte>(data_, size_);
}

}  // namespace stoker::internal
