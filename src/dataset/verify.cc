// VerifyDataset: see stoker/dataset.h.
#include <memory>
#include <vector>

#include "core/aligned_memory.h"
#include "stoker/dataset.h"

namespace stoker {

Result<VerifyReport> VerifyDataset(Store& store, const VerifyOptions& options) {
  STOKER_ASSIGN_OR_RETURN(format::Manifest m, ReadManifest(store));
  VerifyReport report;
  auto problem = [&](VerifyProblem p) {
    if (options.on_problem) options.on_problem(p);
    report.problems.push_back(std::move(p));
  };

  ReadQueueOptions qo;
  qo.depth = std::max(1u, options.reads_in_flight);
  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ReadQueue> queue, store.NewReadQueue(qo));
  // One buffer per read in flight, reused; one byte longer than the largest
  // shard, so that a shard that grew after packing (bytes appended) reads
  // longer than the manifest says instead of looking whole.
  std::vector<internal::AlignedPtr> buffers;
  std::vector<size_t> free_buffers;
  uint64_t max_bytes = 0;
  for (const auto& s : m.shards) max_bytes = std::max(max_bytes, s.bytes);
  for (uint32_t i = 0; i < qo.depth && i < m.shards.size(); ++i) {
    buffers.push_back(internal::AllocateAligned(max_bytes + 1, kDirectIoAlignment));
    if (buffers.back() == nullptr) {
      return NoSpace("verify " + store.uri() + ": out of memory for a " +
                     std::to_string(max_bytes) + "-byte shard buffer");
    }
    free_buffers.push_back(i);
  }
  std::vector<size_t> buffer_of(m.shards.size());
  size_t next = 0;
  std::vector<ReadCompletion> done;
  while (next < m.shards.size() || queue->Outstanding() > 0) {
    std::vector<ReadRequest> reqs;
    while (next < m.shards.size() && !free_buffers.empty()) {
      const size_t buf = free_buffers.back();
      free_buffers.pop_back();
      buffer_of[next] = buf;
      reqs.push_back({m.shards[next].key, 0, {buffers[buf].get(), m.shards[next].bytes + 1}, next});
      ++next;
    }
    if (!reqs.empty()) STOKER_RETURN_IF_ERROR(queue->Submit(reqs));
    done.clear();
    auto waited = queue->Wait(1, Clock::now() + std::chrono::seconds(120), &done);
    if (!waited.ok() && done.empty()) return waited.status().WithContext("verify " + store.uri());
    for (const auto& c : done) {
      const auto& info = m.shards[c.tag];
      const size_t buf = buffer_of[c.tag];
      free_buffers.push_back(buf);
      report.shards_checked++;
      if (!c.status.ok()) {
        problem({info.key, -1, c.status});
        continue;
      }
      report.bytes_read += c.bytes;
      if (c.bytes > info.bytes) {
        problem({info.key, -1,
                 Corruption(info.key + ": grown: more than the " + std::to_string(info.bytes) +
                            " bytes the manifest says (bytes appended after packing?)")});
        continue;
      }
      if (c.bytes != info.bytes) {
        problem({info.key, -1,
                 Corruption(info.key + ": truncated: " + std::to_string(c.bytes) +
                            " bytes, the manifest says " + std::to_string(info.bytes))});
        continue;
      }
      auto view = format::ShardView::Parse({buffers[buf].get(), c.bytes},
                                           format::ExpectationFor(m, uint32_t(c.tag)));
      if (!view.ok()) {
        problem({info.key, -1, view.status()});
        continue;
      }
      for (uint32_t i = 0; i < view->sample_count(); ++i) {
        report.samples_checked++;
        Status st = view->VerifySample(i);
        if (!st.ok()) problem({info.key, int64_t(info.first_sample + i), st});
      }
      Status pad = view->VerifyPadding();
      if (!pad.ok()) problem({info.key, -1, pad});
    }
  }
  return report;
}

}  // namespace stoker
