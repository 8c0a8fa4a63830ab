// Collation: turns a list of samples into one Batch (internal).
//
// Shared by the Loader and the per-file baseline, so both sides of every
// comparison do the same collation and decode work.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "loader/batch_memory.h"
#include "stoker/loader.h"

namespace stoker {

// What a column of the batch is made of, from its field (ColumnSpecFor).
enum class ColumnKind : uint8_t {
  kBytes,   // offsets + data (bytes, str, json)
  kInt64,   // 8 bytes a sample
  kImage,   // decoded: DecodedSampleBytes a sample
  kFixed,   // item_bytes a sample (float32, float64, fixed-shape arrays)
  kRagged,  // rows of row_bytes, padded or back to back (arrays of shape [*, ...])
};

struct ColumnSpec {
  std::string name;
  format::FieldType type = format::FieldType::kBytes;
  // Decode this bytes column as JPEG into an image column.
  bool decode = false;
  // The rest is set by ColumnSpecFor; left as they are, a bytes or int64
  // field's spec needs none of them.
  ColumnKind kind = ColumnKind::kBytes;
  ElementType element = ElementType::kUInt8;
  std::vector<int64_t> shape{};  // kFixed: one sample's; kRagged: one row's
  uint64_t item_bytes = 0;     // kFixed: one sample's; kRagged: one row's
  bool padded = true;          // kRagged: LoaderOptions::ragged == "padded"
};

// The column of `field`: its kind, element type and shapes. `decode`: the
// field is decoded into images; `padded`: variable arrays are padded.
ColumnSpec ColumnSpecFor(const format::FieldSpec& field, bool decode, bool padded);
// A column's kind where ColumnSpecFor did not set it (a spec built as
// {name, type, decode}): from decode and type.
ColumnKind KindOf(const ColumnSpec& c);

struct BatchSamples {
  size_t count = 0;
  const uint64_t* sample_ids = nullptr;
  // Where decode's random draws come from: SampleKey{seed, epoch, sample_ids[i]}.
  uint64_t seed = 0;
  const uint8_t* padding = nullptr;  // may be null: no padding
  // The raw value of column c of sample i (an int64 column's 8 bytes).
  std::function<std::span<const std::byte>(size_t i, size_t c)> value;
  // "sample 17 (shards/000002.stks)": names sample i in messages.
  std::function<std::string(size_t i)> describe;
  // Optional: checks sample i (its checksum) right before its values are
  // copied, while they are in cache; an error fails the batch.
  std::function<Status(size_t i)> check;
  // Optional: the memory sample i's check and values read. While the builder
  // works on sample i it asks the CPU to fetch sample i+1's, when that is
  // small (<= kPrefetchMaxBytes): a shuffled small sample is a random spot in
  // the shard buffers, which the hardware prefetcher does not foresee, and
  // its checksum would otherwise wait on memory line by line.
  std::function<std::span<const std::byte>(size_t i)> memory;
  // Optional, for records not in memory (LoaderOptions::read_unit "sample"):
  // the length of column c of sample i, for the layout, and a read of sample
  // i that puts column c's bytes at dst[c] (length(i, c) of them) and checks
  // the record's checksum. With these, value, check and memory are not used.
  std::function<uint64_t(size_t i, size_t c)> length;
  std::function<Status(size_t i, std::span<std::byte* const> dst)> read;
};

// Samples up to this size are prefetched whole (see BatchSamples::memory);
// longer ones are streamed well enough by the hardware prefetcher, and
// prefetching them only evicts what is being copied (measured on AMD EPYC,
// check + copy alone: 4 KiB samples 1.7x faster, 16 KiB 1.3x, 32 KiB and up
// slower with it; `stoker bench loader` on 4 KiB samples: 1.16x samples/s,
// 0.38 instead of 0.46 CPU s/GB; 16 KiB unchanged).
inline constexpr size_t kPrefetchMaxBytes = 16 * 1024;

// Values of at least this size are copied into the batch by StreamCopy
// (core/stream_copy.h; `stoker bench loader`, 5 epochs hot, AMD EPYC VM:
// 4 KiB samples 1.25x MB/s and 0.49 instead of 0.61 CPU s/GB; 16 KiB 1.2x,
// 0.41 instead of 0.50; 128 KiB 1.17x, 0.43 instead of 0.50). Smaller ones
// are not measured.
inline constexpr size_t kStreamMinBytes = 4 * 1024;

// A batch laid out but not yet filled: its block, with sample ids, padding
// and every bytes column's offsets written. Filled in ranges of samples by
// any number of threads at once (disjoint ranges), then finished once.
struct BatchLayout {
  Batch batch;                               // memory, epoch, index, state, ids and padding set
  std::byte* base = nullptr;                 // batch's block
  std::vector<uint64_t> column_offset;       // where column c's array starts
  std::vector<uint64_t> column_data_offset;  // bytes columns: where the data starts
  std::vector<uint64_t*> offsets;            // bytes columns: n + 1 offsets, written
  // Ragged columns: lengths (n) and row offsets (n + 1), written, and the
  // rows each sample's slot has when padded (the batch's longest).
  std::vector<int64_t*> lengths;
  std::vector<int64_t*> row_offsets;
  std::vector<uint64_t> max_rows;
  uint64_t image_bytes = 0;                  // one decoded sample
  size_t count = 0;
  // The GPU decode (loader/gpu_decode.h): the images left for the GPU;
  // null when the workers decode everything.
  std::shared_ptr<GpuDecodeList> gpu;
};

// What filling a range of samples counted.
struct FillCounts {
  uint64_t decode_skipped = 0;  // corrupt images zero-filled (DecodeOptions::skip_corrupt)
  uint64_t decoded = 0;         // images decoded here (not left for the GPU)
};

class BatchBuilder {
 public:
  // Lays out and fills a batch from `samples` in a block from `pool`.
  // Decode errors are Corruption naming the sample.
  static Result<Batch> Build(BufferPool& pool, const std::vector<ColumnSpec>& columns,
                             const DecodeOptions& decode, const BatchSamples& samples,
                             uint64_t epoch, uint64_t index, LoaderState state_after);

  // The same in three steps, for batches built by several workers: the
  // layout needs every sample's lengths (samples.value or samples.length),
  // so the records (or their index) must be in memory by then. NoSpace
  // naming the batch and its bytes when its block cannot be allocated.
  static Result<BatchLayout> Layout(BufferPool& pool, const std::vector<ColumnSpec>& columns,
                                    const DecodeOptions& decode, const BatchSamples& samples,
                                    uint64_t epoch, uint64_t index, LoaderState state_after);
  // Checks and copies (or reads, or decodes) samples [begin, end) into their
  // slots. Safe to call concurrently for disjoint ranges of one layout.
  static Status Fill(const BatchLayout& layout, const std::vector<ColumnSpec>& columns,
                     const DecodeOptions& decode, const BatchSamples& samples, size_t begin,
                     size_t end, DecodeScratch* scratch, FillCounts* counts);
  static Batch Finish(BatchLayout layout, const std::vector<ColumnSpec>& columns,
                      const DecodeOptions& decode);

  // GPU delivery: the buffer a built batch lives in, and its device copy.
  static const std::shared_ptr<BatchMemory>& Memory(const Batch& b) { return b.memory_; }
  static void AttachDevice(Batch& b, std::shared_ptr<DeviceBatch> d) { b.device_ = std::move(d); }
  static void SetCorruptSkipped(Batch& b, uint64_t n) { b.corrupt_skipped_ = n; }
};

}  // namespace stoker
