// The cache folder's shared state: what the processes of a node that share a
// cache folder know about it together, kept in the folder itself.
//
//   DIR/stoker-cache.table     the folder's header (bytes held, a clock),
//                              mmap'd; flock on it is the folder lock
//   DIR/<dataset id>/table     one entry per shard: absent, being fetched
//                              (its bytes reserved) or present, mmap'd
//   DIR/<dataset id>/fetch.lock   byte i: shard i's fetch lock (OFD)
//   DIR/<dataset id>/pin.lock     byte i: shard i's pins (OFD, shared)
//   DIR/<dataset id>/NNNNNNNN.stks   the cache files
//
// Thread safety: FolderLock serialises the threads of a process (a mutex)
// and the processes (flock) on the tables; ByteLock is one lock of one open
// file description (not shared between threads).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "stoker/status.h"

namespace stoker::cache_internal {

inline constexpr uint64_t kFolderMagic = 0x31454843414b5453ull;   // "STKACHE1"
inline constexpr uint64_t kDatasetMagic = 0x32534443414b5453ull;  // "STKACDS2"

struct FolderHeader {
  uint64_t magic;
  uint64_t used;  // bytes of present and reserved (being fetched) shards
  uint64_t tick;  // the LRU clock
};

enum EntryState : uint32_t { kAbsent = 0, kFetching = 1, kPresent = 2 };

struct Entry {
  uint32_t state;
  uint32_t pid;  // the fetcher's, for messages
  uint64_t bytes;
  uint64_t last_use;
  // Reads of the shard in epoch reads_epoch - 1 by the node's ranks (planned
  // eviction: a shard every rank has read is done for the epoch).
  uint32_t reads_epoch;
  uint32_t reads;
  // The cache file as its fetcher wrote it (inode, ctime in ns): a file that
  // still matches was checked whole when fetched; one that does not was
  // changed or replaced behind the cache's back.
  uint64_t ino;
  uint64_t ctime_ns;
};
static_assert(sizeof(Entry) == 48);

struct DatasetHeader {
  uint64_t magic;
  uint64_t shards;
  uint64_t unused[6];
};
static_assert(sizeof(DatasetHeader) == 64);

// A file mapped shared, created with `bytes` zero bytes when missing.
class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  Status Open(const std::string& path, uint64_t bytes);
  void* data() const { return data_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// An OFD record lock on one byte of a lock file, on its own open file
// description, so that two threads of one process exclude each other as two
// processes do. The kernel drops it when the holder dies.
class ByteLock {
 public:
  ByteLock() = default;
  ~ByteLock() { Release(); }
  ByteLock(ByteLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  ByteLock& operator=(ByteLock&&) = delete;
  // Exclusive (or shared) lock on byte `at`. wait: block in the kernel until
  // it is free; otherwise false at once when another holds it.
  Result<bool> Lock(const std::string& path, uint64_t at, bool exclusive, bool wait);
  bool held() const { return fd_ >= 0; }
  void Release();

 private:
  int fd_ = -1;
};

// Whether the file system of `path` offers OFD locks (EINVAL otherwise).
Status CheckOfdLocks(const std::string& path);

}  // namespace stoker::cache_internal
