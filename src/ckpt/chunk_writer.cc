#include "ckpt/chunk_writer.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "ckpt/records.h"
#include "stoker/format.h"

namespace stoker::ckpt {

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
        c.segments.push_back({t.data.data() + off, c.bytes, t.device});
        plan.push_back(std::move(c));
      }
      stream += n;
      group.offset = stream;
      continue;
    }
    if (group.bytes + n > chunk) flush();
    group.segments.push_back({t.data.data(), n, t.device});
    group.bytes += n;
    stream += n;
  }
  flush();
  return plan;
}

void BlockHasher::Update(std::span<const std::byte> p) {
  while (!p.empty()) {
    if (in_block_ == 0 && p.size() >= block_) {  // a whole block at once: one call
      done_.push_back(format::Hash64(p.first(block_)));
      p = p.subspan(block_);
      continue;
    }
    if (!current_) current_.emplace();
    const size_t n = static_cast<size_t>(std::min<uint64_t>(p.size(), block_ - in_block_));
    current_->Update(p.first(n));
    in_block_ += n;
    p = p.subspan(n);
    if (in_block_ == block_) {
      done_.push_back(current_->Digest());
      current_.reset();
      in_block_ = 0;
    }
  }
}

std::vector<uint64_t> BlockHasher::Finish() {
  if (in_block_ > 0) done_.push_back(current_->Digest());
  current_.reset();
  in_block_ = 0;
  return std::move(done_);
}

RankPart DescribeTensors(std::span<const TensorRef> tensors) {
  RankPart r;
  uint64_t at = 0;
  for (const TensorRef& t : tensors) {
    TensorInfo ti;
    ti.name = t.name;
    ti.dtype = t.dtype;
    ti.shape = t.shape;
    ti.offset = at;
    ti.bytes = t.data.size();
    ti.layout = t.layout;
    at += ti.bytes;
    r.tensors.push_back(std::move(ti));
  }
  return r;
}

Result<std::vector<TensorRef>> StagingArea::Snapshot(std::span<const TensorRef> tensors) {
  uint64_t total = 0;
  for (const TensorRef& t : tensors) total += t.data.size();
  if (!memory_ || memory_->size() < total) {
    memory_.reset();
    STOKER_ASSIGN_OR_RETURN(memory_, internal::MappedMemory::Make(total, /*huge_pages=*/true));
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
      pieces.push_back(
          {t.data.data() + off, memory_->data() + at + off, std::min(kPiece, t.data.size() - off)});
    }
    t.data = std::span<const std::byte>(memory_->data() + at, t.data.size());
    at += t.data.size();
  }
  const uint32_t copiers = std::clamp<uint32_t>(std::thread::hardware_concurrency(), 1, 16);
  (void)ParallelFor(pieces.size(), copiers, [&](size_t i, size_t) {
    std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].n);
    return Status::Ok();
  });
  return staged;
}

Result<RankPart> ChunkWriter::Write(const std::string& name, uint32_t rank,
                                    std::span<const TensorRef> tensors, uint64_t chunk_bytes,
                                    uint64_t block_bytes, ChunkSource* source) {
  RankPart part = DescribeTensors(tensors);
  part.rank = rank;
  const std::vector<ChunkPlan> plan = PlanChunks(tensors, chunk_bytes);
  part.chunks.resize(plan.size());
  // A shared chunk is gathered into a per-thread buffer, a chunk of one
  // tensor is written from the tensor's memory.
  std::vector<internal::ScratchBuffer> scratch(Workers(plan.size(), io_threads_));
  Status s = ParallelFor(plan.size(), io_threads_, [&](size_t i, size_t w) -> Status {
    const ChunkPlan& c = plan[i];
    std::span<const std::byte> data;
    if (source != nullptr) {
      STOKER_ASSIGN_OR_RETURN(data, source->Acquire(i, c));
    }
    struct Released {
      ChunkSource* s;
      size_t i;
      ~Released() {
        if (s != nullptr) s->Release(i);
      }
    } released{source, i};
    if (!data.empty()) {
      // From the source.
    } else if (c.segments.size() == 1) {
      data = {c.segments[0].src, c.segments[0].bytes};
    } else {
      auto got = scratch[w].Get(c.bytes, "checkpoint writer's gather buffer");
      if (!got.ok()) {
        return got.status().WithContext("checkpoint " + name + ", chunk " +
                                        ChunkKey(name, rank, i) + " (rank " + std::to_string(rank) +
                                        ", tensors " +
                                        JoinNames(TensorsIn(part, c.offset, c.bytes)) + ")");
      }
      std::byte* gather = *got;
      size_t at = 0;
      for (const Segment& seg : c.segments) {
        std::memcpy(gather + at, seg.src, seg.bytes);
        at += seg.bytes;
      }
      data = {gather, c.bytes};
    }
    ChunkInfo& ci = part.chunks[i];
    ci.key = ChunkKey(name, rank, i);
    ci.bytes = c.bytes;
    ci.offset = c.offset;
    // The checksum is taken as the store writes the bytes (one pass over
    // them, not two; a retried write shows each byte once); the chunk's
    // durability waits for the Sync below.
    WriteOptions deferred{.durability = Durability::kDeferred};
    if (block_bytes > 0) {
      BlockHasher blocks(block_bytes);
      const PutObserver see = [&blocks](std::span<const std::byte> p) { blocks.Update(p); };
      deferred.observer = &see;
      Status put = store_->Put(ci.key, data, deferred);
      if (put.ok()) {
        ci.block_bytes = block_bytes;
        ci.block_hashes = blocks.Finish();
      }
      return put;
    }
    format::Hash64Stream stream;
    const PutObserver see = [&stream](std::span<const std::byte> p) { stream.Update(p); };
    deferred.observer = &see;
    Status put = store_->Put(ci.key, data, deferred);
    if (put.ok()) ci.hash = stream.Digest();
    return put;
  });
  // Every chunk durable at once (one flush, not one per chunk), before the
  // record that names them. Not retried: a failed sync does not say which
  // chunks it lost, and a second one would not report it again.
  if (s.ok()) s = store_->Sync();
  if (!s.ok()) return s;
  return part;
}

Status ChunkWriter::PutSmall(const std::string& key, std::span<const std::byte> data) {
  return store_->Put(key, data);
}

}  // namespace stoker::ckpt
