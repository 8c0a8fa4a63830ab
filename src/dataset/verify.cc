// VerifyDataset: see stoker/dataset.h.
#include <algorithm>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/aligned_memory.h"
#include "stoker/dataset.h"

namespace stoker {

namespace {

struct BlockSums {
  uint32_t tokens = 0, sums = 0;  // field indexes
  uint32_t block_bytes = 0;
  std::string name;  // the token field's
};

// Each block of sample `i`'s token fields against its checksum.
Status CheckBlockSums(const format::ShardView& view, uint32_t i,
                      const std::vector<BlockSums>& fields, const std::string& shard) {
  for (const BlockSums& f : fields) {
    const std::span<const std::byte> tokens = view.Field(i, f.tokens);
    const std::span<const std::byte> sums = view.Field(i, f.sums);
    const uint64_t B = f.block_bytes;
    if (sums.size() != format::BlockSumsBytes(tokens.size(), f.block_bytes)) {
      return Corruption(shard + ": sample " + std::to_string(i) + " of the shard: field '" +
                        f.name + "': " + std::to_string(sums.size()) +
                        " bytes of block checksums for " +
                        std::to_string(tokens.size()) + " token bytes in blocks of " +
                        std::to_string(B));
    }
    const int64_t bad = format::FirstBadBlock(tokens, sums, f.block_bytes);
    if (bad >= 0) {
      const uint64_t b = uint64_t(bad), n = std::min<uint64_t>(B, tokens.size() - b * B);
      return Corruption(shard + ": sample " + std::to_string(i) + " of the shard: field '" +
                        f.name + "': block " + std::to_string(b) + " (bytes " +
                        std::to_string(b * B) + ".." + std::to_string(b * B + n - 1) +
                        ") does not match its checksum");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<VerifyReport> VerifyDataset(Store& store, const VerifyOptions& options) {
  // The shard table is streamed, twice, and never held (24 bytes a shard
  // read twice is nothing next to the shards): once whole, so that a bad
  // table is an error before any shard is read, as a bad manifest is, and
  // for the largest shard; then again to read the shards.
  STOKER_ASSIGN_OR_RETURN(format::Manifest m, ReadManifestOnly(store));
  uint64_t max_bytes = 0;
  uint64_t shards = 0;
  STOKER_RETURN_IF_ERROR(ForEachShard(store, m, [&](uint32_t, const format::ShardInfo& s) {
    max_bytes = std::max(max_bytes, s.bytes);
    ++shards;
    return Status::Ok();
  }));

  // Token fields' block checksums (docs/format.md §3.5): the record's
  // checksum covers them, and each is checked against its block here too,
  // as the loader checks the blocks a window reads.
  std::vector<BlockSums> block_sums;
  for (size_t j = 0; j < m.fields.size(); ++j) {
    if (m.fields[j].block_sums_of.empty()) continue;
    const int t = m.FieldIndex(m.fields[j].block_sums_of);
    if (t >= 0) {
      block_sums.push_back({uint32_t(t), uint32_t(j), m.fields[j].block_bytes, m.fields[t].name});
    }
  }

  VerifyReport report;
  auto problem = [&](VerifyProblem p) {
    if (options.on_problem) options.on_problem(p);
    report.problems.push_back(std::move(p));
  };

  ReadQueueOptions qo;
  qo.depth = std::max(1u, options.reads_in_flight);
  // One buffer per read in flight, reused; one byte longer than the largest
  // shard, so that a shard that grew after packing (bytes appended) reads
  // longer than the manifest says instead of looking whole.
  std::vector<internal::AlignedPtr> buffers;
  std::vector<size_t> free_buffers;
  for (uint32_t i = 0; i < qo.depth && i < shards; ++i) {
    buffers.push_back(internal::AllocateAligned(max_bytes + 1, kDirectIoAlignment));
    if (buffers.back() == nullptr) {
      return NoSpace("verify " + store.uri() + ": out of memory for a " +
                     std::to_string(max_bytes) + "-byte shard buffer");
    }
    free_buffers.push_back(i);
  }
  // After the buffers, so that it is destroyed first: a queue cancels and
  // waits for its reads when destroyed, which must not land in freed memory.
  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ReadQueue> queue, store.NewReadQueue(qo));
  struct InFlight {
    format::ShardInfo info;
    size_t buffer;
  };
  std::unordered_map<uint64_t, InFlight> in_flight;  // by shard number (the tag)

  auto check = [&](const ReadCompletion& c) {
    auto it = in_flight.find(c.tag);
    const format::ShardInfo info = std::move(it->second.info);
    const size_t buf = it->second.buffer;
    in_flight.erase(it);
    free_buffers.push_back(buf);
    report.shards_checked++;
    if (!c.status.ok()) {
      problem({info.key, -1, c.status});
      return;
    }
    report.bytes_read += c.bytes;
    if (c.bytes > info.bytes) {
      problem({info.key, -1,
               Corruption(info.key + ": grown: more than the " + std::to_string(info.bytes) +
                          " bytes the manifest says (bytes appended after packing?)")});
      return;
    }
    if (c.bytes != info.bytes) {
      problem({info.key, -1,
               Corruption(info.key + ": truncated: " + std::to_string(c.bytes) +
                          " bytes, the manifest says " + std::to_string(info.bytes))});
      return;
    }
    auto view = format::ShardView::Parse({buffers[buf].get(), c.bytes},
                                         format::ExpectationFor(m, uint32_t(c.tag), info));
    if (!view.ok()) {
      problem({info.key, -1, view.status()});
      return;
    }
    for (uint32_t i = 0; i < view->sample_count(); ++i) {
      report.samples_checked++;
      Status st = view->VerifySample(i);
      if (st.ok()) st = CheckBlockSums(*view, i, block_sums, info.key);
      if (!st.ok()) problem({info.key, int64_t(info.first_sample + i), st});
    }
    Status pad = view->VerifyPadding();
    if (!pad.ok()) problem({info.key, -1, pad});
  };
  std::vector<ReadCompletion> done;
  auto reap = [&]() -> Status {
    done.clear();
    auto waited = queue->Wait(1, Clock::now() + std::chrono::seconds(120), &done);
    if (!waited.ok() && done.empty()) return waited.status().WithContext("verify " + store.uri());
    for (const auto& c : done) check(c);
    return Status::Ok();
  };

  STOKER_RETURN_IF_ERROR(ForEachShard(store, m, [&](uint32_t i, const format::ShardInfo& s) {
    while (free_buffers.empty()) STOKER_RETURN_IF_ERROR(reap());
    const size_t buf = free_buffers.back();
    free_buffers.pop_back();
    const ReadRequest req{s.key, 0, {buffers[buf].get(), s.bytes + 1}, i};
    in_flight.emplace(i, InFlight{s, buf});
    return queue->Submit({&req, 1});
  }));
  while (queue->Outstanding() > 0) STOKER_RETURN_IF_ERROR(reap());
  return report;
}

}  // namespace stoker
