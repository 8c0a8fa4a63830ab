#include "ckpt/restore.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "ckpt/chunk_writer.h"
#include "ckpt/device_staging.h"
#include "ckpt/parallel.h"
#include "ckpt/reshard.h"
#include "core/aligned_memory.h"
#include "stoker/format.h"

namespace stoker::ckpt {

namespace {

// A chunk is read in pieces of this size, all in flight together (the size
// a loader's shard read has).
constexpr size_t kReadPiece = 4ull << 20;
// Tensor parts at least this large are read straight into their tensor;
// smaller ones go through a worker's buffer.
constexpr size_t kDirectMin = 256ull << 10;

// Restore faults its new memory in ahead of the reads in steps of this
// size, for blocks of at least kPopulateMin.
constexpr uint64_t kPopulateStep = 2ull << 20;
constexpr uint64_t kPopulateMin = 16ull << 20;
// Threads that fault the block in: one per CPU up to kPopulateThreadsMax. A
// fault's cost is mostly the kernel's (or, in a VM, the host's) and spreads
// over CPUs (docs/benchmarks.md, "Checkpoints").
constexpr size_t kPopulateThreadsMax = 4;
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels answer EINVAL
#endif

// Faults a new block in ahead of the reads that fill it, while they wait on
// the device: threads take kPopulateStep steps in address order, each the
// next one not taken (a thread that had every other step fell behind the
// other), with MADV_POPULATE_WRITE, which maps pages and never changes bytes
// already read. Stops on destruction; on a kernel without
// MADV_POPULATE_WRITE it does nothing and the reads fault.
class Populator {
 public:
  Populator(std::byte* base, size_t size) : base_(base), size_(size) {
    const size_t threads =
        std::clamp<size_t>(std::thread::hardware_concurrency(), 1, kPopulateThreadsMax);
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

// One read of a chunk: `dst.size()` bytes from `offset` in the chunk's
// object into `dst`. A chunk's pieces cover it in order, without gaps.
struct Piece {
  uint64_t offset = 0;
  std::span<std::byte> dst;
};

// Bytes read into the worker's buffer, copied to their tensor once the
// chunk is verified.
struct CopyOut {
  const std::byte* from;
  std::byte* to;
  uint64_t bytes;
};

struct ChunkRead {
  std::vector<Piece> pieces;
  std::vector<CopyOut> copies;
  uint64_t covered = 0;  // the chunk's bytes given to pieces
};

using WantedIndex = std::unordered_map<const TensorInfo*, size_t>;

// How one chunk is read: in pieces straight into the tensors it holds, so a
// restore touches no memory but theirs; runs of small tensors (and bytes of
// tensors not wanted) as one piece into `scratch`, copied out afterwards,
// so a chunk of many small tensors is still a few large reads.
Result<ChunkRead> PlanChunkRead(const RankPart& part, const ChunkInfo& chunk,
                                const WantedIndex& wanted,
                                const std::vector<std::span<std::byte>>& dst,
                                internal::ScratchBuffer& scratch) {
  struct Segment {
    uint64_t bytes;
    std::byte* target;  // where its bytes belong; null: not wanted
    bool direct;
  };
  std::vector<Segment> segments;
  uint64_t buffered = 0;
  const auto& ts = part.tensors;
  auto t = std::upper_bound(ts.begin(), ts.end(), chunk.offset,
                            [](uint64_t o, const TensorInfo& x) { return o < x.offset; });
  if (t != ts.begin()) --t;
  for (; t != ts.end() && t->offset < chunk.offset + chunk.bytes; ++t) {
    const uint64_t lo = std::max(t->offset, chunk.offset);
    const uint64_t hi = std::min(t->offset + t->bytes, chunk.offset + chunk.bytes);
    if (hi <= lo) continue;
    auto it = wanted.find(&*t);
    std::byte* target = it == wanted.end() ? nullptr : dst[it->second].data() + (lo - t->offset);
    const bool direct = target != nullptr && hi - lo >= kDirectMin;
    segments.push_back({hi - lo, target, direct});
    if (!direct) buffered += hi - lo;
  }
  std::byte* buffer = nullptr;
  if (buffered > 0) {
    auto got = scratch.Get(buffered, "checkpoint restore's buffer of small tensors");
    if (!got.ok()) {
      return got.status().WithContext("restoring " + chunk.key + ChunkContext(part, chunk));
    }
    buffer = *got;
  }
  ChunkRead r;
  uint64_t used = 0;  // the buffer's bytes given out so far
  auto add = [&](std::byte* into, uint64_t bytes) {
    for (uint64_t o = 0; o < bytes; o += kReadPiece) {
      const uint64_t len = std::min<uint64_t>(kReadPiece, bytes - o);
      r.pieces.push_back({r.covered + o, {into + o, static_cast<size_t>(len)}});
    }
    r.covered += bytes;
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
        r.copies.push_back({start + run, segments[i].target, segments[i].bytes});
      }
      run += segments[i].bytes;
    }
    add(start, run);
    used += run;
  }
  return r;
}

// Reads `pieces` of object `key`, all in flight at once on `queue` (made on
// first use): a cold file is read with the device's queue depth instead of
// one readahead window at a time. Each piece is hashed into `hash` as soon
// as it and the pieces before it have landed, while the later ones are
// still in flight and it is still in cache. Returns the bytes read in order
// up to the first short piece (the object's end); `hash` covers exactly
// those bytes.
using Observer = std::function<void(std::span<const std::byte>)>;

Result<size_t> ReadPieces(Store& store, std::unique_ptr<ReadQueue>& queue, bool direct,
                          const std::string& key, const std::vector<Piece>& pieces,
                          const Observer& hash) {
  if (!queue) {
    ReadQueueOptions qo;
    qo.depth = 16;
    qo.direct_io = direct;
    STOKER_ASSIGN_OR_RETURN(queue, store.NewReadQueue(qo));
  }
  std::vector<ReadRequest> requests;
  requests.reserve(pieces.size());
  for (const Piece& p : pieces) requests.push_back({key, p.offset, p.dst, requests.size()});
  STOKER_RETURN_IF_ERROR(queue->Submit(requests));
  std::vector<ReadCompletion> done;
  done.reserve(requests.size());
  std::vector<int64_t> landed(requests.size(), -1);  // bytes, or -1 while in flight
  size_t hashed = 0, total = 0;
  bool short_read = false;  // a piece ended early: the object ends there
  Status first;
  while (done.size() < requests.size()) {
    // The store's own operation timeout bounds each read (RADOS: 30 s);
    // this deadline only keeps a stuck backend from hanging forever.
    const size_t before = done.size();
    STOKER_RETURN_IF_ERROR(queue->Wait(1, Clock::now() + std::chrono::minutes(10), &done).status());
    for (size_t k = before; k < done.size(); ++k) {
      const ReadCompletion& c = done[k];
      if (!c.status.ok() && first.ok()) first = c.status;
      landed[c.tag] = c.status.ok() ? int64_t(c.bytes) : 0;
    }
    while (first.ok() && !short_read && hashed < requests.size() && landed[hashed] >= 0) {
      const size_t n = size_t(landed[hashed]);
      if (hash) hash(requests[hashed].dst.first(n));
      total += n;
      short_read = n < requests[hashed].dst.size();
      ++hashed;
    }
  }
  if (!first.ok()) return first;
  return total;
}

// A whole chunk's checksum, taken as it lands: one hash of it (format 1)
// or one per block (format 2).
class ChunkHasher {
 public:
  explicit ChunkHasher(const ChunkInfo& c) : chunk_(c) {
    if (!c.block_hashes.empty()) blocks_.emplace(c.block_bytes);
  }
  void Update(std::span<const std::byte> p) { blocks_ ? blocks_->Update(p) : whole_.Update(p); }
  bool Matches() {
    return blocks_ ? blocks_->Finish() == chunk_.block_hashes : whole_.Digest() == chunk_.hash;
  }

 private:
  const ChunkInfo& chunk_;
  format::Hash64Stream whole_;
  std::optional<BlockHasher> blocks_;
};

bool ChunkMatches(const ChunkInfo& c, std::span<const std::byte> data) {
  ChunkHasher h(c);
  h.Update(data);
  return h.Matches();
}

bool AllAligned(const std::vector<Piece>& pieces) {
  return std::all_of(pieces.begin(), pieces.end(), [](const Piece& p) {
    return p.offset % kDirectIoAlignment == 0 &&
           reinterpret_cast<uintptr_t>(p.dst.data()) % kDirectIoAlignment == 0;
  });
}

// A worker's read queues: buffered, and direct (O_DIRECT) for pieces that
// are 4 KiB-aligned in the object and in memory.
struct WorkerQueues {
  std::unique_ptr<ReadQueue> buffered, direct;
};

// Reads `pieces` of `chunk` (of `part`) on `q`, direct where `direct_ok`
// and the pieces allow; a filesystem without O_DIRECT turns `direct_ok` off
// and is read buffered from then on. `start` is called before each attempt
// (anew after a fallback) and gives what sees the bytes as they land.
// Errors name the chunk's URI and its tensors.
Result<size_t> ReadChunkPieces(Store& store, WorkerQueues& q, std::atomic<bool>& direct_ok,
                               const std::string& uri, const RankPart& part, const ChunkInfo& chunk,
                               const std::vector<Piece>& pieces,
                               const std::function<Observer()>& start) {
  const bool direct = direct_ok.load(std::memory_order_relaxed) && AllAligned(pieces);
  auto read = [&](bool d) {
    return ReadPieces(store, d ? q.direct : q.buffered, d, chunk.key, pieces, start());
  };
  auto got = read(direct);
  if (direct && !got.ok() && got.status().code() == Code::kUnsupported) {
    direct_ok.store(false, std::memory_order_relaxed);
    got = read(false);
  }
  if (!got.ok()) {
    const Status& s = got.status();
    if (s.code() == Code::kNotFound) {
      return NotFound(uri + ": chunk missing" + ChunkContext(part, chunk));
    }
    return Status(s.code(), s.message() + ChunkContext(part, chunk), s.retryable());
  }
  return got;
}

}  // namespace

Result<std::vector<const TensorInfo*>> Restorer::Select(
    const CheckpointManifest& m, const RestoreOptions& o,
    const std::vector<std::string>& names) const {
  const std::string where = "restore of checkpoint " + m.name + " at " + store_->uri();
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
  const std::vector<std::string>& want = names.empty() ? o.only : names;
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

Status Restorer::ReadTensors(const CheckpointManifest& m,
                             const std::vector<const TensorInfo*>& wanted,
                             const std::vector<std::span<std::byte>>& dst) {
  std::set<std::pair<uint32_t, size_t>> keys;  // (rank, chunk) in order
  WantedIndex wanted_index;
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
  std::vector<std::pair<uint32_t, size_t>> jobs(keys.begin(), keys.end());
  const size_t workers = Workers(jobs.size(), opt_.io_threads);
  std::vector<internal::ScratchBuffer> scratch(workers);
  // Per worker: a queue of buffered reads, and one of direct reads
  // (CheckpointerOptions::direct_reads) for chunks whose pieces all start
  // 4 KiB-aligned, in the file and in memory.
  std::vector<WorkerQueues> queues(workers);
  std::atomic<bool> direct_ok{opt_.direct_reads};
  return ParallelFor(jobs.size(), opt_.io_threads, [&](size_t n, size_t w) -> Status {
    const RankPart& part = m.ranks[jobs[n].first];
    const ChunkInfo& chunk = part.chunks[jobs[n].second];
    STOKER_ASSIGN_OR_RETURN(const ChunkRead plan,
                            PlanChunkRead(part, chunk, wanted_index, dst, scratch[w]));
    if (plan.covered != chunk.bytes) {
      return Corruption(KeyUri(chunk.key) + ": its tensors cover " + std::to_string(plan.covered) +
                        " of its " + std::to_string(chunk.bytes) + " bytes" +
                        ChunkContext(part, chunk));
    }
    std::optional<ChunkHasher> hash;
    auto got = ReadChunkPieces(*store_, queues[w], direct_ok, KeyUri(chunk.key), part, chunk,
                               plan.pieces, [&]() -> Observer {
                                 hash.emplace(chunk);
                                 return [&hash](std::span<const std::byte> p) { hash->Update(p); };
                               });
    if (!got.ok()) return got.status();
    if (*got != chunk.bytes) {
      return Corruption(KeyUri(chunk.key) + ": truncated: " + std::to_string(*got) +
                        " bytes, the manifest says " + std::to_string(chunk.bytes) +
                        ChunkContext(part, chunk));
    }
    if (!hash->Matches()) {
      return Corruption(KeyUri(chunk.key) + ": checksum mismatch" + ChunkContext(part, chunk));
    }
    for (const CopyOut& c : plan.copies) std::memcpy(c.to, c.from, c.bytes);
    return Status::Ok();
  });
}

Result<Restored> Restorer::Restore(CheckpointManifest m, const RestoreOptions& o) {
  Restored out;
  out.manifest = std::move(m);
  STOKER_ASSIGN_OR_RETURN(std::vector<const TensorInfo*> wanted, Select(out.manifest, o, {}));
  // One block; each tensor 64-byte aligned in it, and those large enough to
  // be read straight into (kDirectMin) 4 KiB-aligned, as direct reads need.
  std::vector<uint64_t> at(wanted.size());
  uint64_t total = 0;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const uint64_t align = wanted[i]->bytes >= kDirectMin ? kDirectIoAlignment : 64;
    total = (total + align - 1) / align * align;
    at[i] = total;
    total += wanted[i]->bytes;
  }
  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<internal::MappedMemory> mem,
                          internal::MappedMemory::Make(total, /*huge_pages=*/false));
  std::vector<std::span<std::byte>> dst(wanted.size());
  for (size_t i = 0; i < wanted.size(); ++i) {
    dst[i] = std::span<std::byte>(mem->data() + at[i], wanted[i]->bytes);
  }
  // New memory costs a page fault per 4 KiB on first touch, paid where the
  // bytes land; left to the reads it adds to their time (docs/
  // benchmarks.md). A Populator faults the block in ahead of the reads.
  std::optional<Populator> populate;
  if (total >= kPopulateMin) populate.emplace(mem->data(), mem->size());
  Status read = ReadTensors(out.manifest, wanted, dst);
  populate.reset();
  STOKER_RETURN_IF_ERROR(read);
  for (size_t i = 0; i < wanted.size(); ++i) out.tensors.push_back({*wanted[i], dst[i]});
  out.memory = std::shared_ptr<void>(
      mem.release(), [](void* p) { delete static_cast<internal::MappedMemory*>(p); });
  return out;
}

Status Restorer::RestoreInto(const CheckpointManifest& m, std::span<const TensorDestination> all,
                             const RestoreOptions& o) {
  std::vector<TensorDestination> dst, pieces, device;
  for (const TensorDestination& d : all) {
    if (d.layout.kind != TensorLayout::Kind::kWhole) {
      pieces.push_back(d);
    } else {
      (d.device >= 0 ? device : dst).push_back(d);
    }
  }
  if (!pieces.empty()) STOKER_RETURN_IF_ERROR(RestoreResharded(m, pieces));
  if (!device.empty()) {
    // Whole tensors into device memory: the bytes of each tensor, through
    // the pinned ring.
    std::vector<std::string> names;
    for (const TensorDestination& d : device) names.push_back(d.name);
    STOKER_ASSIGN_OR_RETURN(std::vector<const TensorInfo*> wanted, Select(m, o, names));
    std::vector<PieceCopy> copies;
    for (size_t i = 0; i < wanted.size(); ++i) {
      if (device[i].data.size() != wanted[i]->bytes) {
        return InvalidArgument("restore of checkpoint " + m.name + " at " + store_->uri() +
                               ": tensor '" + wanted[i]->name + "' is " +
                               std::to_string(wanted[i]->bytes) + " bytes, its destination " +
                               std::to_string(device[i].data.size()));
      }
      if (wanted[i]->bytes == 0) continue;
      copies.push_back({wanted[i]->rank, wanted[i]->offset, device[i].data.data(), wanted[i]->bytes,
                        device[i].device});
    }
    STOKER_RETURN_IF_ERROR(ReadCopies(m, std::move(copies)));
  }
  if (dst.empty()) return Status::Ok();
  std::vector<std::string> names;
  for (const TensorDestination& d : dst) names.push_back(d.name);
  STOKER_ASSIGN_OR_RETURN(std::vector<const TensorInfo*> wanted, Select(m, o, names));
  std::vector<std::span<std::byte>> spans;
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (dst[i].data.size() != wanted[i]->bytes) {
      return InvalidArgument("restore of checkpoint " + m.name + " at " + store_->uri() +
                             ": tensor '" + wanted[i]->name + "' is " +
                             std::to_string(wanted[i]->bytes) + " bytes, its destination " +
                             std::to_string(dst[i].data.size()));
    }
    spans.push_back(dst[i].data);
  }
  return ReadTensors(m, wanted, spans);
}

namespace {

// The most a span of blocks holds (rounded to whole blocks): the buffer it
// is read into, pinned where it goes to a device.
constexpr uint64_t kSpanBytes = 16ull << 20;

// A copy out of a span of blocks read into a buffer.
struct SpanCopy {
  uint64_t at;  // in the chunk
  std::byte* dst;
  uint64_t bytes;
  int device;  // of dst; -1: host
};

// One read of a resharded restore: blocks [first, last) of one chunk, and
// what is copied out of them.
struct BlockSpan {
  uint32_t rank = 0;
  size_t chunk = 0;
  uint64_t begin = 0, end = 0;  // bytes of the chunk (block-aligned, end clipped)
  std::vector<SpanCopy> copies;
};

// The reads that serve `copies`: each copy cut at chunk ends, then the
// checksum blocks it touches (the whole chunk for a format-1 chunk) merged
// into spans per chunk.
Result<std::vector<BlockSpan>> PlanSpans(const CheckpointManifest& m,
                                         std::vector<PieceCopy> copies) {
  std::sort(copies.begin(), copies.end(), [](const PieceCopy& a, const PieceCopy& b) {
    return std::tie(a.rank, a.stream_offset) < std::tie(b.rank, b.stream_offset);
  });
  std::vector<BlockSpan> spans;
  for (const PieceCopy& c : copies) {
    const RankPart& part = m.ranks[c.rank];
    uint64_t at = c.stream_offset, left = c.bytes;
    std::byte* dst = c.dst;
    while (left > 0) {
      auto ch = std::upper_bound(part.chunks.begin(), part.chunks.end(), at,
                                 [](uint64_t o, const ChunkInfo& x) { return o < x.offset; });
      if (ch == part.chunks.begin()) return Internal("reshard: a copy before the first chunk");
      --ch;
      const ChunkInfo& chunk = *ch;
      const uint64_t in = at - chunk.offset;
      if (in >= chunk.bytes) return Internal("reshard: a copy past the last chunk");
      const uint64_t n = std::min(left, chunk.bytes - in);
      const uint64_t block = chunk.block_hashes.empty() ? chunk.bytes : chunk.block_bytes;
      // A span stays inside one window of whole blocks of about
      // kSpanBytes, so that its buffer (pinned, for a device) is bounded.
      const uint64_t window = std::max<uint64_t>(block, kSpanBytes / block * block);
      const uint64_t cut = std::min(n, (in / window + 1) * window - in);
      const uint64_t begin = in / block * block;
      const uint64_t end = std::min(chunk.bytes, (in + cut + block - 1) / block * block);
      const size_t index = static_cast<size_t>(ch - part.chunks.begin());
      BlockSpan* last = spans.empty() ? nullptr : &spans.back();
      if (last != nullptr && last->rank == c.rank && last->chunk == index && begin <= last->end &&
          begin / window == last->begin / window) {
        last->end = std::max(last->end, end);
      } else {
        spans.push_back({c.rank, index, begin, end, {}});
        last = &spans.back();
      }
      last->copies.push_back({in, dst, cut, c.device});
      const uint64_t done = cut;
      at += done;
      dst += done;
      left -= done;
    }
  }
  return spans;
}

}  // namespace

Status Restorer::RestoreResharded(const CheckpointManifest& m,
                                  std::span<const TensorDestination> dst) {
  const std::string where = "restore of checkpoint " + m.name + " at " + store_->uri();
  STOKER_ASSIGN_OR_RETURN(std::vector<PieceCopy> copies, PlanReshard(m, dst, where));
  return ReadCopies(m, std::move(copies));
}

Status Restorer::ReadCopies(const CheckpointManifest& m, std::vector<PieceCopy> copies) {
  const bool device =
      std::any_of(copies.begin(), copies.end(), [](const PieceCopy& c) { return c.device >= 0; });
  if (device && copier_ == nullptr) {
    return Unsupported("restore of checkpoint " + m.name + ": no device copier for device memory");
  }
  STOKER_ASSIGN_OR_RETURN(std::vector<BlockSpan> spans, PlanSpans(m, std::move(copies)));
  const size_t workers = Workers(spans.size(), opt_.io_threads);
  std::vector<internal::ScratchBuffer> scratch(workers);
  std::vector<WorkerQueues> queues(workers);
  std::atomic<bool> direct_ok{opt_.direct_reads};
  return ParallelFor(spans.size(), opt_.io_threads, [&](size_t i, size_t w) -> Status {
    const BlockSpan& span = spans[i];
    const RankPart& part = m.ranks[span.rank];
    const ChunkInfo& chunk = part.chunks[span.chunk];
    const uint64_t n = span.end - span.begin;
    // Spans with device destinations are read into pinned memory (the
    // ring), so the copies in are DMA from it.
    const auto first_device = std::find_if(span.copies.begin(), span.copies.end(),
                                           [](const SpanCopy& c) { return c.device >= 0; });
    const bool to_device = first_device != span.copies.end();
    std::span<std::byte> pinned;
    if (to_device) {
      STOKER_ASSIGN_OR_RETURN(pinned, copier_->TakeBuffer(n, first_device->device));
    }
    struct GiveBack {
      DeviceCopier* c;
      std::span<std::byte> b;
      ~GiveBack() {
        if (!b.empty()) c->GiveBack(b);
      }
    } give_back{copier_.get(), pinned};
    std::byte* buf = pinned.data();
    if (!to_device) {
      auto got = scratch[w].Get(n, "checkpoint restore's read buffer");
      if (!got.ok()) {
        return got.status().WithContext("restoring " + KeyUri(chunk.key) +
                                        ChunkContext(part, chunk));
      }
      buf = *got;
    }
    std::vector<Piece> pieces;
    for (uint64_t o = 0; o < n; o += kReadPiece) {
      pieces.push_back(
          {span.begin + o, {buf + o, static_cast<size_t>(std::min(kReadPiece, n - o))}});
    }
    // A whole format-1 chunk is hashed as one stream as it lands; blocks
    // are hashed once the span is in.
    const bool whole = chunk.block_hashes.empty();
    std::optional<format::Hash64Stream> stream;
    auto got = ReadChunkPieces(
        *store_, queues[w], direct_ok, KeyUri(chunk.key), part, chunk, pieces, [&]() -> Observer {
          stream.emplace();
          if (!whole) return nullptr;
          return [&stream](std::span<const std::byte> p) { stream->Update(p); };
        });
    if (!got.ok()) return got.status();
    if (*got != n) {
      return Corruption(KeyUri(chunk.key) + ": truncated: " + std::to_string(span.begin + *got) +
                        " bytes, the manifest says " + std::to_string(chunk.bytes) +
                        ChunkContext(part, chunk));
    }
    if (whole) {
      if (stream->Digest() != chunk.hash) {
        return Corruption(KeyUri(chunk.key) + ": checksum mismatch" + ChunkContext(part, chunk));
      }
    } else {
      for (uint64_t o = 0; o < n; o += chunk.block_bytes) {
        const uint64_t b = (span.begin + o) / chunk.block_bytes;
        const size_t len = static_cast<size_t>(std::min(chunk.block_bytes, n - o));
        if (format::Hash64({buf + o, len}) != chunk.block_hashes[b]) {
          return Corruption(KeyUri(chunk.key) + ": checksum mismatch in block " +
                            std::to_string(b) + " (bytes " + std::to_string(span.begin + o) + ".." +
                            std::to_string(span.begin + o + len) + ")" + ChunkContext(part, chunk));
        }
      }
    }
    std::vector<DeviceCopier::HostToDevice> in;
    for (const SpanCopy& c : span.copies) {
      if (c.device < 0) {
        std::memcpy(c.dst, buf + (c.at - span.begin), c.bytes);
      } else {
        in.push_back({c.device, c.dst, buf + (c.at - span.begin), c.bytes});
      }
    }
    if (!in.empty()) return copier_->CopyIn(in);
    return Status::Ok();
  });
}

Status Restorer::Verify(const CheckpointManifest& m, CheckpointVerifyReport* report) {
  CheckpointVerifyReport local;
  CheckpointVerifyReport& r = report ? *report : local;
  std::vector<std::pair<const RankPart*, const ChunkInfo*>> items;
  for (const RankPart& p : m.ranks) {
    for (const ChunkInfo& c : p.chunks) items.push_back({&p, &c});
    r.tensors += p.tensors.size();
  }
  std::mutex mu;
  std::vector<internal::ScratchBuffer> scratch(Workers(items.size(), opt_.io_threads));
  // A chunk that cannot be read for want of memory is no verdict on it: the
  // verify fails with that error.
  STOKER_RETURN_IF_ERROR(ParallelFor(items.size(), opt_.io_threads, [&](size_t i, size_t w) {
    const auto& [part, chunk] = items[i];
    std::string problem;
    auto info = store_->Stat(chunk->key);
    if (!info.ok()) {
      problem = info.status().message();
    } else if (info->size != chunk->bytes) {
      problem = KeyUri(chunk->key) + ": " + std::to_string(info->size) +
                " bytes, the manifest says " + std::to_string(chunk->bytes);
    } else {
      auto memory = scratch[w].Get(chunk->bytes, "checkpoint verify's read buffer");
      if (!memory.ok()) {
        return memory.status().WithContext("verifying " + KeyUri(chunk->key) +
                                           ChunkContext(*part, *chunk));
      }
      const std::span<std::byte> buf(*memory, chunk->bytes);
      auto got = store_->Read(chunk->key, 0, buf);
      if (!got.ok()) {
        problem = got.status().message();
      } else if (*got != buf.size() || !ChunkMatches(*chunk, buf)) {
        problem = KeyUri(chunk->key) + ": checksum mismatch";
      }
    }
    std::lock_guard<std::mutex> l(mu);
    ++r.chunks;
    r.bytes += chunk->bytes;
    if (!problem.empty()) r.problems.push_back(problem + ChunkContext(*part, *chunk));
    return Status::Ok();
  }));
  std::sort(r.problems.begin(), r.problems.end());
  if (!r.problems.empty()) {
    return Corruption("checkpoint " + m.name + " at " + store_->uri() + ": " +
                      std::to_string(r.problems.size()) +
                      " bad chunk(s); first: " + r.problems.front());
  }
  return Status::Ok();
}

}  // namespace stoker::ckpt
