#include "loader/schedule.h"

#include <algorithm>

namespace stoker {

uint64_t Schedule::MaxLiveShards() const {
  const uint64_t nb = batch_uses.size();
  std::vector<int64_t> delta(nb + 1, 0);
  for (const auto& u : uses) {
    delta[u.first_batch]++;
    delta[u.last_batch + 1]--;
  }
  int64_t live = 0, best = 0;
  for (uint64_t b = 0; b < nb; ++b) {
    live += delta[b];
    best = std::max(best, live);
  }
  return uint64_t(best);
}

Schedule BuildSchedule(const EpochPlan& p, const format::Manifest& manifest) {
  Schedule s;
  const uint64_t nb = p.num_batches();
  s.use_of_sample.resize(p.rank_samples());
  s.local_of_sample.resize(p.rank_samples());
  s.batch_uses.resize(nb);
  std::vector<int64_t> use_of_shard(manifest.shards.size(), -1);
  std::vector<uint64_t> added_in_batch;  // per use: last batch it was added to, + 1
  for (uint64_t b = 0; b < nb; ++b) {
    uint64_t first, count;
    p.BatchRange(b, &first, &count);
    for (uint64_t j = first; j < first + count; ++j) {
      const uint64_t id = p.RankSample(j);
      const auto shard = static_cast<uint32_t>(manifest.ShardOf(id));
      if (use_of_shard[shard] < 0) {
        use_of_shard[shard] = int64_t(s.uses.size());
        s.uses.push_back({shard, b, b, 0});
        added_in_batch.push_back(0);
      }
      const auto u = static_cast<uint32_t>(use_of_shard[shard]);
      if (added_in_batch[u] != b + 1) {
        added_in_batch[u] = b + 1;
        s.batch_uses[b].push_back(u);
        s.uses[u].batches++;
        s.uses[u].last_batch = b;
      }
      s.use_of_sample[j] = u;
      s.local_of_sample[j] = static_cast<uint32_t>(id - manifest.shards[shard].first_sample);
    }
  }
  return s;
}

}  // namespace stoker
