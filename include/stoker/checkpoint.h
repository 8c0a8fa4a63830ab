// Checkpoints: named tensors and metadata saved to a store in parallel chunks,
// committed atomically by a manifest written last, restored in parallel with
// every checksum verified. The byte-level format is docs/checkpoint.md.
//
// A checkpoint root is a store URI (a directory, or rados://checkpoint/RUN);
// each checkpoint is a NAME under it:
//
//   NAME/rank-RRRRR/CCCCCC.chunk   chunks of rank R's tensors (raw bytes)
//   NAME/rank-RRRRR.part           rank R's part record, after its chunks
//   NAME/manifest.stkc             the commit, written by rank 0 after every part
//   latest                         the name of the newest commit, moved after it
//
// Saving: every rank calls Save (or SaveAsync) with its own tensors and the
// same name, rank and world size. A rank writes its chunks, then its part
// record; rank 0 waits until every rank's part is durable, then writes the
// manifest (the commit), then moves `latest`, then applies retention. A save
// killed at any point leaves the previous checkpoints and `latest` as they
// were; the half-written NAME has no manifest and no reader takes it for a
// checkpoint (`stoker ckpt ls` shows it as incomplete; Remove deletes it).
//
// Asynchronous saves copy the tensors into a host staging area that the
// Checkpointer keeps and reuses, return, and write in the background. A
// failed write is retried (write_retries) and then reported through the
// handle, and also on stderr if nobody asked the handle by the time the
// Checkpointer is destroyed: never silently dropped.
//
// Thread safety: a Checkpointer is safe for concurrent use; saves are
// serialised (a save waits for the previous asynchronous save to finish
// writing, because they share the staging area). SaveHandle is safe for
// concurrent use.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker {

// Element types, named as PyTorch names them (docs/checkpoint.md §3).
enum class DType : uint8_t {
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kUInt16,
  kInt32,
  kUInt32,
  kInt64,
  kUInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kComplex64,
  kComplex128,
  kFloat8E4M3FN,
  kFloat8E5M2,
};
// "float32", "bfloat16", ...; ParseDType is its inverse (InvalidArgument on
// an unknown name).
std::string_view DTypeName(DType t);
Result<DType> ParseDType(std::string_view name);
size_t DTypeSize(DType t);

// The longest tensor name, in bytes of UTF-8 (docs/checkpoint.md §3.1).
inline constexpr size_t kMaxTensorNameBytes = 1024;
// The most ranks a checkpoint has (SaveOptions::world_size, the manifest's
// world_size: docs/checkpoint.md §2.3).
inline constexpr uint32_t kMaxCheckpointRanks = 65536;
// SaveOptions::chunk_bytes' default: half RADOS's default
// osd_max_object_size, large enough that an fsync per chunk costs little.
inline constexpr uint64_t kDefaultChunkBytes = 64ull << 20;
// SaveOptions::checksum_block_bytes' default: a ranged read of a slice
// reads at most this much more than the slice at each end.
inline constexpr uint64_t kDefaultChecksumBlockBytes = 1ull << 20;
// The checkpoint format this build writes (docs/checkpoint.md); it reads
// every version up to it.
inline constexpr uint32_t kCheckpointFormat = 2;

// Where a tensor lies in a larger, global one (docs/checkpoint.md §3.4): the
// layout of a sharded tensor (FSDP, tensor parallel, ZeRO). A piece is a box
// of the global tensor (its offset in each dimension; its lengths are the
// piece's shape) or a flat range of it (elements [flat_start, flat_start +
// numel) of the row-major global tensor; the piece is 1-D). Pieces of one
// global tensor saved by several ranks share its name; a load of another
// world size or split reads, of each piece it wants, only the bytes that
// intersect it.
struct TensorLayout {
  enum class Kind : uint8_t {
    kWhole,  // not a piece: the tensor is all there is (the default)
    kBox,
    kFlat,
  };
  Kind kind = Kind::kWhole;
  std::vector<int64_t> global_shape;  // kBox, kFlat
  std::vector<int64_t> offsets;       // kBox: one per dimension of global_shape
  uint64_t flat_start = 0;            // kFlat
};
// "whole", "box [0, 512] of [1024, 1024]", "flat [0, 4096) of [64, 128]".
std::string LayoutText(const TensorLayout& l, std::span<const int64_t> shape);

// One tensor to save: a name, an element type, a shape and its bytes
// (row-major, contiguous). data.size() must equal product(shape) x the
// element size. The memory is only read, and only during Save (sync) or
// until SaveAsync returns (async). A piece of a sharded tensor says where it
// lies in `layout` (a box: shape is its lengths; flat: shape is [numel]).
//
// Device memory (docs/checkpoint.md §9): with `device` >= 0, data is memory
// of CUDA device `device`, written by work queued on `stream` (a
// cudaStream_t; null: the legacy default stream). The checkpointer copies it
// to pinned host staging itself, on a copy stream of its own that waits for
// an event recorded on `stream` at the call; SaveAsync returns once the
// copies are queued, and the caller must not change the tensor until
// SaveHandle::WaitStaged returns (the one window where changing it is the
// caller's error).
struct TensorRef {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
  TensorLayout layout;
  int device = -1;  // -1: host memory
  void* stream = nullptr;
};

struct SaveOptions {
  // This process's rank and the number of ranks that save this checkpoint.
  // Default: 0 of 1.
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // Target size of a chunk object. Tensors smaller than this are grouped into
  // shared chunks; larger ones are cut into chunks of this size written
  // straight from their memory. Default: kDefaultChunkBytes (64 MiB).
  uint64_t chunk_bytes = kDefaultChunkBytes;
  // Each chunk is checksummed per block of this size (format 2), so that a
  // read of part of a chunk (a slice, at another world size) is verified
  // by the blocks it covers. 4 KiB .. 64 MiB. Default:
  // kDefaultChecksumBlockBytes (1 MiB).
  uint64_t checksum_block_bytes = kDefaultChecksumBlockBytes;
  // The format written: 2, or 1 for readers older than format 2 (one
  // checksum per chunk, no layouts: tensors with a layout are refused).
  // Default: kCheckpointFormat.
  uint32_t format_version = kCheckpointFormat;
  // User metadata: a JSON object, stored in the manifest with the step
  // (docs/checkpoint.md §2.1: {"step": N or null, "user": {...}}) and read
  // back as CheckpointManifest::metadata_json. Default: {}.
  std::string metadata_json = "{}";
  // The training step this checkpoint is of, stored in the manifest
  // (CheckpointManifest::step). A Save or SaveAsync with an empty name goes
  // under StepCheckpointName(step), the same name on every rank. Default:
  // none.
  std::optional<uint64_t> step;
  // Keep the newest K committed checkpoints under the root and remove older
  // ones after a commit (rank 0), found in the root's index without a
  // listing (docs/checkpoint.md §7). Default: 0 = keep all.
  uint32_t keep_last = 0;
  // Tells the ranks' part records of this save from those of an earlier,
  // crashed attempt at the same name: rank 0 commits only parts with the
  // same token. Every rank must pass the same value (MPI or
  // torch.distributed can broadcast one). Default: empty (any attempt).
  std::string attempt;
  // How long rank 0 waits for the other ranks' parts, and the other ranks
  // for rank 0's commit. Default: 10 min.
  std::chrono::milliseconds commit_timeout{600000};
  // Ranks other than 0: wait for the commit before the save counts as done.
  // Default: on, so that a finished save means a committed checkpoint.
  bool wait_for_commit = true;
  // How the ranks learn that every part is durable (docs/checkpoint.md
  // §1.1). kStore: rank 0 polls the part records in the store, the others
  // the manifest. kMpi: each rank sends its outcome and part record to rank
  // 0 over MPI, and rank 0 sends back the commit's outcome, so a failed rank
  // is known at once instead of at the commit timeout. Messages go point to
  // point on MPI_COMM_WORLD with stoker's own tags, never interleaving with
  // the job's collectives; MPI's rank and size must equal rank and
  // world_size, and an asynchronous save needs MPI_THREAD_MULTIPLE. kAuto:
  // kMpi when this build has MPI and those hold, else kStore. Default: kAuto.
  enum class Coordination { kAuto, kStore, kMpi };
  Coordination coordination = Coordination::kAuto;
};

struct CheckpointerOptions {
  // Chunk writes (and restore reads) in flight at once. Default: 8.
  uint32_t io_threads = 8;
  // How device tensors reach host memory on a save (docs/checkpoint.md §9).
  // kSnapshot: every device tensor of a save is copied into one pinned
  // staging area (as large as the largest save's device bytes, allocated
  // once and reused by every save), writes starting as each slice lands; an
  // asynchronous save returns once the copies are queued. Memory: pinned
  // host memory of the device state's size, kept. kBounded: a ring of
  // staging_ring_bytes of pinned buffers, one chunk each, refilled as chunks
  // are written: for nodes without host memory for a whole copy; then
  // WaitStaged (the window in which the tensors must not change) lasts
  // about the whole save, at the store's speed. Default: kSnapshot.
  enum class DeviceStaging { kSnapshot, kBounded };
  DeviceStaging device_staging = DeviceStaging::kSnapshot;
  // kBounded's ring, and the pinned buffers a restore into device memory
  // reads through (at least two chunks' worth). Default: 256 MiB.
  uint64_t staging_ring_bytes = 256ull << 20;
  // Attempts after a failed chunk, part or manifest write whose error is
  // retryable (a RADOS timeout, an unavailable OSD); other errors (a full
  // disk, a refused write) fail the save at once. Default: 3.
  uint32_t write_retries = 3;
  // Wait before the first retry, doubled each time. Default: 200 ms.
  std::chrono::milliseconds retry_backoff{200};
  // How often rank 0 looks for the other ranks' parts (and they for the
  // commit). Default: 50 ms.
  std::chrono::milliseconds poll_interval{50};
  // Restore reads chunks past the page cache (O_DIRECT on a POSIX store)
  // where the destination allows it (4 KiB-aligned; Restore's own memory
  // always does): a cold restore streams at the device's rate, and a
  // restored checkpoint does not evict the data a loader keeps cached. A
  // restore of chunks that are in the page cache reads them from the device
  // again. A filesystem without O_DIRECT gets buffered reads. Default: on.
  bool direct_reads = true;
  // Options of the store that OpenCheckpointer opens. Default: chunks
  // written past the page cache (StoreOptions::direct_writes).
  StoreOptions store{.direct_writes = true};
};

// The state of one asynchronous save. Copies share it.
class SaveHandle {
 public:
  SaveHandle() = default;
  // True once the save has finished, committed or failed.
  bool Done() const;
  // Waits for the save; its outcome. Ok means durable (and committed, on
  // rank 0 or with wait_for_commit).
  Status Wait() const;
  // Waits until `deadline`; TimedOut if the save is still running then.
  Status WaitUntil(Deadline deadline) const;
  // Waits until every device tensor of the save has been copied to host
  // staging (at once for a save without device tensors): from then on the
  // caller may change them, e.g. the optimizer step. Ok, or the error that
  // failed the copies (which also fails the save).
  Status WaitStaged() const;
  const std::string& name() const;
  // Calls `f` with the save's outcome once it has finished: at once, on
  // this thread, if it has; else on the thread that finishes it, just
  // before Done() turns true and Wait() returns. For a decorator that
  // accounts for saves (metrics::MeterCheckpointer): unlike Wait it is not
  // asking the handle, so a failure nobody asks about is still said on
  // stderr. `f` must be quick, must not wait on the handle (it runs before
  // the handle is done) and must not use the Checkpointer. An empty handle
  // calls nothing.
  void OnDone(std::function<void(const Status&)> f) const;

  struct State;  // implementation
  explicit SaveHandle(std::shared_ptr<State> s) : state_(std::move(s)) {}

 private:
  std::shared_ptr<State> state_;
};

// What the manifest says about one tensor.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  uint32_t rank = 0;
  // Position in its rank's stream, the concatenation of that rank's chunks.
  uint64_t offset = 0;
  uint64_t bytes = 0;
  TensorLayout layout;  // where it lies in its global tensor (format 2)
};

struct ChunkInfo {
  std::string key;
  uint64_t bytes = 0;
  uint64_t hash = 0;    // format 1: xxh3-64 of the chunk's bytes
  uint64_t offset = 0;  // in its rank's stream (sum of the chunks before it)
  // Format 2: xxh3-64 of each block of block_bytes (the last one shorter),
  // so that a ranged read is verified by the blocks it covers.
  uint64_t block_bytes = 0;
  std::vector<uint64_t> block_hashes;
};

struct RankPart {
  uint32_t rank = 0;
  std::vector<TensorInfo> tensors;
  std::vector<ChunkInfo> chunks;
  uint64_t bytes() const { return chunks.empty() ? 0 : chunks.back().offset + chunks.back().bytes; }
};

struct CheckpointManifest {
  uint32_t format_version = 0;
  std::string name;
  uint64_t sequence = 0;  // commit order under the root, from 1
  std::string created_by;
  int64_t created_unix_ms = 0;
  uint32_t world_size = 1;
  std::string attempt;
  // SaveOptions::metadata_json and SaveOptions::step, as saved. A manifest
  // written before the metadata had its envelope (docs/checkpoint.md §2.1)
  // is all user metadata, its step that object's "step" if an unsigned.
  std::string metadata_json = "{}";
  std::optional<uint64_t> step;
  std::vector<RankPart> ranks;  // by rank, 0 .. world_size-1
  uint64_t bytes() const;
  size_t tensor_count() const;
};

// One entry of List.
struct CheckpointListing {
  std::string name;
  // False for a NAME with objects but no manifest: a save that is running,
  // or one that was killed (Remove deletes it).
  bool committed = false;
  bool latest = false;
  uint64_t sequence = 0, bytes = 0, tensors = 0;
  uint32_t world_size = 0;
  int64_t created_unix_ms = 0;
  uint64_t objects = 0;  // objects under NAME/
  // Set when the manifest is there but damaged (Corruption, Unsupported):
  // the error. Such a checkpoint is listed (sequence 0) and never removed by
  // retention; other errors reading a manifest fail the listing.
  std::string problem;
};

struct RestoreOptions {
  // The rank whose tensors to restore, and the world size of the restoring
  // job. A world size other than the checkpoint's is an error naming both,
  // unless all_ranks is set. Default: 0 of 0 (0 = do not check).
  uint32_t rank = 0;
  uint32_t world_size = 0;
  // Restore every rank's tensors (for a re-shard by the caller, or a tool).
  // Default: off.
  bool all_ranks = false;
  // Only these tensors (by name); empty = all of the chosen rank(s).
  std::vector<std::string> only;
};

// A restored tensor; data points into Restored::memory (or the caller's
// buffer, for RestoreInto).
struct RestoredTensor {
  TensorInfo info;
  std::span<const std::byte> data;
};

struct Restored {
  CheckpointManifest manifest;
  std::vector<RestoredTensor> tensors;  // in manifest order
  // Owns the tensors' memory (each tensor 64-byte aligned, those of 256 KiB
  // or more 4 KiB-aligned); data stays valid
  // while any copy of this pointer lives.
  std::shared_ptr<void> memory;
};

// A caller-owned destination for RestoreInto.
//
// With layout kWhole (the default): the tensor `name` of the restoring rank,
// data exactly its size. With a box or flat layout: a piece of the global
// tensor `name`, of `dtype` and `shape` (box lengths; flat: [numel]), filled
// from whatever pieces the checkpoint's ranks saved of it (docs/
// checkpoint.md §6), reading only the bytes that intersect it: a load on
// another world size or split. A tensor saved whole (without a layout) is a
// box at offset 0 of itself; saved whole by several ranks (replicated), it
// is read from the lowest of them. Such destinations are not bound to the
// restoring rank, and the world-size check does not apply to them.
struct TensorDestination {
  std::string name;
  std::span<std::byte> data;  // exactly the tensor's (or the piece's) size
  TensorLayout layout;
  DType dtype = DType::kUInt8;  // layouts other than kWhole: checked against the stored one
  std::vector<int64_t> shape;   // layouts other than kWhole: the piece's shape
  // Memory of CUDA device `device` (-1: host): its bytes are read into a
  // pinned ring, checked there, and copied in on a copy stream; RestoreInto
  // returns once they have landed.
  int device = -1;
};

// What Verify found.
struct CheckpointVerifyReport {
  uint64_t chunks = 0, bytes = 0, tensors = 0;
  std::vector<std::string> problems;  // one line each, naming chunk and tensors
};

class Checkpointer {
 public:
  virtual ~Checkpointer() = default;

  // The root's URI, for messages.
  virtual const std::string& uri() const = 0;

  // Saves and returns when done (see SaveOptions::wait_for_commit). `name`
  // matches [A-Za-z0-9][A-Za-z0-9._-]{0,127}, or is empty when
  // SaveOptions::step is set (StepCheckpointName(step)); a name already
  // committed is AlreadyExists. Tensor names are unique, 1..1024 bytes of UTF-8 without
  // control characters, and never used as object keys.
  virtual Status Save(std::string_view name, std::span<const TensorRef> tensors,
                      const SaveOptions& options) = 0;

  // Copies the tensors into the staging area, returns, and writes in the
  // background. The caller may change or free its tensors once this returns.
  // Errors found before the copy (bad arguments) are returned here; the
  // rest through the handle.
  virtual Result<SaveHandle> SaveAsync(std::string_view name, std::span<const TensorRef> tensors,
                                       const SaveOptions& options) = 0;

  // Committed and incomplete checkpoints under the root, by sequence
  // (incomplete ones last, by name).
  virtual Result<std::vector<CheckpointListing>> List() = 0;

  // The name `latest` points to; NotFound if there is none.
  virtual Result<std::string> Latest() = 0;

  // A new automatic name, ckpt-NNNNNN (six or more digits), claimed under the
  // root by an exclusive create (Store::Put of NAME/claim, if_absent): no two callers,
  // in one process or several, get the same one, and names that checkpoints
  // already have are skipped. The claim is an object under NAME/ that Remove
  // deletes with the rest.
  virtual Result<std::string> ClaimName() = 0;

  // Reads and checks a manifest. "" or "latest" means the latest.
  virtual Result<CheckpointManifest> ReadManifest(std::string_view name) = 0;

  // Restores into new memory, reading chunks in parallel and verifying each.
  virtual Result<Restored> Restore(std::string_view name, const RestoreOptions& options) = 0;

  // Restores into caller buffers, one per tensor wanted (by name).
  virtual Result<CheckpointManifest> RestoreInto(std::string_view name,
                                                 std::span<const TensorDestination> dst,
                                                 const RestoreOptions& options) = 0;

  // Reads every chunk of every rank and checks sizes and checksums. Returns
  // the manifest's error if it cannot be read; chunk problems are listed in
  // the report (and make the status Corruption).
  virtual Status Verify(std::string_view name, CheckpointVerifyReport* report) = 0;

  // Removes a checkpoint, committed or not: its manifest first (so it is no
  // longer a checkpoint), then the rest of NAME/ (Store::RemoveFolder: its
  // objects and what a killed save left there). If `latest` named it,
  // `latest` moves to the newest remaining commit (or is removed).
  virtual Status Remove(std::string_view name) = 0;
};

// Opens the checkpoint root at `uri` (any store URI, see OpenStore).
Result<std::unique_ptr<Checkpointer>> OpenCheckpointer(std::string_view uri,
                                                       const CheckpointerOptions& options = {});
// Over an already open store (tests, wrappers).
std::unique_ptr<Checkpointer> NewCheckpointer(std::shared_ptr<Store> store,
                                              const CheckpointerOptions& options = {});

// Checks a checkpoint name (InvalidArgument naming what is wrong).
Status ValidateCheckpointName(std::string_view name);

// The name of the checkpoint of training step `step`: "step-" and the step
// in decimal, zero-padded to 12 digits ("step-000000001200"; more digits
// past 10^12). ParseStepCheckpointName is its inverse: the step of a name it
// made, nullopt for any other name ("step-12", "step-0000000012x").
std::string StepCheckpointName(uint64_t step);
std::optional<uint64_t> ParseStepCheckpointName(std::string_view name);

// The name a save goes under (what stoker.save does): `name` when not empty
// (checked), else StepCheckpointName of options.step, else, for a save by
// one rank, a new c.ClaimName(). A save by several ranks with neither is
// InvalidArgument: every rank must save under the same name.
Result<std::string> CheckpointNameFor(Checkpointer& c, std::string_view name,
                                      const SaveOptions& options);

// ---- Saved states: nested structures by key path ---------------------------
//
// A rank may save a nested structure (dicts, lists, tuples, scalars, strings
// and tensors: a PyTorch state dict, an optimizer's state) as its tensors
// plus a structure document, stored as the uint8 tensor "stoker:structure"
// (docs/checkpoint.md §8). stoker.save writes one; StateBuilder writes one
// from C++. Every value has a key path: its keys from the root joined by
// '.', list and tuple items by index ("optim.param_groups.0.lr").
//
// Thread safety: StateStructure is a value (const methods are safe from any
// thread); a StateBuilder belongs to one thread.

inline constexpr std::string_view kStructureTensor = "stoker:structure";

// One value of a structure.
struct StateEntry {
  std::string path;  // "" for the root
  // "dict", "odict", "list", "tuple" (containers); "tensor", "parameter",
  // "ndarray" (tensors); "none", "bool", "int", "float", "str", "bytes",
  // "complex", "dtype", "device", "size", "numpy" (scalars).
  std::string type;
  std::string tensor;  // tensors: the checkpoint tensor holding it
  std::string value;   // scalars: the value as JSON text
  size_t items = 0;    // containers: how many items
  int depth = 0;       // 0 for the root
};

class StateStructure {
 public:
  // Parses a structure document; Corruption naming `where` when it is not
  // one (or names a tensor twice in a way §8 forbids), Unsupported for a
  // newer version.
  static Result<StateStructure> Parse(std::span<const std::byte> document, std::string_view where);

  // Every value, depth first in document order (a container before its
  // items).
  const std::vector<StateEntry>& entries() const { return entries_; }

  // The value at `path`. A key that holds '.' is matched whole, so
  // "a.b" finds {"a.b": x} as well as {"a": {"b": x}} (the first in
  // document order). NotFound naming the path and the nearest container.
  Result<StateEntry> Find(std::string_view path) const;

 private:
  std::vector<StateEntry> entries_;
};

// Builds a structure of dicts from C++: each value set at a key path, dicts
// made as needed, in the order first set.
class StateBuilder {
 public:
  StateBuilder();
  ~StateBuilder();
  StateBuilder(StateBuilder&&) noexcept;
  StateBuilder& operator=(StateBuilder&&) noexcept;

  // The tensor is stored under its path as its name. InvalidArgument when
  // the path is empty, a component is empty, or a value is there already.
  Status SetTensor(std::string_view path, DType dtype, std::vector<int64_t> shape,
                   std::span<const std::byte> data);
  Status SetInt(std::string_view path, int64_t v);
  Status SetFloat(std::string_view path, double v);
  Status SetString(std::string_view path, std::string_view v);
  Status SetBool(std::string_view path, bool v);

  // What to save: the tensors set, then "stoker:structure". Valid while the
  // builder lives (the structure's bytes are its own).
  std::vector<TensorRef> Tensors();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Rank `rank`'s structure in checkpoint `name` ("" = the latest); NotFound
// when that rank saved a flat set of tensors (no "stoker:structure").
Result<StateStructure> ReadStateStructure(Checkpointer& c, std::string_view name,
                                          uint32_t rank = 0);

// Restores the tensor at key `path` of rank `rank`'s state into `dst`
// (exactly its size; InvalidArgument naming both sizes otherwise); returns
// what the manifest says of it. NotFound for a path that is not there,
// InvalidArgument for one that holds no tensor.
Result<TensorInfo> RestoreStatePath(Checkpointer& c, std::string_view name, std::string_view path,
                                    std::span<std::byte> dst, uint32_t rank = 0);

// ---- Saved states as trees: what a language binding saves and loads --------
//
// EncodeState turns a tree of values into the tensors and the structure
// document that Save takes; LoadState restores a rank's state back into a
// tree, reading tensors into caller memory where the caller says so. The
// policy lives here, not in a binding: how tensors are named (key paths made
// unique and valid), tied tensors stored once, the document's encoding, the
// world-size rule of a load. A binding only converts its objects (the Python
// package: python/ckpt_state.cc). Thread safety: values; free functions.

struct StateValue {
  enum class Kind : uint8_t {
    kNone,
    kBool,
    kInt,
    kFloat,
    kStr,
    kBytes,
    kComplex,
    kDType,
    kDevice,
    kSize,
    kNumpy,
    kList,
    kTuple,
    kDict,
    kODict,
    kTensor,
    kParameter,
    kNdarray,
  };
  Kind kind = Kind::kNone;
  bool flag = false;          // kBool: the value; tensors: requires_grad
  double real = 0, imag = 0;  // kFloat (real); kComplex
  // kInt: decimal digits, any size; kStr, kBytes: the bytes; kDType: a
  // DTypeName; kDevice: e.g. "cuda:0"; kNumpy: the numpy dtype's name;
  // tensors: the checkpoint tensor's name (set by EncodeState and LoadState).
  std::string text;
  // kList, kTuple, kSize (kInt items): the items; kDict, kODict: key, value,
  // key, value, ...; kNumpy: its one value.
  std::vector<StateValue> items;
  // Dict keys: the key as a component of key paths and tensor names (the
  // Python package: a str as it is, an int in decimal, else its repr).
  std::string component;
  // Tensors: element type, shape and bytes (LoadState: in Loaded::memory, or
  // the caller's destination).
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
  // Tensors to save: the same non-empty `tie` is the same tensor (tied
  // weights), stored once. LoadState: the index of the destination it was
  // read into, or -1.
  std::string tie;
  int64_t destination = -1;
  // Tensors: where the tensor lies in a global one (a piece of a sharded
  // tensor, saved with it; LoadState: as the part record says).
  TensorLayout layout;
  // Tensors to save: in memory of this CUDA device (-1: host), written on
  // `stream` (TensorRef::device, TensorRef::stream).
  int device = -1;
  void* stream = nullptr;
};

struct EncodedState {
  std::vector<TensorRef> tensors;  // the state's tensors, then "stoker:structure"
  std::string document;            // the structure's bytes (tensors.back())
  uint64_t tensor_bytes = 0;       // of the state's tensors, without the document
};

// The tensors and structure document of a state (docs/checkpoint.md §8).
// Tensor names are the key paths joined by '.', "state" for a tensor at the
// root, cut to fit kMaxTensorNameBytes and made unique with "~2", "~3", ...;
// each tensor's `text` is set to its name. InvalidArgument for a tree that
// is no state (a dict with an odd item count, a tag-less value).
Result<EncodedState> EncodeState(StateValue& root);

struct StateLoadOptions {
  // The rank to load and the job's world size (0: not checked), as
  // RestoreOptions. Default: 0 of 0.
  uint32_t rank = 0;
  uint32_t world_size = 0;
  // A checkpoint of one rank loads as rank 0 whatever rank and world size
  // say (a replicated state, as torch.load would). Default: off.
  bool any_world_if_single = false;
  // Every rank's state. Default: off.
  bool all_ranks = false;
  // A load of another world size or split (docs/checkpoint.md §6.1), for a
  // plan whose destinations are pieces (TensorDestination::layout): the
  // world-size check is off, and the structure, scalars and tensors without
  // a layout are rank `rank`'s where the checkpoint has that rank, else
  // rank 0's (replicated state: RNG seeds, a step, a loader position that is
  // global). Pieces are filled from every rank's. Default: off.
  bool reshard = false;
};

struct LoadedState {
  CheckpointManifest manifest;  // of the checkpoint loaded (never "latest")
  // By rank (every rank with all_ranks, else only the one loaded; rank
  // parts that are missing come back as empty dicts). A rank saved without
  // a structure is a dict of its tensors by name.
  std::vector<StateValue> roots;
  std::vector<uint32_t> ranks;
  std::shared_ptr<void> memory;  // owns the tensors not read into destinations
};

// Loads rank states of checkpoint `name` ("" or "latest": the latest). With
// `plan`, the caller chooses destinations for one rank's tensors once the
// structure is known and before anything else is read: it gets the root
// (tensors without data) and fills `dst`; LoadState reads those tensors into
// them (each tensor's `destination` says which) and the rest into new memory.
using StatePlan = std::function<Status(const StateValue& root, const CheckpointManifest& m,
                                       std::vector<TensorDestination>* dst)>;
Result<LoadedState> LoadState(Checkpointer& c, std::string_view name,
                              const StateLoadOptions& options, const StatePlan& plan = nullptr);

}  // namespace stoker
