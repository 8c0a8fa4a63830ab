// The cache folder's space: one limit for every dataset and process sharing
// the folder. A fetch reserves its shard's bytes before it starts, evicting
// as the policy ranks the candidates, so that the folder never holds more
// than the limit (temporary files included); the bookkeeping that keeps the
// table true to the files (a killed fetcher, a file found bad) is here too.
//
// Eviction never removes a shard a reader holds (its pin: a shared OFD lock
// that eviction must take exclusively). Other datasets' shards in the folder
// are candidates too: those their planned processes do not expect to read
// soon (Entry::soon), least recently used first.
//
// Thread safety: every call but the constructor runs under the folder lock
// (FolderTables::Locked).
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/folder.h"
#include "cache/shard_files.h"

namespace stoker::cache_internal {

// A candidate for eviction, in the order the policy gives: own shards not
// needed again in this epoch (`far`, planned) first, the furthest next use
// (`rank`) first; then, least recently used first, own shards under LRU
// (`lru`, rank = the LRU clock) together with other datasets' shards their
// processes do not expect to read soon; then the rest of the own, furthest
// first. So two datasets in one folder share its space: neither's planned
// eviction takes the other's shards about to be read, nor its own near ones
// before the other's idle ones.
struct Candidate {
  uint32_t shard;
  uint64_t rank;
  bool far = false;
  bool lru = false;
};

class Space {
 public:
  Space(FolderTables* tables, const ShardFiles* files, std::string pin_lock,
        std::vector<uint64_t> shard_bytes, uint64_t capacity, std::atomic<uint64_t>* evictions);

  uint64_t capacity() const { return capacity_; }
  const std::vector<uint64_t>& shard_bytes() const { return shard_bytes_; }
  // Reserves shard s's bytes (state kFetching, this pid), evicting from
  // `own` (this dataset's candidates, in any order) and, when `others`, the
  // other datasets' shards not needed soon. false: no room the policy would
  // free, nothing reserved.
  bool Reserve(uint32_t s, std::vector<Candidate> own, bool others);
  // A reservation given back (the fetch failed or the file was not written).
  void Unreserve(uint32_t s);
  // The fetch landed: the file as written (its identity, for later hits).
  void Commit(uint32_t s, const struct stat& written);
  // A good file the table does not count (a fetcher killed between rename
  // and bookkeeping, a lost table), or whose identity it does not know.
  void Adopt(uint32_t s, const struct stat& st);
  // Entry s made absent, its bytes freed (the file is gone or being dropped).
  void Forget(uint32_t s);
  // Under shard s's fetch lock: makes the entry agree with the file after a
  // killed fetcher (its temporary file removed before its bytes are freed).
  void FixStale(uint32_t s);

 private:
  bool EvictOwn(uint32_t x);
  void EvictIdle(std::vector<Candidate> own, bool others, uint64_t bytes);

  FolderTables* tables_;
  const ShardFiles* files_;
  const std::string pin_lock_;
  const std::vector<uint64_t> shard_bytes_;
  const uint64_t capacity_;
  std::atomic<uint64_t>* evictions_;
};

}  // namespace stoker::cache_internal
