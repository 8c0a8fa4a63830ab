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

Result<Batch> BatchBuilder::Build(BufferPool& pool, const std::vector<ColumnSpec>& columns,
                                  const DecodeOptions& decode, const BatchSamples& s,
                                  uint64_t epoch, uint64_t index, LoaderState state_after) {
  const size_t n = s.count;
  // Pass 1: the layout. Every array starts on a kColumnAlignment boundary.
  std::vector<uint64_t> column_offset(columns.size());
  std::vector<uint64_t> column_data_offset(columns.size());
  uint64_t size = 0;
  const uint64_t ids_at = size;
  size = AlignUp(size + n * sizeof(uint64_t), kColumnAlignment);
  const uint64_t padding_at = size;
  size = AlignUp(size + n, kColumnAlignment);
  const uint64_t image_bytes = DecodedSampleBytes(decode);
  for (size_t c = 0; c < columns.size(); ++c) {
    column_offset[c] = size;
    const ColumnSpec& col = columns[c];
    if (col.decode) {
      size = AlignUp(size + n * image_bytes, kColumnAlignment);
    } else if (col.type == format::FieldType::kInt64) {
      size = AlignUp(size + n * sizeof(int64_t), kColumnAlignment);
    } else {
      uint64_t total = 0;
      for (size_t i = 0; i < n; ++i) total += s.read ? s.length(i, c) : s.value(i, c).size();
      column_data_offset[c] = AlignUp(size + (n + 1) * sizeof(uint64_t), kColumnAlignment);
      size = AlignUp(column_data_offset[c] + total, kColumnAlignment);
    }
  }

  Batch b;
  b.memory_ = pool.Get(size);
  std::byte* base = b.memory_->data();
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

  // Pass 2: fill, sample by sample, so that a sample is checked and copied
  // while it is in cache: one read of it from memory, one copy into the batch.
  std::vector<uint64_t*> offsets(columns.size());
  std::vector<uint64_t> pos(columns.size(), 0);
  for (size_t c = 0; c < columns.size(); ++c) {
    offsets[c] = reinterpret_cast<uint64_t*>(base + column_offset[c]);
  }
  thread_local DecodeScratch scratch;
  if (s.read) {
    // Each record lands in place; only a decoded column's bytes go through
    // a scratch buffer of their own, to be decoded from there.
    thread_local std::vector<std::vector<std::byte>> encoded;
    encoded.resize(std::max(encoded.size(), columns.size()));
    std::vector<std::byte*> dst(columns.size());
    for (size_t i = 0; i < n; ++i) {
      for (size_t c = 0; c < columns.size(); ++c) {
        const ColumnSpec& col = columns[c];
        std::byte* at = base + column_offset[c];
        if (col.decode) {
          encoded[c].resize(s.length(i, c));
          dst[c] = encoded[c].data();
        } else if (col.type == format::FieldType::kInt64) {
          dst[c] = at + i * sizeof(int64_t);
        } else {
          offsets[c][i] = pos[c];
          dst[c] = base + column_data_offset[c] + pos[c];
          pos[c] += s.length(i, c);
        }
      }
      STOKER_RETURN_IF_ERROR(s.read(i, dst));
      for (size_t c = 0; c < columns.size(); ++c) {
        if (!columns[c].decode) continue;
        std::byte* out = base + column_offset[c] + i * image_bytes;
        Status st = DecodeSample(decode, encoded[c], {s.seed, epoch, s.sample_ids[i]},
                                 {out, image_bytes}, &scratch);
        if (!st.ok()) return st.WithContext(s.describe(i) + ": field '" + columns[c].name + "'");
      }
    }
  }
  bool streamed = false;
  for (size_t i = 0; i < n && !s.read; ++i) {
    if (s.memory && i + 1 < n) {
      std::span<const std::byte> next = s.memory(i + 1);
      if (next.size() <= kPrefetchMaxBytes) {
        for (size_t o = 0; o < next.size(); o += 64) __builtin_prefetch(next.data() + o);
      }
    }
    if (s.check) STOKER_RETURN_IF_ERROR(s.check(i));
    for (size_t c = 0; c < columns.size(); ++c) {
      const ColumnSpec& col = columns[c];
      std::byte* at = base + column_offset[c];
      auto v = s.value(i, c);
      if (col.decode) {
        std::byte* out = at + i * image_bytes;
        Status st =
            DecodeSample(decode, v, {s.seed, epoch, s.sample_ids[i]}, {out, image_bytes}, &scratch);
        if (!st.ok()) return st.WithContext(s.describe(i) + ": field '" + col.name + "'");
      } else if (col.type == format::FieldType::kInt64) {
        std::memcpy(at + i * sizeof(int64_t), v.data(), sizeof(int64_t));
      } else {
        offsets[c][i] = pos[c];
        if (v.size() >= kStreamMinBytes) {
          StreamCopy(base + column_data_offset[c] + pos[c], v.data(), v.size());
          streamed = true;
        } else if (!v.empty()) {
          std::memcpy(base + column_data_offset[c] + pos[c], v.data(), v.size());
        }
        pos[c] += v.size();
      }
    }
  }
  // Streamed stores are weakly ordered: make them visible before the batch
  // is handed to another thread or to the GPU.
  if (streamed) StreamFence();
  for (size_t c = 0; c < columns.size(); ++c) {
    const ColumnSpec& col = columns[c];
    std::byte* at = base + column_offset[c];
    if (col.decode) {
      b.images_.push_back(
          {col.name, {at, n * image_bytes}, decode.height, decode.width, 3, decode.dtype,
           decode.layout});
    } else if (col.type == format::FieldType::kInt64) {
      b.int64_.push_back({col.name, {reinterpret_cast<int64_t*>(at), n}});
    } else {
      offsets[c][n] = pos[c];
      b.bytes_.push_back({col.name, {offsets[c], n + 1}, {base + column_data_offset[c], pos[c]}});
    }
  }
  return b;
}

}  // namespace stoker
