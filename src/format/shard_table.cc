// The shard table: ShardTable in memory, and the binary file of fixed records
// that format v2 keeps next to the manifest. docs/format.md §7.
#include <algorithm>
#include <cassert>
#include <cstring>

#include "format/coding.h"
#include "stoker/format.h"

namespace stoker::format {

using internal::Hex16;
using internal::HexBytes;
using internal::LoadLE;
using internal::StoreLE;

namespace {

// §7.1: the header's fields.
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 8;
constexpr size_t kOffRecordBytes = 12;
constexpr size_t kOffRecordCount = 16;
constexpr size_t kOffDatasetId = 24;
constexpr size_t kOffBlockRecords = 40;
constexpr size_t kOffBlockCount = 44;
constexpr size_t kOffSumsHash = 48;
constexpr size_t kOffHeaderHash = 56;
// §7.2: a record's fields.
constexpr size_t kRecFirstSample = 0;
constexpr size_t kRecIndexHash = 8;
constexpr size_t kRecUnits = 16;
constexpr size_t kRecSamples = 20;

constexpr uint64_t kMaxUnits = kMaxShardBytes / kShardAlignment;

// "shards/%06u.stks" into `buf` without the C library's formatting (a key is
// made for every shard a reader opens); returns its length.
size_t FormatShardKey(uint32_t n, char (&buf)[32]) {
  char digits[10];
  size_t nd = 0;
  do {
    digits[nd++] = static_cast<char>('0' + n % 10);
    n /= 10;
  } while (n != 0);
  std::memcpy(buf, "shards/", 7);
  size_t len = 7;
  for (size_t pad = nd; pad < 6; ++pad) buf[len++] = '0';
  while (nd > 0) buf[len++] = digits[--nd];
  std::memcpy(buf + len, ".stks", 5);
  return len + 5;
}

bool IsShardKey(std::string_view key, uint64_t n) {
  if (n > UINT32_MAX) return false;
  char buf[32];
  return key == std::string_view(buf, FormatShardKey(static_cast<uint32_t>(n), buf));
}

uint64_t BlockCount(uint64_t records, uint32_t block_records) {
  return (records + block_records - 1) / block_records;
}

}  // namespace

std::string ShardKey(uint32_t shard_number) {
  char buf[32];
  return std::string(buf, FormatShardKey(shard_number, buf));
}

// ---- ShardTable ---------------------------------------------------------------

void ShardTable::reserve(size_t n) {
  first_.reserve(n + 1);
  units_.reserve(n);
  index_hash_.reserve(n);
  if (!keys_.empty()) keys_.reserve(n);
}

void ShardTable::clear() {
  first_.assign(1, 0);
  units_.clear();
  index_hash_.clear();
  keys_.clear();
}

void ShardTable::AppendFields(uint64_t bytes, uint32_t samples, uint64_t index_hash) {
  assert(bytes % kShardAlignment == 0 && bytes <= kMaxShardBytes);
  units_.push_back(static_cast<uint32_t>(bytes / kShardAlignment));
  first_.push_back(first_.back() + samples);
  index_hash_.push_back(index_hash);
}

void ShardTable::AppendNumbered(uint64_t bytes, uint32_t samples, uint64_t index_hash) {
  if (!keys_.empty()) keys_.push_back(ShardKey(static_cast<uint32_t>(size())));
  AppendFields(bytes, samples, index_hash);
}

void ShardTable::push_back(const ShardInfo& s) {
  const bool own_keys = !keys_.empty() || !IsShardKey(s.key, size());
  if (own_keys && keys_.empty()) {
    // The first key of its own (shard 0's too): from here on every shard's
    // key is kept.
    keys_.reserve(index_hash_.capacity());
    for (size_t i = 0; i < size(); ++i) keys_.push_back(ShardKey(static_cast<uint32_t>(i)));
  }
  if (own_keys) keys_.push_back(s.key);
  AppendFields(s.bytes, s.samples, s.index_hash);
}

std::string ShardTable::key(size_t i) const {
  if (!keys_.empty()) return keys_[i];
  return NumberedKey(i);
}

void ShardTable::SetParts(std::vector<PartRef> parts) {
  parts_ = std::move(parts);
  part_first_.assign(1, 0);
  for (const PartRef& p : parts_) part_first_.push_back(part_first_.back() + p.shards);
  if (parts_.empty()) part_first_.clear();
}

int32_t ShardTable::PartOf(size_t i, uint32_t* local) const {
  if (parts_.empty()) {
    *local = static_cast<uint32_t>(i);
    return -1;
  }
  auto it = std::upper_bound(part_first_.begin(), part_first_.end(), static_cast<uint32_t>(i));
  const size_t p = std::min<size_t>(size_t(it - part_first_.begin()) - 1, parts_.size() - 1);
  *local = static_cast<uint32_t>(i - part_first_[p]);
  return static_cast<int32_t>(p);
}

std::string ShardTable::NumberedKey(size_t i) const {
  uint32_t local;
  const int32_t p = PartOf(i, &local);
  if (p < 0) return ShardKey(local);
  return parts_[p].prefix + "/" + ShardKey(local);
}

ShardInfo ShardTable::operator[](size_t i) const {
  ShardInfo s;
  s.key = key(i);
  s.bytes = bytes(i);
  s.samples = samples(i);
  s.first_sample = first_sample(i);
  s.index_hash = index_hash(i);
  return s;
}

uint64_t ShardTable::total_bytes() const {
  uint64_t units = 0;
  for (uint32_t u : units_) units += u;
  return units * kShardAlignment;
}

int64_t ShardTable::ShardOf(uint64_t sample) const {
  if (sample >= first_.back()) return -1;
  // The last shard whose first sample is <= sample; shards hold >= 1 sample,
  // so it holds it.
  auto it = std::upper_bound(first_.begin(), first_.end(), sample);
  return (it - first_.begin()) - 1;
}

int64_t ShardTable::Find(std::string_view key) const {
  if (!keys_.empty()) {
    for (size_t i = 0; i < keys_.size(); ++i) {
      if (keys_[i] == key) return static_cast<int64_t>(i);
    }
    return -1;
  }
  if (!parts_.empty()) {
    // PREFIX/shards/NNNNNN.stks: the part by its prefix, then the number.
    const size_t slash = key.find("/shards/");
    if (slash == std::string_view::npos) return -1;
    const std::string_view prefix = key.substr(0, slash);
    auto it = std::lower_bound(parts_.begin(), parts_.end(), prefix,
                               [](const PartRef& p, std::string_view k) { return p.prefix < k; });
    if (it == parts_.end() || it->prefix != prefix) return -1;
    const int64_t n = ShardKeyNumber(key.substr(slash + 1));
    if (n < 0 || static_cast<uint64_t>(n) >= it->shards) return -1;
    const int64_t i = int64_t{part_first_[size_t(it - parts_.begin())]} + n;
    return static_cast<uint64_t>(i) < size() ? i : -1;
  }
  const int64_t n = ShardKeyNumber(key);
  return n >= 0 && static_cast<uint64_t>(n) < size() ? n : -1;
}

int64_t ShardKeyNumber(std::string_view key) {
  constexpr std::string_view kPrefix = "shards/", kSuffix = ".stks";
  if (!key.starts_with(kPrefix) || !key.ends_with(kSuffix)) return -1;
  const std::string_view digits =
      key.substr(kPrefix.size(), key.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() < 6 || digits.size() > 10) return -1;
  uint64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  if (!IsShardKey(key, n)) return -1;  // beyond u32, or not as ShardKey pads it
  return static_cast<int64_t>(n);
}

// ---- the file (§7) --------------------------------------------------------------

std::vector<std::byte> EncodeShardTable(const Manifest& m, ShardTableRef* ref,
                                        uint32_t block_records) {
  block_records = std::clamp<uint32_t>(block_records, 1, kMaxShardTableBlockRecords);
  const ShardTable& t = m.shards;
  const uint64_t records = t.size();
  const uint64_t blocks = BlockCount(records, block_records);
  const uint64_t records_offset = kShardTableHeaderBytes + 8 * blocks;
  std::vector<std::byte> out(records_offset + records * kShardTableRecordBytes);
  std::byte* const base = out.data();
  for (uint64_t i = 0; i < records; ++i) {
    std::byte* r = base + records_offset + i * kShardTableRecordBytes;
    StoreLE<uint64_t>(r + kRecFirstSample, t.first_sample(i));
    StoreLE<uint64_t>(r + kRecIndexHash, t.index_hash(i));
    StoreLE<uint32_t>(r + kRecUnits, static_cast<uint32_t>(t.bytes(i) / kShardAlignment));
    StoreLE<uint32_t>(r + kRecSamples, t.samples(i));
  }
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t first = b * block_records;
    const uint64_t count = std::min<uint64_t>(block_records, records - first);
    StoreLE<uint64_t>(base + kShardTableHeaderBytes + 8 * b,
                      Hash64({base + records_offset + first * kShardTableRecordBytes,
                              count * kShardTableRecordBytes}));
  }
  std::memcpy(base + kOffMagic, kShardTableMagic, sizeof kShardTableMagic);
  StoreLE<uint32_t>(base + kOffVersion, kShardTableVersion);
  StoreLE<uint32_t>(base + kOffRecordBytes, kShardTableRecordBytes);
  StoreLE<uint64_t>(base + kOffRecordCount, records);
  std::memcpy(base + kOffDatasetId, m.dataset_id.data(), m.dataset_id.size());
  StoreLE<uint32_t>(base + kOffBlockRecords, block_records);
  StoreLE<uint32_t>(base + kOffBlockCount, static_cast<uint32_t>(blocks));
  StoreLE<uint64_t>(base + kOffSumsHash, Hash64({base + kShardTableHeaderBytes, 8 * blocks}));
  const uint64_t header_hash = Hash64({base, kOffHeaderHash});
  StoreLE<uint64_t>(base + kOffHeaderHash, header_hash);
  ref->key = std::string(kShardTableKey);
  ref->records = records;
  ref->bytes = out.size();
  ref->header_hash = header_hash;
  return out;
}

ShardTableReader::ShardTableReader(const Manifest& m, std::string where)
    : m_(m),
      where_(std::move(where)),
      entry_bytes_(IndexEntryBytes(static_cast<uint32_t>(m.fields.size()))) {}

std::string ShardTableReader::Records(uint64_t first, uint64_t count) const {
  return "records " + std::to_string(first) + ".." + std::to_string(first + count - 1);
}

Status ShardTableReader::Header(std::span<const std::byte> header, uint64_t object_size) {
  const std::string& w = where_;
  const uint64_t expected_records = m_.table.records;
  // 1
  if (header.size() < kShardTableHeaderBytes || object_size < kShardTableHeaderBytes) {
    return Corruption(
        w + ": truncated: " + std::to_string(expected_records) + " records expected, 0 present (" +
        std::to_string(std::min<uint64_t>(object_size, header.size())) +
        " bytes, shorter than the " + std::to_string(kShardTableHeaderBytes) + "-byte header)");
  }
  const std::byte* p = header.data();
  // 2
  if (std::memcmp(p + kOffMagic, kShardTableMagic, sizeof kShardTableMagic) != 0) {
    return Corruption(w + ": bad magic: not a stoker shard table");
  }
  // 3: before the header hash, which a newer version may place elsewhere.
  const uint32_t version = LoadLE<uint32_t>(p + kOffVersion);
  if (version == 0) return Corruption(w + ": shard table version 0");
  if (version > kShardTableVersion) {
    return Unsupported(w + ": written by a newer stoker (shard table v" + std::to_string(version) +
                       "; this build reads v" + std::to_string(kShardTableVersion) + ")");
  }
  // 4
  const uint64_t header_hash = LoadLE<uint64_t>(p + kOffHeaderHash);
  if (Hash64(header.first(kOffHeaderHash)) != header_hash) {
    return Corruption(w + ": header checksum mismatch");
  }
  // 5
  const uint32_t record_bytes = LoadLE<uint32_t>(p + kOffRecordBytes);
  if (record_bytes != kShardTableRecordBytes) {
    return Corruption(w + ": record size " + std::to_string(record_bytes) + ", expected " +
                      std::to_string(kShardTableRecordBytes));
  }
  // 6
  const uint64_t records = LoadLE<uint64_t>(p + kOffRecordCount);
  if (records > UINT32_MAX) {
    return Corruption(w + ": " + std::to_string(records) + " records, more than 2^32-1 shards");
  }
  const uint32_t block_records = LoadLE<uint32_t>(p + kOffBlockRecords);
  if (block_records < 1 || block_records > kMaxShardTableBlockRecords) {
    return Corruption(w + ": blocks of " + std::to_string(block_records) +
                      " records, expected 1.." + std::to_string(kMaxShardTableBlockRecords));
  }
  // 7
  const uint32_t blocks = LoadLE<uint32_t>(p + kOffBlockCount);
  if (blocks != BlockCount(records, block_records)) {
    return Corruption(w + ": " + std::to_string(blocks) + " blocks, expected " +
                      std::to_string(BlockCount(records, block_records)) + " for " +
                      std::to_string(records) + " records in blocks of " +
                      std::to_string(block_records));
  }
  // 8
  DatasetId id;
  std::memcpy(id.data(), p + kOffDatasetId, id.size());
  if (id != m_.dataset_id) {
    return Corruption(w + ": table belongs to another dataset (id " +
                      HexBytes(id.data(), id.size()) + ", manifest says " + m_.IdHex() + ")");
  }
  // 9
  if (records != expected_records) {
    return Corruption(w + ": " + std::to_string(records) + " records, the manifest says " +
                      std::to_string(expected_records));
  }
  // 10
  if (header_hash != m_.table.header_hash) {
    return Corruption(w + ": header hash " + Hex16(header_hash) + ", the manifest says " +
                      Hex16(m_.table.header_hash) + " (a table another pack wrote?)");
  }
  // 11
  const uint64_t records_offset = kShardTableHeaderBytes + 8 * uint64_t{blocks};
  const uint64_t size = records_offset + records * kShardTableRecordBytes;
  if (object_size < size) {
    const uint64_t present =
        object_size < records_offset ? 0 : (object_size - records_offset) / kShardTableRecordBytes;
    return Corruption(w + ": truncated: " + std::to_string(records) + " records expected, " +
                      std::to_string(present) + " present (" + std::to_string(object_size) +
                      " bytes, expected " + std::to_string(size) + ")");
  }
  if (object_size > size) {
    return Corruption(w + ": " + std::to_string(object_size) + " bytes, expected " +
                      std::to_string(size) + " (data after the last record)");
  }
  if (size != m_.table.bytes) {
    return Corruption(w + ": " + std::to_string(size) + " bytes, the manifest says " +
                      std::to_string(m_.table.bytes));
  }
  records_ = records;
  block_records_ = block_records;
  blocks_ = blocks;
  records_offset_ = records_offset;
  sums_hash_ = LoadLE<uint64_t>(p + kOffSumsHash);
  header_ok_ = true;
  return Status::Ok();
}

Status ShardTableReader::Sums(std::span<const std::byte> sums) {
  if (!header_ok_) return InvalidArgument(where_ + ": block checksums read before the header");
  if (sums.size() < sums_bytes()) {
    return Corruption(where_ + ": truncated: " + std::to_string(records_) +
                      " records expected, 0 present (the block checksums end early)");
  }
  // 12
  if (Hash64(sums.first(sums_bytes())) != sums_hash_) {
    return Corruption(where_ + ": block checksums mismatch");
  }
  sums_.resize(blocks_);
  for (uint32_t b = 0; b < blocks_; ++b) sums_[b] = LoadLE<uint64_t>(sums.data() + 8 * b);
  sums_ok_ = true;
  return Status::Ok();
}

void ShardTableReader::BlockRange(uint32_t b, uint64_t* offset, uint64_t* length) const {
  const uint64_t first = uint64_t{b} * block_records_;
  const uint64_t count =
      first < records_ ? std::min<uint64_t>(block_records_, records_ - first) : 0;
  *offset = records_offset_ + first * kShardTableRecordBytes;
  *length = count * kShardTableRecordBytes;
}

template <typename Sink>
Status ShardTableReader::CheckBlock(uint32_t b, std::span<const std::byte> data, Sink&& sink) {
  if (!sums_ok_) return InvalidArgument(where_ + ": a block read before the block checksums");
  if (b != next_block_ || b >= blocks_) {
    return InvalidArgument(where_ + ": block " + std::to_string(b) +
                           " read out of order (next is " + std::to_string(next_block_) + " of " +
                           std::to_string(blocks_) + ")");
  }
  const uint64_t first = uint64_t{b} * block_records_;
  const uint64_t count = std::min<uint64_t>(block_records_, records_ - first);
  if (data.size() < count * kShardTableRecordBytes) {
    return Corruption(where_ + ": truncated: " + std::to_string(records_) + " records expected, " +
                      std::to_string(first + data.size() / kShardTableRecordBytes) + " present");
  }
  data = data.first(count * kShardTableRecordBytes);
  // 13
  if (Hash64(data) != sums_[b]) {
    return Corruption(where_ + ": " + Records(first, count) + " (block " + std::to_string(b) +
                      "): checksum mismatch");
  }
  // 14
  for (uint64_t k = 0; k < count; ++k) {
    const std::byte* r = data.data() + k * kShardTableRecordBytes;
    const uint64_t i = first + k;
    const uint64_t units = LoadLE<uint32_t>(r + kRecUnits);
    const uint32_t samples = LoadLE<uint32_t>(r + kRecSamples);
    const uint64_t first_sample = LoadLE<uint64_t>(r + kRecFirstSample);
    auto bad = [&](const std::string& what) {
      return Corruption(where_ + ": record " + std::to_string(i) + " (" +
                        ShardKey(static_cast<uint32_t>(i)) + "): " + what);
    };
    if (units < 1 || units > kMaxUnits) {
      return bad("bytes " + std::to_string(units * kShardAlignment) + " is outside " +
                 std::to_string(kShardAlignment) + ".." + std::to_string(kMaxShardBytes));
    }
    const uint64_t bytes = units * kShardAlignment;
    const uint64_t max_samples = (bytes - kShardHeaderBytes) / entry_bytes_;
    if (samples < 1 || samples > max_samples) {
      return bad("samples " + std::to_string(samples) + " is outside 1.." +
                 std::to_string(max_samples) + " for a shard of " + std::to_string(bytes) +
                 " bytes");
    }
    if (first_sample != next_sample_) {
      return bad("first_sample " + std::to_string(first_sample) + ", expected " +
                 std::to_string(next_sample_) + " (the sum of the samples before it)");
    }
    // Each term < 2^32 and fewer than 2^32 records: no overflow in u64, but
    // the input is untrusted and the check is cheap.
    if (__builtin_add_overflow(next_sample_, samples, &next_sample_) ||
        __builtin_add_overflow(record_area_, bytes - kShardHeaderBytes - samples * entry_bytes_,
                               &record_area_)) {
      return bad("totals overflow");
    }
    sink(static_cast<uint32_t>(i), bytes, samples, first_sample,
         LoadLE<uint64_t>(r + kRecIndexHash));
  }
  ++next_block_;
  return Status::Ok();
}

Status ShardTableReader::Block(uint32_t b, std::span<const std::byte> data, ShardTable* out) {
  return CheckBlock(b, data,
                    [out](uint32_t, uint64_t bytes, uint32_t samples, uint64_t, uint64_t hash) {
                      out->AppendNumbered(bytes, samples, hash);
                    });
}

Status ShardTableReader::Block(uint32_t b, std::span<const std::byte> data,
                               const std::function<void(uint32_t, const ShardInfo&)>& each) {
  ShardInfo info;
  return CheckBlock(
      b, data, [&](uint32_t i, uint64_t bytes, uint32_t samples, uint64_t first, uint64_t hash) {
        info.key = m_.shards.NumberedKey(i);
        info.bytes = bytes;
        info.samples = samples;
        info.first_sample = first;
        info.index_hash = hash;
        each(i, info);
      });
}

Status ShardTableReader::Finish() const {
  if (!sums_ok_ || next_block_ != blocks_) {
    return InvalidArgument(where_ + ": finished after " + std::to_string(next_block_) + " of " +
                           std::to_string(blocks_) + " blocks");
  }
  // 15
  if (next_sample_ != m_.sample_count) {
    return Corruption(where_ + ": the records hold " + std::to_string(next_sample_) +
                      " samples, the manifest's sample_count is " +
                      std::to_string(m_.sample_count));
  }
  if (m_.payload_bytes > record_area_) {
    return Corruption(
        where_ + ": the manifest's payload_bytes " + std::to_string(m_.payload_bytes) +
        " does not fit in the shards' record areas (" + std::to_string(record_area_) + " bytes)");
  }
  return Status::Ok();
}

Status DecodeShardTable(std::span<const std::byte> table, std::string_view where, Manifest* m) {
  ShardTableReader r(*m, std::string(where));
  STOKER_RETURN_IF_ERROR(
      r.Header(table.first(std::min(table.size(), kShardTableHeaderBytes)), table.size()));
  // Header checked the size: every range below lies inside `table`.
  STOKER_RETURN_IF_ERROR(r.Sums(table.subspan(r.sums_offset(), r.sums_bytes())));
  ShardTable shards;
  shards.reserve(r.record_count());
  for (uint32_t b = 0; b < r.block_count(); ++b) {
    uint64_t offset, length;
    r.BlockRange(b, &offset, &length);
    STOKER_RETURN_IF_ERROR(r.Block(b, table.subspan(offset, length), &shards));
  }
  STOKER_RETURN_IF_ERROR(r.Finish());
  shards.SetParts(m->shards.parts());
  m->shards = std::move(shards);
  return Status::Ok();
}

}  // namespace stoker::format
