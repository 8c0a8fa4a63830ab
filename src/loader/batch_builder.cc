#include "loader/batch_builder.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/stream_copy.h"
#include "loader/gpu_decode.h"
#include "stoker/gpu.h"

namespace stoker {

const Batch::BytesColumn* Batch::bytes(std::string_view name) const {
  for (const auto& c : bytes_) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

const Batch::Int64Column* Batch::int64(std::string_view name) const {
  for (const auto& c : int64_) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

const Batch::ImageColumn* Batch::image(std::string_view name) const {
  for (const auto& c : images_) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

const Batch::FixedColumn* Batch::fixed(std::string_view name) const {
  for (const auto& c : fixed_) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

const Batch::RaggedColumn* Batch::ragged(std::string_view name) const {
  for (const auto& c : ragged_) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// ElementType is DType's numbering plus float64 (loader.h).
static_assert(uint8_t(ElementType::kUInt8) == uint8_t(format::DType::kUInt8));
static_assert(uint8_t(ElementType::kBFloat16) == uint8_t(format::DType::kBFloat16));
static_assert(uint8_t(ElementType::kFloat32) == uint8_t(format::DType::kFloat32));

std::string_view ElementTypeName(ElementType t) {
  if (t == ElementType::kFloat64) return "float64";
  return format::DTypeName(format::DType(t));
}

uint32_t ElementTypeBytes(ElementType t) {
  if (t == ElementType::kFloat64) return 8;
  return format::DTypeBytes(format::DType(t));
}

ColumnSpec ColumnSpecFor(const format::FieldSpec& f, bool decode, bool padded) {
  ColumnSpec c;
  c.name = f.name;
  c.type = f.type;
  c.decode = decode;
  c.padded = padded;
  using format::FieldType;
  switch (f.type) {
    case FieldType::kInt64:
      c.kind = ColumnKind::kInt64;
      c.element = ElementType::kInt64;
      c.item_bytes = 8;
      break;
    case FieldType::kFloat32:
      c.kind = ColumnKind::kFixed;
      c.element = ElementType::kFloat32;
      c.item_bytes = 4;
      break;
    case FieldType::kFloat64:
      c.kind = ColumnKind::kFixed;
      c.element = ElementType::kFloat64;
      c.item_bytes = 8;
      break;
    case FieldType::kArray:
      c.element = ElementType(f.dtype);  // the same numbers
      if (f.FixedBytes() != 0) {
        c.kind = ColumnKind::kFixed;
        c.shape = f.shape;
        c.item_bytes = f.FixedBytes();
      } else {
        c.kind = ColumnKind::kRagged;
        c.shape.assign(f.shape.begin() + 1, f.shape.end());
        c.item_bytes = f.RowBytes();
      }
      break;
    default:  // bytes, str, json
      c.kind = ColumnKind::kBytes;
      break;
  }
  if (decode) c.kind = ColumnKind::kImage;
  return c;
}

ColumnKind KindOf(const ColumnSpec& c) {
  if (c.decode) return ColumnKind::kImage;
  if (c.type == format::FieldType::kInt64) return ColumnKind::kInt64;
  return c.kind;
}

std::span<const std::byte> Batch::buffer() const {
  if (!memory_) return {};
  return {memory_->data(), memory_->size()};
}

const void* Batch::DeviceAddress(const void* host) const {
  if (!device_ || !memory_ || host == nullptr) return nullptr;
  const auto offset = static_cast<const std::byte*>(host) - memory_->data();
  return device_->data() + offset;
}

namespace {

// Decodes column c of sample i from `encoded` into its slot. A sample that is
// not a decodable JPEG fails the batch, or with skip_corrupt is zero-filled
// and counted.
Status DecodeInto(const BatchLayout& l, const ColumnSpec& col, size_t c,
                  const DecodeOptions& decode, const BatchSamples& s, size_t i,
                  std::span<const std::byte> encoded, DecodeScratch* scratch, FillCounts* counts) {
  std::byte* out = l.base + l.column_offset[c] + i * l.image_bytes;
  const SampleKey key{s.seed, l.batch.epoch(), s.sample_ids[i]};
  if (l.gpu &&
      l.gpu->Take(i, encoded, key, [&] { return s.describe(i) + ": field '" + col.name + "'"; })) {
    return Status::Ok();  // the device stage decodes it
  }
  Status st = DecodeSample(decode, encoded, key, {out, l.image_bytes}, scratch);
  counts->decoded++;
  if (st.ok()) return st;
  if (decode.skip_corrupt && st.code() == Code::kCorruption) {
    std::memset(out, 0, l.image_bytes);
    counts->decode_skipped++;
    return Status::Ok();
  }
  return st.WithContext(s.describe(i) + ": field '" + col.name + "'");
}

// Where column c of sample i goes (not for images), once its length is
// known to fit: a fixed column's value must have item_bytes, a ragged one's
// the rows the layout gave it (it was laid out by the same lengths, so only
// a corrupt record whose length is no whole number of rows differs).
Result<std::byte*> Place(const BatchLayout& l, const ColumnSpec& col, ColumnKind kind, size_t c,
                         const BatchSamples& s, size_t i, uint64_t length) {
  switch (kind) {
    case ColumnKind::kInt64:
      return l.base + l.column_offset[c] + i * sizeof(int64_t);
    case ColumnKind::kFixed:
      if (length != col.item_bytes) break;
      return l.base + l.column_offset[c] + i * col.item_bytes;
    case ColumnKind::kRagged: {
      const uint64_t rows = uint64_t(l.lengths[c][i]);
      if (length != rows * col.item_bytes) break;
      const uint64_t first = col.padded ? i * l.max_rows[c] : uint64_t(l.row_offsets[c][i]);
      return l.base + l.column_data_offset[c] + first * col.item_bytes;
    }
    default:
      return l.base + l.column_data_offset[c] + l.offsets[c][i];
  }
  return Corruption(s.describe(i) + ": field '" + col.name + "' has " + std::to_string(length) +
                    " bytes, not " +
                    (kind == ColumnKind::kFixed ? std::to_string(col.item_bytes)
                                                : "a whole number of rows of " +
                                                      std::to_string(col.item_bytes)));
}

// Padded ragged columns: zeros after sample i's own rows, up to the batch's
// longest.
void ZeroTail(const BatchLayout& l, const ColumnSpec& col, size_t c, size_t i, std::byte* at,
              uint64_t length) {
  const uint64_t slot = l.max_rows[c] * col.item_bytes;
  if (slot > length) std::memset(at + length, 0, slot - length);
}

// Per-sample reads: each record lands in place; only a decoded column's
// bytes go through a scratch buffer of their own, to be decoded from there.
Status FillRead(const BatchLayout& l, const std::vector<ColumnSpec>& columns,
                const DecodeOptions& decode, const BatchSamples& s, size_t begin, size_t end,
                DecodeScratch* scratch, FillCounts* counts) {
  thread_local std::vector<std::vector<std::byte>> encoded;
  encoded.resize(std::max(encoded.size(), columns.size()));
  std::vector<std::byte*> dst(columns.size());
  std::vector<ColumnKind> kinds(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) kinds[c] = KindOf(columns[c]);
  for (size_t i = begin; i < end; ++i) {
    for (size_t c = 0; c < columns.size(); ++c) {
      const ColumnSpec& col = columns[c];
      if (kinds[c] == ColumnKind::kImage) {
        encoded[c].resize(s.length(i, c));
        dst[c] = encoded[c].data();
      } else {
        STOKER_ASSIGN_OR_RETURN(dst[c], Place(l, col, kinds[c], c, s, i, s.length(i, c)));
      }
    }
    STOKER_RETURN_IF_ERROR(s.read(i, dst));
    for (size_t c = 0; c < columns.size(); ++c) {
      if (kinds[c] == ColumnKind::kRagged && columns[c].padded) {
        ZeroTail(l, columns[c], c, i, dst[c], s.length(i, c));
      }
      if (kinds[c] != ColumnKind::kImage) continue;
      STOKER_RETURN_IF_ERROR(
          DecodeInto(l, columns[c], c, decode, s, i, encoded[c], scratch, counts));
    }
  }
  return Status::Ok();
}

// Records in memory: each sample is checked and copied while it is in cache:
// one read of it from memory, one copy into the batch.
Status FillCopy(const BatchLayout& l, const std::vector<ColumnSpec>& columns,
                const DecodeOptions& decode, const BatchSamples& s, size_t begin, size_t end,
                DecodeScratch* scratch, FillCounts* counts) {
  std::byte* base = l.base;
  bool streamed = false;
  // Bytes and int64 columns keep their own fast paths; the typed ones go
  // through Place, which checks their lengths.
  thread_local std::vector<ColumnKind> kinds;
  kinds.resize(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) kinds[c] = KindOf(columns[c]);
  for (size_t i = begin; i < end; ++i) {
    if (s.memory && i + 1 < end) {
      std::span<const std::byte> next = s.memory(i + 1);
      if (next.size() <= kPrefetchMaxBytes) {
        for (size_t o = 0; o < next.size(); o += 64) __builtin_prefetch(next.data() + o);
      }
    }
    if (s.check) STOKER_RETURN_IF_ERROR(s.check(i));
    for (size_t c = 0; c < columns.size(); ++c) {
      const ColumnSpec& col = columns[c];
      auto v = s.value(i, c);
      const ColumnKind kind = kinds[c];
      if (kind == ColumnKind::kImage) {
        STOKER_RETURN_IF_ERROR(DecodeInto(l, col, c, decode, s, i, v, scratch, counts));
      } else if (kind == ColumnKind::kInt64) {
        std::memcpy(base + l.column_offset[c] + i * sizeof(int64_t), v.data(), sizeof(int64_t));
      } else if (kind == ColumnKind::kFixed || kind == ColumnKind::kRagged) {
        STOKER_ASSIGN_OR_RETURN(std::byte * at, Place(l, col, kind, c, s, i, v.size()));
        if (!v.empty()) std::memcpy(at, v.data(), v.size());
        if (kind == ColumnKind::kRagged && col.padded) ZeroTail(l, col, c, i, at, v.size());
      } else if (v.size() >= kStreamMinBytes) {
        StreamCopy(base + l.column_data_offset[c] + l.offsets[c][i], v.data(), v.size());
        streamed = true;
      } else if (!v.empty()) {
        std::memcpy(base + l.column_data_offset[c] + l.offsets[c][i], v.data(), v.size());
      }
    }
  }
  // Streamed stores are weakly ordered: make them visible before the batch
  // is handed to another thread or to the GPU.
  if (streamed) StreamFence();
  return Status::Ok();
}

}  // namespace

Result<BatchLayout> BatchBuilder::Layout(BufferPool& pool, const std::vector<ColumnSpec>& columns,
                                         const DecodeOptions& decode, const BatchSamples& s,
                                         uint64_t epoch, uint64_t index, LoaderState state_after) {
  const size_t n = s.count;
  BatchLayout l;
  l.count = n;
  l.column_offset.resize(columns.size());
  l.column_data_offset.resize(columns.size());
  l.offsets.resize(columns.size());
  l.image_bytes = DecodedSampleBytes(decode);
  // Every array starts on a kColumnAlignment boundary.
  uint64_t size = 0;
  const uint64_t ids_at = size;
  size = AlignUp(size + n * sizeof(uint64_t), kColumnAlignment);
  const uint64_t padding_at = size;
  size = AlignUp(size + n, kColumnAlignment);
  std::vector<uint64_t> totals(columns.size(), 0);
  l.lengths.resize(columns.size(), nullptr);
  l.row_offsets.resize(columns.size(), nullptr);
  l.max_rows.resize(columns.size(), 0);
  auto length = [&s](size_t i, size_t c) -> uint64_t {
    return s.read ? s.length(i, c) : s.value(i, c).size();
  };
  for (size_t c = 0; c < columns.size(); ++c) {
    l.column_offset[c] = size;
    const ColumnSpec& col = columns[c];
    const ColumnKind kind = KindOf(col);
    if (kind == ColumnKind::kImage) {
      size = AlignUp(size + n * l.image_bytes, kColumnAlignment);
    } else if (kind == ColumnKind::kInt64) {
      size = AlignUp(size + n * sizeof(int64_t), kColumnAlignment);
    } else if (kind == ColumnKind::kFixed) {
      size = AlignUp(size + n * col.item_bytes, kColumnAlignment);
    } else if (kind == ColumnKind::kRagged) {
      // lengths (n), row offsets (n + 1), then the rows.
      uint64_t rows = 0, longest = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint64_t r = length(i, c) / col.item_bytes;
        rows += r;
        longest = std::max(longest, r);
      }
      l.max_rows[c] = longest;
      totals[c] = (col.padded ? n * longest : rows) * col.item_bytes;
      size = AlignUp(size + n * sizeof(int64_t), kColumnAlignment);
      size = AlignUp(size + (n + 1) * sizeof(int64_t), kColumnAlignment);
      l.column_data_offset[c] = size;
      size = AlignUp(size + totals[c], kColumnAlignment);
    } else {
      for (size_t i = 0; i < n; ++i) totals[c] += s.read ? s.length(i, c) : s.value(i, c).size();
      l.column_data_offset[c] = AlignUp(size + (n + 1) * sizeof(uint64_t), kColumnAlignment);
      size = AlignUp(l.column_data_offset[c] + totals[c], kColumnAlignment);
    }
  }
  Batch& b = l.batch;
  auto memory = pool.Get(size, "loader batch buffer");
  if (!memory.ok()) {
    return memory.status().WithContext("batch " + std::to_string(index) + " of epoch " +
                                       std::to_string(epoch) + " (" + std::to_string(n) +
                                       " samples)");
  }
  b.memory_ = std::move(memory).value();
  std::byte* base = l.base = b.memory_->data();
  b.epoch_ = epoch;
  b.index_ = index;
  b.state_after_ = state_after;
  auto* ids = reinterpret_cast<uint64_t*>(base + ids_at);
  std::memcpy(ids, s.sample_ids, n * sizeof(uint64_t));
  b.sample_ids_ = {ids, n};
  auto* pad = reinterpret_cast<uint8_t*>(base + padding_at);
  if (s.padding != nullptr) {
    std::memcpy(pad, s.padding, n);
  } else {
    std::memset(pad, 0, n);
  }
  b.padding_ = {pad, n};
  // Bytes columns: each sample's place, so that any worker can fill any range.
  for (size_t c = 0; c < columns.size(); ++c) {
    const ColumnKind kind = KindOf(columns[c]);
    if (kind == ColumnKind::kRagged) {
      l.lengths[c] = reinterpret_cast<int64_t*>(base + l.column_offset[c]);
      l.row_offsets[c] = reinterpret_cast<int64_t*>(
          base + AlignUp(l.column_offset[c] + n * sizeof(int64_t), kColumnAlignment));
      int64_t pos = 0;
      for (size_t i = 0; i < n; ++i) {
        const auto rows = int64_t(length(i, c) / columns[c].item_bytes);
        l.lengths[c][i] = rows;
        l.row_offsets[c][i] = pos;
        pos += rows;
      }
      l.row_offsets[c][n] = pos;
      continue;
    }
    if (kind != ColumnKind::kBytes) continue;
    l.offsets[c] = reinterpret_cast<uint64_t*>(base + l.column_offset[c]);
    uint64_t pos = 0;
    for (size_t i = 0; i < n; ++i) {
      l.offsets[c][i] = pos;
      pos += s.read ? s.length(i, c) : s.value(i, c).size();
    }
    l.offsets[c][n] = pos;
  }
  return l;
}

Status BatchBuilder::Fill(const BatchLayout& l, const std::vector<ColumnSpec>& columns,
                          const DecodeOptions& decode, const BatchSamples& s, size_t begin,
                          size_t end, DecodeScratch* scratch, FillCounts* counts) {
  return s.read ? FillRead(l, columns, decode, s, begin, end, scratch, counts)
                : FillCopy(l, columns, decode, s, begin, end, scratch, counts);
}

Batch BatchBuilder::Finish(BatchLayout l, const std::vector<ColumnSpec>& columns,
                           const DecodeOptions& decode) {
  Batch b = std::move(l.batch);
  const size_t n = l.count;
  std::byte* base = b.memory_->data();
  b.memory_->set_gpu_decode(l.gpu && l.gpu->taken() ? std::move(l.gpu) : nullptr);
  for (size_t c = 0; c < columns.size(); ++c) {
    const ColumnSpec& col = columns[c];
    std::byte* at = base + l.column_offset[c];
    const ColumnKind kind = KindOf(col);
    if (kind == ColumnKind::kFixed) {
      b.fixed_.push_back(
          {col.name, col.type, col.element, col.shape, col.item_bytes, {at, n * col.item_bytes}});
    } else if (kind == ColumnKind::kRagged) {
      const uint64_t rows = col.padded ? n * l.max_rows[c] : uint64_t(l.row_offsets[c][n]);
      b.ragged_.push_back({col.name,
                           col.element,
                           col.shape,
                           col.item_bytes,
                           col.padded,
                           l.max_rows[c],
                           {base + l.column_data_offset[c], rows * col.item_bytes},
                           {l.lengths[c], n},
                           {l.row_offsets[c], n + 1}});
    } else if (kind == ColumnKind::kImage) {
      b.images_.push_back({col.name,
                           {at, n * l.image_bytes},
                           decode.height,
                           decode.width,
                           3,
                           decode.dtype,
                           decode.layout});
    } else if (kind == ColumnKind::kInt64) {
      b.int64_.push_back({col.name, {reinterpret_cast<int64_t*>(at), n}});
    } else {
      const uint64_t total = l.offsets[c][n];
      b.bytes_.push_back(
          {col.name, {l.offsets[c], n + 1}, {base + l.column_data_offset[c], total}, col.type});
    }
  }
  return b;
}

Result<Batch> BatchBuilder::Build(BufferPool& pool, const std::vector<ColumnSpec>& columns,
                                  const DecodeOptions& decode, const BatchSamples& s,
                                  uint64_t epoch, uint64_t index, LoaderState state_after) {
  STOKER_ASSIGN_OR_RETURN(BatchLayout l,
                          Layout(pool, columns, decode, s, epoch, index, state_after));
  thread_local DecodeScratch scratch;
  FillCounts counts;
  STOKER_RETURN_IF_ERROR(Fill(l, columns, decode, s, 0, s.count, &scratch, &counts));
  return Finish(std::move(l), columns, decode);
}

}  // namespace stoker
