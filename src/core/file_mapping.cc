#include "core/file_mapping.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>

namespace stoker::internal {

Result<FileIdentity> IdentityOf(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoToStatus(errno, "fstat " + path);
  if (!S_ISREG(st.st_mode)) {
    return Unsupported(path + " is not a regular file: it cannot be mapped");
  }
  return IdentityOf(st);
}

FileIdentity IdentityOf(const struct stat& st) {
  FileIdentity id;
  id.device = st.st_dev;
  id.inode = st.st_ino;
  id.size = static_cast<uint64_t>(st.st_size);
  id.mtime_ns = int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  return id;
}

Result<std::shared_ptr<const FileMap>> FileMap::Make(int fd, uint64_t size, const std::string& path,
                                                     int* error) {
  const std::byte* data = nullptr;
  if (size > 0) {
    // No MAP_POPULATE: the readers' first loads fault pages in, in parallel,
    // a 64 KiB window at a time (the kernel's fault-around); pre-faulting
    // measured no faster on the build VM.
    void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      if (error != nullptr) *error = err;
      return ErrnoToStatus(err, "mmap " + path);
    }
    data = static_cast<const std::byte*>(p);
  }
  return std::shared_ptr<const FileMap>(new FileMap(data, size));
}

FileMap::~FileMap() {
  if (data_ != nullptr) munmap(const_cast<std::byte*>(data_), size_);
}

std::shared_ptr<MappingCache> MappingCache::ForMachine(uint64_t max_bytes) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const uint64_t memory = max_bytes > 0           ? max_bytes
                          : pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page)
                                                  : uint64_t{16} << 30;
  uint64_t max_map_count = 65530;  // the kernel's default
  std::ifstream f("/proc/sys/vm/max_map_count");
  if (uint64_t v; f >> v && v > 0) max_map_count = v;
  return std::make_shared<MappingCache>(memory, std::max<size_t>(1, max_map_count / 4));
}

Result<std::shared_ptr<const FileMap>> MappingCache::Get(int fd, const std::string& path,
                                                         const FileIdentity& id) {
  std::lock_guard lock(mu_);
  auto it = kept_.find(path);
  if (it != kept_.end()) {
    if (it->second.id == id) {
      lru_.splice(lru_.end(), lru_, it->second.use);
      return it->second.map;
    }
    DropLocked(it);  // another file at this path now, or this one written since
  }
  // One file beyond the whole limit is mapped for its reader only.
  if (id.size > max_bytes_) return FileMap::Make(fd, id.size, path);
  EvictLocked(id.size, 1);
  int error = 0;
  auto map = FileMap::Make(fd, id.size, path, &error);
  if (!map.ok() && error == ENOMEM && !kept_.empty()) {
    const size_t keep = kept_.size() / 2;
    while (kept_.size() > keep) EvictOldestLocked();
    map = FileMap::Make(fd, id.size, path);
  }
  if (!map.ok()) return map.status();
  lru_.push_back(path);
  kept_.emplace(path, Entry{id, *map, std::prev(lru_.end())});
  kept_bytes_ += id.size;
  return std::move(map).value();
}

void MappingCache::DropLocked(std::unordered_map<std::string, Entry>::iterator it) {
  kept_bytes_ -= it->second.id.size;
  lru_.erase(it->second.use);
  kept_.erase(it);  // unmapped here, or when its last reader lets go
}

// Makes room for `bytes` more in `maps` more mappings.
void MappingCache::EvictLocked(uint64_t bytes, size_t maps) {
  while (!lru_.empty() && (kept_bytes_ + bytes > max_bytes_ || kept_.size() + maps > max_maps_)) {
    EvictOldestLocked();
  }
}

void MappingCache::EvictOldestLocked() {
  DropLocked(kept_.find(lru_.front()));
  evictions_++;
}

uint64_t MappingCache::kept_bytes() const {
  std::lock_guard lock(mu_);
  return kept_bytes_;
}

size_t MappingCache::kept_maps() const {
  std::lock_guard lock(mu_);
  return kept_.size();
}

uint64_t MappingCache::evictions() const {
  std::lock_guard lock(mu_);
  return evictions_;
}

Result<std::span<const std::byte>> FileMapping::Get(int fd, const std::string& path) {
  std::lock_guard lock(mu_);
  if (map_ == nullptr) {
    if (cache_ != nullptr) {
      STOKER_ASSIGN_OR_RETURN(map_, cache_->Get(fd, path, id_));
    } else {
      STOKER_ASSIGN_OR_RETURN(FileIdentity id, IdentityOf(fd, path));
      STOKER_ASSIGN_OR_RETURN(map_, FileMap::Make(fd, id.size, path));
    }
  }
  return map_->bytes();
}

}  // namespace stoker::internal
