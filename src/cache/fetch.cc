// The node cache's whole-shard read path: a hit (the cache file, checked),
// a wait on another process's fetch (blocked on its lock in the kernel), or
// a fetch (the remote read, checked, written under a temporary name and
// renamed). See include/stoker/cache.h.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "cache/node_cache.h"

namespace stoker::cache_internal {

Status NodeCacheImpl::Verify(uint32_t s, std::span<const std::byte> data, bool samples) const {
  STOKER_ASSIGN_OR_RETURN(format::ShardView v,
                          format::ShardView::Parse(data, format::ExpectationFor(manifest_, s)));
  if (samples) {
    for (uint32_t i = 0; i < v.sample_count(); ++i) STOKER_RETURN_IF_ERROR(v.VerifySample(i));
  }
  return Status::Ok();
}

// A file as its fetcher wrote it was checked whole then (its inode and ctime
// are in the table); anything else was changed or replaced behind our back.
bool NodeCacheImpl::AsWritten(uint32_t s, const struct stat& st) const {
  const Entry& e = tables_.At(s);
  return tables_.Present(s) && e.ino == uint64_t(st.st_ino) &&
         e.ctime_ns == ShardFiles::CtimeNs(st);
}

// Reads the cache file of shard s into dst (its size) and checks it.
Look NodeCacheImpl::TryHit(uint32_t s, std::span<std::byte> dst, ino_t* inode) {
  ByteLock pin;
  auto got = pin.Lock(pin_lock_path_, s, /*exclusive=*/false, /*wait=*/true);
  if (!got.ok()) return Look::kMiss;
  const int fd = open(files_.Path(s).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Look::kMiss;
  struct stat st;
  Look look = Look::kBad;
  if (fstat(fd, &st) == 0) {
    *inode = st.st_ino;
    if (uint64_t(st.st_size) == dst.size() && ShardFiles::ReadAll(fd, dst)) {
      // The samples of a file as written are checked again by the loader as
      // it delivers them.
      const bool as_written = AsWritten(s, st);
      if (Verify(s, dst, options_.verify_samples && !as_written).ok()) {
        look = Look::kHit;
        if (!as_written) {
          FolderTables::Locked l(tables_);
          space_->Adopt(s, st);
        }
      }
    }
  }
  close(fd);
  return look;
}

Status NodeCacheImpl::GetWhole(uint32_t s, std::span<std::byte> dst, bool prefetch, bool deliver) {
  auto hit = [&] {
    if (deliver) {
      hits_++;
      cache_bytes_ += dst.size();
    }
    return Status::Ok();
  };
  ino_t bad_inode = 0;
  Look look = TryHit(s, dst, &bad_inode);
  if (look == Look::kHit) return hit();
  ByteLock fetch;
  STOKER_ASSIGN_OR_RETURN(bool got, fetch.Lock(fetch_lock_path_, s, true, /*wait=*/false));
  const bool waited = !got;
  if (waited) {
    // Another process (or thread) fetches it: block on its lock in the
    // kernel until it is done (or dead), then look again.
    fetch_waits_++;
    STOKER_RETURN_IF_ERROR(fetch.Lock(fetch_lock_path_, s, true, /*wait=*/true).status());
  }
  if (waited || look == Look::kMiss) {
    // It may have landed meanwhile (between the look and the lock).
    ino_t inode = 0;
    look = TryHit(s, dst, &inode);
    if (look == Look::kHit) return hit();
    if (look == Look::kBad) bad_inode = inode;
  }
  if (look == Look::kBad) DropBad(s, bad_inode);
  return Fetch(s, dst, prefetch);
}

// Under shard s's fetch lock: removes a cache file that failed its check
// (only the very file that failed: a good one may have replaced it).
void NodeCacheImpl::DropBad(uint32_t s, ino_t inode) {
  FolderTables::Locked l(tables_);
  struct stat st;
  const std::string path = files_.Path(s);
  if (stat(path.c_str(), &st) == 0 && st.st_ino == inode) {
    unlink(path.c_str());
    refetches_++;
    if (!bad_said_.exchange(true)) {
      std::fprintf(stderr, "stoker: cache: %s failed its check; dropped, fetching it again\n",
                   path.c_str());
    }
  }
  space_->Forget(s);
}

// Under shard s's fetch lock, the file absent: reads s from the remote store
// into dst, checks it and, when the cache admits it, writes it to the
// folder. A prefetch that the cache does not admit is NoSpace, and reads
// nothing.
Status NodeCacheImpl::Fetch(uint32_t s, std::span<std::byte> dst, bool prefetch) {
  const format::ShardInfo info = manifest_.shards[s];
  bool admitted;
  {
    FolderTables::Locked l(tables_);
    space_->FixStale(s);
    admitted = Reserve(s, prefetch);
  }
  if (prefetch && !admitted) return NoSpace("cache: no room to prefetch " + info.key);
  auto n = target()->Read(info.key, 0, dst);
  Status st = n.status();
  if (st.ok() && *n != info.bytes) {
    st = Corruption(target()->uri() + "/" + info.key + ": truncated: read " + std::to_string(*n) +
                    " bytes, the manifest says " + std::to_string(info.bytes));
  }
  if (st.ok()) {
    remote_bytes_ += *n;
    st = Verify(s, dst, options_.verify_samples);
  }
  if (st.ok() && admitted) {
    // A cache that cannot write (a full disk) still serves the read.
    Status wrote = files_.Write(s, dst);
    struct stat written;
    if (wrote.ok() && stat(files_.Path(s).c_str(), &written) == 0) {
      FolderTables::Locked l(tables_);
      space_->Commit(s, written);
      admitted = false;
    } else if (!wrote.ok() && !write_said_.exchange(true)) {
      std::fprintf(stderr, "stoker: cache folder %s: %s; serving reads uncached meanwhile\n",
                   options_.dir.c_str(), wrote.ToString().c_str());
    }
  }
  if (admitted) {
    FolderTables::Locked l(tables_);
    space_->Unreserve(s);
  }
  if (st.ok()) (prefetch ? prefetches_ : misses_)++;
  return st;
}

}  // namespace stoker::cache_internal
