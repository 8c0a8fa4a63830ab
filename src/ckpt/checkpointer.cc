// The Checkpointer: save (sync and async), commit, list, restore, verify and
// remove over one store. docs/checkpoint.md is the format; §1.1 the commit
// protocol this file carries out.
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/coordinator.h"
#include "ckpt/records.h"
#include "stoker/checkpoint.h"
#include "stoker/format.h"

namespace stoker {

using namespace std::chrono_literals;

// ---- SaveHandle -------------------------------------------------------------

struct SaveHandle::State {
  std::string name;
  std::string uri;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool done = false;
  mutable bool observed = false;
  Status status;

  void Finish(Status s) {
    {
      std::lock_guard<std::mutex> l(mu);
      status = std::move(s);
      done = true;
    }
    cv.notify_all();
  }
};

bool SaveHandle::Done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> l(state_->mu);
  if (state_->done) state_->observed = true;
  return state_->done;
}

Status SaveHandle::Wait() const {
  if (!state_) return InvalidArgument("SaveHandle: empty handle");
  std::unique_lock<std::mutex> l(state_->mu);
  state_->cv.wait(l, [&] { return state_->done; });
  state_->observed = true;
  return state_->status;
}

Status SaveHandle::WaitUntil(Deadline deadline) const {
  if (!state_) return InvalidArgument("SaveHandle: empty handle");
  std::unique_lock<std::mutex> l(state_->mu);
  if (!state_->cv.wait_until(l, deadline, [&] { return state_->done; })) {
    return TimedOut("checkpoint " + state_->name + " at " + state_->uri + ": still being written");
  }
  state_->observed = true;
  return state_->status;
}

const std::string& SaveHandle::name() const {
  static const std::string kEmpty;
  return state_ ? state_->name : kEmpty;
}

namespace {

using ckpt::ChunkKey;
using ckpt::ManifestKey;
using ckpt::PartKey;
using ckpt::PartRecord;

// ---- helpers ----------------------------------------------------------------

// The number of workers ParallelFor uses.
size_t Workers(size_t n, uint32_t threads) {
  return std::max<size_t>(1, std::min<size_t>(threads, n));
}

// Runs fn(i, worker) for i in 0..n-1 on Workers(n, threads) threads (worker
// in 0..Workers-1, for per-worker scratch); the first error stops the others
// from taking new indices and is returned.
Status ParallelFor(size_t n, uint32_t threads, const std::function<Status(size_t, size_t)>& fn) {
  if (n == 0) return Status::Ok();
  const size_t t = Workers(n, threads);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first;
  auto work = [&](size_t worker) {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      size_t i = next.fetch_add(1);
      if (i >= n) return;
      Status s = fn(i, worker);
      if (!s.ok()) {
        std::lock_guard<std::mutex> l(mu);
        if (first.ok()) first = std::move(s);
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t i = 1; i < t; ++i) pool.emplace_back(work, i);
  work(0);
  for (auto& th : pool) th.join();
  return first;
}

// Page-aligned anonymous memory: the staging area and restored tensors.
struct MappedMemory {
  std::byte* data = nullptr;
  size_t size = 0;
  MappedMemory() = default;
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;
  ~MappedMemory() {
    if (data != nullptr) ::munmap(data, size);
  }
  // With `huge_pages`, asks for transparent huge pages (MADV_HUGEPAGE): 512
  // times fewer faults, but the first touch may stall on compaction
  // (defrag=madvise, Debian's default), and on VMs that return free memory
  // to the host (virtio-balloon free page reporting, which reports 2 MiB
  // blocks) a fresh huge page is exactly what the host has taken back.
  // Measured restores of 1 GiB into fresh memory: on one VM 1.2 s with them
  // and 0.6 s without (compaction); on another, whose 4 KiB faults cost
  // 3-4 s/GB, 0.35 s with and 4.0 s without; on a Firecracker VM with free
  // page reporting, first touch 0.25-3.2 s/GiB with them and 0.55-0.7 s/GiB
  // without, run to run. Restored tensors leave the choice to the system's
  // own THP policy (no hint); the staging area, allocated once and reused,
  // asks for them.
  static Result<std::unique_ptr<MappedMemory>> Make(size_t bytes, bool huge_pages) {
    auto m = std::make_unique<MappedMemory>();
    if (bytes == 0) return m;
    constexpr size_t kHugePage = 2ull << 20;
    m->size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      m->size = 0;
      return ErrnoToStatus(errno, "mmap of " + std::to_string(bytes) + " bytes");
    }
    if (huge_pages) (void)::madvise(p, m->size, MADV_HUGEPAGE);  // a hint only
    m->data = static_cast<std::byte*>(p);
    return m;
  }
};

// Restore reads a chunk in pieces of this size, all in flight together (the
// size a loader's shard read has).
constexpr size_t kReadPiece = 4ull << 20;
// Tensor parts at least this large are read straight into their tensor;
// smaller ones go through a worker's buffer.
constexpr size_t kDirectMin = 256ull << 10;

// Restore faults its new memory in ahead of the reads (see Restore) in steps
// of this size, for blocks of at least kPopulateMin.
constexpr uint64_t kPopulateStep = 2ull << 20;
constexpr uint64_t kPopulateMin = 16ull << 20;
// Threads that fault the block in (Populator): one per CPU up to
// kPopulateThreadsMax. A fault's cost is mostly the kernel's (or, in a VM,
// the host's) and spreads over CPUs: MADV_POPULATE_WRITE of 8 GiB of fresh
// memory on a 2-vCPU Firecracker VM took 0.52-0.78 s/GiB from 2 threads and
// 0.86-2.08 from one (docs/benchmarks.md).
constexpr size_t kPopulateThreadsMax = 4;
size_t PopulateThreads() {
  return std::clamp<size_t>(std::thread::hardware_concurrency(), 1, kPopulateThreadsMax);
}
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL
#endif

// Faults a new block in ahead of the reads that fill it, while they wait on
// the device: PopulateThreads() threads take kPopulateStep steps in address
// order, each the next one not taken (one thread fell 2.7 s behind the other
// on 8 GiB when each had every other step), with MADV_POPULATE_WRITE, which
// maps pages and never changes bytes already read. Stops on destruction; on
// a kernel without MADV_POPULATE_WRITE it does nothing and the reads fault.
class Populator {
 public:
  Populator(std::byte* base, size_t size) : base_(base), size_(size) {
    const size_t threads = PopulateThreads();
    for (size_t t = 0; t < threads; ++t) threads_.emplace_back([this] { Run(); });
  }
  ~Populator() {
    stop_.store(true, std::memory_order_relaxed);
    for (std::thread& t : threads_) t.join();
  }
  Populator(const Populator&) = delete;
  Populator& operator=(const Populator&) = delete;

 private:
  void Run() {
    while (!stop_.load(std::memory_order_relaxed)) {
      const uint64_t o = next_.fetch_add(kPopulateStep, std::memory_order_relaxed);
      if (o >= size_) return;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kPopulateStep, size_ - o));
      if (::madvise(base_ + o, n, MADV_POPULATE_WRITE) != 0) {
        stop_.store(true, std::memory_order_relaxed);
      }
    }
  }

  std::byte* const base_;
  const uint64_t size_;
  std::atomic<uint64_t> next_{0};  // the start of the next step to take
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;  // last: started once the rest is set
};

// A worker's reusable buffer for shared chunks, 4 KiB-aligned so that direct
// reads can land in it. Not zeroed: every byte is written before it is read.
class Scratch {
 public:
  std::byte* Get(size_t n) {
    if (n > size_) {
      const size_t rounded = (n + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
      data_.reset(static_cast<std::byte*>(std::aligned_alloc(kDirectIoAlignment, rounded)));
      if (data_ == nullptr) throw std::bad_alloc();
      size_ = rounded;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

// One piece of a chunk: bytes of one tensor.
struct Segment {
  const std::byte* src = nullptr;
  size_t bytes = 0;
};

struct ChunkPlan {
  uint64_t offset = 0, bytes = 0;
  std::vector<Segment> segments;
};

// Where the writer cuts a rank's stream (§3.1: the writer's choice). Tensors
// of at least a sixteenth of the chunk size (4 MiB at the default) get chunks
// of their own, at most `chunk` bytes each, written straight from their
// memory and read straight into their place; smaller ones share chunks of up
// to `chunk` bytes, gathered on save and scattered on restore, which costs a
// copy of only the small tensors.
std::vector<ChunkPlan> PlanChunks(std::span<const TensorRef> tensors, uint64_t chunk) {
  const uint64_t own = std::max<uint64_t>(chunk / 16, 1);
  std::vector<ChunkPlan> plan;
  ChunkPlan group;
  uint64_t stream = 0;
  auto flush = [&] {
    if (group.bytes > 0) plan.push_back(std::move(group));
    group = ChunkPlan{};
    group.offset = stream;
  };
  for (const TensorRef& t : tensors) {
    const uint64_t n = t.data.size();
    if (n == 0) continue;
    if (n >= own) {
      flush();
      for (uint64_t off = 0; off < n; off += chunk) {
        ChunkPlan c;
        c.offset = stream + off;
        c.bytes = std::min(chunk, n - off);
        c.segments.push_back({t.data.data() + off, c.bytes});
        plan.push_back(std::move(c));
      }
      stream += n;
      group.offset = stream;
      continue;
    }
    if (group.bytes + n > chunk) flush();
    group.segments.push_back({t.data.data(), n});
    group.bytes += n;
    stream += n;
  }
  flush();
  return plan;
}

std::string Join(const std::vector<std::string>& v, size_t max = 8) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < max; ++i) {
    if (i) out += ", ";
    out += v[i];
  }
  if (v.size() > max) out += ", and " + std::to_string(v.size() - max) + " more";
  return out;
}

// Names of the tensors of `part` that overlap [offset, offset + bytes).
std::vector<std::string> TensorsIn(const RankPart& part, uint64_t offset, uint64_t bytes) {
  std::vector<std::string> out;
  auto it = std::upper_bound(part.tensors.begin(), part.tensors.end(), offset,
                             [](uint64_t o, const TensorInfo& t) { return o < t.offset; });
  if (it != part.tensors.begin()) --it;
  for (; it != part.tensors.end() && it->offset < offset + bytes; ++it) {
    if (it->bytes > 0 && it->offset + it->bytes > offset) out.push_back(it->name);
  }
  return out;
}

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---- the checkpointer -------------------------------------------------------

class CheckpointerImpl final : public Checkpointer {
 public:
  CheckpointerImpl(std::shared_ptr<Store> store, const CheckpointerOptions& options)
      : store_(std::move(store)), opt_(options) {
    if (opt_.io_threads == 0) opt_.io_threads = 1;
  }

  ~CheckpointerImpl() override {
    std::lock_guard<std::mutex> l(save_mu_);
    JoinBackground();
  }

  const std::string& uri() const override { return store_->uri(); }

  Status Save(std::string_view name, std::span<const TensorRef> tensors,
              const SaveOptions& options) override {
    STOKER_RETURN_IF_ERROR(CheckSave(name, tensors, options));
    STOKER_ASSIGN_OR_RETURN(const bool mpi, ChooseMpi(name, options, /*background=*/false));
    std::lock_guard<std::mutex> l(save_mu_);
    JoinBackground();
    if (Status p = Prepare(name, options); !p.ok()) {
      return mpi ? CoordinateOverMpi(std::string(name), p, {}, "", options) : p;
    }
    return WriteAndCommit(std::string(name), Describe(tensors),
                          PlanChunks(tensors, options.chunk_bytes), options, mpi);
  }

  Result<SaveHandle> SaveAsync(std::string_view name, std::span<const TensorRef> tensors,
                               const SaveOptions& options) override {
    STOKER_RETURN_IF_ERROR(CheckSave(name, tensors, options));
    STOKER_ASSIGN_OR_RETURN(const bool mpi, ChooseMpi(name, options, /*background=*/true));
    std::lock_guard<std::mutex> l(save_mu_);
    JoinBackground();
    if (Status p = Prepare(name, options); !p.ok()) {
      return mpi ? CoordinateOverMpi(std::string(name), p, {}, "", options) : p;
    }

    // The snapshot: every tensor copied, back to back, into the staging area.
    uint64_t total = 0;
    for (const TensorRef& t : tensors) total += t.data.size();
    if (!staging_ || staging_->size < total) {
      staging_.reset();
      STOKER_ASSIGN_OR_RETURN(staging_, MappedMemory::Make(total, /*huge_pages=*/true));
    }
    struct Piece {
      const std::byte* src;
      std::byte* dst;
      size_t n;
    };
    std::vector<Piece> pieces;
    std::vector<TensorRef> staged(tensors.begin(), tensors.end());
    uint64_t at = 0;
    constexpr size_t kPiece = 32ull << 20;  // spreads a large tensor over threads
    for (TensorRef& t : staged) {
      for (size_t off = 0; off < t.data.size(); off += kPiece) {
        pieces.push_back({t.data.data() + off, staging_->data + at + off,
                          std::min(kPiece, t.data.size() - off)});
      }
      t.data = std::span<const std::byte>(staging_->data + at, t.data.size());
      at += t.data.size();
    }
    const uint32_t copiers = std::clamp<uint32_t>(std::thread::hardware_concurrency(), 1, 16);
    (void)ParallelFor(pieces.size(), copiers, [&](size_t i, size_t) {
      std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].n);
      return Status::Ok();
    });

    auto state = std::make_shared<SaveHandle::State>();
    state->name = std::string(name);
    state->uri = uri();
    background_ = state;
    bg_ = std::thread([this, state, staged = std::move(staged), options, mpi]() {
      Status s = WriteAndCommit(state->name, Describe(staged),
                                PlanChunks(staged, options.chunk_bytes), options, mpi);
      if (!s.ok()) {
        // Never silently dropped: said here, and kept in the handle.
        std::fprintf(stderr, "stoker: background save of checkpoint %s failed: %s\n",
                     state->name.c_str(), s.ToString().c_str());
      }
      state->Finish(std::move(s));
    });
    return SaveHandle(state);
  }

  Result<std::vector<CheckpointListing>> List() override {
    STOKER_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, store_->List(""));
    std::map<std::string, CheckpointListing> by_name;
    for (const ObjectInfo& o : objects) {
      size_t slash = o.key.find('/');
      if (slash == std::string::npos) continue;  // `latest`, strays
      std::string name = o.key.substr(0, slash);
      if (!ValidateCheckpointName(name).ok()) continue;
      CheckpointListing& l = by_name[name];
      l.name = name;
      ++l.objects;
      if (o.key == ManifestKey(name)) l.committed = true;
    }
    std::string latest;
    if (auto lt = ReadLatest(); lt.ok()) latest = *lt;
    std::vector<CheckpointListing> out;
    for (auto& [name, l] : by_name) {
      l.latest = name == latest;
      if (l.committed) {
        auto m = ReadManifestOf(name);
        if (!m.ok()) {
          const Code code = m.status().code();
          if (code != Code::kCorruption && code != Code::kUnsupported) return m.status();
          l.problem = m.status().ToString();
          out.push_back(std::move(l));
          continue;
        }
        l.sequence = m->sequence;
        l.bytes = m->bytes();
        l.tensors = m->tensor_count();
        l.world_size = m->world_size;
        l.created_unix_ms = m->created_unix_ms;
      }
      out.push_back(std::move(l));
    }
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
      if (a.committed != b.committed) return a.committed;
      return a.committed ? a.sequence < b.sequence : a.name < b.name;
    });
    return out;
  }

  Result<std::string> Latest() override { return ReadLatest(); }

  Result<CheckpointManifest> ReadManifest(std::string_view name) override {
    STOKER_ASSIGN_OR_RETURN(std::string n, Resolve(name));
    return ReadManifestOf(n);
  }

  Result<Restored> Restore(std::string_view name, const RestoreOptions& options) override {
    Restored out;
    STOKER_ASSIGN_OR_RETURN(std::string n, Resolve(name));
    STOKER_ASSIGN_OR_RETURN(out.manifest, ReadManifestOf(n));
    STOKER_ASSIGN_OR_RETURN(std::vector<const TensorInfo*> wanted,
                            Select(out.manifest, options, {}));
    // One block; each tensor 64-byte aligned in it, and those large enough
    // to be read straight into (kDirectMin) 4 KiB-aligned, as direct reads
    // need.
    std::vector<uint64_t> at(wanted.size());
    uint64_t total = 0;
    for (size_t i = 0; i < wanted.size(); ++i) {
      const uint64_t align = wanted[i]->bytes >= kDirectMin ? kDirectIoAlignment : 64;
      total = (total + align - 1) / align * align;
      at[i] = total;
      total += wanted[i]->bytes;
    }
    STOKER_ASSIGN_OR_RETURN(std::unique_ptr<MappedMemory> mem,
                            MappedMemory::Make(total, /*huge_pages=*/false));
    std::vector<std::span<std::byte>> dst(wanted.size());
    for (size_t i = 0; i < wanted.size(); ++i) {
      dst[i] = std::span<std::byte>(mem->data + at[i], wanted[i]->bytes);
    }
    // New memory costs a page fault per 4 KiB on first touch, paid where
    // the bytes land. Left to the reads it adds to their time (8 GiB: 5.0 s
    // of reads at fio's rate plus 4.0 s of faults, docs/benchmarks.md);
    // here a Populator faults the block in, in chunk order, ahead of the
    // reads.
    std::optional<Populator> populate;
    if (total >= kPopulateMin) populate.emplace(mem->data, mem->size);
    Status read = ReadTensors(out.manifest, wanted, dst);
    populate.reset();
    STOKER_RETURN_IF_ERROR(read);
    for (size_t i = 0; i < wanted.size(); ++i) out.tensors.push_back({*wanted[i], dst[i]});
    out.memory =
        std::shared_ptr<void>(mem.release(), [](void* p) { delete static_cast<MappedMemory*>(p); });
    return out;
  }

  Result<CheckpointManifest> RestoreInto(std::string_view name,
                                         std::span<const TensorDestination> dst,
                                         const RestoreOptions& options) override {
    STOKER_ASSIGN_OR_RETURN(std::string n, Resolve(name));
    STOKER_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifestOf(n));
    std::vector<std::string> names;
    for (const TensorDestination& d : dst) names.push_back(d.name);
    STOKER_ASSIGN_OR_RETURN(std::vector<const TensorInfo*> wanted, Select(m, options, names));
    std::vector<std::span<std::byte>> spans;
    for (size_t i = 0; i < wanted.size(); ++i) {
      if (dst[i].data.size() != wanted[i]->bytes) {
        return InvalidArgument("restore of checkpoint " + n + " at " + uri() + ": tensor '" +
                               wanted[i]->name + "' is " + std::to_string(wanted[i]->bytes) +
                               " bytes, its destination " + std::to_string(dst[i].data.size()));
      }
      spans.push_back(dst[i].data);
    }
    STOKER_RETURN_IF_ERROR(ReadTensors(m, wanted, spans));
    return m;
  }

  Status Verify(std::string_view name, CheckpointVerifyReport* report) override {
    CheckpointVerifyReport local;
    CheckpointVerifyReport& r = report ? *report : local;
    STOKER_ASSIGN_OR_RETURN(std::string n, Resolve(name));
    STOKER_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifestOf(n));
    struct Item {
      const RankPart* part;
      const ChunkInfo* chunk;
    };
    std::vector<Item> items;
    for (const RankPart& p : m.ranks) {
      for (const ChunkInfo& c : p.chunks) items.push_back({&p, &c});
      r.tensors += p.tensors.size();
    }
    std::mutex mu;
    (void)ParallelFor(items.size(), opt_.io_threads, [&](size_t i, size_t) {
      const Item& it = items[i];
      std::string problem;
      auto info = store_->Stat(it.chunk->key);
      if (!info.ok()) {
        problem = info.status().message();
      } else if (info->size != it.chunk->bytes) {
        problem = KeyUri(it.chunk->key) + ": " + std::to_string(info->size) +
                  " bytes, the manifest says " + std::to_string(it.chunk->bytes);
      } else {
        std::vector<std::byte> buf(it.chunk->bytes);
        auto got = store_->Read(it.chunk->key, 0, buf);
        if (!got.ok()) {
          problem = got.status().message();
        } else if (*got != buf.size() || format::Hash64(buf) != it.chunk->hash) {
          problem = KeyUri(it.chunk->key) + ": checksum mismatch";
        }
      }
      std::lock_guard<std::mutex> l(mu);
      ++r.chunks;
      r.bytes += it.chunk->bytes;
      if (!problem.empty()) {
        r.problems.push_back(problem + " (rank " + std::to_string(it.part->rank) + ", tensors " +
                             Join(TensorsIn(*it.part, it.chunk->offset, it.chunk->bytes)) + ")");
      }
      return Status::Ok();
    });
    std::sort(r.problems.begin(), r.problems.end());
    if (!r.problems.empty()) {
      return Corruption("checkpoint " + n + " at " + uri() + ": " +
                        std::to_string(r.problems.size()) +
                        " bad chunk(s); first: " + r.problems.front());
    }
    return Status::Ok();
  }

  Status Remove(std::string_view name) override {
    STOKER_RETURN_IF_ERROR(ValidateCheckpointName(name));
    const std::string n(name);
    STOKER_ASSIGN_OR_RETURN(std::vector<ObjectInfo> objects, store_->List(n + "/"));
    if (objects.empty()) return NotFound("no checkpoint " + n + " at " + uri());
    // The manifest first: from here on it is no checkpoint, whatever remains.
    Status s = store_->Remove(ManifestKey(n));
    if (!s.ok() && s.code() != Code::kNotFound) return s;
    auto latest = ReadLatest();
    if (latest.ok() && *latest == n) STOKER_RETURN_IF_ERROR(RepointLatest());
    // The rest, with what a killed save left that no listing shows (a POSIX
    // store's temporary files of chunks cut short).
    return store_->RemoveFolder(n + "/");
  }

 private:
  std::string KeyUri(std::string_view key) const { return uri() + "/" + std::string(key); }
  std::string Where(std::string_view name) const {
    return "checkpoint " + std::string(name) + " at " + uri();
  }

  void JoinBackground() {
    if (bg_.joinable()) bg_.join();
    if (background_) {
      std::lock_guard<std::mutex> l(background_->mu);
      if (!background_->status.ok() && !background_->observed) {
        std::fprintf(stderr,
                     "stoker: the background save of checkpoint %s failed and nobody asked its "
                     "handle: %s\n",
                     background_->name.c_str(), background_->status.ToString().c_str());
      }
    }
    background_.reset();
  }

  // Arguments, before anything is written or copied.
  Status CheckSave(std::string_view name, std::span<const TensorRef> tensors,
                   const SaveOptions& o) const {
    STOKER_RETURN_IF_ERROR(ValidateCheckpointName(name));
    const std::string where = "save of checkpoint " + std::string(name) + " to " + uri();
    if (o.world_size == 0 || o.world_size > 65536) {
      return InvalidArgument(where + ": world_size " + std::to_string(o.world_size) +
                             " (1..65536)");
    }
    if (o.rank >= o.world_size) {
      return InvalidArgument(where + ": rank " + std::to_string(o.rank) +
                             " is not below world_size " + std::to_string(o.world_size));
    }
    if (o.chunk_bytes < 4096 || o.chunk_bytes > ckpt::kMaxChunkBytes) {
      return InvalidArgument(where + ": chunk_bytes " + std::to_string(o.chunk_bytes) +
                             " (4 KiB .. 1 GiB)");
    }
    auto meta = nlohmann::json::parse(o.metadata_json, nullptr, /*allow_exceptions=*/false);
    if (!meta.is_object()) {
      return InvalidArgument(where + ": metadata is not a JSON object");
    }
    std::unordered_set<std::string_view> names;
    for (const TensorRef& t : tensors) {
      if (std::string why = ckpt::TensorNameProblem(t.name); !why.empty()) {
        return InvalidArgument(where + ": " + why);
      }
      if (!names.insert(t.name).second) {
        return InvalidArgument(where + ": tensor name '" + t.name + "' given twice");
      }
      const size_t size = DTypeSize(t.dtype);
      if (size == 0) return InvalidArgument(where + ": tensor '" + t.name + "': unknown dtype");
      unsigned __int128 count = 1;
      for (int64_t d : t.shape) {
        if (d < 0) {
          return InvalidArgument(where + ": tensor '" + t.name + "': negative dimension");
        }
        count *= static_cast<uint64_t>(d);
        if (count > (static_cast<unsigned __int128>(1) << 58)) {
          return InvalidArgument(where + ": tensor '" + t.name + "': too many elements");
        }
      }
      if (count * size != t.data.size()) {
        return InvalidArgument(where + ": tensor '" + t.name + "' has " +
                               std::to_string(t.data.size()) + " bytes; its shape and dtype (" +
                               std::string(DTypeName(t.dtype)) + ") make " +
                               std::to_string(static_cast<uint64_t>(count * size)));
      }
    }
    return Status::Ok();
  }

  // §1.1 step 1: refuse a committed name; drop this rank's stale part.
  Status Prepare(std::string_view name, const SaveOptions& o) {
    auto st = store_->Stat(ManifestKey(name));
    if (st.ok()) {
      return AlreadyExists(Where(name) +
                           " is already committed; remove it or save under another name");
    }
    if (st.status().code() != Code::kNotFound) return st.status();
    Status s = store_->Remove(PartKey(name, o.rank));
    if (!s.ok() && s.code() != Code::kNotFound) return s;
    return Status::Ok();
  }

  static RankPart Describe(std::span<const TensorRef> tensors) {
    RankPart r;
    uint64_t at = 0;
    for (const TensorRef& t : tensors) {
      TensorInfo ti;
      ti.name = t.name;
      ti.dtype = t.dtype;
      ti.shape = t.shape;
      ti.offset = at;
      ti.bytes = t.data.size();
      at += ti.bytes;
      r.tensors.push_back(std::move(ti));
    }
    return r;
  }

  // Put with retries of retryable errors (doubling backoff). With `hash`,
  // sets it to Hash64 of the bytes written, taken as the store writes them
  // (PutObserved: one pass over the data instead of two), and leaves the
  // object's durability to the store's next SyncDeferred() (a chunk: the
  // part record that names it is written only after that).
  Status PutWithRetries(const std::string& key, std::span<const std::byte> data,
                        uint64_t* hash = nullptr) {
    auto backoff = opt_.retry_backoff;
    for (uint32_t attempt = 0;; ++attempt) {
      Status s;
      if (hash != nullptr) {
        format::Hash64Stream stream;
        s = store_->PutObservedDeferred(
            key, data, [&stream](std::span<const std::byte> p) { stream.Update(p); });
        if (s.ok()) *hash = stream.Digest();
      } else {
        s = store_->Put(key, data);
      }
      if (s.ok() || !s.retryable() || attempt >= opt_.write_retries) {
        if (!s.ok() && s.retryable()) {
          return Status(s.code(),
                        s.message() + " (after " + std::to_string(attempt + 1) + " attempts)",
                        true);
        }
        return s;
      }
      std::this_thread::sleep_for(backoff);
      backoff *= 2;
    }
  }

  Status WriteAndCommit(const std::string& name, RankPart part, std::vector<ChunkPlan> plan,
                        const SaveOptions& o, bool mpi) {
    // Over MPI a failure is sent to rank 0 too, so that nobody waits for it.
    auto fail = [&](Status st) {
      return mpi ? CoordinateOverMpi(name, std::move(st), {}, "", o) : st;
    };
    part.rank = o.rank;
    part.chunks.resize(plan.size());
    // Chunks, in parallel; a shared chunk is gathered into a per-thread
    // buffer, a chunk of one tensor is written from the tensor's memory.
    std::vector<Scratch> scratch(Workers(plan.size(), opt_.io_threads));
    Status s = ParallelFor(plan.size(), opt_.io_threads, [&](size_t i, size_t w) -> Status {
      const ChunkPlan& c = plan[i];
      std::span<const std::byte> data;
      if (c.segments.size() == 1) {
        data = {c.segments[0].src, c.segments[0].bytes};
      } else {
        std::byte* gather = scratch[w].Get(c.bytes);
        size_t at = 0;
        for (const Segment& seg : c.segments) {
          std::memcpy(gather + at, seg.src, seg.bytes);
          at += seg.bytes;
        }
        data = {gather, c.bytes};
      }
      ChunkInfo& ci = part.chunks[i];
      ci.key = ChunkKey(name, o.rank, i);
      ci.bytes = c.bytes;
      ci.offset = c.offset;
      return PutWithRetries(ci.key, data, &ci.hash);
    });
    // Every chunk durable at once (one flush, not one per chunk), before
    // the record that names them. Not retried: a failed sync does not say
    // which chunks it lost, and a second one would not report it again.
    if (s.ok()) s = store_->SyncDeferred();
    if (!s.ok()) return fail(s.WithContext("save of " + Where(name)));

    PartRecord rec{name, o.world_size, o.attempt, std::move(part)};
    const std::string encoded = ckpt::EncodePart(rec);
    s = PutWithRetries(PartKey(name, o.rank), std::as_bytes(std::span(encoded)));
    if (!s.ok()) return fail(s.WithContext("save of " + Where(name) + ": part record"));

    if (mpi) return CoordinateOverMpi(name, Status::Ok(), std::move(rec), encoded, o);
    if (o.rank == 0) {
      STOKER_ASSIGN_OR_RETURN(std::vector<RankPart> parts, PartsFromStore(name, std::move(rec), o));
      return Commit(name, std::move(parts), o);
    }
    if (o.wait_for_commit) return WaitForCommit(name, o);
    return Status::Ok();
  }

  // Whether this save coordinates over MPI (SaveOptions::coordination).
  Result<bool> ChooseMpi(std::string_view name, const SaveOptions& o, bool background) const {
    if (o.coordination == SaveOptions::Coordination::kStore || o.world_size == 1) return false;
    std::string why;
    if (ckpt::MpiUsable(o.rank, o.world_size, background, &why)) return true;
    if (o.coordination == SaveOptions::Coordination::kAuto) return false;
    return InvalidArgument("save of " + Where(name) + ": coordination over MPI asked for, but " +
                           why);
  }

  // §1.1 steps 2-6 over MPI: every rank sends rank 0 its outcome and part
  // record (a failure included, so rank 0 learns of it at once); rank 0
  // commits and sends every rank the outcome.
  Status CoordinateOverMpi(const std::string& name, Status mine, PartRecord rec,
                           const std::string& encoded, const SaveOptions& o) {
    const ckpt::MpiSaveId id{name, o.attempt};
    const Deadline deadline = Clock::now() + o.commit_timeout;
    if (o.rank != 0) {
      Status sent = ckpt::MpiSendPart(id, mine, encoded);
      if (!mine.ok()) return mine;
      if (!sent.ok()) return sent.WithContext("save of " + Where(name));
      if (!o.wait_for_commit) return Status::Ok();
      Status outcome = ckpt::MpiReceiveOutcome(id, deadline);
      if (outcome.ok()) return outcome;
      return outcome.WithContext("save of " + Where(name) + ": not committed by rank 0");
    }
    std::vector<std::string> raw;
    Status gathered = ckpt::MpiGatherParts(id, o.world_size, deadline, &raw);
    Status outcome = !mine.ok()      ? mine
                     : gathered.ok() ? Status::Ok()
                                     : gathered.WithContext("commit of " + Where(name));
    std::vector<RankPart> parts;
    if (outcome.ok()) {
      parts.push_back(std::move(rec.part));
      for (uint32_t r = 1; r < o.world_size && outcome.ok(); ++r) {
        auto part =
            ckpt::DecodePart(std::as_bytes(std::span(raw[r])),
                             "the part record rank " + std::to_string(r) + " sent over MPI", name);
        if (!part.ok()) {
          outcome = part.status();
        } else if (part->part.rank != r || part->world_size != o.world_size) {
          outcome = Corruption("commit of " + Where(name) + ": rank " + std::to_string(r) +
                               " sent the part of rank " + std::to_string(part->part.rank) +
                               " of " + std::to_string(part->world_size));
        } else {
          parts.push_back(std::move(part->part));
        }
      }
    }
    if (outcome.ok()) outcome = Commit(name, std::move(parts), o);
    Status sent = ckpt::MpiSendOutcome(id, o.world_size, outcome);
    if (outcome.ok() && !sent.ok()) return sent.WithContext(Where(name) + " is committed, but");
    return outcome;
  }

  // §1.1 step 2 through the store, on rank 0: every rank's part record.
  Result<std::vector<RankPart>> PartsFromStore(const std::string& name, PartRecord mine,
                                               const SaveOptions& o) {
    std::vector<std::optional<RankPart>> parts(o.world_size);
    parts[0] = std::move(mine.part);
    size_t have = 1;
    std::map<uint32_t, std::string> stale;
    const Deadline deadline = Clock::now() + o.commit_timeout;
    while (have < o.world_size) {
      for (uint32_t r = 1; r < o.world_size; ++r) {
        if (parts[r]) continue;
        auto raw = store_->ReadAll(PartKey(name, r));
        if (!raw.ok()) {
          if (raw.status().code() != Code::kNotFound) return raw.status();
          continue;
        }
        auto rec = ckpt::DecodePart(*raw, KeyUri(PartKey(name, r)), name);
        if (!rec.ok()) {
          // A part being replaced cannot be half-written (Put is atomic), so
          // a bad one is damage, not a race.
          return rec.status();
        }
        if (rec->world_size != o.world_size || rec->attempt != o.attempt || rec->part.rank != r) {
          stale[r] = "its part says world_size " + std::to_string(rec->world_size) + ", attempt '" +
                     rec->attempt + "'";
          continue;
        }
        stale.erase(r);
        parts[r] = std::move(rec->part);
        ++have;
      }
      if (have == o.world_size) break;
      if (Clock::now() >= deadline) {
        std::vector<std::string> missing;
        for (uint32_t r = 0; r < o.world_size; ++r) {
          if (parts[r]) continue;
          missing.push_back(std::to_string(r) +
                            (stale.count(r) ? " (" + stale[r] + ")" : std::string()));
        }
        return TimedOut("commit of " + Where(name) + ": rank(s) " + Join(missing, 16) +
                        " did not write their part within " +
                        std::to_string(o.commit_timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(opt_.poll_interval);
    }
    std::vector<RankPart> out;
    for (auto& p : parts) out.push_back(std::move(*p));
    return out;
  }

  // §1.1 steps 3-5, on rank 0, once every part is durable.
  Status Commit(const std::string& name, std::vector<RankPart> parts, const SaveOptions& o) {
    CheckpointManifest m;
    m.format_version = ckpt::kCheckpointFormatVersion;
    m.name = name;
    m.created_by = "stoker 0.1.0";
    m.created_unix_ms = UnixMillis();
    m.world_size = o.world_size;
    m.attempt = o.attempt;
    m.metadata_json = o.metadata_json;
    m.ranks = std::move(parts);
    STOKER_ASSIGN_OR_RETURN(std::vector<CheckpointListing> committed, Committed());
    for (const CheckpointListing& l : committed) m.sequence = std::max(m.sequence, l.sequence);
    ++m.sequence;
    const std::string encoded = ckpt::EncodeCheckpointManifest(m);
    Status s = PutWithRetries(ManifestKey(name), std::as_bytes(std::span(encoded)));
    if (!s.ok()) return s.WithContext("commit of " + Where(name));
    const std::string pointer = name + "\n";
    s = PutWithRetries(std::string(ckpt::kLatestKey), std::as_bytes(std::span(pointer)));
    if (!s.ok()) {
      return s.WithContext(Where(name) + " is committed, but moving 'latest' to it failed");
    }
    if (o.keep_last > 0) {
      CheckpointListing now;
      now.name = name;
      now.committed = true;
      now.sequence = m.sequence;
      committed.push_back(std::move(now));
      for (size_t i = 0; i + o.keep_last < committed.size(); ++i) {
        if (committed[i].name == name || !committed[i].problem.empty()) continue;
        s = Remove(committed[i].name);
        if (!s.ok() && s.code() != Code::kNotFound) {
          return s.WithContext(Where(name) + " is committed, but removing " + committed[i].name +
                               " (keep_last " + std::to_string(o.keep_last) + ") failed");
        }
      }
    }
    return Status::Ok();
  }

  Status WaitForCommit(const std::string& name, const SaveOptions& o) {
    const Deadline deadline = Clock::now() + o.commit_timeout;
    for (;;) {
      auto st = store_->Stat(ManifestKey(name));
      if (st.ok()) return Status::Ok();
      if (st.status().code() != Code::kNotFound) return st.status();
      if (Clock::now() >= deadline) {
        return TimedOut("save of " + Where(name) + ": rank " + std::to_string(o.rank) +
                        "'s part is durable, but rank 0 did not commit within " +
                        std::to_string(o.commit_timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(opt_.poll_interval);
    }
  }

  // Committed checkpoints, by sequence.
  Result<std::vector<CheckpointListing>> Committed() {
    STOKER_ASSIGN_OR_RETURN(std::vector<CheckpointListing> all, List());
    std::erase_if(all, [](const CheckpointListing& l) { return !l.committed; });
    return all;
  }

  Status RepointLatest() {
    STOKER_ASSIGN_OR_RETURN(std::vector<CheckpointListing> committed, Committed());
    if (committed.empty()) {
      Status s = store_->Remove(std::string(ckpt::kLatestKey));
      return s.code() == Code::kNotFound ? Status::Ok() : s;
    }
    const std::string pointer = committed.back().name + "\n";
    return PutWithRetries(std::string(ckpt::kLatestKey), std::as_bytes(std::span(pointer)));
  }

  Result<std::string> ReadLatest() {
    auto raw = store_->ReadAll(ckpt::kLatestKey);
    if (!raw.ok()) {
      if (raw.status().code() == Code::kNotFound) {
        return NotFound("no checkpoint at " + uri() + " (no 'latest' pointer)");
      }
      return raw.status();
    }
    std::string s(reinterpret_cast<const char*>(raw->data()), raw->size());
    if (s.empty() || s.back() != '\n' || !ValidateCheckpointName(s.substr(0, s.size() - 1)).ok()) {
      return Corruption(KeyUri(ckpt::kLatestKey) + ": not a checkpoint name and a newline");
    }
    s.pop_back();
    return s;
  }

  Result<std::string> Resolve(std::string_view name) {
    if (name.empty() || name == ckpt::kLatestKey) {
      STOKER_ASSIGN_OR_RETURN(std::string n, ReadLatest());
      if (auto st = store_->Stat(ManifestKey(n)); !st.ok()) {
        if (st.status().code() == Code::kNotFound) {
          return NotFound(KeyUri(ckpt::kLatestKey) + " names " + n + ", which has no manifest (" +
                          KeyUri(ManifestKey(n)) + " is missing)");
        }
        return st.status();
      }
      return n;
    }
    STOKER_RETURN_IF_ERROR(ValidateCheckpointName(name));
    return std::string(name);
  }

  Result<CheckpointManifest> ReadManifestOf(const std::string& name) {
    auto raw = store_->ReadAll(ManifestKey(name));
    if (!raw.ok()) {
      if (raw.status().code() == Code::kNotFound) {
        auto any = store_->List(name + "/");
        const bool partial = any.ok() && !any->empty();
        return NotFound("no checkpoint " + name + " at " + uri() +
                        (partial ? " (it has objects but no manifest: a save that is running or "
                                   "was interrupted)"
                                 : ""));
      }
      return raw.status();
    }
    return ckpt::DecodeCheckpointManifest(*raw, KeyUri(ManifestKey(name)), name);
  }

  // The tensors a restore reads, in manifest order (or in `names` order).
  Result<std::vector<const TensorInfo*>> Select(const CheckpointManifest& m,
                                                const RestoreOptions& o,
                                                const std::vector<std::string>& names) {
    const std::string where = "restore of checkpoint " + m.name + " at " + uri();
    if (!o.all_ranks && o.world_size != 0 && o.world_size != m.world_size) {
      return InvalidArgument(where + ": it was written by " + std::to_string(m.world_size) +
                             " rank(s), this job has " + std::to_string(o.world_size) +
                             " (restore all ranks' tensors to re-shard them)");
    }
    if (!o.all_ranks && o.rank >= m.world_size) {
      return InvalidArgument(where + ": rank " + std::to_string(o.rank) + " is not below its " +
                             std::to_string(m.world_size) + " rank(s)");
    }
    std::vector<const TensorInfo*> pool;
    for (const RankPart& p : m.ranks) {
      if (!o.all_ranks && p.rank != o.rank) continue;
      for (const TensorInfo& t : p.tensors) pool.push_back(&t);
    }
    std::vector<std::string> want = names.empty() ? o.only : names;
    if (want.empty()) return pool;
    std::unordered_map<std::string_view, const TensorInfo*> by_name;
    for (const TensorInfo* t : pool) by_name.emplace(t->name, t);
    std::vector<const TensorInfo*> out;
    for (const std::string& n : want) {
      auto it = by_name.find(n);
      if (it == by_name.end()) {
        return NotFound(where + ": no tensor '" + n + "'" +
                        (o.all_ranks ? "" : " in rank " + std::to_string(o.rank)));
      }
      out.push_back(it->second);
    }
    return out;
  }

  // One read of a chunk: `dst.size()` bytes from `offset` in the chunk's
  // object into `dst`. A chunk's pieces cover it in order, without gaps.
  struct Piece {
    uint64_t offset = 0;
    std::span<std::byte> dst;
  };

  // Reads `pieces` of object `key`, all in flight at once on the worker's
  // queue (made on first use): a cold file is read with the device's queue
  // depth instead of one readahead window at a time. Each piece is hashed
  // into `hash` as soon as it and the pieces before it have landed, while
  // the later ones are still in flight and it is still in cache. Returns the
  // bytes read in order up to the first short piece (the object's end);
  // `hash` covers exactly those bytes.
  Result<size_t> ReadPieces(std::unique_ptr<ReadQueue>& queue, bool direct, const std::string& key,
                            const std::vector<Piece>& pieces, format::Hash64Stream& hash) {
    if (!queue) {
      ReadQueueOptions qo;
      qo.depth = 16;
      qo.direct_io = direct;
      STOKER_ASSIGN_OR_RETURN(queue, store_->NewReadQueue(qo));
    }
    std::vector<ReadRequest> requests;
    requests.reserve(pieces.size());
    for (const Piece& p : pieces) requests.push_back({key, p.offset, p.dst, requests.size()});
    STOKER_RETURN_IF_ERROR(queue->Submit(requests));
    std::vector<ReadCompletion> done;
    done.reserve(requests.size());
    // landed[i]: piece i's bytes, or -1 while it is in flight.
    std::vector<int64_t> landed(requests.size(), -1);
    size_t hashed = 0;        // pieces hashed, in order
    bool short_read = false;  // a piece ended early: the object ends there
    size_t total = 0;
    Status first;
    while (done.size() < requests.size()) {
      // The store's own operation timeout bounds each read (RADOS: 30 s);
      // this deadline only keeps a stuck backend from hanging forever.
      const size_t before = done.size();
      STOKER_ASSIGN_OR_RETURN(size_t got,
                              queue->Wait(1, Clock::now() + std::chrono::minutes(10), &done));
      (void)got;
      for (size_t k = before; k < done.size(); ++k) {
        const ReadCompletion& c = done[k];
        if (!c.status.ok() && first.ok()) first = c.status;
        landed[c.tag] = c.status.ok() ? int64_t(c.bytes) : 0;
      }
      while (first.ok() && !short_read && hashed < requests.size() && landed[hashed] >= 0) {
        const size_t n = size_t(landed[hashed]);
        hash.Update(requests[hashed].dst.first(n));
        total += n;
        short_read = n < requests[hashed].dst.size();
        ++hashed;
      }
    }
    if (!first.ok()) return first;
    return total;
  }

  // Reads the chunks under `wanted` into `dst` (one span per tensor), every
  // chunk checked before its bytes count. A chunk is read in pieces straight
  // into the tensors it holds, so a restore touches no memory but theirs;
  // runs of small tensors (and bytes of tensors not wanted) are read as one
  // piece into a buffer and copied out once the chunk is verified, so a
  // chunk of many small tensors is still a few large reads.
  Status ReadTensors(const CheckpointManifest& m, const std::vector<const TensorInfo*>& wanted,
                     const std::vector<std::span<std::byte>>& dst) {
    struct Job {
      const RankPart* part;
      const ChunkInfo* chunk;
    };
    std::set<std::pair<uint32_t, size_t>> keys;  // (rank, chunk) in order
    std::unordered_map<const TensorInfo*, size_t> wanted_index;
    for (size_t i = 0; i < wanted.size(); ++i) {
      const TensorInfo& t = *wanted[i];
      wanted_index.emplace(&t, i);
      if (t.bytes == 0) continue;
      const RankPart& p = m.ranks[t.rank];
      auto first = std::upper_bound(p.chunks.begin(), p.chunks.end(), t.offset,
                                    [](uint64_t o, const ChunkInfo& c) { return o < c.offset; });
      for (auto c = std::prev(first); c != p.chunks.end() && c->offset < t.offset + t.bytes; ++c) {
        keys.emplace(t.rank, static_cast<size_t>(c - p.chunks.begin()));
      }
    }
    std::vector<Job> jobs;
    for (const auto& [rank, c] : keys) jobs.push_back({&m.ranks[rank], &m.ranks[rank].chunks[c]});
    std::vector<Scratch> scratch(Workers(jobs.size(), opt_.io_threads));
    // Per worker: a queue of buffered reads, and one of direct reads
    // (CheckpointerOptions::direct_reads) for chunks whose pieces all start
    // 4 KiB-aligned, in the file and in memory.
    std::vector<std::unique_ptr<ReadQueue>> queues(scratch.size());
    std::vector<std::unique_ptr<ReadQueue>> direct_queues(scratch.size());
    std::atomic<bool> direct_ok{opt_.direct_reads};
    return ParallelFor(jobs.size(), opt_.io_threads, [&](size_t n, size_t w) -> Status {
      const Job& j = jobs[n];
      const ChunkInfo& chunk = *j.chunk;
      // The chunk as segments, one per tensor part it holds, in order; each
      // goes straight to its tensor or through the buffer.
      struct Part {
        uint64_t at;  // in the chunk
        uint64_t bytes;
        std::byte* target;  // where its bytes belong; null: not wanted
        bool direct;
      };
      std::vector<Part> segments;
      uint64_t buffered = 0;
      const auto& ts = j.part->tensors;
      auto t = std::upper_bound(ts.begin(), ts.end(), chunk.offset,
                                [](uint64_t o, const TensorInfo& x) { return o < x.offset; });
      if (t != ts.begin()) --t;
      for (; t != ts.end() && t->offset < chunk.offset + chunk.bytes; ++t) {
        const uint64_t lo = std::max(t->offset, chunk.offset);
        const uint64_t hi = std::min(t->offset + t->bytes, chunk.offset + chunk.bytes);
        if (hi <= lo) continue;
        auto it = wanted_index.find(&*t);
        std::byte* target =
            it == wanted_index.end() ? nullptr : dst[it->second].data() + (lo - t->offset);
        const bool direct = target != nullptr && hi - lo >= kDirectMin;
        segments.push_back({lo - chunk.offset, hi - lo, target, direct});
        if (!direct) buffered += hi - lo;
      }
      // Pieces: direct segments cut at kReadPiece; runs of buffered segments
      // laid out one after the other in the buffer and read together.
      std::byte* buffer = buffered > 0 ? scratch[w].Get(buffered) : nullptr;
      std::vector<Piece> pieces;
      struct CopyOut {
        const std::byte* from;
        std::byte* to;
        uint64_t bytes;
      };
      std::vector<CopyOut> copies;
      uint64_t covered = 0;  // the chunk's bytes given to pieces so far
      uint64_t used = 0;     // the buffer's bytes given out so far
      auto add = [&](std::byte* into, uint64_t bytes) {
        for (uint64_t o = 0; o < bytes; o += kReadPiece) {
          const uint64_t len = std::min<uint64_t>(kReadPiece, bytes - o);
          pieces.push_back({covered + o, {into + o, static_cast<size_t>(len)}});
        }
        covered += bytes;
      };
      for (size_t i = 0; i < segments.size();) {
        if (segments[i].direct) {
          add(segments[i].target, segments[i].bytes);
          ++i;
          continue;
        }
        uint64_t run = 0;
        std::byte* start = buffer + used;
        for (; i < segments.size() && !segments[i].direct; ++i) {
          if (segments[i].target != nullptr) {
            copies.push_back({start + run, segments[i].target, segments[i].bytes});
          }
          run += segments[i].bytes;
        }
        add(start, run);
        used += run;
      }
      auto tensors = [&] {
        return " (rank " + std::to_string(j.part->rank) + ", tensors " +
               Join(TensorsIn(*j.part, chunk.offset, chunk.bytes)) + ")";
      };
      if (covered != chunk.bytes) {
        return Corruption(KeyUri(chunk.key) + ": its tensors cover " + std::to_string(covered) +
                          " of its " + std::to_string(chunk.bytes) + " bytes" + tensors());
      }
      const bool direct =
          direct_ok.load(std::memory_order_relaxed) &&
          std::all_of(pieces.begin(), pieces.end(), [](const Piece& p) {
            return p.offset % kDirectIoAlignment == 0 &&
                   reinterpret_cast<uintptr_t>(p.dst.data()) % kDirectIoAlignment == 0;
          });
      uint64_t digest = 0;
      auto read = [&](bool d) -> Result<size_t> {
        format::Hash64Stream hash;
        auto r = ReadPieces(d ? direct_queues[w] : queues[w], d, chunk.key, pieces, hash);
        if (r.ok()) digest = hash.Digest();
        return r;
      };
      auto got = read(direct);
      if (direct && !got.ok() && got.status().code() == Code::kUnsupported) {
        // A filesystem without O_DIRECT: buffered reads from now on.
        direct_ok.store(false, std::memory_order_relaxed);
        got = read(false);
      }
      if (!got.ok()) {
        const Status& s = got.status();
        if (s.code() == Code::kNotFound) {
          return NotFound(KeyUri(chunk.key) + ": chunk missing" + tensors());
        }
        return Status(s.code(), s.message() + tensors(), s.retryable());
      }
      if (*got != chunk.bytes) {
        return Corruption(KeyUri(chunk.key) + ": truncated: " + std::to_string(*got) +
                          " bytes, the manifest says " + std::to_string(chunk.bytes) + tensors());
      }
      if (digest != chunk.hash) {
        return Corruption(KeyUri(chunk.key) + ": checksum mismatch" + tensors());
      }
      for (const CopyOut& c : copies) std::memcpy(c.to, c.from, c.bytes);
      return Status::Ok();
    });
  }

  std::shared_ptr<Store> store_;
  CheckpointerOptions opt_;
  std::mutex save_mu_;  // one save at a time; guards the members below
  std::unique_ptr<MappedMemory> staging_;
  std::thread bg_;
  std::shared_ptr<SaveHandle::State> background_;
};

}  // namespace

std::unique_ptr<Checkpointer> NewCheckpointer(std::shared_ptr<Store> store,
                                              const CheckpointerOptions& options) {
  return std::make_unique<CheckpointerImpl>(std::move(store), options);
}

Result<std::unique_ptr<Checkpointer>> OpenCheckpointer(std::string_view uri,
                                                       const CheckpointerOptions& options) {
  STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(uri, options.store));
  return NewCheckpointer(std::move(store), options);
}

}  // namespace stoker
