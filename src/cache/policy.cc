// The node cache's policy: what a fetch may evict, what a read tells the
// plan, and the planned prefetch. See include/stoker/cache.h.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "cache/node_cache.h"

namespace stoker::cache_internal {
namespace {

// STOKER_CACHE_ACCESS_LOG=FILE: every process appends a line per shard read
// ("<CLOCK_MONOTONIC ns> <epoch> <shard>"), the node's read sequence, from
// which `stoker bench node` computes the offline optimum (Belady's MIN).
void LogAccess(uint64_t epoch, uint32_t s) {
  static const int fd = [] {
    const char* path = std::getenv("STOKER_CACHE_ACCESS_LOG");
    return path && *path ? open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644) : -1;
  }();
  if (fd < 0) return;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  char line[80];
  const int n = std::snprintf(line, sizeof line, "%llu %llu %u\n",
                              (unsigned long long)ts.tv_sec * 1000000000ull + ts.tv_nsec,
                              (unsigned long long)epoch, s);
  (void)!write(fd, line, size_t(n));  // O_APPEND: one write, one whole line
}

}  // namespace

// Planned (Belady, as offline MIN with a cache that may decline): a read
// evicts only shards the node needs later than it needs s after this read,
// and when that frees too little, s is not admitted (the read is served
// from the remote store). A prefetch uses free room only: evicting for it
// would take a shard the node still needs when a little later a shard its
// ranks have finished (needed next in a later epoch) would do; with the
// prefetch evicting, the half-size cache read 1.2-2x the optimum, without it
// within a few percent (docs/benchmarks.md). LRU: the least recently used
// shard goes. Both then take other datasets' shards their processes do not
// expect to read soon (Space::Reserve).
bool NodeCacheImpl::Reserve(uint32_t s, bool prefetch) {
  const Planner::View v = planned_ ? planner_.Current() : Planner::View{};
  std::vector<Candidate> own;
  const uint64_t bytes = manifest_.shards.bytes(s);
  const uint64_t used = tables_.header().used;
  const bool full = used + bytes > space_->capacity();
  const bool evict = full && !(prefetch && v);
  const uint64_t mine = v ? Planner::NextUse(v, tables_, s, /*after_mine=*/!prefetch) : 0;
  if (evict) {
    own = ranking_.Take(v, tables_, space_->shard_bytes(), s, mine,
                        used + bytes - space_->capacity());
  }
  if (!space_->Reserve(s, std::move(own), /*others=*/evict)) return false;
  if (v) {
    bool now;
    Planner::NextUse(v, tables_, s, false, &now);
    tables_.At(s).soon = now ? 1 : 0;
  }
  return true;
}

// A read of shard s, once done: the LRU clock and (a whole-shard read or a
// reader's open, which a rank makes once per epoch) the plan's progress and
// marks. After the read, not before: a rank waiting on another's fetch of
// the same shard is then still unmarked, so the fetcher sees it needs the
// shard now and keeps it; marked at the start, the waiter looked done and
// the fetch was declined or evicted early, and the waiter fetched it again
// (Ceph, half-size cache: 1.14-1.29x MIN before, 1.03-1.09x after).
void NodeCacheImpl::Touch(uint32_t s, bool whole) {
  const Planner::View v = planned_ && whole ? planner_.Current() : Planner::View{};
  if (whole) LogAccess(epoch_, s);
  FolderTables::Locked l(tables_);
  tables_.At(s).last_use = ++tables_.header().tick;
  if (v) planner_.OnRead(v, tables_, s);
}

// Fetches the shards the node needs next (this epoch, then the next; at most
// prefetch_shards absent ones, soonest first) while the cache admits them.
// Shards another process fetches are skipped (their lock is held).
void NodeCacheImpl::PrefetchLoop() {
  std::vector<std::byte> buffer;
  uint64_t seen = 0;
  Planner::AheadMemo memo;
  auto others_seen = std::chrono::steady_clock::time_point{};
  while (planner_.WaitForChange(&seen, std::chrono::milliseconds(200))) {
    // The other jobs planning this dataset's cache, every 200 ms: their
    // orders count in this process's eviction keys (jobs.h).
    if (std::chrono::steady_clock::now() - others_seen >= std::chrono::milliseconds(200)) {
      others_seen = std::chrono::steady_clock::now();
      std::vector<std::pair<uint32_t, JobSlot>> others;
      {
        FolderTables::Locked l(tables_);
        others = jobs_->Others(tables_);
      }
      // A job this one cannot plan for (over 64 ranks a node) is left out.
      (void)planner_.SetOthers(others);
    }
    const Planner::View v = planner_.Current();
    if (!v) continue;
    std::vector<uint32_t> ahead;
    {
      FolderTables::Locked l(tables_);
      // No free room: nothing to do until reads make some.
      if (tables_.header().used + largest_shard_ > space_->capacity()) continue;
      ahead = Planner::Ahead(v, tables_, options_.prefetch_shards, &memo);
    }
    for (uint32_t s : ahead) {
      if (planner_.Current().generation != v.generation) break;
      if (tables_.Present(s)) continue;
      ByteLock fetch;
      auto got = fetch.Lock(fetch_lock_path_, s, true, /*wait=*/false);
      if (!got.ok() || !*got) continue;
      struct stat st;
      if (stat(files_.Path(s).c_str(), &st) == 0) continue;  // landed meanwhile
      buffer.resize(manifest_.shards.bytes(s));
      // NoSpace: the cache holds only shards needed sooner than this one,
      // which comes before every one after it.
      if (Fetch(s, buffer, /*prefetch=*/true).code() == Code::kNoSpace) break;
    }
  }
}

}  // namespace stoker::cache_internal
