// Read-only mappings of whole files (internal): ObjectReader::Map for the
// POSIX store's readers and the node cache's.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>

#include "stoker/status.h"

namespace stoker::internal {

// Which file, as it was when it was mapped: another inode at the same path,
// or the same inode written since, is another mapping.
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

FileIdentity IdentityOf(const struct stat& st);
// The identity of open file `fd` (named `path` in errors); Unsupported when
// it is not a regular file.
Result<FileIdentity> IdentityOf(int fd, const std::string& path);

// One mapping of a file's bytes (MAP_SHARED, PROT_READ: the page cache's
// pages themselves), unmapped when the last holder lets go. The size is the
// file's when it was mapped: a file that grows later shows its old size, one
// that shrinks raises SIGBUS past its new end (core/mapped_guard.h).
class FileMap {
 public:
  // An empty file is an empty span (nothing is mapped). On failure, mmap's
  // errno goes to *error when given.
  static Result<std::shared_ptr<const FileMap>> Make(int fd, uint64_t size, const std::string& path,
                                                     int* error = nullptr);
  ~FileMap();
  FileMap(const FileMap&) = delete;
  FileMap& operator=(const FileMap&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  FileMap(const std::byte* data, size_t size) : data_(data), size_(size) {}
  const std::byte* const data_;
  const size_t size_;
};

// Mappings kept from one open of a file to the next, so that a shard read
// again (the next epoch) costs no mmap, no page faults while its pages stay
// in the page cache, and no munmap (on a many-core node, each munmap
// interrupts every core the process has run on to flush their TLBs).
// Least recently used first out, past `max_bytes` mapped or `max_maps`
// mappings. A kept mapping of a file since deleted or replaced holds that
// inode's blocks until it is dropped: at the next open of its path, when it
// is evicted, or with the cache. Thread-safe.
class MappingCache {
 public:
  MappingCache(uint64_t max_bytes, size_t max_maps) : max_bytes_(max_bytes), max_maps_(max_maps) {}

  // Limits from the machine: `max_bytes`, or when 0 its physical memory
  // (more than the page cache can hold would fault again anyway), and a
  // quarter of vm.max_map_count (every mapping is one of the process's
  // memory areas, which are shared with malloc, the libraries and CUDA).
  static std::shared_ptr<MappingCache> ForMachine(uint64_t max_bytes = 0);

  // The mapping of `fd`, opened from `path`, whose identity is `id`: the
  // kept one when the file is the same, else a new one, then kept. When the
  // kernel refuses a new mapping (ENOMEM: too many mappings, or no
  // address space left), half of the
  // kept ones are dropped and it is tried once more. A file larger than
  // `max_bytes` is mapped for its reader only.
  Result<std::shared_ptr<const FileMap>> Get(int fd, const std::string& path,
                                             const FileIdentity& id);

  uint64_t kept_bytes() const;
  size_t kept_maps() const;
  // Dropped for the limits (not for a changed file), since the start.
  uint64_t evictions() const;

 private:
  struct Entry {
    FileIdentity id;
    std::shared_ptr<const FileMap> map;
    std::list<std::string>::iterator use;  // in lru_
  };
  void DropLocked(std::unordered_map<std::string, Entry>::iterator it);
  void EvictLocked(uint64_t bytes, size_t maps);
  void EvictOldestLocked();  // the least recently used; lru_ not empty

  const uint64_t max_bytes_;
  const size_t max_maps_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> kept_;
  std::list<std::string> lru_;  // least recently used first
  uint64_t kept_bytes_ = 0;
  uint64_t evictions_ = 0;
};

// Maps on first use, from any thread, through `cache` when one is given (the
// mapping then outlives this object), else its own.
class FileMapping {
 public:
  FileMapping() = default;
  FileMapping(std::shared_ptr<MappingCache> cache, FileIdentity id)
      : cache_(std::move(cache)), id_(id) {}
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  // The bytes of `fd` (named `path` in errors).
  Result<std::span<const std::byte>> Get(int fd, const std::string& path);

 private:
  const std::shared_ptr<MappingCache> cache_;
  const FileIdentity id_;
  std::mutex mu_;
  std::shared_ptr<const FileMap> map_;
};

}  // namespace stoker::internal
