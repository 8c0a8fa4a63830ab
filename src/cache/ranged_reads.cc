// The node cache's ranged reads: a read of part of a shard, and OpenReader
// for the loader's per-sample reads (LoaderOptions::read_unit "sample"). The
// node fetches the shard whole once, as for whole-shard reads; then each
// range is a pread of the cache file, which the reader keeps open and
// pinned (never evicted while a reader holds it) until it is closed.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <mutex>

#include "cache/node_cache.h"
#include "core/file_mapping.h"

namespace stoker::cache_internal {
namespace {

// Ranges of a pinned cache file.
class CachedReader final : public ObjectReader {
 public:
  CachedReader(NodeCacheImpl* cache, ByteLock pin, int fd, std::string path, uint64_t size)
      : cache_(cache), pin_(std::move(pin)), fd_(fd), path_(std::move(path)), size_(size) {}
  ~CachedReader() override { close(fd_); }
  Result<size_t> ReadV(uint64_t offset, std::span<const std::span<std::byte>> dsts) override {
    std::vector<iovec> iov;
    uint64_t want = 0;
    for (const auto& d : dsts) {
      iov.push_back({d.data(), d.size()});
      want += d.size();
    }
    want = offset < size_ ? std::min(want, size_ - offset) : 0;
    uint64_t done = 0;
    while (done < want) {
      // Skip what is done: whole pieces, then part of one.
      std::vector<iovec> rest;
      uint64_t skip = done;
      for (const auto& v : iov) {
        if (skip >= v.iov_len) {
          skip -= v.iov_len;
          continue;
        }
        rest.push_back({static_cast<std::byte*>(v.iov_base) + skip, v.iov_len - skip});
        skip = 0;
      }
      const ssize_t n = preadv(fd_, rest.data(), int(rest.size()), off_t(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoToStatus(errno, "read " + path_);
      if (n == 0) break;
      done += uint64_t(n);
    }
    cache_->CountCacheBytes(done);
    return size_t(done);
  }
  void WillNeed(uint64_t offset, uint64_t length) override {
    (void)posix_fadvise(fd_, off_t(offset), off_t(length), POSIX_FADV_WILLNEED);
  }
  // The cache file stays whole while the pin is held: eviction and refetch
  // replace it by rename and unlink, never in place.
  Result<std::span<const std::byte>> Map() override { return mapping_.Get(fd_, path_); }
  void CountMapped(uint64_t bytes) override { cache_->CountCacheBytes(bytes); }

 private:
  NodeCacheImpl* cache_;
  ByteLock pin_;
  const int fd_;
  const std::string path_;
  const uint64_t size_;
  internal::FileMapping mapping_;
};

// A shard the cache would not admit: ranges of the copy fetched for it.
class MemoryReader final : public ObjectReader {
 public:
  explicit MemoryReader(std::vector<std::byte> data) : data_(std::move(data)) {}
  Result<size_t> ReadV(uint64_t offset, std::span<const std::span<std::byte>> dsts) override {
    uint64_t at = offset;
    for (const auto& d : dsts) {
      if (at >= data_.size()) break;
      const uint64_t n = std::min<uint64_t>(d.size(), data_.size() - at);
      std::memcpy(d.data(), data_.data() + at, n);
      at += n;
    }
    return size_t(at - std::min<uint64_t>(offset, at));
  }
  Result<std::span<const std::byte>> Map() override {
    return std::span<const std::byte>(data_.data(), data_.size());
  }

 private:
  std::vector<std::byte> data_;
};

// An object that is no shard, from a store behind that cannot map it (RADOS):
// read from there, and mapped as a copy in memory, made by the first Map,
// since the cache's readers map whatever the store behind
// (capabilities().mapped_reads).
class CopyMappedReader final : public ObjectReaderWrapper {
 public:
  CopyMappedReader(std::unique_ptr<ObjectReader> target, Store* store, std::string key)
      : ObjectReaderWrapper(std::move(target)), store_(store), key_(std::move(key)) {}
  Result<std::span<const std::byte>> Map() override {
    std::call_once(copied_, [&] {
      auto all = store_->ReadAll(key_);
      if (all.ok()) {
        copy_ = std::move(*all);
      } else {
        copy_status_ = all.status();
      }
    });
    if (!copy_status_.ok()) return copy_status_;
    return std::span<const std::byte>(copy_.data(), copy_.size());
  }

 private:
  Store* store_;
  const std::string key_;
  std::once_flag copied_;
  Status copy_status_;
  std::vector<std::byte> copy_;
};

}  // namespace

Result<std::unique_ptr<ObjectReader>> NodeCacheImpl::OpenReader(std::string_view key) {
  const int64_t s = ShardOfKey(key);
  if (s < 0) {
    STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> r, target()->OpenReader(key));
    if (target()->capabilities().mapped_reads) return r;
    return std::unique_ptr<ObjectReader>(
        new CopyMappedReader(std::move(r), target(), std::string(key)));
  }
  auto reader = OpenShardReader(uint32_t(s));
  // A rank opens each of its shards once per epoch: its read, once done
  // (see Touch).
  if (reader.ok()) Touch(uint32_t(s), /*whole=*/true);
  return reader;
}

Result<std::unique_ptr<ObjectReader>> NodeCacheImpl::OpenShardReader(uint32_t s) {
  const uint64_t bytes = manifest_.shards.bytes(s);
  std::vector<std::byte> whole;
  bool counted = false;  // a fetch counted this open as a miss
  for (int attempt = 0; attempt < 3; ++attempt) {
    ByteLock pin;
    STOKER_RETURN_IF_ERROR(pin.Lock(pin_lock_path_, s, /*exclusive=*/false, true).status());
    const std::string path = files_.Path(s);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && uint64_t(st.st_size) == bytes && AsWritten(s, st)) {
      if (!counted) hits_++;
      return std::unique_ptr<ObjectReader>(new CachedReader(this, std::move(pin), fd, path, bytes));
    }
    if (fd >= 0) close(fd);
    pin.Release();
    // Absent, or not as the cache wrote it: the whole-shard path checks it
    // (dropping a bad file) or fetches it.
    whole.resize(bytes);
    const uint64_t fetched = misses_;
    STOKER_RETURN_IF_ERROR(GetWhole(s, whole, /*prefetch=*/false, /*deliver=*/false));
    counted = counted || misses_ != fetched;
    if (!tables_.Present(s)) break;  // not admitted: the copy in hand serves
  }
  if (!counted) hits_++;
  return std::unique_ptr<ObjectReader>(new MemoryReader(std::move(whole)));
}

Result<size_t> NodeCacheImpl::ReadShard(uint32_t s, uint64_t offset, std::span<std::byte> dst) {
  const uint64_t bytes = manifest_.shards.bytes(s);
  const bool whole = offset == 0 && dst.size() >= bytes;
  if (whole) {
    STOKER_RETURN_IF_ERROR(GetWhole(s, dst.first(bytes), /*prefetch=*/false));
    Touch(s, true);  // once read: see Touch
    return size_t(bytes);
  }
  // Part of a shard: through a reader, which fetches it whole first.
  Touch(s, false);
  if (offset >= bytes) return size_t(0);
  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> r, OpenShardReader(s));
  const std::span<std::byte> one[] = {dst.first(std::min<uint64_t>(dst.size(), bytes - offset))};
  return r->ReadV(offset, one);
}

}  // namespace stoker::cache_internal
