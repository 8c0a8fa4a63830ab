// The store: stoker's one narrow interface to storage, with object semantics.
//
// Everything above it (format, pack, loader, cache, checkpoint) sees storage
// only through this file: named objects that are read by byte range, written
// whole and atomically, stat'ed, listed by prefix and removed. Backends are
// picked by URI (see OpenStore): a local directory (io_uring, or a thread pool
// when io_uring is unavailable), Ceph RADOS, or memory (unit tests).
//
// Reads are batch-first and asynchronous, shaped like io_uring: prepare many
// ReadRequests, Submit them to a ReadQueue, then Wait for at least N
// completions with a deadline. Reads land in caller-owned memory; a backend
// never allocates or copies on the read path beyond what its kernel interface
// requires.
//
// Thread safety: a Store is safe for concurrent use by many threads (all
// methods, including NewReadQueue). A ReadQueue is NOT: it belongs to one
// thread at a time (external synchronisation otherwise); use one queue per
// thread that reads.
//
// Object keys are relative, '/'-separated names ("ds/shard-000001.stk").
// A key never starts with '/', never has an empty component ("a//b") or one
// that starts with '.' (so no "." or "..", and no hidden names: the POSIX store
// keeps its temporary files there), and never contains NUL; backends reject
// such keys with InvalidArgument, so no key can escape the store's root.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// One read of a byte range of an object into caller-owned memory.
struct ReadRequest {
  std::string key;
  uint64_t offset = 0;
  // Destination; its size is the number of bytes asked for. The memory must
  // stay valid and untouched until the request's completion is reaped.
  std::span<std::byte> dst;
  // Opaque to the store; returned in the completion.
  uint64_t tag = 0;
};

// The outcome of one ReadRequest.
struct ReadCompletion {
  uint64_t tag = 0;
  // OK: `bytes` were read. A range that runs past the end of the object is
  // not an error: `bytes` is then smaller than dst.size() (0 at or past the
  // end). A missing object is NotFound.
  Status status;
  size_t bytes = 0;
};

// Options of a ReadQueue.
struct ReadQueueOptions {
  // Most requests in flight at once; Submit accepts more and queues the rest.
  // Default: 32.
  uint32_t depth = 32;
  // Bypass the page cache where the backend can (O_DIRECT on POSIX). Requires
  // dst, offset and length aligned to kDirectIoAlignment, except that a read
  // may end at the object's end. Default: off.
  bool direct_io = false;
};

// 4 KiB: the logical block size of NVMe and the alignment O_DIRECT needs.
inline constexpr size_t kDirectIoAlignment = 4096;

// A submission/completion queue of reads. Not thread-safe (see above).
class ReadQueue {
 public:
  virtual ~ReadQueue() = default;

  // Queues the requests; at most `depth` are in flight at once, the rest wait
  // inside the queue. Errors about one request (bad key, missing object) are
  // reported in its completion, not here; Submit fails only when the queue
  // itself cannot go on (e.g. shut down).
  virtual Status Submit(std::span<const ReadRequest> requests) = 0;

  // Waits until at least `min_completions` completions are available (capped
  // at the number outstanding) or `deadline` passes, then moves every
  // available completion into `out` (appending) and returns how many it
  // moved. Returns TimedOut only if fewer than `min_completions` arrived by
  // the deadline (whatever did arrive is still appended to `out`).
  virtual Result<size_t> Wait(size_t min_completions, Deadline deadline,
                              std::vector<ReadCompletion>* out) = 0;

  // Submitted requests whose completions have not been reaped yet.
  virtual size_t Outstanding() const = 0;
};

// One object held open for synchronous ranged reads, from any thread at once:
// the loader's per-sample reads, where a queue round trip per read would cost
// more than the read. Obtained from Store::OpenReader.
class ObjectReader {
 public:
  virtual ~ObjectReader() = default;
  // Reads consecutive bytes from `offset` into `dsts`, one after another (a
  // scatter read: POSIX preadv). Returns the bytes read, short only at the
  // object's end. Errors name the object.
  virtual Result<size_t> ReadV(uint64_t offset, std::span<const std::span<std::byte>> dsts) = 0;
  // A hint that [offset, offset + length) will be read soon, so that reads
  // which would wait on the device find it in memory (POSIX: the kernel's
  // readahead, posix_fadvise WILLNEED). Default: nothing.
  virtual void WillNeed(uint64_t offset, uint64_t length) {
    (void)offset;
    (void)length;
  }
  // The whole object mapped read-only into memory, where the backend can
  // (StoreCapabilities::mapped_reads: a file, a memory store's bytes);
  // Unsupported where it cannot. A load from it is the cheapest read there
  // is, no system call and no copy into a buffer: a caller can check a record
  // where it lies and copy it once, straight to where it goes. The first call
  // maps; later ones return the same bytes. Valid while the reader lives.
  // A mapped file truncated behind the reader's back, or a disk error under
  // a page, raises SIGBUS on the load: stoker loads from it only under
  // GuardedLoads (core/mapped_guard.h), which turns that into an error.
  virtual Result<std::span<const std::byte>> Map() {
    return Unsupported("this store's objects cannot be mapped into memory");
  }
  // Loads from Map()'s bytes are not reads the store sees: a caller reports
  // what it read, for the counters a store keeps of its reads (the node
  // cache's hits). Default: nothing.
  virtual void CountMapped(uint64_t bytes) { (void)bytes; }
};

// Forwards every call to another queue, so that a decorator's queue
// (metering, latency) overrides only what it changes. Thread safety: as the
// queue it wraps (one thread at a time).
class ReadQueueWrapper : public ReadQueue {
 public:
  explicit ReadQueueWrapper(std::unique_ptr<ReadQueue> target) : target_(std::move(target)) {}
  Status Submit(std::span<const ReadRequest> requests) override {
    return target_->Submit(requests);
  }
  Result<size_t> Wait(size_t min_completions, Deadline deadline,
                      std::vector<ReadCompletion>* out) override {
    return target_->Wait(min_completions, deadline, out);
  }
  size_t Outstanding() const override { return target_->Outstanding(); }
  ReadQueue* target() const { return target_.get(); }

 private:
  std::unique_ptr<ReadQueue> target_;
};

// Forwards every call to another reader (ReadV, WillNeed, Map, CountMapped),
// so that a decorator's reader (metering, retry) overrides only what it
// changes and keeps mapped reads, readahead and the counting of mapped
// loads. Thread safety: as the reader it wraps (any thread).
class ObjectReaderWrapper : public ObjectReader {
 public:
  explicit ObjectReaderWrapper(std::unique_ptr<ObjectReader> target) : target_(std::move(target)) {}
  Result<size_t> ReadV(uint64_t offset, std::span<const std::span<std::byte>> dsts) override {
    return target_->ReadV(offset, dsts);
  }
  void WillNeed(uint64_t offset, uint64_t length) override { target_->WillNeed(offset, length); }
  Result<std::span<const std::byte>> Map() override { return target_->Map(); }
  void CountMapped(uint64_t bytes) override { target_->CountMapped(bytes); }
  ObjectReader* target() const { return target_.get(); }

 private:
  std::unique_ptr<ObjectReader> target_;
};

// What Stat and List report about an object.
struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
};

// Capabilities a caller may choose its way by. Each is a property of the
// backend, forwarded by StoreWrapper.
struct StoreCapabilities {
  // A small ranged read costs a system call on this machine, not a network
  // round trip: a local disk file system or tmpfs (POSIX), memory. The
  // loader reads large samples one by one, straight into the batch, only
  // from such stores (LoaderOptions::read_unit). Default: false.
  bool local_reads = false;
  // List(prefix) costs what lies under the prefix (a POSIX folder, a memory
  // map's range), so a caller may list one checkpoint's folder; on RADOS a
  // listing walks the whole pool. Default: false.
  bool prefix_listing = false;
  // ObjectReader::Map works: the objects are files (POSIX, or the node
  // cache's copies) or bytes in memory. Default: false.
  bool mapped_reads = false;
  // Put with WriteOptions::if_absent works (POSIX, RADOS, memory); where it
  // does not, such a Put is Unsupported. Default: false.
  bool exclusive_create = false;
};

// Sees the bytes of a Put as it writes them (WriteOptions::observer).
using PutObserver = std::function<void(std::span<const std::byte>)>;

// When a Put's object is durable (WriteOptions::durability).
enum class Durability {
  // On return (POSIX: file and directory fsync'ed).
  kDurable,
  // After the next Store::Sync() that returns OK. On return the object is
  // whole and visible, atomic as a durable Put is (a killed writer leaves the
  // old object or the new one), but a machine crash before that Sync may
  // lose it or leave it short. For many objects made durable together, then
  // committed by a durable Put that names them (a checkpoint's chunks, then
  // its manifest): one Sync() costs one flush of the device where each
  // durable Put pays its own (POSIX: a file and a directory fsync). A store
  // that cannot defer (RADOS, memory; POSIX on a network file system) makes
  // the object durable on return.
  kDeferred,
};

// How Store::Put writes an object. The defaults: a durable replace, unseen.
struct WriteOptions {
  // Default: kDurable.
  Durability durability = Durability::kDurable;
  // Exclusive create: the object is written only if no object has the key,
  // AlreadyExists otherwise (an existing object is left as it was). Of
  // writers that create one key at the same time, from any processes and
  // machines, exactly one succeeds (POSIX: link(2) of a synced temporary
  // file; RADOS: an exclusive create in the write operation). For claims: a
  // checkpoint's sequence number, an automatic name. Unsupported where the
  // store cannot (StoreCapabilities::exclusive_create). Default: off.
  bool if_absent = false;
  // Shown every byte of the data, in order, in pieces, each once, on the
  // calling thread, as they are written: a caller that checksums what it
  // stores reads its data once instead of twice. (The POSIX store hands over
  // each piece next to its copy into the page cache or an aligned buffer,
  // while the piece is in cache; a store without such a copy shows all of
  // the data before writing it.) A failed Put may have shown only a prefix;
  // a retry starts over. Must outlive the call. Default: none.
  const PutObserver* observer = nullptr;
};

// What a store is, for reports and metrics labels: its backend, where its
// objects live, how it reads them, and the decorators in front of it. Callers
// choose their way by capabilities(), never by this.
struct StoreDescription {
  // "posix", "rados" or "memory"; a store of the caller's own: "other".
  std::string kind = "other";
  // POSIX: the root folder; RADOS: the pool; memory: the store's name;
  // other: its URI.
  std::string location;
  // RADOS: the key prefix inside the pool, without its '/' (may be empty).
  std::string prefix;
  // POSIX: "io_uring" or "threads", the engine in use (not the one asked
  // for); RADOS: "librados"; otherwise empty.
  std::string engine;
  // The decorators in front of the backend, outermost first: "retry",
  // "node cache DIR", "metering"...
  std::vector<std::string> layers;
  // One line: "posix /data/ds (io_uring) through retry, metering".
  std::string ToString() const;
};

class Store {
 public:
  virtual ~Store() = default;

  // The URI this store was opened with, for messages.
  virtual const std::string& uri() const = 0;

  // What this store is (see StoreDescription). Cheap; safe from any thread.
  // The default: kind "other", location uri(). A decorator forwards its
  // target's (StoreWrapper) and may add its layer in front.
  virtual StoreDescription Describe() const;

  // A new read queue. Cheap; one per reading thread.
  virtual Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& options) = 0;

  // Synchronous read of one range, through a queue. Returns bytes read
  // (short at the end of the object).
  virtual Result<size_t> Read(std::string_view key, uint64_t offset, std::span<std::byte> dst);

  // Reads a whole object into a new buffer. For small objects (manifests).
  virtual Result<std::vector<std::byte>> ReadAll(std::string_view key);
  // Opens `key` for ranged reads (see ObjectReader); NotFound if it does not
  // exist. The default reads through Read(), piece by piece. A reader must
  // not outlive its store.
  virtual Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view key);
  // StoreCapabilities::local_reads, for the loader's choice of read unit.
  bool local_reads() const { return capabilities().local_reads; }

  // Writes a whole object atomically: a reader sees the old object or the new
  // one, never a mix or a prefix, also when the writer is killed part way.
  // Replaces an existing object unless options.if_absent. When it is durable,
  // whether its bytes are shown as written and whether it may replace: see
  // WriteOptions. The one write of a store: a decorator that must see every
  // write overrides this.
  virtual Status Put(std::string_view key, std::span<const std::byte> data,
                     const WriteOptions& options) = 0;
  // A durable replace, unseen: Put with the default WriteOptions. Not
  // virtual: a class that overrides Put brings this one back with
  // `using Store::Put;`.
  Status Put(std::string_view key, std::span<const std::byte> data) {
    return Put(key, data, WriteOptions{});
  }

  // Makes every object this store wrote with Durability::kDeferred durable.
  // An error means some of them may not be: write them again (a second call
  // does not report the same error again). POSIX, on a local file system:
  // syncfs of the store's file system (one journal commit and device flush;
  // it also writes back other programs' dirty data there); elsewhere the
  // deferred Puts were durable already and this returns OK. Default: OK.
  virtual Status Sync() { return Status::Ok(); }

  // What this store can do cheaply; see StoreCapabilities.
  virtual StoreCapabilities capabilities() const { return {}; }

  // Size of an object; NotFound if it does not exist.
  virtual Result<ObjectInfo> Stat(std::string_view key) = 0;

  // Every object whose key starts with `prefix`, sorted by key. Objects being
  // written by an unfinished Put are never listed.
  virtual Result<std::vector<ObjectInfo>> List(std::string_view prefix) = 0;

  // The keys List would give, without the sizes, which some backends pay
  // for object by object: RADOS a stat each, POSIX one where the folder's
  // entry does not say it is a file. The default is List's keys.
  virtual Result<std::vector<std::string>> ListKeys(std::string_view prefix);

  // Removes an object; NotFound if it does not exist.
  virtual Status Remove(std::string_view key) = 0;

  // Removes every object under `folder` (a key prefix ending in '/', whose
  // components pass the key rules) and what the backend keeps there besides
  // objects: the POSIX store removes the folder itself, with the temporary
  // files that Puts killed part way left behind (never listed, so no
  // object-by-object removal finds them) and the emptied sub-folders. OK if
  // nothing is there. Not atomic, not durable on return: a crash part way
  // leaves some of the objects, each whole. A Put under `folder` at the same
  // time may survive it. The default lists (ListKeys) and removes each
  // object.
  virtual Status RemoveFolder(std::string_view folder);

  // Removes `folder` (as for RemoveFolder) only if it holds no object: only
  // sub-folders and the backend's temporary files of writes killed before
  // they landed (a POSIX store's ".NAME.tmp.PID.N"), none of them changed
  // within `idle`. What a writer killed after making a folder leaves
  // (POSIX), which no listing shows. A writer stalled longer than `idle`
  // loses its temporary file: its Put then fails, naming the object. True when it was removed; false when it holds something
  // or changed within `idle` (a writer may be about to use it: it is left
  // alone); NotFound when there is no such folder. The default (a store
  // without folders keeps nothing besides objects): false when
  // ListKeys(folder) has objects, NotFound otherwise (so it costs a listing:
  // see StoreCapabilities::prefix_listing).
  virtual Result<bool> RemoveEmptyFolder(std::string_view folder, std::chrono::seconds idle);
};

// Forwards every call to another store, so that a decorator (fault injection,
// metering, caching, retry) overrides only what it changes and keeps the
// rest of what the store can do (its queues and readers, wrapped, derive
// from ReadQueueWrapper and ObjectReaderWrapper): per-sample reads (OpenReader),
// every WriteOptions (deferred durability and Sync, exclusive creates,
// observers), folder removal and capabilities. A decorator that must see
// every write overrides Put (the three-argument one, with `using
// StoreWrapper::Put;`); every read, NewReadQueue, Read, ReadAll and
// OpenReader.
class StoreWrapper : public Store {
 public:
  explicit StoreWrapper(std::shared_ptr<Store> target) : target_(std::move(target)) {}
  const std::string& uri() const override { return target_->uri(); }
  StoreDescription Describe() const override { return target_->Describe(); }
  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& o) override {
    return target_->NewReadQueue(o);
  }
  Result<size_t> Read(std::string_view k, uint64_t off, std::span<std::byte> dst) override {
    return target_->Read(k, off, dst);
  }
  Result<std::vector<std::byte>> ReadAll(std::string_view k) override {
    return target_->ReadAll(k);
  }
  Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view k) override {
    return target_->OpenReader(k);
  }
  using Store::Put;
  Status Put(std::string_view k, std::span<const std::byte> d, const WriteOptions& o) override {
    return target_->Put(k, d, o);
  }
  Status Sync() override { return target_->Sync(); }
  StoreCapabilities capabilities() const override { return target_->capabilities(); }
  Result<ObjectInfo> Stat(std::string_view k) override { return target_->Stat(k); }
  Result<std::vector<ObjectInfo>> List(std::string_view p) override { return target_->List(p); }
  Result<std::vector<std::string>> ListKeys(std::string_view p) override {
    return target_->ListKeys(p);
  }
  Status Remove(std::string_view k) override { return target_->Remove(k); }
  Status RemoveFolder(std::string_view f) override { return target_->RemoveFolder(f); }
  Result<bool> RemoveEmptyFolder(std::string_view f, std::chrono::seconds idle) override {
    return target_->RemoveEmptyFolder(f, idle);
  }
  Store* target() const { return target_.get(); }

 protected:
  // The target's description with `layer` in front of its layers: what a
  // decorator's Describe() returns.
  StoreDescription DescribeWithLayer(std::string layer) const {
    StoreDescription d = target_->Describe();
    d.layers.insert(d.layers.begin(), std::move(layer));
    return d;
  }

 private:
  std::shared_ptr<Store> target_;
};

// Options for opening a store. Each backend reads only what it understands.
struct StoreOptions {
  // POSIX backend: "auto" picks io_uring when the kernel allows it and falls
  // back to a thread pool otherwise; "io_uring" and "threads" force one
  // (io_uring fails with Unsupported when unavailable). The environment
  // variable STOKER_POSIX_ENGINE overrides "auto". Default: "auto".
  std::string posix_engine = "auto";
  // POSIX thread-pool engine: threads serving reads. Default: 0 = 2 x cores,
  // at least 4 (reads block in the kernel, so more threads than cores help).
  uint32_t io_threads = 0;
  // Timeout of one backend operation (RADOS); 0 = backend default.
  // Default for RADOS: 30 s, finite so a dead cluster is an error, not a hang.
  std::chrono::milliseconds op_timeout{0};
  // POSIX backend: Put writes objects of 1 MiB or more with O_DIRECT, past
  // the page cache (then fsync, as always). For large objects written once
  // and not read back soon, such as checkpoint chunks: a save neither evicts
  // the data a loader keeps cached nor waits on the kernel's writeback of
  // dirty pages (docs/benchmarks.md, "checkpoints past the page cache").
  // Memory that is not 4 KiB-aligned goes through a
  // per-thread 8 MiB bounce buffer; a filesystem without O_DIRECT gets
  // buffered writes. Default: off (CheckpointerOptions turns it on).
  bool direct_writes = false;
  // POSIX backend: bytes of object files kept mapped from one reader to the
  // next (ObjectReader::Map, the loader's read_unit "map"), so that a shard
  // read again next epoch is not mapped, faulted in and unmapped again.
  // Kept pages count in the process's RSS as shared file pages; an
  // accounting that sums RSS over ranks (Slurm's jobacct_gather/linux) sees
  // them once per process. Page tables take 2 MiB per GiB kept and resident,
  // per process. A limit smaller than a shard keeps none. At most
  // a quarter of vm.max_map_count mappings are kept, whatever the limit.
  // Default: 0 = the machine's physical memory.
  uint64_t keep_mapped_bytes = 0;
};

// `r` served at once by `store.Read`, as the completion a queue would give:
// for read queues that serve requests through another store's Read.
ReadCompletion ReadNow(Store& store, const ReadRequest& r);

// Opens the store named by `uri`:
//   /abs/or/rel/path, file:///abs/path   the POSIX backend rooted there
//   mem://NAME                           a process-wide in-memory store
//                                        (same NAME, same store; unit tests)
//   rados://POOL[/PREFIX][?conf=..&id=..&keyring=..]   Ceph (when built)
// A dataset is a store: its URI is the store's root, and its objects (the
// manifest, the shards) are keys relative to it. For POSIX the root folder is
// created by the first Put; opening a root that does not exist is not an
// error (Stat/List/Read then report NotFound / nothing).
Result<std::shared_ptr<Store>> OpenStore(std::string_view uri, const StoreOptions& options = {});

// Backend constructors, for code that wants one directly.
Result<std::shared_ptr<Store>> NewPosixStore(std::string root, const StoreOptions& options = {});
std::shared_ptr<Store> NewMemoryStore(std::string name = "");

// Checks a key against the rules above; InvalidArgument naming the key if bad.
Status ValidateKey(std::string_view key);

}  // namespace stoker
