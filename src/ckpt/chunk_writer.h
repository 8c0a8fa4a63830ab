// Writing one rank's tensors as chunks (docs/checkpoint.md §3.1, §4), and
// the staging area an asynchronous save snapshots them into. Internal.
//
// Thread safety: a ChunkWriter may write several saves at once (it keeps no
// state between calls); a StagingArea belongs to one save at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/parallel.h"
#include "core/aligned_memory.h"
#include "stoker/checkpoint.h"
#include "stoker/format.h"

namespace stoker::ckpt {

// Checksums of consecutive blocks of `block` bytes of a stream shown in
// pieces of any size (the last block may be shorter).
class BlockHasher {
 public:
  explicit BlockHasher(uint64_t block) : block_(block) {}
  void Update(std::span<const std::byte> p);
  std::vector<uint64_t> Finish();

 private:
  uint64_t block_, in_block_ = 0;
  std::optional<format::Hash64Stream> current_;
  std::vector<uint64_t> done_;
};

// One piece of a chunk: bytes of one tensor (device memory where device
// >= 0).
struct Segment {
  const std::byte* src = nullptr;
  size_t bytes = 0;
  int device = -1;
};

// One chunk to write: its place in the rank's stream and its pieces.
struct ChunkPlan {
  uint64_t offset = 0, bytes = 0;
  std::vector<Segment> segments;
};

// Where the writer cuts a rank's stream (§3.1: the writer's choice). Tensors
// of at least a sixteenth of the chunk size get chunks of their own, at most
// `chunk` bytes each, written straight from their memory and read straight
// into their place; smaller ones share chunks of up to `chunk` bytes,
// gathered on save and scattered on restore, which costs a copy of only the
// small tensors.
std::vector<ChunkPlan> PlanChunks(std::span<const TensorRef> tensors, uint64_t chunk);

// The part's tensors (names, types, shapes, places in the stream), without
// chunks.
RankPart DescribeTensors(std::span<const TensorRef> tensors);

// Host memory an asynchronous save copies its tensors into, kept and reused
// by the next one (grown when a save needs more).
class StagingArea {
 public:
  // Copies `tensors` back to back into the area, on up to 16 threads;
  // returns the same tensors pointing into it.
  Result<std::vector<TensorRef>> Snapshot(std::span<const TensorRef> tensors);

 private:
  std::unique_ptr<internal::MappedMemory> memory_;
};

// Where a chunk's bytes come from when they are not all in host memory yet
// (device tensors: device_staging.h). Called from the writer's threads.
class ChunkSource {
 public:
  virtual ~ChunkSource() = default;
  // Before chunk `index` (planned as `c`) is written: its bytes, or an empty
  // span when its segments' memory may now be read as it is. May block.
  virtual Result<std::span<const std::byte>> Acquire(size_t index, const ChunkPlan& c) = 0;
  // After its write (whatever the write's outcome), for each Acquire that
  // succeeded.
  virtual void Release(size_t index) = 0;
};

class ChunkWriter {
 public:
  // `store` retries what is retryable (WithWriteRetries).
  ChunkWriter(std::shared_ptr<Store> store, uint32_t io_threads)
      : store_(std::move(store)), io_threads_(io_threads) {}

  // §1.1 step 1: writes the chunks of `rank`'s stream of checkpoint `name` in
  // parallel, each checksummed as it is written (and retried by the store),
  // then makes them durable together (Store::Sync); returns the part
  // with its chunks.
  // `block_bytes` > 0: each chunk gets a checksum per block of that size
  // (format 2, §4.1); 0: one per chunk (format 1).
  // `source`, when given, is asked for each chunk's bytes first.
  Result<RankPart> Write(const std::string& name, uint32_t rank, std::span<const TensorRef> tensors,
                         uint64_t chunk_bytes, uint64_t block_bytes, ChunkSource* source = nullptr);

  // Puts a small object (a part record, a manifest) durably.
  Status PutSmall(const std::string& key, std::span<const std::byte> data);

 private:
  std::shared_ptr<Store> store_;
  uint32_t io_threads_;
};

}  // namespace stoker::ckpt
