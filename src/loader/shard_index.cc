// The shard source with per-sample reads: each shard's header and index, and
// the workers' record reads (see shard_source.h).
#include <algorithm>
#include <cstring>

#include "loader/shard_source.h"

namespace stoker {

using format::ShardView;

// Loads each shard's header and index, in order of first use, synchronously
// (a few small reads, no thread hand-offs), for every batch the assembly may
// build. Keeping only reads_in_flight indexes ahead starved the workers on a
// 16-core machine (a 256 x 128 KiB batch spans ~16 shards of 4 MiB); cold
// shards still stream in ahead: each loaded shard's records are handed to
// the kernel's readahead (WillNeed) before the workers need them.
void ShardSource::IndexLoop() {
  while (true) {
    uint64_t use;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || next_read_ >= state_.size() ||
               (slots_free_ > 0 && schedule_.uses[next_read_].first_batch < build_limit_);
      });
      if (stop_ || next_read_ >= state_.size()) return;
      use = next_read_++;
      slots_free_--;
      state_[use].buffer = config_.pool->Get(config_.slot_bytes);
      state_[use].state = State::kReading;
    }
    Status st = LoadIndex(state_[use], schedule_.uses[use].shard);
    if (st.ok()) LoaderCounters::Add(config_.counters->shards_read, 1);
    Finish(state_[use], std::move(st));
  }
}

// Opens the shard, reads and checks its header and index into u.buffer
// (header first, then the bytes holding the index), and hints its records.
Status ShardSource::LoadIndex(UseState& u, uint32_t shard) {
  const auto& info = config_.manifest->shards[shard];
  const std::string& uri = config_.store->uri();
  auto object = config_.store->OpenReader(info.key);
  if (!object.ok()) return object.status().WithContext("opening shard " + info.key + " of " + uri);
  const format::ShardExpectation expect = format::ExpectationFor(*config_.manifest, shard);
  uint64_t offset, length;
  ShardView::IndexRange(expect, &offset, &length);
  std::byte* base = u.buffer->data();
  const uint64_t header_bytes = std::min<uint64_t>(info.bytes, format::kShardHeaderBytes);
  const std::span<std::byte> header(base, header_bytes);
  const std::span<std::byte> tail(base + format::kShardHeaderBytes, length);
  for (const auto& [at, dst] : {std::pair{uint64_t{0}, header}, std::pair{offset, tail}}) {
    auto n = (*object)->ReadV(at, {&dst, 1});
    if (!n.ok()) return n.status().WithContext("reading shard " + info.key + " of " + uri);
    if (*n != dst.size()) {
      return Corruption(uri + "/" + info.key + ": truncated: read " + std::to_string(*n) +
                        " bytes at offset " + std::to_string(at) + ", expected " +
                        std::to_string(dst.size()) + " (the manifest says " +
                        std::to_string(info.bytes) + " bytes in all)");
    }
  }
  LoaderCounters::Add(config_.counters->bytes_read, header.size() + tail.size());
  auto view = ShardView::ParseIndex(header, tail, offset, expect);
  if (!view.ok()) return view.status().WithContext(uri);
  u.view = std::move(view).value();
  u.object = std::move(object).value();
  u.object->WillNeed(format::kShardHeaderBytes, u.view.index_offset());
  return Status::Ok();
}

std::string ShardSource::Where(const ShardView& v, uint32_t local) const {
  return config_.store->uri() + "/" + v.key() + ": sample " + std::to_string(local) + " (global " +
         std::to_string(v.first_sample() + local) + ")";
}

// One scatter read of the record straight into the batch, then its checksum
// over the bytes just landed (in cache).
Result<uint64_t> ShardSource::ReadRecord(uint32_t use, uint32_t local,
                                         std::span<std::byte* const> dst) {
  const UseState& u = state_[use];
  const ShardView& v = u.view;
  const uint32_t fields = v.field_count();
  const auto& first_column = config_.first_column_of_field;
  thread_local std::vector<std::byte> skipped;
  uint32_t len[format::kMaxFields];
  uint64_t record = 0, skipped_bytes = 0;
  for (uint32_t f = 0; f < fields; ++f) {
    len[f] = v.FieldLength(local, f);
    record += len[f];
    if (first_column[f] < 0) skipped_bytes += len[f];
  }
  if (skipped.size() < skipped_bytes) skipped.resize(skipped_bytes);
  std::span<std::byte> pieces[format::kMaxFields];
  uint64_t at = 0;
  for (uint32_t f = 0; f < fields; ++f) {
    const int c = first_column[f];
    pieces[f] = c >= 0 ? std::span<std::byte>{dst[size_t(c)], len[f]}
                       : std::span<std::byte>{skipped.data() + at, len[f]};
    if (c < 0) at += len[f];
  }
  const std::span<const std::span<std::byte>> all(pieces, fields);
  const uint64_t offset = v.RecordOffset(local);
  Result<size_t> n = u.object->ReadV(offset, all);
  if (!n.ok()) return n.status().WithContext(Where(v, local));
  if (*n != record) {
    return Corruption(Where(v, local) + ": truncated: read " + std::to_string(*n) + " of its " +
                      std::to_string(record) + " bytes at offset " + std::to_string(offset));
  }
  uint64_t hash;
  if (fields == 1) {
    hash = format::Hash64(pieces[0]);
  } else {
    format::Hash64Stream h;
    for (const auto& p : all) h.Update(p);
    hash = h.Digest();
  }
  Status st = v.CheckRecord(local, hash);
  if (!st.ok()) return st.WithContext(config_.store->uri());
  // A field delivered twice: its other columns are copies.
  const auto& column_fields = config_.column_fields;
  for (size_t c = 0; c < column_fields.size(); ++c) {
    const int first = first_column[size_t(column_fields[c])];
    if (first != int(c)) std::memcpy(dst[c], dst[size_t(first)], len[column_fields[c]]);
  }
  return record;
}

}  // namespace stoker
