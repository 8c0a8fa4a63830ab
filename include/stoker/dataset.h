// The dataset module: reading a packed dataset's manifest, and what `stoker
// inspect` and `stoker verify` do, as a library. Pack, verify and the loader
// all read a dataset through here; none of them needs another.
//
// Thread safety: reentrant; VerifyDataset calls `on_problem` from the calling
// thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stoker/format.h"
#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker {

// Reads and validates a dataset's manifest and, for format v2, the shard
// table it names (docs/format.md §2, §7), so that m.shards lists every
// shard. NotFound "no stoker dataset at URI" when there is none; a missing
// or damaged shard table is Corruption naming the table and its records.
Result<format::Manifest> ReadManifest(Store& store);

// The manifest alone: for a v2 dataset m.shards stays empty (m.table names
// the table; ForEachShard or ReadShardTable reads it); a v1 manifest lists
// its shards itself. For what streams the shards instead of holding them
// (inspect, verify).
Result<format::Manifest> ReadManifestOnly(Store& store);

// Reads the shard table `m->table` names into m->shards: ranged reads of a
// few MiB each, every block checked before its shards are kept, the totals
// after the last. Nothing to do for a v1 manifest.
Status ReadShardTable(Store& store, format::Manifest* m);

// Calls `each(shard number, shard)` for every shard in order: from m.shards
// when it holds them (v1, or after ReadShardTable), else from the shard
// table, read as ReadShardTable reads it but kept only one read at a time.
// Every block is checked before its shards are handed over and the totals
// after the last (so a caller learns of a bad table only when it gets
// there). The first error, the table's or one `each` returns, ends it.
Status ForEachShard(Store& store, const format::Manifest& m,
                    const std::function<Status(uint32_t, const format::ShardInfo&)>& each);

// One problem verify found: a whole shard (sample < 0) or one sample.
struct VerifyProblem {
  std::string shard_key;
  int64_t sample = -1;  // global sample id, -1 for the shard as a whole
  Status status;
};

struct VerifyReport {
  uint64_t shards_checked = 0;
  uint64_t samples_checked = 0;
  uint64_t bytes_read = 0;
  std::vector<VerifyProblem> problems;
  bool ok() const { return problems.empty(); }
};

struct VerifyOptions {
  // Whole-shard reads in flight. Default: 8.
  uint32_t reads_in_flight = 8;
  // Called for each problem as it is found (e.g. to print it). May be empty.
  std::function<void(const VerifyProblem&)> on_problem;
};

// Reads every byte of every shard and checks it against the manifest: the
// header, the index, every sample's checksum, the padding. Every bad shard
// and every bad sample is a problem in the report (verify goes on past the
// first). The manifest itself must be valid, else its error is returned.
Result<VerifyReport> VerifyDataset(Store& store, const VerifyOptions& options = {});

}  // namespace stoker
