#include "cache/optimum.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <set>

namespace stoker::cache_internal {

Result<std::vector<Access>> ReadAccessLog(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return ErrnoToStatus(errno, "open " + path);
  std::vector<Access> out;
  unsigned long long t, e;
  unsigned s;
  while (std::fscanf(f, "%llu %llu %u", &t, &e, &s) == 3) out.push_back({t, e, s});
  std::fclose(f);
  std::stable_sort(out.begin(), out.end(),
                   [](const Access& a, const Access& b) { return a.time_ns < b.time_ns; });
  return out;
}

std::vector<uint64_t> OptimalRemoteBytes(std::span<const Access> reads,
                                         std::span<const uint64_t> shard_bytes, uint64_t capacity) {
  constexpr uint64_t kNoMore = std::numeric_limits<uint64_t>::max();
  if (capacity == 0) capacity = kNoMore;
  // next[i]: the index of the next read of reads[i]'s shard.
  std::vector<uint64_t> next(reads.size(), kNoMore);
  std::vector<uint64_t> seen(shard_bytes.size(), kNoMore);
  for (size_t i = reads.size(); i-- > 0;) {
    const uint32_t s = reads[i].shard;
    if (s >= shard_bytes.size()) continue;
    next[i] = seen[s];
    seen[s] = i;
  }
  std::vector<uint64_t> out;
  std::set<std::pair<uint64_t, uint32_t>> cached;  // (next read, shard)
  std::vector<uint64_t> key(shard_bytes.size(), kNoMore);
  std::vector<bool> in(shard_bytes.size(), false);
  uint64_t used = 0;
  for (size_t i = 0; i < reads.size(); ++i) {
    const uint32_t s = reads[i].shard;
    if (s >= shard_bytes.size()) continue;
    if (out.size() <= reads[i].epoch) out.resize(reads[i].epoch + 1, 0);
    if (in[s]) {
      cached.erase({key[s], s});
      key[s] = next[i];
      cached.insert({key[s], s});
      continue;
    }
    out[reads[i].epoch] += shard_bytes[s];
    if (next[i] == kNoMore) continue;  // never read again: not worth a byte
    // Room from shards read again later than s, furthest first; none of
    // them evicted unless that makes room.
    uint64_t room = capacity - std::min(capacity, used);
    for (auto it = cached.rbegin(); room < shard_bytes[s] && it != cached.rend(); ++it) {
      if (it->first <= next[i]) break;
      room += shard_bytes[it->second];
    }
    if (room < shard_bytes[s]) continue;  // declined
    while (capacity - std::min(capacity, used) < shard_bytes[s]) {
      const auto last = std::prev(cached.end());
      in[last->second] = false;
      used -= shard_bytes[last->second];
      cached.erase(last);
    }
    in[s] = true;
    key[s] = next[i];
    used += shard_bytes[s];
    cached.insert({key[s], s});
  }
  return out;
}

}  // namespace stoker::cache_internal
