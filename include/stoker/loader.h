// The loader: reads a packed dataset from any store and delivers batches.
//
//   epoch plan ──▶ shard reads (whole shards, N in flight, into a bounded
//   buffer pool) ──▶ workers, all on each batch, a chunk of samples each
//   (checksum each sample, copy its fields into one contiguous batch buffer,
//   optionally decode JPEG + augment) ──▶ batches in plan order ──▶ Next()
//
// A shard is read once per epoch per rank, whole, with one request, and is
// given back to the pool as soon as the last batch that needs it is built.
// Memory is bounded by LoaderOptions::memory_budget (by default sized from the
// dataset and the machine); Open refuses an explicit budget that cannot hold
// the shards one shuffle window needs at once.
//
// Every sample is checked against its checksum before it is delivered. An
// error (a missing or corrupt shard, a storage timeout after retries) is
// returned by Next() for the first batch it affects, with a message naming the
// shard and sample; the loader then stays failed until StartEpoch.
//
// With LoaderOptions::device = "cuda:N" the batches are also delivered in
// GPU memory (see gpu.h): batch buffers are pinned, and one more thread per
// epoch copies each built batch, in plan order, with cudaMemcpyAsync on the
// loader's own stream while the next batches are read and collated;
// Batch::device() is the copy, with an event the consumer's stream waits on.
//
// Thread safety: a Loader is used by one thread at a time (external
// synchronisation otherwise); its workers are internal. Batches are values
// that may move to any thread; their memory lives until the last Batch copy
// referring to it is destroyed, then goes back to the loader's pool (or is
// freed if the loader is gone).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/dataset.h"  // ReadManifest, for the loader's callers
#include "stoker/decode.h"
#include "stoker/format.h"
#include "stoker/plan.h"
#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker {

// Where an epoch stands: enough to resume it, on any machine and (the
// position being global) on any world size.
// Where a loader stands, and what it was reading, so that a resume on another
// dataset or with another order is refused instead of silently selecting
// other samples. A state of version 0 is a bare position (a caller that built
// one by hand): only its bounds are checked. Version 1 was saved under epoch
// order version 1 (plan.h, kPlanOrderVersion), version 2 under order version
// 2: a shuffled version-1 state mid-epoch is refused (its remaining samples
// would differ); at position 0, or unshuffled, the orders agree.
inline constexpr uint32_t kLoaderStateVersion = 2;
struct LoaderState {
  // A bare position (version 0); IdentifiedState sets the identity.
  LoaderState(uint64_t e = 0, uint64_t p = 0) : epoch(e), position(p) {}  // NOLINT: {e, p}
  uint64_t epoch = 0;
  // Global samples consumed by all ranks together (see plan.h): the same on
  // every rank, so a job may resume on another world size or batch size.
  uint64_t position = 0;
  // kLoaderStateVersion when the identity below is set; 0 = not set.
  // Default: 0.
  uint32_t version = 0;
  // The identity of the order (checked on resume): the dataset's id (32 hex
  // digits, Manifest::IdHex), seed, shuffle and shuffle window.
  std::string dataset_id;
  uint64_t seed = 0;
  bool shuffle = true;
  uint32_t shuffle_window_shards = 0;
  // The world size that saved it: for messages only (see position).
  uint32_t world_size = 0;
  // LoaderOptions::sequence_length (positions then count windows); checked.
  // Default: 0.
  uint32_t sequence_length = 0;
};

// reads_in_flight 0: the workers' count, within these.
inline constexpr uint32_t kAutoReadsMin = 8;
inline constexpr uint32_t kAutoReadsMax = 64;

struct LoaderOptions {
  uint32_t batch_size = 256;
  // Default: on. See plan.h for the order and the rank's share.
  bool shuffle = true;
  uint64_t seed = 0;
  // Default: 8 shards (32 MiB of 4 MiB shards) mixed at a time.
  uint32_t shuffle_window_shards = 8;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // Default: off: the last batch may be short and ranks are padded equally.
  bool drop_last = false;
  // Whole-shard reads in flight. Default: 0 = from the workers: as many as
  // `threads`, at least kAutoReadsMin (8: Ceph's rados bench runs 16 over 2
  // replicas' worth of OSDs; on NVMe 8 x 4 MiB saturate a drive) and at most
  // kAutoReadsMax, so that each worker of a large node can be waiting on a
  // shard of its own. The automatic memory budget reads fewer ahead when
  // they do not fit; an explicit budget refuses no plan for them.
  uint32_t reads_in_flight = 0;
  // Bytes of shard buffers plus batch buffers. An explicit budget is obeyed:
  // Open refuses a plan that does not fit it, naming what it needs.
  // Default: 0 = automatic: what the plan needs (the shards one batch
  // position keeps alive, reads_in_flight shards ahead, prefetch_batches
  // batches ahead), within a quarter of the machine's available memory
  // (/proc/meminfo MemAvailable), at most 16 GiB; when that is too little,
  // fewer reads and batches ahead (down to one), and beyond the quarter what
  // one batch and its shards need, up to 80% of available memory. Only a
  // dataset whose batch does not fit that is refused, naming its sample size
  // and the memory needed.
  uint64_t memory_budget = 0;
  // Batches built ahead of the consumer. All workers build each batch
  // together, so this is overlap, not parallelism. Default: 4.
  uint32_t prefetch_batches = 4;
  // Workers that build batches, a chunk of samples each at a time (read,
  // check, decode, copy). Default: 0 = the machine's cores.
  uint32_t threads = 0;
  // Read shards with O_DIRECT (POSIX), bypassing the page cache. Default: off.
  bool direct_io = false;
  // How records reach the batch. "shard": each shard is read whole into a
  // shard buffer, and workers check and copy its records into batches.
  // "sample": only each shard's header and index are read ahead; workers
  // then read every record straight into its place in the batch (one preadv
  // per sample) and check it there, while it is in cache: one copy of each
  // byte fewer, and the checksum reads cache, not memory. Not with
  // direct_io (records are not block-aligned). "auto" picks "sample" when
  // the store's reads are local (Store::local_reads: a disk file system or
  // tmpfs; through the node cache, a cache that can hold the whole dataset
  // on a local disk) and the mean record is at least kSampleReadMinBytes,
  // "shard" otherwise. "map": as "sample", but each shard file is mapped
  // into memory and workers check every record where it lies in the page
  // cache, then copy it into the batch with streaming stores: no system call
  // per record, and no read of the batch's memory before it is written, so
  // each byte crosses memory once fewer than with "sample" (which matters
  // where the GPU's DMA shares host memory bandwidth with the copies). Only
  // stores whose objects can be mapped (StoreCapabilities::mapped_reads: a
  // local folder, the node cache; a shard whose reader still cannot map, as
  // behind a wrapper that does not pass ObjectReader::Map on, is read as
  // with "sample"); a shard file truncated behind the loader is an error
  // naming the record, not a crash. A local folder's shard files stay mapped
  // from one epoch to the next, while the store is open (up to the machine's
  // physical memory; they show in the process's RSS as shared file pages).
  // Not chosen by "auto": with 16 workers on a 16-core H200 node it was no
  // faster than "sample" (0.95x at 128 KiB; into HBM 0.96x), on 2 cores
  // 1.8x. Default: "auto".
  std::string read_unit = "auto";
  // Fields to deliver, by name. Default: empty = every field but token
  // block checksums (FieldSpec::block_sums_of; named, they are delivered).
  std::vector<std::string> fields;
  // How an array field whose first dimension varies (format 3, `uint32[*]`)
  // is collated (Batch::RaggedColumn): "padded", each sample's rows followed
  // by zero rows up to the batch's longest, or "offsets", every sample's rows
  // back to back. Both give each sample's row count and row offsets.
  // Default: "padded" (a dense (batch, longest, ...) tensor, what most
  // models take).
  std::string ragged = "padded";
  DecodeOptions decode;
  // A read that fails with a retryable error is tried again this many times
  // (with backoff, by a RetryingStore around the store) before the epoch
  // fails. 0: no retries (no wrapper). Default: 3.
  uint32_t read_retries = 3;
  // Deadline of one shard read, from its first attempt, retries included:
  // past it the epoch fails with TimedOut naming the shard, so a dead
  // cluster is an error after read_timeout, not a hang. With per-sample
  // reads (read_unit), Next() also fails with TimedOut when the batch it
  // waits for is not built within read_timeout. Default: 60 s.
  std::chrono::milliseconds read_timeout{60000};
  // Where Open starts: epoch 0 from its beginning, or a saved state to
  // resume from (nothing before it is read). Default: {0, 0}.
  LoaderState start;
  // Where batches are delivered: "" (or "cpu") host memory only; "cuda:N"
  // also GPU N's memory (Batch::device()). Open fails with a message naming
  // the device and the CUDA call when there is no such GPU, and Unsupported
  // in a build without CUDA. Default: "" (host).
  std::string device;
  // Device memory for batches on the GPU: the loader's copies in flight and
  // ready, plus the batches the consumer still holds. When the consumer holds
  // all of it, the next copy waits for a release (Next() fails with NoSpace
  // once it is clear that none will come). With the GPU decode
  // (DecodeOptions::device) a quarter of it goes to nvJPEG and the decoded
  // windows. Default: 0 = room for prefetch_batches + 4 batches of the
  // largest possible size (and the GPU decode's 128 MiB or more on top).
  uint64_t device_memory_budget = 0;
  StoreOptions store;
  // The node cache (cache.h): a folder on the node's local disk shared by
  // every rank and job on the node, so that each shard is fetched from the
  // store once per node. Default: "" = no cache.
  std::string cache_dir;
  // Most bytes the cache folder holds. Default: 0 = its file system's free
  // space plus what the cache holds, less 5% of the file system (at least
  // 256 MiB).
  uint64_t cache_bytes = 0;
  // "planned" (prefetch along the node's order, Belady eviction) or "lru".
  // Default: "planned".
  std::string cache_policy = "planned";
  // Ranks per node: ranks [k * ranks_per_node, (k + 1) * ranks_per_node) are
  // node k's, and share its cache. Default: 0 = every rank is on this node.
  uint32_t ranks_per_node = 0;
  // Node affinity (plan.h): each shard is read by one node only for the
  // whole run, and shuffled within that node's part. Default: off (the
  // global shuffle).
  bool node_affinity = false;
  // When the cache folder is unusable, read uncached (saying so once on
  // stderr) rather than failing Open. Default: off.
  bool cache_fallback = false;
  // Token windows (tokens.h; docs/architecture.md "Token windows"): > 0
  // delivers, instead of records, windows of sequence_length + 1 tokens that
  // run across document boundaries, batch_size of them a batch, as one
  // (batch, L + 1) FixedColumn "tokens". The token field is a record's
  // integer array of shape [*] (sequence_field). With shuffle off, window k
  // is tokens [kL, kL + L + 1) of the documents concatenated in dataset
  // order; with shuffle on, the documents' order and the windows' are pure
  // functions of (dataset, seed, epoch). Positions count windows: rank r
  // gets the epoch's windows start + j * world_size + r, floor(rest /
  // world_size) of them (drop_last: whole batches only). Only the byte
  // ranges of the windows' documents are read (never whole shards). Not
  // with decode, device, cache_dir, node_affinity or fields. Default: 0 =
  // records.
  uint32_t sequence_length = 0;
  // The token field. Default: "" = "tokens", else the only integer array of
  // shape [*].
  std::string sequence_field;
  // "int64" or "int32": the tokens' element type. Default: "int64".
  std::string sequence_dtype = "int64";
  // Also deliver "positions" (each token's position in its document,
  // 0 at a document's start) and "documents" (which document of the window
  // each token is in, from 0): what a block-diagonal attention mask and
  // reset position ids need. Default: off.
  bool sequence_positions = false;
  // Check every token delivered (on: the token blocks a window touches and
  // their checksums, or in a dataset without block checksums the whole
  // records), or read only the tokens' bytes (off; a record is then checked
  // only when a window holds all of it). TokenDatasetOptions::verify.
  // Default: on.
  bool sequence_verify = true;
};

// The epoch plan's options (plan.h) that the loader runs with: seed,
// shuffle, shuffle_window_shards, batch_size, rank, world_size, drop_last,
// node_affinity and ranks_per_node, copied. With EpochPlan::Make and the
// manifest's shard sample counts it gives the order any rank of the job
// reads in any epoch, as the loader itself (and the node cache's prefetch)
// computes it.
PlanOptions PlanOptionsOf(const LoaderOptions& o);

// Records of at least this many bytes on average are read one by one under
// read_unit "auto" (see LoaderOptions::read_unit): a system call per sample
// is then a few per cent of the copy it saves.
inline constexpr uint64_t kSampleReadMinBytes = 64 * 1024;

struct LoaderStats {
  uint64_t shards_read = 0;
  // Whole shards; with per-sample reads, records plus headers and indexes.
  uint64_t bytes_read = 0;
  uint64_t samples_delivered = 0;
  uint64_t batches_delivered = 0;
  uint64_t read_retries = 0;
  // Corrupt images zero-filled (DecodeOptions::skip_corrupt), counted in the
  // batches delivered (not in those built ahead): the sum of their
  // Batch::corrupt_skipped().
  uint64_t decode_skipped = 0;
  // Batches built by more than one worker: how well the work spreads.
  uint64_t shared_batches = 0;
  // Images decoded by each backend (DecodeOptions::device), counted when
  // decoded: nvJPEG's hardware engines, nvJPEG on CUDA, libjpeg-turbo in
  // the workers (every image without the GPU decode). And which path runs:
  // "cpu", "cuda:0: nvJPEG 13.0.1 (...): hardware backend, ..." or "cpu
  // (decode device cuda:0: no nvJPEG (tried ...))"; empty without decode.
  uint64_t decoded_hardware = 0, decoded_cuda = 0, decoded_cpu = 0;
  std::string decode_path;
  // The share of the GPU's images the workers decode now
  // (DecodeOptions::cpu_share, or where cpu_share_balance moved it); 0
  // without the GPU decode.
  float decode_cpu_share = 0.0f;
  // Time Next() spent blocked waiting for a batch (the consumer's data wait).
  std::chrono::nanoseconds wait_time{0};
  // Device delivery: the copier thread that takes built batches to the GPU.
  // copier_wait_time: blocked for the workers' next batch (the GPU stage
  // ahead of them); gpu_decode_time: in the GPU decode (nvJPEG's host work,
  // queuing the kernels, the CPU fallback), gpu_decode_wait_time of it
  // waiting for the GPU's earlier work; copier_cpu_time: the CPU time the
  // thread got (over every batch: the copies and the waits for device
  // memory and for room in the delivered queue too). gpu_decode_time less
  // gpu_decode_wait_time well above copier_cpu_time means it waited for a
  // core.
  std::chrono::nanoseconds copier_wait_time{0};
  std::chrono::nanoseconds gpu_decode_time{0};
  std::chrono::nanoseconds gpu_decode_wait_time{0};
  std::chrono::nanoseconds copier_cpu_time{0};
  // Peak bytes held in shard and batch buffers.
  uint64_t peak_buffer_bytes = 0;
  // Device delivery: bytes copied to the GPU, and the time those copies kept
  // the copy engine busy (the copies overlap reads and collation; H2D that is
  // not hidden shows up in wait_time).
  uint64_t h2d_bytes = 0;
  std::chrono::nanoseconds h2d_time{0};
  // Device delivery: device memory the batch pool holds now, the most it
  // held, and host batch memory pinned now.
  uint64_t device_bytes = 0;
  uint64_t peak_device_bytes = 0;
  uint64_t pinned_bytes = 0;
  // The node cache (LoaderOptions::cache_dir), this process's share; see
  // CacheStats in cache.h. Without a cache, remote_bytes = bytes_read.
  uint64_t remote_bytes = 0;
  uint64_t cache_bytes = 0;
  uint64_t cache_hits = 0;
  uint64_t cache_misses = 0;
  uint64_t cache_fetch_waits = 0;
  uint64_t cache_evictions = 0;
  uint64_t cache_refetches = 0;
};

// The element type of a typed column (Batch::FixedColumn, RaggedColumn): an
// array field's dtype (the same numbers as format::DType), or a float32 /
// float64 scalar's.
enum class ElementType : uint8_t {
  kUInt8 = 1,
  kUInt16 = 2,
  kUInt32 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat16 = 6,
  kBFloat16 = 7,  // the upper 16 bits of a binary32
  kFloat32 = 8,
  kFloat64 = 9,  // no array dtype: float64 scalars only
};
// "bfloat16": the names numpy and torch give them.
std::string_view ElementTypeName(ElementType t);
// Bytes of one element.
uint32_t ElementTypeBytes(ElementType t);

class BatchMemory;  // the pooled buffer behind a Batch (implementation)
class DeviceBatch;  // a batch's copy in GPU memory (stoker/gpu.h)

// One batch of samples, laid out for zero-copy hand-off: every array is a
// contiguous, 64-byte aligned region of one buffer. Each delivered field is
// one column, by its type: int64 an Int64Column; bytes, str and json a
// BytesColumn (its type says which); a decoded image an ImageColumn; float32,
// float64 and arrays of fixed shape a FixedColumn; arrays whose first
// dimension varies a RaggedColumn.
class Batch {
 public:
  // A variable-length field: sample i's bytes are data[offsets[i], offsets[i+1]).
  // `type` says what the bytes are: kBytes (raw), kString (UTF-8 text) or
  // kJson (one JSON value's text, as written); the bindings turn the last
  // two into strings and parsed values.
  struct BytesColumn {
    std::string name;
    std::span<const uint64_t> offsets;  // size() + 1 entries
    std::span<const std::byte> data;
    format::FieldType type = format::FieldType::kBytes;
  };
  struct Int64Column {
    std::string name;
    std::span<const int64_t> values;
  };
  // A field of one size in every sample: a float32 or float64 scalar, or an
  // array of fixed shape (format 3). Dense: sample i's value is
  // data[i * item_bytes, (i + 1) * item_bytes), its elements row-major, so
  // the column is one (size(), item_shape...) array of `element`.
  struct FixedColumn {
    std::string name;
    format::FieldType type = format::FieldType::kFloat32;  // kFloat32, kFloat64 or kArray
    ElementType element = ElementType::kFloat32;
    std::vector<int64_t> item_shape;  // one sample's: {} for a scalar
    uint64_t item_bytes = 0;          // product of item_shape x the element's bytes
    std::span<const std::byte> data;  // size() x item_bytes
  };
  // An array field whose first dimension varies per sample (shape [*, ...]):
  // sample i holds lengths[i] rows of row_shape. Laid out as
  // LoaderOptions::ragged says:
  //   padded:  data is size() x max_rows rows; sample i's rows come first in
  //            its max_rows, the rest are zeros (a (size(), max_rows,
  //            row_shape...) array);
  //   offsets: data is every sample's rows back to back (a (total rows,
  //            row_shape...) array); sample i's are rows [offsets[i],
  //            offsets[i + 1]).
  // lengths and offsets are given in both layouts.
  struct RaggedColumn {
    std::string name;
    ElementType element = ElementType::kUInt8;
    std::vector<int64_t> row_shape;  // the dimensions after the first: {} for [*]
    uint64_t row_bytes = 0;          // product of row_shape x the element's bytes
    bool padded = true;
    uint64_t max_rows = 0;            // the longest sample's rows
    std::span<const std::byte> data;  // padded: size() x max_rows rows; else offsets.back() rows
    std::span<const int64_t> lengths;  // size() entries: rows of each sample
    std::span<const int64_t> offsets;  // size() + 1 entries: the first row of each sample (offsets)
  };
  // A decoded image field: dense, N x H x W x C or N x C x H x W (layout),
  // C = 3 (RGB), elements of `dtype` (uint8, float32 or float16).
  struct ImageColumn {
    std::string name;
    std::span<const std::byte> data;
    uint32_t height = 0, width = 0, channels = 3;
    ImageDType dtype = ImageDType::kUInt8;
    ImageLayout layout = ImageLayout::kNHWC;
  };

  Batch() = default;
  size_t size() const { return sample_ids_.size(); }
  uint64_t epoch() const { return epoch_; }
  // Index of this batch within the rank's epoch (counting from the epoch's
  // start, also after a resume).
  uint64_t index() const { return index_; }
  // Global sample ids, in delivery order.
  std::span<const uint64_t> sample_ids() const { return sample_ids_; }
  // 1 where the sample is padding (a repeat that evens out the ranks).
  std::span<const uint8_t> padding() const { return padding_; }
  const std::vector<BytesColumn>& bytes_columns() const { return bytes_; }
  const std::vector<Int64Column>& int64_columns() const { return int64_; }
  const std::vector<ImageColumn>& image_columns() const { return images_; }
  const std::vector<FixedColumn>& fixed_columns() const { return fixed_; }
  const std::vector<RaggedColumn>& ragged_columns() const { return ragged_; }
  const BytesColumn* bytes(std::string_view name) const;
  const Int64Column* int64(std::string_view name) const;
  const ImageColumn* image(std::string_view name) const;
  const FixedColumn* fixed(std::string_view name) const;
  const RaggedColumn* ragged(std::string_view name) const;
  // Images of this batch that were not decodable and were zero-filled
  // (DecodeOptions::skip_corrupt); 0 otherwise.
  uint64_t corrupt_skipped() const { return corrupt_skipped_; }
  // The resume state once this batch has been consumed.
  LoaderState state_after() const { return state_after_; }
  // The buffer holding every array of the batch (for zero-copy exporters,
  // which keep `memory()` alive as long as they refer to it).
  std::shared_ptr<const BatchMemory> memory() const { return memory_; }
  std::span<const std::byte> buffer() const;
  // Device delivery (LoaderOptions::device): the batch's copy on the GPU,
  // the same bytes at the same offsets as buffer(); null for host delivery.
  // Call device()->WaitOn(stream) before using it on a stream (gpu.h).
  const std::shared_ptr<DeviceBatch>& device() const { return device_; }
  // Where `host`, a pointer into buffer() (a column's data()), lives in the
  // device copy; null for host delivery.
  template <typename T>
  const T* device_pointer(const T* host) const {
    return static_cast<const T*>(DeviceAddress(host));
  }

 private:
  const void* DeviceAddress(const void* host) const;
  friend class BatchBuilder;
  std::shared_ptr<BatchMemory> memory_;
  std::shared_ptr<DeviceBatch> device_;
  uint64_t epoch_ = 0, index_ = 0;
  uint64_t corrupt_skipped_ = 0;
  std::span<const uint64_t> sample_ids_;
  std::span<const uint8_t> padding_;
  std::vector<BytesColumn> bytes_;
  std::vector<Int64Column> int64_;
  std::vector<ImageColumn> images_;
  std::vector<FixedColumn> fixed_;
  std::vector<RaggedColumn> ragged_;
  LoaderState state_after_;
};

class Loader {
 public:
  // Opens the dataset at `uri` (its manifest is read and validated) and
  // starts reading at options.start. Invalid options are InvalidArgument naming the option.
  static Result<std::unique_ptr<Loader>> Open(std::string_view uri, const LoaderOptions& options);
  static Result<std::unique_ptr<Loader>> Open(std::shared_ptr<Store> store,
                                              const LoaderOptions& options);

  virtual ~Loader() = default;

  virtual const format::Manifest& manifest() const = 0;
  virtual const LoaderOptions& options() const = 0;

  // Stops the current epoch (in-flight reads are waited for, buffers return
  // to the pool) and starts `epoch` at global `position` (0: the start).
  virtual Status StartEpoch(uint64_t epoch, uint64_t position = 0) = 0;
  Status Resume(const LoaderState& s) { return StartEpoch(s.epoch, s.position); }

  // Reads ahead for `epoch`: starts it from its beginning in the background
  // as StartEpoch(epoch) does (what is left of the current epoch is
  // dropped), and keeps it for the StartEpoch that follows: a
  // StartEpoch(epoch, 0) before any Next() finds its first batches read
  // instead of starting over. Meant for the end of an epoch (Next() said
  // OutOfRange), so that whatever the caller does between epochs
  // (evaluation, a checkpoint) overlaps the next one's first reads. Open's
  // start is kept the same way for the StartEpoch of that same epoch and
  // position. A Next() ends the keeping: a StartEpoch after it starts over.
  // Errors: those StartEpoch gives.
  virtual Status Prefetch(uint64_t epoch) = 0;

  // The next batch of the epoch; OutOfRange once the epoch is over (then
  // StartEpoch(epoch + 1) goes on). Blocks until the batch is ready.
  virtual Result<Batch> Next() = 0;

  // Batches this rank gets in the current epoch, from where it started.
  virtual uint64_t num_batches() const = 0;
  // Batches this rank would get in `epoch` from global `position` (what
  // num_batches() says after StartEpoch(epoch, position)) without starting
  // it: the plan's own count, drop_last, padding and node affinity
  // included, so that no caller recomputes it. Errors: those StartEpoch
  // gives for that position. O(shards) unless it is the current epoch's.
  virtual Result<uint64_t> BatchesFrom(uint64_t epoch, uint64_t position) const = 0;
  // The state after the last batch Next() returned.
  virtual LoaderState state() const = 0;
  virtual LoaderStats stats() const = 0;
  // How records are read: "shard" or "sample" (what read_unit "auto" chose).
  virtual std::string_view read_unit() const = 0;
  // What one epoch's positions count (resume states and num_batches are in
  // these): the dataset's samples, or with LoaderOptions::sequence_length
  // the epoch's windows. Default: manifest().sample_count.
  virtual uint64_t epoch_positions() const { return manifest().sample_count; }
};

// The state at (epoch, position) of a loader over `m` with `o`, identity set.
LoaderState IdentifiedState(uint64_t epoch, uint64_t position, const format::Manifest& m,
                            const LoaderOptions& o);

// Whether a loader over `m` with `o` may resume from `state`: its position
// within the dataset, and (version >= 1) the same dataset, seed, shuffle and
// shuffle window. InvalidArgument naming both values otherwise; Unsupported
// for a newer version, and for a shuffled version-1 state mid-epoch (the
// older epoch order).
Status CheckResumeState(const LoaderState& state, const format::Manifest& m,
                        const LoaderOptions& o);

// Decodes a JPEG and resizes it to out_h x out_w RGB into `out` (size
// out_h * out_w * 3). `scratch` is reused between calls. Corruption when the
// data is not a decodable JPEG. Unsupported when built without libturbojpeg.
Status DecodeJpegResized(std::span<const std::byte> jpeg, uint32_t out_h, uint32_t out_w,
                         std::span<uint8_t> out, std::vector<uint8_t>* scratch);

}  // namespace stoker
