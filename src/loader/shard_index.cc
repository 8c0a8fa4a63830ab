// The shard source with per-sample reads: each shard's header and index, and
// the workers' record reads (see shard_source.h).
#include <algorithm>
#include <cstring>
#include <optional>

#include "core/mapped_guard.h"
#include "core/stream_copy.h"
#include "loader/batch_builder.h"
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
      state_[use] = std::make_unique<UseState>();
      state_[use]->state = State::kReading;
    }
    // Live until its last batch is built, which waits for this Finish.
    UseState& u = *state_[use];
    const uint32_t shard = schedule_.uses[use].shard;
    auto buffer = config_.pool->Get(config_.slot_bytes, "loader shard index buffer");
    Status st;
    if (buffer.ok()) {
      u.buffer = std::move(buffer).value();
      st = LoadIndex(u, shard);
    } else {
      st = buffer.status().WithContext("reading the index of shard " +
                                       config_.manifest->shards[shard].key + " of " +
                                       config_.store->uri());
    }
    if (st.ok()) LoaderCounters::Add(config_.counters->shards_read, 1);
    Finish(u, std::move(st));
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
  if (config_.mapped_reads) {
    auto mapped = u.object->Map();
    // A reader that cannot map (a wrapper of the store's that does not pass
    // Map on) is read with preads, as read_unit "sample".
    if (!mapped.ok() && mapped.status().code() == Code::kUnsupported) return Status::Ok();
    if (!mapped.ok()) {
      return mapped.status().WithContext("mapping shard " + info.key + " of " + uri);
    }
    if (mapped->size() < info.bytes) {
      return Corruption(uri + "/" + info.key + ": truncated: the file has " +
                        std::to_string(mapped->size()) + " bytes, the manifest says " +
                        std::to_string(info.bytes));
    }
    u.mapped = mapped->first(info.bytes);
    // Once per shard: puts the guard back in front of a SIGBUS handler
    // installed since (a system call, not one per record).
    EnsureMappedGuard();
  }
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
  const UseState& u = *state_[use];
  if (!u.mapped.empty()) return MappedRecord(u, local, dst);
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
  STOKER_RETURN_IF_ERROR(CheckedRecord(v, local, hash, len, dst));
  return record;
}

// The record's checksum against its index entry; then a field delivered
// twice gets its other columns as copies of the first.
Status ShardSource::CheckedRecord(const ShardView& v, uint32_t local, uint64_t hash,
                                  const uint32_t* len, std::span<std::byte* const> dst) const {
  Status st = v.CheckRecord(local, hash);
  if (!st.ok()) return st.WithContext(config_.store->uri());
  const auto& first_column = config_.first_column_of_field;
  const auto& column_fields = config_.column_fields;
  for (size_t c = 0; c < column_fields.size(); ++c) {
    const int first = first_column[size_t(column_fields[c])];
    if (first != int(c)) std::memcpy(dst[c], dst[size_t(first)], len[column_fields[c]]);
  }
  return Status::Ok();
}

// Mapped reads: the checksum reads the record from the page cache (the one
// read of it from memory), then each delivered field is copied from cache
// into the batch with streaming stores, which write it without first reading
// the batch's lines in (the kernel's copy of a pread does read them: on the
// build VM's Xeon, rep movsb into memory not in cache ran at 9.0 GB/s, as
// memcpy, streaming stores at 15.5; bench/copy_paths.cc); a field to be
// decoded goes to the worker's scratch with plain stores, to be read from
// cache by the decoder. A record longer than
// kMappedChunk is checked and copied a chunk at a time, so that the copy
// still finds it in cache. A SIGBUS under the loads (the file truncated
// behind the loader, a disk error) is an error naming the record.
Result<uint64_t> ShardSource::MappedRecord(const UseState& u, uint32_t local,
                                           std::span<std::byte* const> dst) {
  constexpr uint64_t kMappedChunk = 256 * 1024;
  const ShardView& v = u.view;
  const uint32_t fields = v.field_count();
  const auto& first_column = config_.first_column_of_field;
  uint32_t len[format::kMaxFields];
  uint64_t record = 0;
  for (uint32_t f = 0; f < fields; ++f) {
    len[f] = v.FieldLength(local, f);
    record += len[f];
  }
  const uint64_t offset = v.RecordOffset(local);
  if (offset > u.mapped.size() || record > u.mapped.size() - offset) {
    return Corruption(Where(v, local) + ": its " + std::to_string(record) + " bytes at offset " +
                      std::to_string(offset) + " end past the shard's " +
                      std::to_string(u.mapped.size()));
  }
  const std::byte* src = u.mapped.data() + offset;
  // Copies record bytes [a, b) of the delivered fields to their columns.
  auto copy = [&](uint64_t a, uint64_t b) {
    uint64_t at = 0;
    for (uint32_t f = 0; f < fields; at += len[f], ++f) {
      const int c = first_column[f];
      const uint64_t lo = std::max(a, at), hi = std::min<uint64_t>(b, at + len[f]);
      if (c < 0 || lo >= hi) continue;
      std::byte* to = dst[size_t(c)] + (lo - at);
      if (hi - lo >= kStreamMinBytes && !config_.decoded_columns[size_t(c)]) {
        StreamCopy(to, src + lo, hi - lo);
      } else {
        std::memcpy(to, src + lo, hi - lo);
      }
    }
  };
  uint64_t hash = 0;
  // Made outside the guarded loads (it allocates), and only where needed.
  std::optional<format::Hash64Stream> stream;
  if (record > kMappedChunk) stream.emplace();
  const bool loaded = GuardedLoads(src, record, [&] {
    if (record <= kMappedChunk) {
      hash = format::Hash64({src, record});
      copy(0, record);
    } else {
      for (uint64_t a = 0; a < record; a += kMappedChunk) {
        const uint64_t b = std::min(record, a + kMappedChunk);
        stream->Update({src + a, b - a});
        copy(a, b);
      }
      hash = stream->Digest();
    }
    // Streamed stores are weakly ordered: visible before the batch moves on.
    StreamFence();
  });
  if (!loaded) {
    // SIGBUS: the file shrank under the mapping, or the disk failed under it.
    const std::string at = " at offset " + std::to_string(offset);
    auto now = config_.store->Stat(v.key());
    if (now.ok() && now->size < offset + record) {
      return Corruption(Where(v, local) + ": truncated behind the loader: its " +
                        std::to_string(record) + " bytes" + at + " end past the file's " +
                        std::to_string(now->size) + " bytes now (the manifest says " +
                        std::to_string(u.mapped.size()) + ")");
    }
    return IoError(Where(v, local) + ": its " + std::to_string(record) + " bytes" + at +
                   " could not be loaded from the mapped shard file (SIGBUS: a disk error "
                   "under the page, or the file rewritten in place behind the loader)");
  }
  STOKER_RETURN_IF_ERROR(CheckedRecord(v, local, hash, len, dst));
  u.object->CountMapped(record);
  return record;
}

}  // namespace stoker
