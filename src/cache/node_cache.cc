// The node cache (include/stoker/cache.h): the fetch path, the space
// accounting and the planned prefetch and eviction.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "cache/folder.h"
#include "cache/need_order.h"
#include "stoker/cache.h"

namespace stoker {
namespace {

using cache_internal::ByteLock;
using cache_internal::DatasetHeader;
using cache_internal::Entry;
using cache_internal::FolderHeader;
using cache_internal::kNever;
using cache_internal::MappedFile;
using cache_internal::NeedOrder;

constexpr uint64_t kMinMargin = 256ull << 20;

// What a look in the cache found.
enum class Look { kHit, kMiss, kBad };

class NodeCacheImpl;

// A ReadQueue whose requests are served by a few threads, each doing what a
// synchronous read through the cache does (a hit is a pread and a check; a
// miss a remote read, a check and a file write).
class CacheQueue final : public ReadQueue {
 public:
  CacheQueue(NodeCacheImpl* cache, uint32_t depth) : cache_(cache), depth_(std::max(1u, depth)) {}
  ~CacheQueue() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  Status Submit(std::span<const ReadRequest> requests) override {
    std::lock_guard lock(mu_);
    if (stop_) return Cancelled("cache read queue is shut down");
    for (const auto& r : requests) pending_.push_back(r);
    outstanding_ += requests.size();
    // Threads up to the depth, started as they are needed.
    while (threads_.size() < std::min<size_t>(depth_, 8) && threads_.size() < outstanding_) {
      threads_.emplace_back([this] { Serve(); });
    }
    cv_.notify_all();
    return Status::Ok();
  }
  Result<size_t> Wait(size_t min_completions, Deadline deadline,
                      std::vector<ReadCompletion>* out) override {
    std::unique_lock lock(mu_);
    const size_t want = std::min(min_completions, outstanding_);
    const bool met = done_cv_.wait_until(lock, deadline, [&] { return done_.size() >= want; });
    const size_t n = done_.size();
    for (auto& c : done_) out->push_back(std::move(c));
    done_.clear();
    outstanding_ -= n;
    if (!met) return TimedOut("cache read queue: fewer completions than asked by the deadline");
    return n;
  }
  size_t Outstanding() const override {
    std::lock_guard lock(mu_);
    return outstanding_;
  }

 private:
  void Serve();

  NodeCacheImpl* cache_;
  const uint32_t depth_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<ReadRequest> pending_;
  std::vector<ReadCompletion> done_;
  std::vector<std::thread> threads_;
  size_t outstanding_ = 0;
  bool stop_ = false;
};

class NodeCacheImpl final : public NodeCache {
 public:
  NodeCacheImpl(std::shared_ptr<Store> remote, format::Manifest manifest, CacheOptions options)
      : NodeCache(std::move(remote)), manifest_(std::move(manifest)), options_(std::move(options)) {
    for (uint32_t i = 0; i < manifest_.shards.size(); ++i) {
      shard_of_key_.emplace(manifest_.shards[i].key, i);
      shard_samples_.push_back(manifest_.shards[i].samples);
    }
    planned_ = options_.policy == "planned";
  }

  ~NodeCacheImpl() override {
    {
      std::lock_guard lock(plan_mu_);
      stop_ = true;
    }
    plan_cv_.notify_all();
    if (prefetcher_.joinable()) prefetcher_.join();
  }

  Status Init() {
    const std::string& dir = options_.dir;
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return FolderError(ErrnoToStatus(ec.value(), "create " + dir));
    ds_dir_ = dir + "/" + manifest_.IdHex();
    std::filesystem::create_directories(ds_dir_, ec);
    if (ec) return FolderError(ErrnoToStatus(ec.value(), "create " + ds_dir_));
    if (access(ds_dir_.c_str(), W_OK) != 0) {
      return FolderError(ErrnoToStatus(errno, "write to " + ds_dir_));
    }
    fetch_lock_path_ = ds_dir_ + "/fetch.lock";
    pin_lock_path_ = ds_dir_ + "/pin.lock";
    STOKER_RETURN_IF_ERROR(FolderError(cache_internal::CheckOfdLocks(fetch_lock_path_)));
    STOKER_RETURN_IF_ERROR(FolderError(folder_.Open(dir + "/stoker-cache.table", 4096)));
    const uint64_t n = manifest_.shards.size();
    STOKER_RETURN_IF_ERROR(
        FolderError(table_.Open(ds_dir_ + "/table", sizeof(DatasetHeader) + n * sizeof(Entry))));
    STOKER_RETURN_IF_ERROR(ChooseCapacity());
    // A probe write: a read-only mount or a full disk says so here, naming
    // the folder, rather than at the first fetch.
    const std::string probe = ds_dir_ + "/.probe-" + std::to_string(getpid());
    int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return FolderError(ErrnoToStatus(errno, "create " + probe));
    const char byte = 0;
    const bool wrote = write(fd, &byte, 1) == 1;
    const int err = errno;
    close(fd);
    unlink(probe.c_str());
    if (!wrote) return FolderError(ErrnoToStatus(err, "write " + probe));
    STOKER_RETURN_IF_ERROR(Reconcile());
    if (planned_) prefetcher_ = std::thread([this] { PrefetchLoop(); });
    return Status::Ok();
  }

  // ---- Store ----------------------------------------------------------------
  // Shards are served whole from the cache folder; a per-sample read
  // (read_unit "auto" on local reads) would go around it to the remote
  // store, so the cache never reports local reads.
  StoreCapabilities capabilities() const override {
    StoreCapabilities c = StoreWrapper::capabilities();
    c.local_reads = false;
    return c;
  }

  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& o) override {
    return std::unique_ptr<ReadQueue>(new CacheQueue(this, o.depth));
  }
  Result<size_t> Read(std::string_view key, uint64_t offset, std::span<std::byte> dst) override {
    auto it = shard_of_key_.find(key);
    if (it == shard_of_key_.end()) return target()->Read(key, offset, dst);
    return ReadShard(it->second, offset, dst);
  }

  // ---- NodeCache -------------------------------------------------------------
  Status BeginEpoch(const PlanOptions& plan, uint64_t epoch, uint64_t position) override {
    STOKER_ASSIGN_OR_RETURN(NeedOrder cur,
                            NeedOrder::Compute(manifest_.Id64(), shard_samples_, plan,
                                               options_.ranks_per_node, epoch, position));
    STOKER_ASSIGN_OR_RETURN(NeedOrder next,
                            NeedOrder::Compute(manifest_.Id64(), shard_samples_, plan,
                                               options_.ranks_per_node, epoch + 1, 0));
    {
      std::lock_guard lock(plan_mu_);
      cur_ = std::make_shared<const NeedOrder>(std::move(cur));
      next_ = std::make_shared<const NeedOrder>(std::move(next));
      cursor_ = 0;
      epoch_ = epoch;
      generation_++;
    }
    plan_cv_.notify_all();
    return Status::Ok();
  }

  CacheStats stats() const override {
    CacheStats s;
    s.remote_bytes = remote_bytes_;
    s.cache_bytes = cache_bytes_;
    s.hits = hits_;
    s.misses = misses_;
    s.fetch_waits = fetch_waits_;
    s.prefetches = prefetches_;
    s.evictions = evictions_;
    s.refetches = refetches_;
    s.used_bytes = __atomic_load_n(&Header()->used, __ATOMIC_RELAXED);
    s.capacity_bytes = capacity_;
    return s;
  }
  const std::string& dataset_dir() const override { return ds_dir_; }

  // ---- the read path -----------------------------------------------------------
  Result<size_t> ReadShard(uint32_t s, uint64_t offset, std::span<std::byte> dst) {
    const uint64_t bytes = manifest_.shards[s].bytes;
    const bool whole = offset == 0 && dst.size() >= bytes;
    Touch(s, whole);
    if (whole) {
      STOKER_RETURN_IF_ERROR(GetWhole(s, dst.first(bytes), /*prefetch=*/false));
      return size_t(bytes);
    }
    // Part of a shard: fetch it whole (if the cache admits it), then read
    // the part from the cache file.
    if (offset >= bytes) return size_t(0);
    const uint64_t len = std::min<uint64_t>(dst.size(), bytes - offset);
    for (int attempt = 0; attempt < 2; ++attempt) {
      ByteLock pin;
      STOKER_RETURN_IF_ERROR(pin.Lock(pin_lock_path_, s, /*exclusive=*/false, true).status());
      int fd = open(FilePath(s).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        const ssize_t n = pread(fd, dst.data(), len, off_t(offset));
        close(fd);
        if (n == ssize_t(len)) {
          hits_++;
          cache_bytes_ += len;
          return size_t(n);
        }
      }
      pin.Release();
      if (attempt == 1) break;
      std::vector<std::byte> whole(bytes);
      STOKER_RETURN_IF_ERROR(GetWhole(s, whole, /*prefetch=*/false));
      if (!Present(s)) {  // not admitted: the copy in hand serves this read
        std::memcpy(dst.data(), whole.data() + offset, len);
        return size_t(len);
      }
    }
    return target()->Read(manifest_.shards[s].key, offset, dst);
  }

 private:
  friend class CacheQueue;

  FolderHeader* Header() const { return static_cast<FolderHeader*>(folder_.data()); }
  DatasetHeader* DsHeader() const { return static_cast<DatasetHeader*>(table_.data()); }
  Entry& At(uint32_t s) const {
    return reinterpret_cast<Entry*>(static_cast<std::byte*>(table_.data()) +
                                    sizeof(DatasetHeader))[s];
  }
  std::string FilePath(uint32_t s) const {
    char name[32];
    std::snprintf(name, sizeof(name), "/%08u.stks", s);
    return ds_dir_ + name;
  }

  std::string TmpPath(uint32_t s, uint32_t pid) const {
    return ds_dir_ + "/.tmp-" + std::to_string(s) + "-" + std::to_string(pid);
  }

  Status FolderError(Status st) const {
    if (st.ok()) return st;
    return Status(st.code(), "cache folder " + options_.dir + ": " + st.message());
  }

  // The folder lock: threads of this process (the mutex), then processes
  // (flock on the folder table; held briefly, never across I/O but unlinks).
  class Locked {
   public:
    explicit Locked(const NodeCacheImpl* c) : c_(c), lock_(c->folder_mu_) {
      while (flock(c_->folder_.fd(), LOCK_EX) != 0 && errno == EINTR) {
      }
    }
    ~Locked() { flock(c_->folder_.fd(), LOCK_UN); }

   private:
    const NodeCacheImpl* c_;
    std::unique_lock<std::mutex> lock_;
  };

  Status ChooseCapacity() {
    struct statvfs v;
    if (statvfs(options_.dir.c_str(), &v) != 0) {
      return FolderError(ErrnoToStatus(errno, "statvfs " + options_.dir));
    }
    uint64_t largest = 0;
    for (const auto& sh : manifest_.shards) largest = std::max(largest, sh.bytes);
    const uint64_t free_bytes = uint64_t(v.f_bavail) * v.f_frsize;
    uint64_t used;
    {
      Locked l(this);
      InitTables();
      used = Header()->used;
    }
    if (options_.capacity_bytes != 0) {
      capacity_ = options_.capacity_bytes;
    } else {
      const uint64_t total = uint64_t(v.f_blocks) * v.f_frsize;
      const uint64_t margin = std::max(kMinMargin, total / 20);
      capacity_ = free_bytes + used > margin ? free_bytes + used - margin : 0;
    }
    if (capacity_ < largest || free_bytes + used < largest) {
      return NoSpace("cache folder " + options_.dir + ": no room for one shard (" +
                     std::to_string(largest >> 10) + " KiB): " + std::to_string(free_bytes >> 10) +
                     " KiB free on its file system, limit " + std::to_string(capacity_ >> 10) +
                     " KiB");
    }
    return Status::Ok();
  }

  // Under the folder lock.
  void InitTables() {
    FolderHeader* h = Header();
    if (h->magic != cache_internal::kFolderMagic) {
      h->used = 0;
      h->tick = 0;
      h->magic = cache_internal::kFolderMagic;
    }
    DatasetHeader* d = DsHeader();
    if (d->magic != cache_internal::kDatasetMagic || d->shards != manifest_.shards.size()) {
      d->shards = manifest_.shards.size();
      d->magic = cache_internal::kDatasetMagic;
    }
  }

  // After a restart or a killed fetcher: entries being fetched whose fetcher
  // is gone, present entries whose file is gone, temporary files nobody
  // writes any more.
  Status Reconcile() {
    for (uint32_t s = 0; s < manifest_.shards.size(); ++s) {
      if (At(s).state == cache_internal::kAbsent) continue;
      ByteLock fetch;
      STOKER_ASSIGN_OR_RETURN(bool got, fetch.Lock(fetch_lock_path_, s, true, /*wait=*/false));
      if (!got) continue;  // a live fetcher
      Locked l(this);
      FixStale(s);
    }
    DIR* d = opendir(ds_dir_.c_str());
    if (!d) return FolderError(ErrnoToStatus(errno, "list " + ds_dir_));
    while (dirent* e = readdir(d)) {
      unsigned s;
      int pid;
      if (std::sscanf(e->d_name, ".tmp-%u-%d", &s, &pid) != 2) continue;
      ByteLock fetch;
      auto got = fetch.Lock(fetch_lock_path_, s, true, /*wait=*/false);
      if (got.ok() && *got) unlink((ds_dir_ + "/" + e->d_name).c_str());
    }
    closedir(d);
    return Status::Ok();
  }

  // Under the folder lock and shard s's fetch lock: makes the entry agree
  // with the file (a fetcher killed after its reservation, or after its
  // rename).
  void FixStale(uint32_t s) {
    Entry& e = At(s);
    if (e.state == cache_internal::kAbsent) return;
    // Its fetcher's temporary file, if the kill came before the rename: gone
    // before its bytes are freed, so the folder stays within the limit.
    if (e.state == cache_internal::kFetching) unlink(TmpPath(s, e.pid).c_str());
    struct stat st;
    const bool file =
        stat(FilePath(s).c_str(), &st) == 0 && uint64_t(st.st_size) == manifest_.shards[s].bytes;
    if (file) {
      e.state = cache_internal::kPresent;
      return;
    }
    Header()->used -= std::min(Header()->used, e.bytes);
    e.state = cache_internal::kAbsent;
    e.bytes = 0;
  }

  bool Present(uint32_t s) const {
    return __atomic_load_n(&At(s).state, __ATOMIC_ACQUIRE) == cache_internal::kPresent;
  }

  // Header and index against the manifest; with `samples`, every sample's
  // checksum too.
  Status Verify(uint32_t s, std::span<const std::byte> data, bool samples) const {
    STOKER_ASSIGN_OR_RETURN(format::ShardView v,
                            format::ShardView::Parse(data, format::ExpectationFor(manifest_, s)));
    if (samples) {
      for (uint32_t i = 0; i < v.sample_count(); ++i) STOKER_RETURN_IF_ERROR(v.VerifySample(i));
    }
    return Status::Ok();
  }

  // Reads the cache file of shard s into dst (its size) and checks it.
  Look TryHit(uint32_t s, std::span<std::byte> dst, ino_t* inode) {
    ByteLock pin;
    auto got = pin.Lock(pin_lock_path_, s, /*exclusive=*/false, /*wait=*/true);
    if (!got.ok()) return Look::kMiss;
    const int fd = open(FilePath(s).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Look::kMiss;
    struct stat st;
    Look look = Look::kBad;
    if (fstat(fd, &st) == 0) {
      *inode = st.st_ino;
      if (uint64_t(st.st_size) == dst.size()) {
        uint64_t done = 0;
        while (done < dst.size()) {
          const ssize_t n = pread(fd, dst.data() + done, dst.size() - done, off_t(done));
          if (n <= 0) break;
          done += uint64_t(n);
        }
        // A file as its fetcher wrote it was checked whole then; its
        // samples are checked again by the loader as it delivers them.
        const Entry& e = At(s);
        const bool as_written =
            Present(s) && e.ino == uint64_t(st.st_ino) && e.ctime_ns == CtimeNs(st);
        const bool samples = options_.verify_samples && !as_written;
        if (done == dst.size() && Verify(s, dst, samples).ok()) {
          look = Look::kHit;
          if (!as_written) Adopt(s, st);
        }
      }
    }
    close(fd);
    return look;
  }

  static uint64_t CtimeNs(const struct stat& st) {
    return uint64_t(st.st_ctim.tv_sec) * 1000000000ull + uint64_t(st.st_ctim.tv_nsec);
  }

  // A good file the table does not count (its fetcher was killed between
  // rename and bookkeeping, or the table was lost), or whose identity it
  // does not know.
  // Also records the identity of a file found good whole.
  void Adopt(uint32_t s, const struct stat& st) {
    Locked l(this);
    Entry& e = At(s);
    if (e.state == cache_internal::kFetching) return;  // its fetcher is still at it
    if (e.state == cache_internal::kAbsent) {
      e.bytes = manifest_.shards[s].bytes;
      e.state = cache_internal::kPresent;
      Header()->used += e.bytes;
    }
    e.ino = uint64_t(st.st_ino);
    e.ctime_ns = CtimeNs(st);
  }

  // The whole shard s into dst, through the cache.
  Status GetWhole(uint32_t s, std::span<std::byte> dst, bool prefetch) {
    ino_t bad_inode = 0;
    Look look = TryHit(s, dst, &bad_inode);
    if (look == Look::kHit) {
      CountHit(s, dst.size());
      return Status::Ok();
    }
    ByteLock fetch;
    STOKER_ASSIGN_OR_RETURN(bool got, fetch.Lock(fetch_lock_path_, s, true, /*wait=*/false));
    if (!got) {
      // Another process (or thread) fetches it: block on its lock in the
      // kernel until it is done (or dead), then look again.
      fetch_waits_++;
      STOKER_ASSIGN_OR_RETURN(got, fetch.Lock(fetch_lock_path_, s, true, /*wait=*/true));
      ino_t inode = 0;
      look = TryHit(s, dst, &inode);
      if (look == Look::kHit) {
        CountHit(s, dst.size());
        return Status::Ok();
      }
      if (look == Look::kBad) bad_inode = inode;
    } else if (look == Look::kMiss) {
      // It may have landed between the look and the lock.
      ino_t inode = 0;
      look = TryHit(s, dst, &inode);
      if (look == Look::kHit) {
        CountHit(s, dst.size());
        return Status::Ok();
      }
      if (look == Look::kBad) bad_inode = inode;
    }
    if (look == Look::kBad) DropBad(s, bad_inode);
    return Fetch(s, dst, prefetch);
  }

  void CountHit(uint32_t s, uint64_t bytes) {
    hits_++;
    cache_bytes_ += bytes;
  }

  // Under shard s's fetch lock: removes a cache file that failed its check
  // (only the very file that failed: a good one may have replaced it).
  void DropBad(uint32_t s, ino_t inode) {
    Locked l(this);
    struct stat st;
    if (stat(FilePath(s).c_str(), &st) == 0 && st.st_ino == inode) {
      unlink(FilePath(s).c_str());
      refetches_++;
      if (!bad_said_.exchange(true)) {
        std::fprintf(stderr, "stoker: cache: %s failed its check; dropped, fetching it again\n",
                     FilePath(s).c_str());
      }
    }
    Entry& e = At(s);
    if (e.state != cache_internal::kAbsent) {
      Header()->used -= std::min(Header()->used, e.bytes);
      e.state = cache_internal::kAbsent;
      e.bytes = 0;
    }
  }

  // Under shard s's fetch lock, the file absent: reads s from the remote
  // store into dst, checks it and, when the cache admits it, writes it to
  // the folder. A prefetch that the cache does not admit is NoSpace, and
  // reads nothing.
  Status Fetch(uint32_t s, std::span<std::byte> dst, bool prefetch) {
    const auto& info = manifest_.shards[s];
    bool admitted;
    {
      Locked l(this);
      FixStale(s);
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
      struct stat written;
      if (WriteFile(s, dst).ok() && stat(FilePath(s).c_str(), &written) == 0) {
        Locked l(this);
        Entry& e = At(s);
        e.ino = uint64_t(written.st_ino);
        e.ctime_ns = CtimeNs(written);
        __atomic_store_n(&e.state, cache_internal::kPresent, __ATOMIC_RELEASE);
        admitted = false;
      }
    }
    if (admitted) Unreserve(s);
    if (st.ok()) (prefetch ? prefetches_ : misses_)++;
    return st;
  }

  Status WriteFile(uint32_t s, std::span<const std::byte> data) {
    const std::string tmp = TmpPath(s, uint32_t(getpid()));
    int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return WriteFailed(ErrnoToStatus(errno, "create " + tmp));
    uint64_t done = 0;
    while (done < data.size()) {
      const ssize_t n = write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : ENOSPC;
        close(fd);
        unlink(tmp.c_str());
        return WriteFailed(ErrnoToStatus(err, "write " + tmp));
      }
      done += uint64_t(n);
    }
    // No fsync: a cache file lost or cut short by a power cut fails its check
    // on the next hit and is fetched again.
    close(fd);
    if (rename(tmp.c_str(), FilePath(s).c_str()) != 0) {
      const int err = errno;
      unlink(tmp.c_str());
      return WriteFailed(ErrnoToStatus(err, "rename " + tmp));
    }
    return Status::Ok();
  }

  Status WriteFailed(Status st) {
    if (!write_said_.exchange(true)) {
      std::fprintf(stderr, "stoker: cache folder %s: %s; serving reads uncached meanwhile\n",
                   options_.dir.c_str(), st.ToString().c_str());
    }
    return st;
  }

  void Unreserve(uint32_t s) {
    Locked l(this);
    Entry& e = At(s);
    if (e.state == cache_internal::kFetching) {
      Header()->used -= std::min(Header()->used, e.bytes);
      e.state = cache_internal::kAbsent;
      e.bytes = 0;
    }
  }

  // ---- space: admission and eviction -------------------------------------------
  // When shard s is next needed on this node, in steps from now (Belady's
  // key); kNever when not in this epoch or the next.
  uint64_t NextUse(uint32_t s, const NeedOrder* cur, const NeedOrder* next, uint64_t cursor) const {
    // Needed this epoch until every rank of the node has read it (counted in
    // the table: ranks do not run in step, so one rank's progress says
    // little about the others'); needed now once its first step is past.
    const Entry& e = At(s);
    const bool done = e.reads_epoch == uint32_t(epoch_ + 1) && e.reads >= cur->readers[s];
    if (cur->first_step[s] != kNever && !done) {
      return cur->first_step[s] > cursor ? cur->first_step[s] - cursor : 0;
    }
    if (next && next->first_step[s] != kNever) {
      const uint64_t left = cur->steps > cursor ? cur->steps - cursor : 0;
      return left + next->first_step[s] + 1;
    }
    return kNever;
  }

  // Under the folder lock: reserves shard s's bytes, evicting as the policy
  // says; false when the cache does not admit s (no room that the policy
  // would free: every cached shard is pinned or, for a prefetch under the
  // planned policy, needed sooner).
  bool Reserve(uint32_t s, bool prefetch) {
    const uint64_t bytes = manifest_.shards[s].bytes;
    if (bytes > capacity_) return false;
    FolderHeader* h = Header();
    std::shared_ptr<const NeedOrder> cur, next;
    uint64_t cursor;
    {
      std::lock_guard lock(plan_mu_);
      cur = cur_;
      next = next_;
      cursor = cursor_;
    }
    const bool planned = planned_ && cur;
    if (h->used + bytes > capacity_) {
      // Candidates, best victim first.
      std::vector<std::pair<uint64_t, uint32_t>> order;
      const uint64_t mine = planned ? NextUse(s, cur.get(), next.get(), cursor) : 0;
      for (uint32_t x = 0; x < manifest_.shards.size(); ++x) {
        if (x == s || At(x).state != cache_internal::kPresent) continue;
        if (planned) {
          // Belady: the furthest next use goes first. A prefetch evicts only
          // what is needed later than its shard (else it waits); a read
          // evicts regardless: the node's other ranks want the shard now,
          // and a shard passed through uncached is read remotely by each.
          const uint64_t use = NextUse(x, cur.get(), next.get(), cursor);
          if (use > mine || !prefetch) order.emplace_back(~use, x);
        } else {
          order.emplace_back(At(x).last_use, x);
        }
      }
      std::sort(order.begin(), order.end());
      for (const auto& [key, x] : order) {
        if (h->used + bytes <= capacity_) break;
        ByteLock pin;  // no reader holds it: evict
        auto got = pin.Lock(pin_lock_path_, x, /*exclusive=*/true, /*wait=*/false);
        if (!got.ok() || !*got) continue;
        unlink(FilePath(x).c_str());
        Entry& e = At(x);
        h->used -= std::min(h->used, e.bytes);
        e.state = cache_internal::kAbsent;
        e.bytes = 0;
        evictions_++;
      }
      if (h->used + bytes > capacity_) return false;
    }
    Entry& e = At(s);
    e.bytes = bytes;
    e.pid = uint32_t(getpid());
    e.last_use = ++h->tick;
    __atomic_store_n(&e.state, cache_internal::kFetching, __ATOMIC_RELEASE);
    h->used += bytes;
    return true;
  }

  // A read of shard s: the LRU clock, this process's place in the plan and
  // (a whole-shard read, which a rank makes once per epoch) the reads count.
  void Touch(uint32_t s, bool whole) {
    {
      std::lock_guard lock(plan_mu_);
      if (cur_ && cur_->first_step[s] != kNever) cursor_ = std::max(cursor_, cur_->first_step[s]);
    }
    plan_cv_.notify_all();
    Locked l(this);
    Entry& e = At(s);
    e.last_use = ++Header()->tick;
    if (!whole) return;
    if (e.reads_epoch != uint32_t(epoch_ + 1)) {
      e.reads_epoch = uint32_t(epoch_ + 1);
      e.reads = 0;
    }
    e.reads++;
  }

  // ---- planned prefetch ----------------------------------------------------------
  // Fetches the next prefetch_shards shards of the node's order (this epoch,
  // then the next) ahead of this process's reads, while the cache admits
  // them. Shards another process fetches are skipped (their lock is held).
  void PrefetchLoop() {
    std::vector<std::byte> buffer;
    uint64_t seen_cursor = kNever, seen_generation = 0;
    while (true) {
      std::shared_ptr<const NeedOrder> cur, next;
      uint64_t cursor;
      {
        std::unique_lock lock(plan_mu_);
        plan_cv_.wait_for(lock, std::chrono::milliseconds(200), [&] {
          return stop_ || (cur_ && (cursor_ != seen_cursor || generation_ != seen_generation));
        });
        if (stop_) return;
        if (!cur_) continue;
        cur = cur_;
        next = next_;
        cursor = cursor_;
        seen_cursor = cursor;
        seen_generation = generation_;
      }
      std::vector<uint32_t> ahead;
      const auto from =
          std::lower_bound(cur->sequence.begin(), cur->sequence.end(), cursor,
                           [&](uint32_t x, uint64_t c) { return cur->first_step[x] < c; });
      for (auto it = from; it != cur->sequence.end() && ahead.size() < options_.prefetch_shards;
           ++it) {
        ahead.push_back(*it);
      }
      for (size_t i = 0;
           next && i < next->sequence.size() && ahead.size() < options_.prefetch_shards; ++i) {
        ahead.push_back(next->sequence[i]);
      }
      for (uint32_t s : ahead) {
        {
          std::lock_guard lock(plan_mu_);
          if (stop_ || generation_ != seen_generation) break;
        }
        if (Present(s)) continue;
        ByteLock fetch;
        auto got = fetch.Lock(fetch_lock_path_, s, true, /*wait=*/false);
        if (!got.ok() || !*got) continue;
        struct stat st;
        if (stat(FilePath(s).c_str(), &st) == 0) continue;  // landed meanwhile
        buffer.resize(manifest_.shards[s].bytes);
        // NoSpace: the cache holds only shards needed sooner than this one,
        // and sooner than every one after it.
        if (Fetch(s, buffer, /*prefetch=*/true).code() == Code::kNoSpace) break;
      }
    }
  }

  format::Manifest manifest_;
  CacheOptions options_;
  std::map<std::string, uint32_t, std::less<>> shard_of_key_;
  std::vector<uint32_t> shard_samples_;
  bool planned_ = true;
  std::string ds_dir_, fetch_lock_path_, pin_lock_path_;
  MappedFile folder_, table_;
  mutable std::mutex folder_mu_;
  uint64_t capacity_ = 0;

  std::mutex plan_mu_;
  std::condition_variable plan_cv_;
  std::shared_ptr<const NeedOrder> cur_, next_;
  uint64_t cursor_ = 0;
  std::atomic<uint64_t> epoch_{0};
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::thread prefetcher_;

  std::atomic<uint64_t> remote_bytes_{0}, cache_bytes_{0}, hits_{0}, misses_{0}, fetch_waits_{0},
      prefetches_{0}, evictions_{0}, refetches_{0};
  std::atomic<bool> bad_said_{false}, write_said_{false};
};

void CacheQueue::Serve() {
  while (true) {
    ReadRequest r;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopped, nothing left
      r = std::move(pending_.front());
      pending_.pop_front();
    }
    ReadCompletion c;
    c.tag = r.tag;
    auto n = cache_->Read(r.key, r.offset, r.dst);
    if (n.ok()) {
      c.bytes = *n;
    } else {
      c.status = n.status();
    }
    {
      std::lock_guard lock(mu_);
      done_.push_back(std::move(c));
    }
    done_cv_.notify_all();
  }
}

// The cache switched off (CacheOptions::fallback_uncached): every read goes
// to the remote store; only the counters of remote bytes are kept.
class UncachedNodeCache final : public NodeCache {
 public:
  UncachedNodeCache(std::shared_ptr<Store> remote, std::string dir)
      : NodeCache(std::move(remote)), dir_(std::move(dir)) {}
  Status BeginEpoch(const PlanOptions&, uint64_t, uint64_t) override { return Status::Ok(); }
  CacheStats stats() const override {
    CacheStats s;
    s.uncached = true;
    return s;
  }
  const std::string& dataset_dir() const override { return dir_; }

 private:
  std::string dir_;
};

}  // namespace

Result<std::shared_ptr<NodeCache>> OpenNodeCache(std::shared_ptr<Store> remote,
                                                 const format::Manifest& manifest,
                                                 const CacheOptions& options) {
  if (options.dir.empty()) return InvalidArgument("cache: no folder given (CacheOptions::dir)");
  if (options.policy != "planned" && options.policy != "lru") {
    return InvalidArgument("cache policy '" + options.policy + "' is not \"planned\" or \"lru\"");
  }
  auto cache = std::make_shared<NodeCacheImpl>(remote, manifest, options);
  Status st = cache->Init();
  if (st.ok()) return std::shared_ptr<NodeCache>(std::move(cache));
  if (!options.fallback_uncached) return st;
  std::fprintf(stderr, "stoker: %s; reading %s uncached\n", st.ToString().c_str(),
               remote->uri().c_str());
  return std::shared_ptr<NodeCache>(std::make_shared<UncachedNodeCache>(remote, options.dir));
}

}  // namespace stoker
