// Dataset format v3: the manifest, the shard table and the shards, as
// docs/format.md specifies them byte by byte. The constants here point to
// that document's sections.
//
// A dataset is a set of objects in one store: one manifest (the commit: a
// dataset exists once its manifest does), one shard table (a binary file of
// fixed records, one per shard, that the manifest names) and shards, each
// one storage object of about a target size (default 4 MiB, Ceph's object
// size) holding whole samples, an index and a checksum per sample. Datasets
// written by format v1 list their shards in the manifest itself; they are
// still read.
//
// Thread safety: ShardBuilder and ShardTableReader are not thread-safe (one
// per thread). ShardView and ShardTable are read-only once built; they may
// be shared between threads. The free functions are reentrant.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::format {

// docs/format.md §1: the dataset's format version, the manifest's. Version 2
// moved the shard list out of the manifest into the shard table (§7);
// version 3 added the typed fields (float, str, json, arrays; §3.2). This
// build reads versions 1 to 3 and writes the lowest that holds the schema
// (FormatVersionFor): a dataset of bytes and int64 fields is still v2, so
// older readers open it.
inline constexpr uint32_t kFormatVersion = 3;
// §3.1: the shard object's own version, unchanged since format v1.
inline constexpr uint32_t kShardVersion = 1;
// Default: 4 MiB, Ceph's default object size (rados object_size).
inline constexpr uint64_t kDefaultShardBytes = 4ull << 20;
// Every shard's size is a multiple of this, so a whole shard can be read with
// O_DIRECT. 4 KiB: the logical block size of NVMe.
inline constexpr uint64_t kShardAlignment = 4096;
// docs/format.md §2: the manifest's key inside the dataset's store.
inline constexpr std::string_view kManifestKey = "manifest.stoker";
// docs/format.md §7: the shard table's key, as the writer names it (readers
// take the key from the manifest), and its layout.
inline constexpr std::string_view kShardTableKey = "shards.table";
inline constexpr char kShardTableMagic[8] = {'S', 'T', 'O', 'K', 'S', 'T', 'B', 'L'};
inline constexpr uint32_t kShardTableVersion = 1;
inline constexpr size_t kShardTableHeaderBytes = 64;
inline constexpr uint32_t kShardTableRecordBytes = 24;
// Records under one checksum. 65536 records are 1.5 MiB: a block is one
// ranged read, and a bad block names at most that many shards.
inline constexpr uint32_t kShardTableBlockRecords = 65536;
// Readers refuse larger blocks (§7.3): bounds what one block read allocates.
inline constexpr uint32_t kMaxShardTableBlockRecords = 1u << 20;
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
  kBytes = 1,    // variable-length raw bytes (an encoded image, audio, anything)
  kInt64 = 2,    // one little-endian int64 (a class label)
  kFloat32 = 3,  // one little-endian IEEE 754 binary32 (format 3)
  kFloat64 = 4,  // one little-endian IEEE 754 binary64 (format 3)
  kString = 5,   // UTF-8 text, any length (format 3)
  kJson = 6,     // one JSON value (RFC 8259), UTF-8, kept byte for byte (format 3)
  kArray = 7,    // a typed array of a dtype and a shape (format 3, §3.2)
};
std::string_view FieldTypeName(FieldType t);

// Element types of kArray fields (§3.2), little-endian.
enum class DType : uint8_t {
  kUInt8 = 1,
  kUInt16 = 2,
  kUInt32 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat16 = 6,   // IEEE 754 binary16
  kBFloat16 = 7,  // the upper 16 bits of a binary32
  kFloat32 = 8,
};
std::string_view DTypeName(DType d);
// Bytes of one element.
uint32_t DTypeBytes(DType d);
// "uint16" -> kUInt16; false for a name that is no dtype.
bool ParseDType(std::string_view name, DType* out);

// §3.5: the block size of a token field's block checksums, by default.
// 512 bytes: a window of L = 2048 uint16 tokens (4,098 bytes) whose ends
// cut documents reads, verified, the blocks holding its two ends whole:
// B bytes more than its tokens on average (each cut block is read by the
// windows on both of its sides), so 1 + B / 4098 = 1.125x of the token
// bytes with uint16 (1.06x with uint32), plus 8 / B = 1.6% for the
// checksums themselves and the shards' indexes read at open. 1 KiB would be
// 1.25x + 0.8%, 4 KiB 2x (more than reading whole documents of under 4 KiB).
// The hash of 512 bytes costs about what the request's bookkeeping does.
inline constexpr uint32_t kDefaultTokenBlockBytes = 512;
inline constexpr uint32_t kMinTokenBlockBytes = 64;
inline constexpr uint32_t kMaxTokenBlockBytes = 1u << 20;
// An array field's shape has at most this many dimensions (§3.2).
inline constexpr size_t kMaxArrayDims = 8;
// A dimension of an array's shape that varies per sample (JSON null).
inline constexpr int64_t kVariableDim = -1;

struct FieldSpec {
  std::string name;  // [A-Za-z0-9_]{1,64}, unique within a dataset
  FieldType type = FieldType::kBytes;
  // kArray only: the element type and the shape of one sample's value, each
  // dimension >= 1, or kVariableDim for the first (a value holding any
  // number of rows of the rest, zero included). A shape of no dimensions is
  // one element.
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  // Optional (format 3): the name the field has in another format, which
  // the WebDataset exporter gives its members ("seg.png" for a field named
  // seg_png). Empty: the field's name.
  std::string ext;
  // Optional (format 3, §3.5): this field holds the block checksums of the
  // token field named here (an integer array of shape [*] of the same
  // schema): one u64 H(block) per block of `block_bytes` bytes of that
  // field's value, the last block possibly short. The field is kBytes and
  // its length in each record is 8 x ceil(token bytes / block_bytes). The
  // writer adds it (WriterOptions::token_block_bytes); a reader of token
  // windows checks only the blocks a window touches. Empty: not one.
  std::string block_sums_of;
  // The block size of a block-sums field, a power of two in
  // kMinTokenBlockBytes..kMaxTokenBlockBytes; 0 for any other field.
  uint32_t block_bytes = 0;

  bool operator==(const FieldSpec&) const = default;
  // kArray: bytes of one row (the product of the fixed dimensions times the
  // dtype's size); other types: 0.
  uint64_t RowBytes() const;
  // The value length this field always has (8 for int64, 4 for float32, an
  // array of fixed shape's bytes), or 0 when it varies per sample.
  uint64_t FixedBytes() const;
  // Empty when a value of `length` bytes fits this field, else why not
  // ("has 6 bytes, expected a multiple of 4 (uint32 rows of 1)").
  std::string LengthProblem(uint64_t length) const;
  // "tokens (array uint32 [*])": the field in messages.
  std::string Describe() const;
};

// Checks a schema as §2.4 does (1..kMaxFields fields, names, unique names,
// array dtypes and shapes, exts): InvalidArgument naming the field.
Status CheckSchema(std::span<const FieldSpec> fields);
// The name the writer gives the block-sums field of token field `name`:
// NAME_sums, NAME cut to its first 59 bytes so that the name fits 64.
std::string BlockSumsFieldName(std::string_view name);
// The block-sums field (§3.5) of token field `tokens` in blocks of
// `block_bytes`.
FieldSpec BlockSumsFieldFor(const FieldSpec& tokens, uint32_t block_bytes);
// 8 x the number of blocks of `token_bytes` bytes in blocks of
// `block_bytes`: a block-sums field's length in a record (§3.5).
constexpr uint64_t BlockSumsBytes(uint64_t token_bytes, uint32_t block_bytes) {
  return 8 * ((token_bytes + block_bytes - 1) / block_bytes);
}
// The block sums of `tokens` (§3.5: Hash64 of each block of `block_bytes`,
// the last one short, as u64 little-endian) into `sums`, of
// BlockSumsBytes(tokens.size(), block_bytes) bytes.
void FillBlockSums(std::span<const std::byte> tokens, uint32_t block_bytes,
                   std::span<std::byte> sums);
// The first block of `tokens` whose sum in `sums` does not match, or -1.
// `tokens` starts on a block boundary and ends on one or at the field's
// end; `sums` holds the sums of its blocks (8 bytes each, no fewer).
int64_t FirstBadBlock(std::span<const std::byte> tokens, std::span<const std::byte> sums,
                      uint32_t block_bytes);
// True for a field that can be a token field: an array of an integer dtype
// (uint8, uint16, uint32, int32, int64) and shape [*].
bool TokenShaped(const FieldSpec& f);

// Empty when field j's block-sums keys (§3.5) are right within `fields`
// (none; or a bytes field whose block_bytes is a power of two in range and
// whose block_sums_of names a token-shaped field no other field sums),
// else why not.
std::string BlockSumsProblem(std::span<const FieldSpec> fields, size_t j);
// True for a name matching [A-Za-z0-9_]{1,64}.
bool ValidFieldName(std::string_view name);
// Parses a field type as users write it: "bytes", "int64", "float32",
// "float64", "str", "json", an image kind ("jpeg", "png", "image": bytes),
// or "DTYPE[SHAPE]" for an array, e.g. "uint32[*]", "float32[3,224,224]",
// "uint8[*,3]", "float16[]" ("*" the variable first dimension).
Result<FieldSpec> ParseFieldSpec(std::string_view name, std::string_view type);
// The lowest format version that can hold `fields`: 2 for bytes and int64
// fields without exts, else 3.
uint32_t FormatVersionFor(std::span<const FieldSpec> fields);

// One shard as the manifest (format v1) or the shard table (§7) lists it.
struct ShardInfo {
  std::string key;            // e.g. "shards/000000.stks"
  uint64_t bytes = 0;         // object size, a multiple of kShardAlignment
  uint32_t samples = 0;       // samples in the shard
  uint64_t first_sample = 0;  // global index of its first sample
  uint64_t index_hash = 0;    // xxh3-64 of the shard's index (§3.3)
};

// A dataset written in parts (§2.6): part j's shards lie under PREFIX/ as
// that part's own dataset wrote them, numbered from 0 and carrying its id.
struct PartRef {
  std::string prefix;      // "parts/000003"
  DatasetId dataset_id{};  // the part's own id, in its shards' headers
  uint32_t shards = 0;     // its shard count (>= 1)
};

// The shards of a dataset, in global sample order, held compactly: 20 bytes
// per shard and nothing allocated per shard (a prefix sum of the sample
// counts, the sizes in units of kShardAlignment, the index hashes). A key is
// ShardKey(i), made when asked for; only a table decoded from a v1 manifest
// whose keys are not all ShardKey(i) keeps one string per shard.
//
// It reads like a std::vector<ShardInfo> (size, operator[], iteration, each
// giving a ShardInfo by value); loops over many shards use the per-field
// accessors, which neither allocate nor format a key.
//
// Thread safety: const methods may be called from many threads at once;
// push_back, reserve and clear need external synchronisation.
class ShardTable {
 public:
  class const_iterator {
   public:
    using value_type = ShardInfo;
    using reference = ShardInfo;
    using difference_type = std::ptrdiff_t;
    using iterator_category = std::input_iterator_tag;
    struct Arrow {
      ShardInfo info;
      const ShardInfo* operator->() const { return &info; }
    };
    const_iterator() = default;
    const_iterator(const ShardTable* t, size_t i) : t_(t), i_(i) {}
    ShardInfo operator*() const { return (*t_)[i_]; }
    Arrow operator->() const { return {(*t_)[i_]}; }
    const_iterator& operator++() {
      ++i_;
      return *this;
    }
    const_iterator operator++(int) {
      const_iterator old = *this;
      ++i_;
      return old;
    }
    bool operator==(const const_iterator& o) const { return i_ == o.i_; }
    bool operator!=(const const_iterator& o) const { return i_ != o.i_; }

   private:
    const ShardTable* t_ = nullptr;
    size_t i_ = 0;
  };

  size_t size() const { return index_hash_.size(); }
  bool empty() const { return index_hash_.empty(); }
  void reserve(size_t n);
  void clear();

  // Appends shard size(). Its first sample is the sum of the samples before
  // it (the format's rule, §2.4): `s.first_sample` is not stored. Requires
  // `s.bytes` to be a multiple of kShardAlignment, at most kMaxShardBytes,
  // and `s.samples` >= 1, as every valid shard's are (the decoders check
  // this before they append).
  void push_back(const ShardInfo& s);
  // push_back of shard size() with the key ShardKey(size()): what the shard
  // table's records are.
  void AppendNumbered(uint64_t bytes, uint32_t samples, uint64_t index_hash);

  // Precondition for each: i < size().
  std::string key(size_t i) const;
  uint64_t bytes(size_t i) const { return uint64_t{units_[i]} * kShardAlignment; }
  uint32_t samples(size_t i) const { return static_cast<uint32_t>(first_[i + 1] - first_[i]); }
  uint64_t first_sample(size_t i) const { return first_[i]; }
  uint64_t index_hash(size_t i) const { return index_hash_[i]; }
  ShardInfo operator[](size_t i) const;
  ShardInfo back() const { return (*this)[size() - 1]; }
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size()}; }

  // Sum of all samples (first_sample(size())).
  uint64_t total_samples() const { return first_.back(); }
  // Sum of all shards' bytes. O(shards).
  uint64_t total_bytes() const;
  // Shard holding global sample `sample` (binary search), or -1.
  int64_t ShardOf(uint64_t sample) const;
  // The shard whose key is `key`, or -1. O(1) when every key is ShardKey(i);
  // a scan of the keys otherwise (a v1 manifest's own keys): callers that
  // look up keys often then keep their own map.
  int64_t Find(std::string_view key) const;
  // Some key is not ShardKey(i) (only in tables from v1 manifests).
  bool has_own_keys() const { return !keys_.empty(); }

  // A dataset of parts (§2.6): shard i is shard `local` of part `part`, its
  // key PREFIX/ShardKey(local). Set before or after the records; kept by
  // clear(). O(parts) memory; lookups O(log parts).
  void SetParts(std::vector<PartRef> parts);
  const std::vector<PartRef>& parts() const { return parts_; }
  // Where shard i lies: its part (-1 without parts) and number there (i
  // without parts). Needs no records: i may be any shard the parts cover.
  int32_t PartOf(size_t i, uint32_t* local) const;
  // The key of shard i from the parts alone (ShardKey(i) without parts).
  std::string NumberedKey(size_t i) const;

 private:
  void AppendFields(uint64_t bytes, uint32_t samples, uint64_t index_hash);

  std::vector<uint64_t> first_{0};    // size() + 1 entries: prefix sums of samples
  std::vector<uint32_t> units_;       // bytes / kShardAlignment
  std::vector<uint64_t> index_hash_;  // one per shard
  std::vector<std::string> keys_;     // empty, or one per shard (see has_own_keys)
  std::vector<PartRef> parts_;        // empty, or the parts (§2.6)
  std::vector<uint32_t> part_first_;  // parts_.size() + 1: prefix sums of their shards
};

// What a v2 manifest says of its shard table (§2.2): enough to find it and to
// know it is the one the manifest was committed with.
struct ShardTableRef {
  std::string key;           // the table's key in the dataset's store
  uint64_t records = 0;      // == number of shards
  uint64_t bytes = 0;        // exact object size
  uint64_t header_hash = 0;  // the table's header_hash field (§7.1)
};

struct Manifest {
  uint32_t format_version = kFormatVersion;
  DatasetId dataset_id{};            // random, fixed at pack time
  std::vector<FieldSpec> fields;     // the schema, in record order
  std::vector<std::string> classes;  // label names by label value; may be empty
  uint64_t sample_count = 0;         // == sum of shards[i].samples
  uint64_t payload_bytes = 0;        // sum of all samples' record sizes
  uint64_t max_sample_bytes = 0;     // largest sample record
  // In global sample order. DecodeManifest fills it from a v1 manifest; for
  // v2 it stays empty until DecodeShardTable (or a ShardTableReader) reads
  // the table that `table` names. ReadManifest (stoker/dataset.h) does both.
  ShardTable shards;
  // v2: the shard table. Empty key for a v1 manifest, whose shards it lists.
  // EncodeShardTable sets it.
  ShardTableRef table;
  std::string created_by;  // e.g. "stoker 0.1.0 pack"

  // Hex form of dataset_id (32 lowercase hex digits).
  std::string IdHex() const;
  // dataset_id folded to 64 bits: the epoch plan's dataset identity.
  uint64_t Id64() const;
  // Index of the field called `name`, or -1.
  int FieldIndex(std::string_view name) const;
  // Shard holding global sample `sample` (binary search), or -1.
  int64_t ShardOf(uint64_t sample) const { return shards.ShardOf(sample); }
};

// Serialises a manifest of format v2 (§2): a header line with version,
// length and xxh3-64 of the body, then a JSON body with the schema, the
// totals and `m.table`, the reference to the shard table. Set `m.table` with
// EncodeShardTable first; the writer stores the table, then the manifest.
std::string EncodeManifest(const Manifest& m);

// Serialises `m` as a format v1 manifest, which lists every shard in its
// JSON body (§2.5). This build reads such manifests and no longer writes
// them; for tests and tools that make the datasets older versions wrote.
std::string EncodeManifestV1(const Manifest& m);

// Parses and validates a manifest. `where` names it in messages (its URI).
// Every inconsistency (bad header, checksum, JSON, schema, shard list that
// does not add up) is Corruption; a newer format version is Unsupported.
// A v1 manifest comes back whole; a v2 one with `table` set and `shards`
// empty: its shards are in the table (DecodeShardTable, ShardTableReader).
Result<Manifest> DecodeManifest(std::span<const std::byte> data, std::string_view where);

// The shard table of `m.shards` (§7), `block_records` records under each
// block checksum (writers use kShardTableBlockRecords; 1 ..
// kMaxShardTableBlockRecords), as the writer stores it under kShardTableKey.
// Sets `*ref` (normally &m.table) to what the manifest says of it. The keys
// are not stored: shard i's key is ShardKey(i) (§7), whatever m.shards says.
std::vector<std::byte> EncodeShardTable(const Manifest& m, ShardTableRef* ref,
                                        uint32_t block_records = kShardTableBlockRecords);

// Reads a shard table (§7) in pieces, each checked before what it holds is
// used: the header (and the object's size), then the block checksums, then
// the blocks in order, then the totals. For reading a large table in
// ranged reads, or streaming it (verify, inspect) without keeping it.
// Errors are Corruption (a newer table version: Unsupported) and start with
// `where`, the table's name (its URI); a bad block names its records
// ("records A..B"), a bad record its number and key.
class ShardTableReader {
 public:
  // `m` is the decoded v2 manifest that names the table; it must outlive the
  // reader.
  ShardTableReader(const Manifest& m, std::string where);

  // Step 1: the table's first kShardTableHeaderBytes bytes (fewer when the
  // object is shorter) and the object's size. §7.3 checks 1-11.
  Status Header(std::span<const std::byte> header, uint64_t object_size);
  // After Header: the block checksums lie at [sums_offset, + sums_bytes).
  uint64_t sums_offset() const { return kShardTableHeaderBytes; }
  uint64_t sums_bytes() const { return 8 * uint64_t{blocks_}; }
  // Step 2. §7.3 check 12.
  Status Sums(std::span<const std::byte> sums);
  uint32_t block_count() const { return blocks_; }
  uint64_t record_count() const { return records_; }
  // Where block `b` lies in the table and how many records it holds.
  void BlockRange(uint32_t b, uint64_t* offset, uint64_t* length) const;
  // Step 3, for b = 0, 1, ... in order: checks block `b` (its checksum, then
  // each record, §7.3 checks 13-14) and appends its shards to `*out`, or
  // hands each to `each` (shard number, shard).
  Status Block(uint32_t b, std::span<const std::byte> data, ShardTable* out);
  Status Block(uint32_t b, std::span<const std::byte> data,
               const std::function<void(uint32_t, const ShardInfo&)>& each);
  // Step 4, after the last block: the totals against the manifest (§7.3
  // check 15).
  Status Finish() const;

 private:
  template <typename Sink>
  Status CheckBlock(uint32_t b, std::span<const std::byte> data, Sink&& sink);
  std::string Records(uint64_t first, uint64_t count) const;

  const Manifest& m_;
  std::string where_;
  uint64_t entry_bytes_ = 0;  // the shards' index entry size
  uint64_t records_ = 0;      // from the header
  uint32_t block_records_ = 0;
  uint32_t blocks_ = 0;
  uint64_t records_offset_ = 0;
  uint64_t sums_hash_ = 0;
  uint32_t next_block_ = 0;
  std::vector<uint64_t> sums_;
  bool header_ok_ = false;
  bool sums_ok_ = false;
  uint64_t next_sample_ = 0;  // running sum of samples
  uint64_t record_area_ = 0;  // Σ(bytes - 64 - samples * entry_bytes)
};

// The whole table in memory: Header, Sums, every Block into `m->shards`,
// Finish. `m` is the v2 manifest that names it.
Status DecodeShardTable(std::span<const std::byte> table, std::string_view where, Manifest* m);

// A new random dataset id: 16 bytes from getrandom(2). docs/format.md §5.2.
DatasetId NewDatasetId();

// The key of shard `shard_number` by the writer's convention (§1):
// "shards/000000.stks", zero-padded to at least 6 digits.
std::string ShardKey(uint32_t shard_number);
// The n with ShardKey(n) == key, or -1 when `key` is no such key.
int64_t ShardKeyNumber(std::string_view key);

// One field value of a sample, as given to ShardBuilder::Add.
struct FieldValue {
  // kBytes, kString, kJson and kArray: the value's bytes (an array's
  // elements, little-endian, row after row).
  std::span<const std::byte> bytes;
  int64_t i64 = 0;  // kInt64
  double f64 = 0;   // kFloat64, and kFloat32 (rounded to the nearest float)
};

// Builds one shard in memory (§3). Add samples until SizeWith says the next
// would pass the target, then Finish.
class ShardBuilder {
 public:
  ShardBuilder(std::vector<FieldSpec> fields, DatasetId dataset_id, uint32_t shard_number);
  // The same, building into `buffer` (a finished shard's, handed back for
  // its memory: its contents are dropped, its capacity kept) with room
  // reserved for a shard of `expected_bytes`, so that a writer's shards
  // reuse a few buffers instead of growing and faulting in new ones.
  ShardBuilder(std::vector<FieldSpec> fields, DatasetId dataset_id, uint32_t shard_number,
               std::vector<std::byte> buffer, uint64_t expected_bytes);

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

// What a shard must agree with; from the manifest. `fields` is a view of the
// manifest's schema: the manifest it was made from must outlive it.
struct ShardExpectation {
  std::string key;  // names the shard in messages
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
// The same for a shard the caller has at hand (streamed from the shard
// table, so not in m.shards).
ShardExpectation ExpectationFor(const Manifest& m, uint32_t shard_number, const ShardInfo& shard);

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
  // range of a shard that holds its index, from the manifest alone (from
  // `expect`'s bytes, samples and field_count only), and a
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
