// The cache folder's shared state: what the processes of a node that share a
// cache folder know about it together, kept in the folder itself.
//
//   DIR/stoker-cache.table     the folder's header (bytes held, a clock),
//                              mmap'd; flock on it is the folder lock
//   DIR/<dataset id>/table     one entry per shard: absent, being fetched
//                              (its bytes reserved) or present; then, per
//                              job planning the cache (up to kTableJobs),
//                              its plan, each node rank's progress and each
//                              shard's read marks (planned eviction), mmap'd
//   DIR/<dataset id>/jobs.lock    byte j: held shared by the processes of
//                              the job in slot j (OFD: gone when they die)
//   DIR/<dataset id>/fetch.lock   byte i: shard i's fetch lock (OFD)
//   DIR/<dataset id>/pin.lock     byte i: shard i's pins (OFD, shared)
//   DIR/<dataset id>/NNNNNNNN.stks   the cache files
//   DIR/<dataset id>/order-*      the jobs' need orders (shared_orders.h)
//
// Thread safety: FolderLock serialises the threads of a process (a mutex)
// and the processes (flock) on the tables; ByteLock is one lock of one open
// file description (not shared between threads).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "stoker/status.h"

namespace stoker::cache_internal {

inline constexpr uint64_t kFolderMagic = 0x31454843414b5453ull;  // "STKACHE1"
// "STKACDS4": the jobs' slots, then per job the ranks' progress and the
// read marks (version 3 had one set for every job; version 2 a read count
// where Entry::soon is). An older table is taken over with `soon` and all
// after the entries cleared (its files and bytes stay counted).
inline constexpr uint64_t kDatasetMagic = 0x34534443414b5453ull;  // "STKACDS4"

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
  // 1 while a planned process of its dataset expects a read of it soon (it
  // was fetched for a read or a prefetch and not every rank of the node has
  // read it yet): another dataset sharing the folder evicts it only last.
  // 0: LRU, or done for the epoch (kept only for a later one).
  uint32_t soon;
  uint32_t unused;
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
  // Shards made absent so far (evicted, dropped, a fetch given up): while it
  // stands still, no shard seen there or being fetched has gone (the planned
  // prefetch skips what it scanned before). Zero in a table made before it.
  uint64_t dropped;
  uint64_t unused[5];
};
static_assert(sizeof(DatasetHeader) == 64);

// Where one rank of the node is in its epoch: the furthest place (in its own
// order of shard reads) it has begun to read at, in epoch epoch_tag - 1.
struct RankProgress {
  uint32_t epoch_tag;
  uint32_t step;
};

// Which ranks of the node (a bit each) have read a shard in epoch
// epoch_tag - 1: once every rank that needs it has, it is done for the epoch.
struct ReadMarks {
  uint64_t epoch_tag;
  uint64_t mask;
};

// Ranks of one node told apart in the table (a bit each in ReadMarks).
inline constexpr uint32_t kTableRanks = 64;
// Jobs with different plans (seed, world, ...) on one dataset whose
// progress and marks the table keeps apart; a job beyond them evicts LRU.
inline constexpr uint32_t kTableJobs = 4;

// A job planning the cache: its plan as the other jobs need it to compute
// its order (NeedOrder::Compute), and the epoch it is in. identity 0: free.
struct JobSlot {
  uint64_t identity;  // JobIdentity(): the plan without the epoch
  uint64_t seed;
  uint64_t epoch;
  uint64_t position;  // where that epoch began (a resumed one, mid-way)
  uint32_t window;
  uint32_t batch_size;
  uint32_t world_size;
  uint32_t rank;            // one of the node's ranks (which node)
  uint32_t ranks_per_node;  // the cache's (0: the plan's)
  uint32_t plan_ranks_per_node;
  uint32_t flags;  // 1 shuffle, 2 drop_last, 4 node_affinity
  uint32_t unused;
};
static_assert(sizeof(JobSlot) == 64);

// The dataset table's bytes for `shards` shards: the header, the entries,
// the jobs' slots, their ranks' progress and their read marks.
inline uint64_t DatasetTableBytes(uint64_t shards) {
  return sizeof(DatasetHeader) + shards * sizeof(Entry) + kTableJobs * sizeof(JobSlot) +
         kTableJobs * kTableRanks * sizeof(RankProgress) + kTableJobs * shards * sizeof(ReadMarks);
}

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
  // Whether Open found the file empty (made it, or found it just made): its
  // bytes are zeros no process has written yet.
  bool fresh() const { return fresh_; }

 private:
  bool fresh_ = false;
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

// The tables of one dataset in a cache folder, mapped, and the folder lock
// over them.
class FolderTables {
 public:
  // Maps DIR/stoker-cache.table and DS_DIR/table (made if missing).
  Status Open(const std::string& dir, const std::string& ds_dir, uint64_t shards);

  FolderHeader& header() const { return *static_cast<FolderHeader*>(folder_.data()); }
  DatasetHeader& dataset() const { return *static_cast<DatasetHeader*>(table_.data()); }
  Entry& At(uint32_t s) const {
    return reinterpret_cast<Entry*>(Base() + sizeof(DatasetHeader))[s];
  }
  JobSlot& Job(uint32_t j) const {
    return reinterpret_cast<JobSlot*>(Base() + sizeof(DatasetHeader) +
                                      shards_ * sizeof(Entry))[j];
  }
  RankProgress& Progress(uint32_t job, uint32_t r) const {
    return reinterpret_cast<RankProgress*>(JobsEnd())[size_t(job) * kTableRanks + r];
  }
  ReadMarks& Marks(uint32_t job, uint32_t s) const {
    return reinterpret_cast<ReadMarks*>(JobsEnd() + kTableJobs * kTableRanks *
                                                        sizeof(RankProgress))[job * shards_ + s];
  }
  // A job's progress and marks cleared (a slot taken by a new job).
  void ClearJob(uint32_t job) const;
  uint64_t shards() const { return shards_; }
  // Whether Open made the dataset's table (so every entry is absent).
  bool fresh() const { return table_.fresh(); }
  // The shards whose entry is not absent, read (without the folder lock) by
  // pread rather than through the mapping: a scan of every entry maps no
  // page of them into this process (48 MB at 10^6 shards).
  Result<std::vector<uint32_t>> NotAbsent() const;
  // Whether shard s's file is there (read without the folder lock).
  bool Present(uint32_t s) const {
    return __atomic_load_n(&At(s).state, __ATOMIC_ACQUIRE) == kPresent;
  }

  // The folder lock: threads of this process (a mutex), then processes
  // (flock on the folder table). Held briefly, never across a fetch.
  class Locked {
   public:
    explicit Locked(const FolderTables& t);
    ~Locked();
    Locked(const Locked&) = delete;
    Locked& operator=(const Locked&) = delete;

   private:
    const FolderTables& t_;
    std::unique_lock<std::mutex> lock_;
  };

 private:
  std::byte* Base() const { return static_cast<std::byte*>(table_.data()); }
  std::byte* JobsEnd() const {
    return Base() + sizeof(DatasetHeader) + shards_ * sizeof(Entry) + kTableJobs * sizeof(JobSlot);
  }
  MappedFile folder_, table_;
  uint64_t shards_ = 0;
  mutable std::mutex mu_;
};

// Whether the file system of `path` offers OFD locks (EINVAL otherwise).
Status CheckOfdLocks(const std::string& path);

}  // namespace stoker::cache_internal
