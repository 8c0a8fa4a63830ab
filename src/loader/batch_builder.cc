#include "loader/batch_builder.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/stream_copy.h"
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
  Status st = DecodeSample(decode, encoded, {s.seed, l.batch.epoch(), s.sample_ids[i]},
                           {out, l.image_bytes}, scratch);
  if (st.ok()) return st;
  if (decode.skip_corrupt && st.code() == Code::kCorruption) {
    std::memset(out, 0, l.image_bytes);
    counts->decode_skipped++;
    return Status::Ok();
  }
  return st.WithContext(s.describe(i) + ": field '" + col.name + "'");
}

// Per-sample reads: each record lands in place; only a decoded column's
// bytes go through a scratch buffer of their own, to be decoded from there.
Status FillRead(const BatchLayout& l, const std::vector<ColumnSpec>& columns,
                const DecodeOptions& decode, const BatchSamples& s, size_t begin, size_t end,
                DecodeScratch* scratch, FillCounts* counts) {
  thread_local std::vector<std::vector<std::byte>> encoded;
  encoded.resize(std::max(encoded.size(), columns.size()));
  std::byte* base = l.base;
  std::vector<std::byte*> dst(columns.size());
  for (size_t i = begin; i < end; ++i) {
    for (size_t c = 0; c < columns.size(); ++c) {
      const ColumnSpec& col = columns[c];
      if (col.decode) {
        encoded[c].resize(s.length(i, c));
        dst[c] = encoded[c].data();
      } else if (col.type == format::FieldType::kInt64) {
        dst[c] = base + l.column_offset[c] + i * sizeof(int64_t);
      } else {
        dst[c] = base + l.column_data_offset[c] + l.offsets[c][i];
      }
    }
    STOKER_RETURN_IF_ERROR(s.read(i, dst));
    for (size_t c = 0; c < columns.size(); ++c) {
      if (!columns[c].decode) continue;
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
      if (col.decode) {
        STOKER_RETURN_IF_ERROR(DecodeInto(l, col, c, decode, s, i, v, scratch, counts));
      } else if (col.type == format::FieldType::kInt64) {
        std::memcpy(base + l.column_offset[c] + i * sizeof(int64_t), v.data(), sizeof(int64_t));
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

BatchLayout BatchBuilder::Layout(BufferPool& pool, const std::vector<ColumnSpec>& columns,
                                 const DecodeOptions& decode, const BatchSamples& s, uint64_t epoch,
                                 uint64_t index, LoaderState state_after) {
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
  for (size_t c = 0; c < columns.size(); ++c) {
    l.column_offset[c] = size;
    const ColumnSpec& col = columns[c];
    if (col.decode) {
      size = AlignUp(size + n * l.image_bytes, kColumnAlignment);
    } else if (col.type == format::FieldType::kInt64) {
      size = AlignUp(size + n * sizeof(int64_t), kColumnAlignment);
    } else {
      for (size_t i = 0; i < n; ++i) totals[c] += s.read ? s.length(i, c) : s.value(i, c).size();
      l.column_data_offset[c] = AlignUp(size + (n + 1) * sizeof(uint64_t), kColumnAlignment);
      size = AlignUp(l.column_data_offset[c] + totals[c], kColumnAlignment);
    }
  }
  Batch& b = l.batch;
  b.memory_ = pool.Get(size);
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
    if (columns[c].decode || columns[c].type == format::FieldType::kInt64) continue;
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
  for (size_t c = 0; c < columns.size(); ++c) {
    const ColumnSpec& col = columns[c];
    std::byte* at = base + l.column_offset[c];
    if (col.decode) {
      b.images_.push_back({col.name,
                           {at, n * l.image_bytes},
                           decode.height,
                           decode.width,
                           3,
                           decode.dtype,
                           decode.layout});
    } else if (col.type == format::FieldType::kInt64) {
      b.int64_.push_back({col.name, {reinterpret_cast<int64_t*>(at), n}});
    } else {
      const uint64_t total = l.offsets[c][n];
      b.bytes_.push_back(
          {col.name, {l.offsets[c], n + 1}, {base + l.column_data_offset[c], total}});
    }
  }
  return b;
}

Result<Batch> BatchBuilder::Build(BufferPool& pool, const std::vector<ColumnSpec>& columns,
                                  const DecodeOptions& decode, const BatchSamples& s,
                                  uint64_t epoch, uint64_t index, LoaderState state_after) {
  BatchLayout l = Layout(pool, columns, decode, s, epoch, index, state_after);
  thread_local DecodeScratch scratch;
  FillCounts counts;
  STOKER_RETURN_IF_ERROR(Fill(l, columns, decode, s, 0, s.count, &scratch, &counts));
  return Finish(std::move(l), columns, decode);
}

}  // namespace stoker
