// The storage benchmark: the access patterns a training job puts on a store,
// on any backend (file://, rados://, mem://), as a built-in counterpart of
// fio and `rados bench`. Behind `stoker bench storage`; internal to the bench
// module (src/bench/), not part of the library API.
//
//   write  whole objects of object_bytes, `depth` Puts in flight (one writer
//          thread each), as pack and checkpoints write;
//   seq    whole-object reads, `depth` in flight through one ReadQueue, as the
//          loader reads shards;
//   rand   small reads (4 KiB) at random aligned offsets of random objects,
//          `depth` in flight, as a per-sample reader or a cache miss would.
//
// Each pattern runs for `seconds` (the write pattern at least until every
// object exists once, the seq pattern at least one pass). Objects live under
// PREFIX/RUN/ inside the store (default "bench/<host>-<pid>-<time>/"), and are
// removed at the end, also when a pattern fails.
//
// Thread safety: RunStorageBench is reentrant; it starts `depth` writer
// threads of its own and uses one ReadQueue from the calling thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker {

struct StorageBenchOptions {
  // Size of each object written and read whole. Default: 4 MiB, Ceph's
  // object size and the default shard size.
  uint64_t object_bytes = 4ull << 20;
  // Objects written, then read. Default: 16.
  uint32_t objects = 16;
  // Operations in flight in each pattern. Default: 8, the loader's
  // reads_in_flight.
  uint32_t depth = 8;
  // Seconds each pattern runs. Default: 5.
  double seconds = 5;
  // Size of a random read; offsets are multiples of it. Default: 4 KiB.
  uint32_t random_read_bytes = 4096;
  // Which patterns run; seq and rand write the objects first if `write` is
  // off (that write is not reported). Default: all three.
  bool write = true;
  bool seq = true;
  bool rand = true;
  // Where the objects go inside the store. Default: "bench".
  std::string prefix = "bench";
  // Remove the objects afterwards. Default: on.
  bool cleanup = true;
  // Seeds the object contents and the random offsets. Default: 1.
  uint64_t seed = 1;
};

// Latency percentiles of one pattern, in seconds.
struct LatencySummary {
  double p50 = 0, p99 = 0, p999 = 0, max = 0, mean = 0;
};

struct PatternResult {
  std::string name;    // "write", "seq", "rand"
  uint64_t ops = 0;    // operations completed
  uint64_t bytes = 0;  // bytes moved
  double seconds = 0;  // wall time of the pattern
  LatencySummary latency;
  double mb_per_second() const { return seconds > 0 ? bytes / seconds / 1e6 : 0; }
  double iops() const { return seconds > 0 ? ops / seconds : 0; }
};

struct StorageBenchResult {
  std::string uri;
  std::string run_prefix;  // where the objects were, e.g. "bench/host-123-1700000000/"
  StorageBenchOptions options;
  std::vector<PatternResult> patterns;  // in the order run: write, seq, rand
};

// Runs the benchmark on `store`. An operation that fails ends the run with
// its Status (after the cleanup), naming the pattern.
Result<StorageBenchResult> RunStorageBench(Store& store, const StorageBenchOptions& options);

// Percentiles of `samples` (seconds; sorted in place), nearest-rank.
LatencySummary SummarizeLatencies(std::vector<double>& samples);

}  // namespace stoker
