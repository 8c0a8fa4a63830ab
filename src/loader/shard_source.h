// The loader's shard source (internal): brings the shards one epoch's
// schedule needs into memory, in order of first use, into a bounded number of
// slots, and gives a slot back once the last batch that uses it is built.
//
//   whole shards ("shard"): one thread submits whole-shard reads through a
//     ReadQueue (reads_in_flight of them), parses and checks each as it lands;
//   per-sample reads ("sample"): one thread reads each shard's header and
//     index (a few KiB) and opens the shard, for every batch the assembly may
//     build; the workers then read records themselves (ReadRecord);
//   mapped reads ("map"): the same, and the shard's file is mapped, so that
//     the workers check each record where it lies in the page cache and copy
//     it once, with streaming stores, into the batch (ReadRecord).
//
// Deadlock-freedom: slots >= Schedule::MaxLiveShards, and shards load in
// order of first use, so the shards of the earliest batch not yet built
// always fit (docs/architecture.md, "Why it cannot deadlock").
//
// Retries are the store's (RetryingStore); the source enforces read_timeout
// on whole-shard reads, so that a dead cluster is an error, not a hang.
//
// Thread safety: WaitForBatch, BatchBuilt, AllowBuildUpTo and ReadRecord may
// be called from any thread; view/object of a use are valid between a
// successful WaitForBatch of a batch using it and that batch's BatchBuilt.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "loader/batch_memory.h"
#include "loader/counters.h"
#include "loader/schedule.h"
#include "stoker/loader.h"

namespace stoker {

struct ShardSourceConfig {
  std::shared_ptr<Store> store;
  const format::Manifest* manifest = nullptr;
  const LoaderOptions* options = nullptr;
  bool sample_reads = false;
  bool mapped_reads = false;  // with sample_reads
  uint64_t slot_bytes = 0;
  uint64_t slots = 0;
  std::shared_ptr<BufferPool> pool;
  LoaderCounters* counters = nullptr;
  // Per-sample reads: which batch column receives each field (-1: read,
  // checked, not delivered), and the manifest field of each column.
  std::vector<int> first_column_of_field;
  std::vector<int> column_fields;
  // Mapped reads: columns whose bytes are decoded right after the copy (into
  // a worker's scratch), so copied with stores that keep them in cache.
  std::vector<bool> decoded_columns;
};

class ShardSource final {
 public:
  ShardSource(ShardSourceConfig config, const Schedule& schedule);
  ~ShardSource() { Stop(); }

  void Start();
  // Stops the thread; reads in flight are waited for.
  void Stop();

  // Blocks until every shard batch `b` uses is in memory (OK), or one of them
  // failed (its error), or Stop (*stopped set, Cancelled).
  Status WaitForBatch(uint64_t b, bool* stopped);
  // Batch `b` is built: its shards' slots go back once no batch needs them.
  void BatchBuilt(uint64_t b);
  // Per-sample reads: batches below `limit` may now be built (indexes are
  // loaded only for those: each loaded shard holds an open file).
  void AllowBuildUpTo(uint64_t limit);

  const format::ShardView& view(uint32_t use) const { return state_[use]->view; }
  // Per-sample reads: record `local` of `use` into dst[column] (fields not
  // delivered go to scratch), then its checksum; mapped reads: its checksum
  // where it lies, then its delivered fields into dst[column]. Returns the
  // record's size.
  Result<uint64_t> ReadRecord(uint32_t use, uint32_t local, std::span<std::byte* const> dst);

 private:
  enum class State { kPending, kReading, kReady, kFailed };
  struct UseState {
    State state = State::kPending;
    Status error;
    std::shared_ptr<BatchMemory> buffer;  // whole shard, or header then index
    format::ShardView view;
    std::shared_ptr<ObjectReader> object;  // per-sample reads
    std::span<const std::byte> mapped;     // mapped reads: object's bytes
  };

  void ReaderLoop();
  void IndexLoop();
  Status LoadIndex(UseState& u, uint32_t shard);
  Result<uint64_t> MappedRecord(const UseState& u, uint32_t local, std::span<std::byte* const> dst);
  Status CheckedRecord(const format::ShardView& v, uint32_t local, uint64_t hash,
                       const uint32_t* len, std::span<std::byte* const> dst) const;
  ReadRequest RequestFor(uint64_t use);
  void OnRead(const ReadCompletion& c);
  bool FailOverdue(const std::vector<std::pair<uint64_t, Deadline>>& started);
  void FailAll(const Status& st);
  void Finish(UseState& u, Status st);
  std::string Where(const format::ShardView& v, uint32_t local) const;

  const ShardSourceConfig config_;
  const Schedule& schedule_;
  // Per use: its state while it is live (from its read's start until the
  // last batch that uses it is built), else null: a pointer per use, not a
  // UseState per use (10^6 uses in an epoch of 10^6 shards).
  std::vector<std::unique_ptr<UseState>> state_;
  // Per use: batches still to build from it.
  std::unique_ptr<std::atomic<uint32_t>[]> batches_left_;
  // FailAll's error: every use not ready yet (live or not) has failed.
  Status failed_all_;
  std::mutex mu_;
  std::condition_variable cv_;  // any state change; waiters re-check
  bool stop_ = false;
  uint64_t slots_free_ = 0;
  uint64_t next_read_ = 0;    // next use to read
  uint64_t build_limit_ = 0;  // per-sample reads: batches below it may be built
  std::thread thread_;
};

}  // namespace stoker
