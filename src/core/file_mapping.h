// A whole open file mapped read-only (internal): ObjectReader::Map for the
// POSIX store's readers and the node cache's.
#pragma once

#include <cstddef>
#include <mutex>
#include <span>
#include <string>

#include "stoker/status.h"

namespace stoker::internal {

// Maps on first use, from any thread; unmaps on destruction. The file's
// size is taken when it is mapped: a file that grows later shows its old
// size, one that shrinks raises SIGBUS past its new end (core/mapped_guard.h).
class FileMapping {
 public:
  FileMapping() = default;
  ~FileMapping();
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  // The bytes of `fd` (named `path` in errors). An empty file is an empty
  // span (nothing to map).
  Result<std::span<const std::byte>> Get(int fd, const std::string& path);

 private:
  std::mutex mu_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;
};

}  // namespace stoker::internal
