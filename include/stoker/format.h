// Dataset format v1: the manifest and the shards, as docs/format.md specifies
// them byte by byte. The constants here point to that document's sections.
//
// A dataset is a set of objects in one store: one manifest (the commit: a
// dataset exists once its manifest does) and shards, each one storage object
// of about a target size (default 4 MiB, Ceph's object size) holding whole
// samples, an index and a checksum per sample.
//
// Thread safety: ShardBuilder is not thread-safe (one builder per thread).
// ShardView is a read-only view; it may be shared between threads once built.
// The free functions are reentrant.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::format {

// docs/format.md §1.
inline constexpr uint32_t kFormatVersion = 1;
// Default: 4 MiB, Ceph's default object size (rados object_size).
inline constexpr uint64_t kDefaultShardBytes = 4ull << 20;
// Every shard's size is a multiple of this, so a whole shard can be read with
// O_DIRECT. 4 KiB: the logical block size of NVMe.
inline constexpr uint64_t kShardAlignment = 4096;
// docs/format.md §2: the manifest's key inside the dataset's store.
inline constexpr std::string_view kManifestKey = "manifest.stoker";
// docs/format.md §3.1.
inline constexpr size_t kShardHeaderBytes = 64;
inline constexpr char kShardMagic[8] = {'S', 'T', 'O', 'K', 'S', 'H', 'R', 'D'};
// Upper bounds that keep a corrupt manifest or index from asking for absurd
// allocations. docs/format.md §4.
inline constexpr uint32_t kMaxFields = 64;
inline constexpr uint64_t kMaxShardBytes = 1ull << 32;  // 4 GiB
// The manifest's header line: the longest valid one is 64 bytes (§2.1).
inline constexpr size_t kMaxManifestHeaderBytes = 128;
// Shard keys are short relative paths (§2.4).
inline constexpr size_t kMaxKeyBytes = 512;
// A valid manifest body nests 3 deep (§2.4).
inline constexpr int kMaxJsonDepth = 8;
// Field names are [A-Za-z0-9_]{1,64} (§2.2).
inline constexpr size_t kMaxFieldNameBytes = 64;

// Bytes of one index entry for `field_count` fields: round_up(16 + 4 *
// field_count, 8). docs/format.md §3.3.
constexpr uint32_t IndexEntryBytes(uint32_t field_count) {
  return (16 + 4 * field_count + 7) / 8 * 8;
}

using DatasetId = std::array<uint8_t, 16>;

enum class FieldType : uint8_t {
  kBytes = 1,  // variable-length raw bytes (an encoded image, a token array)
  kInt64 = 2,  // one little-endian int64 (a class label)
};
std::string_view FieldTypeName(FieldType t);

struct FieldSpec {
  std::string name;  // [A-Za-z0-9_]{1,64}, unique within a dataset
  FieldType type = FieldType::kBytes;
};

// One shard as the manifest lists it.
struct ShardInfo {
  std::string key;            // e.g. "shards/000000.stks"
  uint64_t bytes = 0;         // object size, a multiple of kShardAlignment
  uint32_t samples = 0;       // samples in the shard
  uint64_t first_sample = 0;  // global index of its first sample
  uint64_t index_hash = 0;    // xxh3-64 of the shard's index (§3.3)
};

struct Manifest {
  uint32_t format_version = kFormatVersion;
  DatasetId dataset_id{};            // random, fixed at pack time
  std::vector<FieldSpec> fields;     // the schema, in record order
  std::vector<std::string> classes;  // label names by label value; may be empty
  uint64_t sample_count = 0;         // == sum of shards[i].samples
  uint64_t payload_bytes = 0;        // sum of all samples' record sizes
  uint64_t max_sample_bytes = 0;     // largest sample record
  std::vector<ShardInfo> shards;     // in global sample order
  std::string created_by;            // e.g. "stoker 0.1.0 pack"

  // Hex form of dataset_id (32 lowercase hex digits).
  std::string IdHex() const;
  // dataset_id folded to 64 bits: the epoch plan's dataset identity.
  uint64_t Id64() const;
  // Index of the field called `name`, or -1.
  int FieldIndex(std::string_view name) const;
  // Shard holding global sample `sample` (binary search), or -1.
  int64_t ShardOf(uint64_t sample) const;
};

// Serialises a manifest (§2): a header line with version, length and xxh3-64
// of the body, then a JSON body.
std::string EncodeManifest(const Manifest& m);

// Parses and validates a manifest. `where` names it in messages (its URI).
// Every inconsistency (bad header, checksum, JSON, schema, shard list that
// does not add up) is Corruption; a newer format version is Unsupported.
Result<Manifest> DecodeManifest(std::span<const std::byte> data, std::string_view where);

// A new random dataset id: 16 bytes from getrandom(2). docs/format.md §5.2.
DatasetId NewDatasetId();

// The key of shard `shard_number` by the writer's convention (§1):
// "shards/000000.stks", zero-padded to at least 6 digits.
std::string ShardKey(uint32_t shard_number);

// One field value of a sample, as given to ShardBuilder::Add.
struct FieldValue {
  std::span<const std::byte> bytes;  // for kBytes
  int64_t i64 = 0;                   // for kInt64
};

// Builds one shard in memory (§3). Add samples until SizeWith says the next
// would pass the target, then Finish.
class ShardBuilder {
 public:
  ShardBuilder(std::vector<FieldSpec> fields, DatasetId dataset_id, uint32_t shard_number);

  // Size in bytes of the finished shard if `values` were added now
  // (aligned; header, records and index included).
  uint64_t SizeWith(std::span<const FieldValue> values) const;
  // Appends a sample. InvalidArgument if the values do not match the schema
  // or the shard would pass kMaxShardBytes.
  Status Add(std::span<const FieldValue> values);
  uint32_t sample_count() const { return sample_count_; }
  // Sum of the record sizes added so far.
  uint64_t payload_bytes() const { return payload_bytes_; }
  uint64_t max_sample_bytes() const { return max_sample_bytes_; }
  // The finished shard object and its xxh3-64 index hash. The builder is
  // empty afterwards and may not be reused. A valid shard holds at least one
  // sample (§3.1): finishing an empty builder gives one that Parse refuses.
  std::vector<std::byte> Finish(uint64_t* index_hash);

 private:
  std::vector<FieldSpec> fields_;
  DatasetId dataset_id_;
  uint32_t shard_number_;
  uint32_t sample_count_ = 0;
  uint64_t payload_bytes_ = 0;
  uint64_t max_sample_bytes_ = 0;
  std::vector<std::byte> data_;   // header placeholder + records
  std::vector<std::byte> index_;  // index entries
};

// What a shard must agree with; from the manifest. Non-owning: the manifest
// it was made from must outlive it.
struct ShardExpectation {
  std::string_view key;  // names the shard in messages
  // The schema. When its size is field_count, Parse also checks that int64
  // fields have length 8 (§3.4 check 17); it may be left empty.
  std::span<const FieldSpec> fields;
  uint32_t shard_number = 0;  // position in manifest.shards
  DatasetId dataset_id{};
  uint32_t field_count = 0;
  uint32_t samples = 0;
  uint64_t bytes = 0;
  uint64_t index_hash = 0;
  uint64_t first_sample = 0;  // global index of its first sample (messages)
};
// Precondition: shard_number < m.shards.size() (otherwise the expectation
// matches no shard and Parse fails).
ShardExpectation ExpectationFor(const Manifest& m, uint32_t shard_number);

// A validated, zero-copy view of a whole shard held in memory.
class ShardView {
 public:
  ShardView() = default;

  // Checks header (magic, version, header hash), identity (dataset id, shard
  // number, sample and field counts, size), and that the index hashes to the
  // expected value and every entry lies inside the record area. Sample
  // checksums are checked one by one by VerifySample. `shard` must outlive
  // the view. Errors name the shard key.
  static Result<ShardView> Parse(std::span<const std::byte> shard, const ShardExpectation& expect);

  // The same checks, without a manifest to compare against (inspect, fuzzing).
  static Result<ShardView> ParseStandalone(std::span<const std::byte> shard, std::string_view key);

  // Reading records one by one (the loader's per-sample reads): the byte
  // range of a shard that holds its index, from the manifest alone, and a
  // view of only the header (its first kShardHeaderBytes) and that range
  // (`tail`, read at `tail_offset`). The checks are Parse's, except those
  // that need the records; CheckRecord then checks each record as it lands.
  // Record, Field and VerifySample of such a view have no records to give.
  static void IndexRange(const ShardExpectation& expect, uint64_t* offset, uint64_t* length);
  static Result<ShardView> ParseIndex(std::span<const std::byte> header,
                                      std::span<const std::byte> tail, uint64_t tail_offset,
                                      const ShardExpectation& expect);

  uint32_t sample_count() const { return sample_count_; }
  uint32_t field_count() const { return field_count_; }
  // Header values, for inspect.
  const DatasetId& dataset_id() const { return dataset_id_; }
  uint32_t shard_number() const { return shard_number_; }
  uint64_t index_offset() const { return index_offset_; }
  uint64_t index_hash() const { return index_hash_; }
  uint64_t first_sample() const { return first_sample_; }
  const std::string& key() const { return key_; }

  // Hot path: O(field_count), no allocation, no further bounds checks needed
  // (Parse proved every record lies inside the shard). An out-of-range `i` or
  // `f` gives an empty span (Int64: 0).
  //
  // The whole record of sample `i` (all fields, concatenated).
  std::span<const std::byte> Record(uint32_t i) const;
  // Field `f` of sample `i`: the raw bytes (for an int64 field, its 8 bytes).
  std::span<const std::byte> Field(uint32_t i, uint32_t f) const;
  // Field `f` of sample `i` as an int64 (little-endian). 0 unless the field
  // is 8 bytes long, which Parse guarantees for the schema's int64 fields.
  int64_t Int64(uint32_t i, uint32_t f) const;
  // Recomputes sample `i`'s checksum. Corruption "KEY: sample I (global G):
  // checksum mismatch" when it differs.
  Status VerifySample(uint32_t i) const;
  // Checks the padding after the index is zero (verify's full check).
  Status VerifyPadding() const;
  // Where sample `i`'s record starts in the shard, and field `f`'s length
  // (0 when out of range): for reading a record without the shard in memory.
  uint64_t RecordOffset(uint32_t i) const;
  uint32_t FieldLength(uint32_t i, uint32_t f) const;
  // Compares `hash` (Hash64 of sample `i`'s record, however it was read)
  // with the index: VerifySample's check and message.
  Status CheckRecord(uint32_t i, uint64_t hash) const;

 private:
  // What ParseCommon checks: the header, the object's size, and bytes of it
  // that hold the index (for a whole shard: all of it, from 0, and the view
  // keeps it as its records).
  struct Parts {
    std::span<const std::byte> header;
    uint64_t size = 0;
    std::span<const std::byte> tail;
    uint64_t tail_offset = 0;
    bool whole = false;
  };
  static Result<ShardView> ParseCommon(const Parts& parts, std::string_view key,
                                       const ShardExpectation* expect);

  std::span<const std::byte> shard_;
  std::string key_;
  uint32_t sample_count_ = 0;
  uint32_t field_count_ = 0;
  uint32_t entry_bytes_ = 0;
  uint32_t shard_number_ = 0;
  uint64_t index_offset_ = 0;
  uint64_t index_hash_ = 0;
  uint64_t first_sample_ = 0;
  DatasetId dataset_id_{};
  const std::byte* index_ = nullptr;
};

// xxh3-64, the checksum of the format (libxxhash).
uint64_t Hash64(std::span<const std::byte> data);

// Hash64 of bytes handed over in pieces, in order: Update(a), Update(b),
// Digest() equals Hash64 of a followed by b. Lets a reader check each piece
// as it lands, while it is still in cache, instead of reading it all back.
class Hash64Stream {
 public:
  Hash64Stream();
  ~Hash64Stream();
  Hash64Stream(const Hash64Stream&) = delete;
  Hash64Stream& operator=(const Hash64Stream&) = delete;

  void Update(std::span<const std::byte> data);
  uint64_t Digest() const;

 private:
  void* state_;  // an XXH3_state_t of the implementation picked at run time
  bool avx2_;
};

}  // namespace stoker::format
