// ReadManifest, ReadShardTable, ForEachShard: see stoker/dataset.h.
#include <algorithm>
#include <string>

#include "stoker/dataset.h"

namespace stoker {
namespace {

// Bytes of the shard table asked for in one read: the whole table of up to
// ~350 000 shards, or a few blocks of a larger one, so that reading it keeps
// no more than this besides what it builds.
constexpr uint64_t kTableReadBytes = 8ull << 20;

std::string TableName(Store& store, const format::Manifest& m) {
  return store.uri() + "/" + m.table.key;
}

// [offset, offset + length) of `key` into `out`, short at the object's end.
Status ReadRange(Store& store, const std::string& key, uint64_t offset, uint64_t length,
                 std::vector<std::byte>* out) {
  out->resize(length);
  STOKER_ASSIGN_OR_RETURN(size_t n, store.Read(key, offset, *out));
  out->resize(n);
  return Status::Ok();
}

// Reads the table `m.table` names through `r`, in order, handing each block
// to `on_block(b, bytes)` (which passes it to r.Block), then r.Finish().
template <typename OnBlock>
Status StreamTable(Store& store, const format::Manifest& m, format::ShardTableReader& r,
                   OnBlock&& on_block) {
  const std::string where = TableName(store, m);
  auto info = store.Stat(m.table.key);
  if (!info.ok()) {
    if (info.status().code() == Code::kNotFound) {
      return Corruption(where + ": missing (the manifest names it: the dataset is damaged)");
    }
    return info.status().WithContext("reading the shard table " + where);
  }
  const uint64_t size = info->size;
  // One read for the header, the block checksums and the first blocks: the
  // whole table, unless it is large.
  std::vector<std::byte> buf;
  uint64_t buf_offset = 0;
  STOKER_RETURN_IF_ERROR(ReadRange(store, m.table.key, 0, std::min(size, kTableReadBytes), &buf));
  STOKER_RETURN_IF_ERROR(
      r.Header(std::span(buf).first(std::min(buf.size(), format::kShardTableHeaderBytes)), size));
  // [offset, offset + length) of the table, from `buf` when it holds it,
  // else read into it with what follows (short where the object ends).
  auto bytes = [&](uint64_t offset, uint64_t length) -> Result<std::span<const std::byte>> {
    const bool held = offset >= buf_offset && offset - buf_offset <= buf.size() &&
                      length <= buf.size() - (offset - buf_offset);
    if (!held) {
      buf_offset = offset;
      const uint64_t rest = size > offset ? size - offset : 0;
      STOKER_RETURN_IF_ERROR(ReadRange(store, m.table.key, offset,
                                       std::max(length, std::min(kTableReadBytes, rest)), &buf));
    }
    const uint64_t at = std::min<uint64_t>(offset - buf_offset, buf.size());
    return std::span<const std::byte>(buf).subspan(at, std::min<uint64_t>(length, buf.size() - at));
  };
  {
    STOKER_ASSIGN_OR_RETURN(auto sums, bytes(r.sums_offset(), r.sums_bytes()));
    STOKER_RETURN_IF_ERROR(r.Sums(sums));
  }
  for (uint32_t b = 0; b < r.block_count(); ++b) {
    uint64_t offset, length;
    r.BlockRange(b, &offset, &length);
    STOKER_ASSIGN_OR_RETURN(auto block, bytes(offset, length));
    STOKER_RETURN_IF_ERROR(on_block(b, block));
  }
  return r.Finish();
}

}  // namespace

Result<format::Manifest> ReadManifestOnly(Store& store) {
  auto raw = store.ReadAll(format::kManifestKey);
  if (!raw.ok()) {
    if (raw.status().code() == Code::kNotFound) {
      return NotFound("no stoker dataset at " + store.uri() + " (no " +
                      std::string(format::kManifestKey) + ")");
    }
    return raw.status();
  }
  return format::DecodeManifest(*raw, store.uri() + "/" + std::string(format::kManifestKey));
}

Status ReadShardTable(Store& store, format::Manifest* m) {
  if (m->table.key.empty()) return Status::Ok();
  format::ShardTableReader r(*m, TableName(store, *m));
  format::ShardTable shards;
  STOKER_RETURN_IF_ERROR(StreamTable(store, *m, r, [&](uint32_t b, std::span<const std::byte> d) {
    // Only now is the record count known to match an object that big.
    if (b == 0) shards.reserve(r.record_count());
    return r.Block(b, d, &shards);
  }));
  shards.SetParts(m->shards.parts());
  m->shards = std::move(shards);
  return Status::Ok();
}

Result<format::Manifest> ReadManifest(Store& store) {
  STOKER_ASSIGN_OR_RETURN(format::Manifest m, ReadManifestOnly(store));
  STOKER_RETURN_IF_ERROR(ReadShardTable(store, &m));
  return m;
}

Status ForEachShard(Store& store, const format::Manifest& m,
                    const std::function<Status(uint32_t, const format::ShardInfo&)>& each) {
  // (An empty v2 dataset's table is read all the same: it is checked.)
  const bool held =
      m.table.key.empty() || (!m.shards.empty() && m.shards.size() == m.table.records);
  if (held) {
    for (uint32_t i = 0; i < m.shards.size(); ++i) STOKER_RETURN_IF_ERROR(each(i, m.shards[i]));
    return Status::Ok();
  }
  format::ShardTableReader r(m, TableName(store, m));
  Status failed;
  return StreamTable(store, m, r, [&](uint32_t b, std::span<const std::byte> d) {
    STOKER_RETURN_IF_ERROR(r.Block(b, d, [&](uint32_t i, const format::ShardInfo& s) {
      if (failed.ok()) failed = each(i, s);
    }));
    return failed;
  });
}

}  // namespace stoker
