// Shard objects: building and validating. docs/format.md §3, §5.1.
#include <algorithm>
#include <bit>
#include <cstring>

#include "format/coding.h"
#include "stoker/format.h"

namespace stoker::format {

using internal::Hex16;
using internal::HexBytes;
using internal::LoadLE;
using internal::StoreLE;

namespace {

// §3.1 header offsets.
constexpr size_t kOffMagic = 0;
constexpr size_t kOffVersion = 8;
constexpr size_t kOffFieldCount = 12;
constexpr size_t kOffEntryBytes = 14;
constexpr size_t kOffDatasetId = 16;
constexpr size_t kOffShardNumber = 32;
constexpr size_t kOffSampleCount = 36;
constexpr size_t kOffIndexOffset = 40;
constexpr size_t kOffIndexHash = 48;
constexpr size_t kOffHeaderHash = 56;
static_assert(kOffHeaderHash + 8 == kShardHeaderBytes);

// §3.3 entry offsets.
constexpr size_t kOffRecordOffset = 0;
constexpr size_t kOffRecordHash = 8;
constexpr size_t kOffFieldLengths = 16;

constexpr uint64_t RoundUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Fields whose value the builder takes as a number (FieldValue::i64, f64)
// rather than as bytes.
bool IsScalar(FieldType t) {
  return t == FieldType::kInt64 || t == FieldType::kFloat32 || t == FieldType::kFloat64;
}

// Record size of `values` against `fields` (missing values count as empty).
uint64_t RecordBytes(const std::vector<FieldSpec>& fields, std::span<const FieldValue> values) {
  uint64_t n = 0;
  for (size_t f = 0; f < fields.size(); ++f) {
    if (IsScalar(fields[f].type)) {
      n += fields[f].FixedBytes();
    } else if (f < values.size()) {
      n += values[f].bytes.size();
    }
  }
  return n;
}

std::string IdHex(const DatasetId& id) { return HexBytes(id.data(), id.size()); }

}  // namespace

// ---- ShardBuilder ------------------------------------------------------------

ShardBuilder::ShardBuilder(std::vector<FieldSpec> fields, DatasetId dataset_id,
                           uint32_t shard_number)
    : fields_(std::move(fields)),
      dataset_id_(dataset_id),
      shard_number_(shard_number),
      data_(kShardHeaderBytes) {}

ShardBuilder::ShardBuilder(std::vector<FieldSpec> fields, DatasetId dataset_id,
                           uint32_t shard_number, std::vector<std::byte> buffer,
                           uint64_t expected_bytes)
    : fields_(std::move(fields)),
      dataset_id_(dataset_id),
      shard_number_(shard_number),
      data_(std::move(buffer)) {
  data_.clear();
  data_.reserve(std::min<uint64_t>(expected_bytes, kMaxShardBytes));
  data_.resize(kShardHeaderBytes);
}

uint64_t ShardBuilder::SizeWith(std::span<const FieldValue> values) const {
  const uint64_t entry = IndexEntryBytes(static_cast<uint32_t>(fields_.size()));
  const uint64_t records_end = data_.size() + RecordBytes(fields_, values);
  return RoundUp(RoundUp(records_end, 8) + (uint64_t{sample_count_} + 1) * entry, kShardAlignment);
}

Status ShardBuilder::Add(std::span<const FieldValue> values) {
  const std::string who = "shard " + std::to_string(shard_number_);
  if (fields_.empty() || fields_.size() > kMaxFields) {
    return InvalidArgument(who + ": schema has " + std::to_string(fields_.size()) +
                           " fields, expected 1.." + std::to_string(kMaxFields));
  }
  if (values.size() != fields_.size()) {
    return InvalidArgument(who + ": sample has " + std::to_string(values.size()) +
                           " values, the schema has " + std::to_string(fields_.size()) + " fields");
  }
  if (sample_count_ == UINT32_MAX) return InvalidArgument(who + ": too many samples");
  for (size_t f = 0; f < fields_.size(); ++f) {
    if (IsScalar(fields_[f].type)) continue;
    if (values[f].bytes.size() > UINT32_MAX) {
      return InvalidArgument(who + ": field '" + fields_[f].name + "' is " +
                             std::to_string(values[f].bytes.size()) + " bytes, the most is 2^32-1");
    }
    if (std::string why = fields_[f].LengthProblem(values[f].bytes.size()); !why.empty()) {
      return InvalidArgument(who + ": field " + fields_[f].Describe() + " " + why);
    }
  }
  const uint64_t size = SizeWith(values);
  if (size > kMaxShardBytes) {
    return InvalidArgument(who + ": sample of " + std::to_string(RecordBytes(fields_, values)) +
                           " bytes would make the shard " + std::to_string(size) +
                           " bytes, more than " + std::to_string(kMaxShardBytes));
  }

  const uint32_t fc = static_cast<uint32_t>(fields_.size());
  const size_t start = data_.size();
  std::byte entry[IndexEntryBytes(kMaxFields)] = {};
  for (uint32_t f = 0; f < fc; ++f) {
    uint32_t len;
    if (fields_[f].type == FieldType::kInt64) {
      std::byte v[8];
      StoreLE<int64_t>(v, values[f].i64);
      data_.insert(data_.end(), v, v + 8);
      len = 8;
    } else if (fields_[f].type == FieldType::kFloat64) {
      std::byte v[8];
      StoreLE<uint64_t>(v, std::bit_cast<uint64_t>(values[f].f64));
      data_.insert(data_.end(), v, v + 8);
      len = 8;
    } else if (fields_[f].type == FieldType::kFloat32) {
      std::byte v[4];
      StoreLE<uint32_t>(v, std::bit_cast<uint32_t>(static_cast<float>(values[f].f64)));
      data_.insert(data_.end(), v, v + 4);
      len = 4;
    } else {
      data_.insert(data_.end(), values[f].bytes.begin(), values[f].bytes.end());
      len = static_cast<uint32_t>(values[f].bytes.size());
    }
    StoreLE<uint32_t>(entry + kOffFieldLengths + 4 * f, len);
  }
  const uint64_t record_bytes = data_.size() - start;
  StoreLE<uint64_t>(entry + kOffRecordOffset, start);
  StoreLE<uint64_t>(entry + kOffRecordHash,
                    Hash64(std::span<const std::byte>(data_).subspan(start, record_bytes)));
  index_.insert(index_.end(), entry, entry + IndexEntryBytes(fc));

  ++sample_count_;
  payload_bytes_ += record_bytes;
  max_sample_bytes_ = std::max(max_sample_bytes_, record_bytes);
  return Status::Ok();
}

std::vector<std::byte> ShardBuilder::Finish(uint64_t* index_hash) {
  std::vector<std::byte> out = std::move(data_);
  data_.clear();
  out.resize(RoundUp(out.size(), 8));  // zero bytes up to the index (§3.2)
  const uint64_t index_offset = out.size();
  const uint64_t ihash = Hash64(index_);
  out.insert(out.end(), index_.begin(), index_.end());
  index_.clear();
  out.resize(RoundUp(out.size(), kShardAlignment));  // zero padding (§3)

  std::byte* h = out.data();
  std::memcpy(h + kOffMagic, kShardMagic, sizeof kShardMagic);
  StoreLE<uint32_t>(h + kOffVersion, kShardVersion);
  StoreLE<uint16_t>(h + kOffFieldCount, static_cast<uint16_t>(fields_.size()));
  StoreLE<uint16_t>(h + kOffEntryBytes,
                    static_cast<uint16_t>(IndexEntryBytes(static_cast<uint32_t>(fields_.size()))));
  std::memcpy(h + kOffDatasetId, dataset_id_.data(), dataset_id_.size());
  StoreLE<uint32_t>(h + kOffShardNumber, shard_number_);
  StoreLE<uint32_t>(h + kOffSampleCount, sample_count_);
  StoreLE<uint64_t>(h + kOffIndexOffset, index_offset);
  StoreLE<uint64_t>(h + kOffIndexHash, ihash);
  StoreLE<uint64_t>(h + kOffHeaderHash, Hash64(std::span<const std::byte>(h, kOffHeaderHash)));
  if (index_hash != nullptr) *index_hash = ihash;
  return out;
}

// ---- ShardView ---------------------------------------------------------------

Result<ShardView> ShardView::Parse(std::span<const std::byte> shard,
                                   const ShardExpectation& expect) {
  const std::string k(expect.key);
  const uint64_t size = shard.size();
  // 1: the manifest knows the exact size; a short object is the common
  // failure (an interrupted copy), so say "truncated" for it.
  if (size != expect.bytes) {
    if (size < expect.bytes) {
      return Corruption(k + ": truncated: " + std::to_string(size) + " bytes, expected " +
                        std::to_string(expect.bytes));
    }
    return Corruption(k + ": " + std::to_string(size) + " bytes, manifest says " +
                      std::to_string(expect.bytes));
  }
  return ParseCommon({shard, shard.size(), shard, 0, /*whole=*/true}, expect.key, &expect);
}

Result<ShardView> ShardView::ParseStandalone(std::span<const std::byte> shard,
                                             std::string_view key) {
  return ParseCommon({shard, shard.size(), shard, 0, /*whole=*/true}, key, nullptr);
}

void ShardView::IndexRange(const ShardExpectation& expect, uint64_t* offset, uint64_t* length) {
  // The index ends within the last kShardAlignment bytes (the padding after
  // it is shorter than that), and starts index_bytes before its end.
  const uint64_t index_bytes = uint64_t{expect.samples} * IndexEntryBytes(expect.field_count);
  const uint64_t back = index_bytes + kShardAlignment;
  *offset = expect.bytes > back ? expect.bytes - back : 0;
  *length = expect.bytes - *offset;
}

Result<ShardView> ShardView::ParseIndex(std::span<const std::byte> header,
                                        std::span<const std::byte> tail, uint64_t tail_offset,
                                        const ShardExpectation& expect) {
  return ParseCommon({header, expect.bytes, tail, tail_offset}, expect.key, &expect);
}

// The checks of docs/format.md §3.4 after the first, shared by Parse,
// ParseStandalone and ParseIndex; `expect` is null for the standalone parse. Numbers in
// comments are the check numbers of the §3.4 table.
Result<ShardView> ShardView::ParseCommon(const Parts& parts, std::string_view key,
                                         const ShardExpectation* expect) {
  const std::string k(key);
  const uint64_t size = parts.size;
  const std::byte* p = parts.header.data();

  // 2
  if (size < kShardHeaderBytes || parts.header.size() < kShardHeaderBytes) {
    return Corruption(k + ": truncated: " +
                      std::to_string(std::min<uint64_t>(size, parts.header.size())) +
                      " bytes, expected at least " + std::to_string(kShardHeaderBytes));
  }
  if (size % kShardAlignment != 0) {
    return Corruption(k + ": truncated: " + std::to_string(size) +
                      " bytes, expected a multiple of " + std::to_string(kShardAlignment));
  }
  if (size > kMaxShardBytes) {
    return Corruption(k + ": " + std::to_string(size) + " bytes, more than " +
                      std::to_string(kMaxShardBytes));
  }
  // 3
  if (std::memcmp(p + kOffMagic, kShardMagic, sizeof kShardMagic) != 0) {
    return Corruption(k + ": bad magic: not a stoker shard");
  }
  // 4: before the header hash, which a newer version may place elsewhere.
  const uint32_t version = LoadLE<uint32_t>(p + kOffVersion);
  if (version == 0) return Corruption(k + ": format version 0");
  if (version > kShardVersion) {
    return Unsupported(k + ": written by a newer stoker (format v" + std::to_string(version) +
                       "; this build reads v" + std::to_string(kShardVersion) + ")");
  }
  // 5
  const uint64_t header_hash = LoadLE<uint64_t>(p + kOffHeaderHash);
  if (Hash64(parts.header.first(kOffHeaderHash)) != header_hash) {
    return Corruption(k + ": header checksum mismatch");
  }

  ShardView v;
  v.key_ = k;
  if (parts.whole) v.shard_ = parts.tail;  // an index-only view holds no records
  v.field_count_ = LoadLE<uint16_t>(p + kOffFieldCount);
  v.entry_bytes_ = LoadLE<uint16_t>(p + kOffEntryBytes);
  std::memcpy(v.dataset_id_.data(), p + kOffDatasetId, v.dataset_id_.size());
  v.shard_number_ = LoadLE<uint32_t>(p + kOffShardNumber);
  v.sample_count_ = LoadLE<uint32_t>(p + kOffSampleCount);
  v.index_offset_ = LoadLE<uint64_t>(p + kOffIndexOffset);
  v.index_hash_ = LoadLE<uint64_t>(p + kOffIndexHash);
  v.first_sample_ = expect ? expect->first_sample : 0;

  // 6
  if (expect) {
    if (v.field_count_ != expect->field_count) {
      return Corruption(k + ": header says " + std::to_string(v.field_count_) +
                        " fields, manifest says " + std::to_string(expect->field_count));
    }
  } else if (v.field_count_ < 1 || v.field_count_ > kMaxFields) {
    return Corruption(k + ": header says " + std::to_string(v.field_count_) +
                      " fields, expected 1.." + std::to_string(kMaxFields));
  }
  // Both branches leave field_count in 1..kMaxFields: the manifest's count
  // was validated by DecodeManifest, but an expectation is caller data.
  if (v.field_count_ < 1 || v.field_count_ > kMaxFields) {
    return Corruption(k + ": " + std::to_string(v.field_count_) + " fields, expected 1.." +
                      std::to_string(kMaxFields));
  }
  // 7
  const uint32_t want_entry = IndexEntryBytes(v.field_count_);
  if (v.entry_bytes_ != want_entry) {
    return Corruption(k + ": index entry size " + std::to_string(v.entry_bytes_) + ", expected " +
                      std::to_string(want_entry) + " for " + std::to_string(v.field_count_) +
                      " fields");
  }
  if (expect) {
    // 8
    if (v.dataset_id_ != expect->dataset_id) {
      return Corruption(k + ": shard belongs to another dataset (id " + IdHex(v.dataset_id_) +
                        ", manifest says " + IdHex(expect->dataset_id) + ")");
    }
    // 9
    if (v.shard_number_ != expect->shard_number) {
      return Corruption(k + ": shard number " + std::to_string(v.shard_number_) +
                        ", manifest says " + std::to_string(expect->shard_number));
    }
    // 10
    if (v.sample_count_ != expect->samples) {
      return Corruption(k + ": header says " + std::to_string(v.sample_count_) +
                        " samples, manifest says " + std::to_string(expect->samples));
    }
  }
  // 10 (§4: every sample needs an index entry). Bounded by the largest
  // shard rather than this object's size: the header hash matched, so the
  // header is what the writer wrote, and a short object is reported as
  // truncated below.
  const uint64_t max_samples = (kMaxShardBytes - kShardHeaderBytes) / v.entry_bytes_;
  if (v.sample_count_ < 1 || v.sample_count_ > max_samples) {
    return Corruption(k + ": header says " + std::to_string(v.sample_count_) +
                      " samples, expected 1.." + std::to_string(max_samples));
  }
  // 11: index_bytes <= kMaxShardBytes - 64 by 10, so nothing below overflows.
  const uint64_t index_bytes = uint64_t{v.sample_count_} * v.entry_bytes_;
  if (v.index_offset_ < kShardHeaderBytes || v.index_offset_ % 8 != 0 ||
      v.index_offset_ > kMaxShardBytes - index_bytes) {
    return Corruption(k + ": index offset " + std::to_string(v.index_offset_) +
                      " outside the object (" + std::to_string(index_bytes) +
                      " bytes of index; the most is " + std::to_string(kMaxShardBytes) + " bytes)");
  }
  // 12: kMaxShardBytes is a multiple of the alignment, so want_size is at
  // most kMaxShardBytes.
  const uint64_t index_end = v.index_offset_ + index_bytes;
  const uint64_t want_size = RoundUp(index_end, kShardAlignment);
  if (size != want_size) {
    if (size < want_size) {
      return Corruption(k + ": truncated: " + std::to_string(size) + " bytes, expected " +
                        std::to_string(want_size));
    }
    return Corruption(k + ": " + std::to_string(size) + " bytes, expected " +
                      std::to_string(want_size) + " (data after the index)");
  }
  // 13
  if (expect && v.index_hash_ != expect->index_hash) {
    return Corruption(k + ": index hash " + Hex16(v.index_hash_) + ", manifest says " +
                      Hex16(expect->index_hash));
  }
  // 14
  if (v.index_offset_ < parts.tail_offset ||
      index_end > parts.tail_offset + parts.tail.size()) {
    return Corruption(k + ": the index at [" + std::to_string(v.index_offset_) + ", " +
                      std::to_string(index_end) + ") is outside the bytes read [" +
                      std::to_string(parts.tail_offset) + ", " +
                      std::to_string(parts.tail_offset + parts.tail.size()) + ")");
  }
  const std::span<const std::byte> index =
      parts.tail.subspan(v.index_offset_ - parts.tail_offset, index_bytes);
  if (Hash64(index) != v.index_hash_) return Corruption(k + ": index checksum mismatch");
  v.index_ = index.data();

  // 15..18: walk the entries (15 offset, 16 padding, 17 lengths by type, 18
  // bounds).
  const bool typed = expect && expect->fields.size() == v.field_count_;
  const uint32_t lengths_end = kOffFieldLengths + 4 * v.field_count_;
  // Check 17's rule per field, once: a fixed length, or rows of a size.
  uint64_t fixed_len[kMaxFields] = {}, row_len[kMaxFields] = {};
  for (uint32_t f = 0; typed && f < v.field_count_; ++f) {
    fixed_len[f] = expect->fields[f].FixedBytes();
    row_len[f] = fixed_len[f] == 0 ? expect->fields[f].RowBytes() : 0;
  }
  uint64_t running = kShardHeaderBytes;
  for (uint32_t i = 0; i < v.sample_count_; ++i) {
    const std::byte* e = v.index_ + uint64_t{i} * v.entry_bytes_;
    auto sample = [&] {
      return k + ": sample " + std::to_string(i) + " (global " +
             std::to_string(v.first_sample_ + i) + "): ";
    };
    const uint64_t offset = LoadLE<uint64_t>(e + kOffRecordOffset);
    if (offset != running) {
      return Corruption(sample() + "record offset " + std::to_string(offset) + ", expected " +
                        std::to_string(running));
    }
    for (uint32_t b = lengths_end; b < v.entry_bytes_; ++b) {
      if (e[b] != std::byte{0}) return Corruption(sample() + "index entry padding is not zero");
    }
    uint64_t record = 0;  // at most 64 * (2^32-1): no overflow
    for (uint32_t f = 0; f < v.field_count_; ++f) {
      const uint32_t len = LoadLE<uint32_t>(e + kOffFieldLengths + 4 * f);
      if ((fixed_len[f] != 0 && len != fixed_len[f]) || (row_len[f] != 0 && len % row_len[f])) {
        return Corruption(sample() + "field " + expect->fields[f].Describe() + " " +
                          expect->fields[f].LengthProblem(len));
      }
      record += len;
    }
    // running <= index_offset holds by induction (it starts at 64).
    if (record > v.index_offset_ - running) {
      return Corruption(sample() + "record of " + std::to_string(record) + " bytes at offset " +
                        std::to_string(running) + " runs into the index at " +
                        std::to_string(v.index_offset_));
    }
    running += record;
  }
  // 19
  if (RoundUp(running, 8) != v.index_offset_) {
    return Corruption(k + ": records end at " + std::to_string(running) + ", index at " +
                      std::to_string(v.index_offset_));
  }
  return v;
}

std::span<const std::byte> ShardView::Record(uint32_t i) const {
  if (i >= sample_count_ || shard_.empty()) return {};
  const std::byte* e = index_ + uint64_t{i} * entry_bytes_;
  uint64_t len = 0;
  for (uint32_t f = 0; f < field_count_; ++f) {
    len += LoadLE<uint32_t>(e + kOffFieldLengths + 4 * f);
  }
  return shard_.subspan(LoadLE<uint64_t>(e + kOffRecordOffset), len);
}

std::span<const std::byte> ShardView::Field(uint32_t i, uint32_t f) const {
  if (i >= sample_count_ || f >= field_count_ || shard_.empty()) return {};
  const std::byte* e = index_ + uint64_t{i} * entry_bytes_;
  uint64_t off = LoadLE<uint64_t>(e + kOffRecordOffset);
  for (uint32_t g = 0; g < f; ++g) off += LoadLE<uint32_t>(e + kOffFieldLengths + 4 * g);
  return shard_.subspan(off, LoadLE<uint32_t>(e + kOffFieldLengths + 4 * f));
}

int64_t ShardView::Int64(uint32_t i, uint32_t f) const {
  std::span<const std::byte> v = Field(i, f);
  if (v.size() != 8) return 0;
  return LoadLE<int64_t>(v.data());
}

Status ShardView::VerifySample(uint32_t i) const {
  if (i >= sample_count_) {
    return InvalidArgument(key_ + ": sample " + std::to_string(i) + " out of range (" +
                           std::to_string(sample_count_) + " samples)");
  }
  if (shard_.empty()) return InvalidArgument(key_ + ": an index-only view holds no records");
  return CheckRecord(i, Hash64(Record(i)));
}

uint64_t ShardView::RecordOffset(uint32_t i) const {
  if (i >= sample_count_) return 0;
  return LoadLE<uint64_t>(index_ + uint64_t{i} * entry_bytes_ + kOffRecordOffset);
}

uint32_t ShardView::FieldLength(uint32_t i, uint32_t f) const {
  if (i >= sample_count_ || f >= field_count_) return 0;
  return LoadLE<uint32_t>(index_ + uint64_t{i} * entry_bytes_ + kOffFieldLengths + 4 * f);
}

Status ShardView::CheckRecord(uint32_t i, uint64_t hash) const {
  if (i >= sample_count_) {
    return InvalidArgument(key_ + ": sample " + std::to_string(i) + " out of range (" +
                           std::to_string(sample_count_) + " samples)");
  }
  const std::byte* e = index_ + uint64_t{i} * entry_bytes_;
  if (hash != LoadLE<uint64_t>(e + kOffRecordHash)) {
    return Corruption(key_ + ": sample " + std::to_string(i) + " (global " +
                      std::to_string(first_sample_ + i) + "): checksum mismatch");
  }
  return Status::Ok();
}

Status ShardView::VerifyPadding() const {
  if (index_ == nullptr || shard_.empty()) return InvalidArgument(key_ + ": not a parsed shard");
  auto check = [&](uint64_t from, uint64_t to) -> Status {
    for (uint64_t o = from; o < to; ++o) {
      if (shard_[o] != std::byte{0}) {
        return Corruption(key_ + ": non-zero padding at offset " + std::to_string(o));
      }
    }
    return Status::Ok();
  };
  // Before the index: from the end of the last record.
  uint64_t records_end = kShardHeaderBytes;
  if (sample_count_ > 0) {
    std::span<const std::byte> last = Record(sample_count_ - 1);
    records_end = static_cast<uint64_t>(last.data() - shard_.data()) + last.size();
  }
  STOKER_RETURN_IF_ERROR(check(records_end, index_offset_));
  const uint64_t index_end = index_offset_ + uint64_t{sample_count_} * entry_bytes_;
  return check(index_end, shard_.size());
}

}  // namespace stoker::format
