// The cache files of one dataset in a cache folder: their names, writing one
// (a temporary name, then a rename, so that a reader never sees part of a
// file), reading one whole.
//
// Thread safety: stateless after construction; safe for concurrent use.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "stoker/status.h"

namespace stoker::cache_internal {

class ShardFiles {
 public:
  ShardFiles() = default;
  explicit ShardFiles(std::string ds_dir) : dir_(std::move(ds_dir)) {}
  const std::string& dir() const { return dir_; }
  std::string Path(uint32_t s) const;
  std::string TmpPath(uint32_t s, uint32_t pid) const;

  // Writes `data` as shard s's file.
  Status Write(uint32_t s, std::span<const std::byte> data) const;
  // Reads an open file whole into dst (the file is dst's size): false when
  // it is shorter or cannot be read.
  static bool ReadAll(int fd, std::span<std::byte> dst);
  // A write of one byte in the folder: a read-only mount or a full disk
  // says so at open, rather than at the first fetch.
  Status Probe() const;
  // Removes temporary files whose writer is gone: `orphan(shard)` says
  // whether shard's fetcher is gone (its fetch lock is free); a need order's
  // (shared_orders.h) when its process is.
  Status RemoveOrphans(const std::function<bool(uint32_t)>& orphan) const;

  static uint64_t CtimeNs(const struct stat& st) {
    return uint64_t(st.st_ctim.tv_sec) * 1000000000ull + uint64_t(st.st_ctim.tv_nsec);
  }

 private:
  std::string dir_;
};

}  // namespace stoker::cache_internal
