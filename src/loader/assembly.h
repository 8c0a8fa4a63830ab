// The loader's batch assembly (internal): `threads` workers build batches
// together, a chunk of samples at a time, and hand each finished batch to
// an ordered queue.
//
// A batch is opened by one worker at a time: it waits until the shard source
// has the batch's shards (or an index of them) in memory, then lays the batch
// out (BatchBuilder::Layout: every sample's place, which needs every
// sample's length). The batch's samples are then split into chunks that the
// workers claim with an atomic counter; the worker that finishes the last
// chunk (an atomic countdown) finishes the batch and puts it, in any order,
// into the output queue, which hands batches out in plan order. A worker
// takes the assembly's lock once per batch it joins, never per sample, and
// opens the next batch as soon as every chunk of the open ones is claimed,
// so all workers are busy whatever the prefetch depth.
//
// Batches are opened in plan order and only below (next batch consumed) +
// window, which bounds batch memory; see docs/architecture.md for why this
// cannot deadlock with the shard source's bounded slots.
//
// Thread safety: Start, Stop and Consumed from the loader's thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "loader/batch_builder.h"
#include "loader/counters.h"
#include "loader/gpu_decode.h"
#include "loader/ordered_queue.h"
#include "loader/schedule.h"
#include "loader/shard_source.h"
#include "stoker/plan.h"

namespace stoker {

struct AssemblyConfig {
  const format::Manifest* manifest = nullptr;
  const LoaderOptions* options = nullptr;
  std::string uri;
  const std::vector<ColumnSpec>* columns = nullptr;
  const std::vector<int>* column_fields = nullptr;  // manifest field of each column
  bool sample_reads = false;
  std::shared_ptr<BufferPool> pool;
  LoaderCounters* counters = nullptr;
  // The GPU decode (loader/gpu_decode.h), when it runs: the workers leave
  // the images it takes in each batch's GpuDecodeList.
  const GpuDecode* gpu_decode = nullptr;
  uint32_t threads = 1;
  uint32_t window = 1;        // batches built and not yet consumed, at most
  uint64_t batch_offset = 0;  // Batch::index of the plan's batch 0
};

class Assembly final {
 public:
  Assembly(AssemblyConfig config, const EpochPlan& plan, const Schedule& schedule,
           ShardSource& source, OrderedQueue<Result<Batch>>& out);
  ~Assembly() { Stop(); }

  void Start();
  // Joins the workers. Stop the shard source first: an opener may wait on it.
  void Stop();
  // The consumer will take batch `next` next: batches below next + window
  // may now be built.
  void Consumed(uint64_t next);

 private:
  struct Job;
  void WorkerLoop(uint32_t id);
  std::shared_ptr<Job> NextJob();
  std::shared_ptr<Job> Open(uint64_t b);
  Status Lay(Job& job, Status shards);
  BatchSamples SamplesOf(const Job& job) const;
  void FillChunk(Job& job, uint32_t chunk, DecodeScratch* scratch, uint32_t worker);
  void Complete(Job& job);
  uint32_t ChunkSize(uint64_t count) const;

  const AssemblyConfig config_;
  const EpochPlan& plan_;
  const Schedule& schedule_;
  ShardSource& source_;
  OrderedQueue<Result<Batch>>& out_;

  std::mutex mu_;  // guards what follows; taken once per batch per worker
  std::condition_variable cv_;
  bool stop_ = false;
  bool opening_ = false;                   // a worker is opening batch next_open_ - 1
  uint32_t idle_ = 0;                      // workers waiting on cv_
  uint64_t next_open_ = 0;                 // next batch to open
  uint64_t limit_ = 0;                     // batches below it may be opened
  std::deque<std::shared_ptr<Job>> open_;  // opened, chunks left to claim
  std::vector<std::thread> workers_;
};

}  // namespace stoker
