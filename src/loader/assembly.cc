#include "loader/assembly.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>

#include "core/thread_boundary.h"

namespace stoker {
namespace {

// Chunks per worker and batch: enough that a slow sample (a large JPEG) does
// not leave the others idle at the batch's end, few enough that claiming is
// not the work.
constexpr uint64_t kChunksPerWorker = 4;
// Chunks of small samples carry at least this many bytes, so that a claim
// (one contended atomic) stays a small part of the copy.
// (On the 16-core H200 machine, raw 4-12 KiB samples in batches of 64 through
// Python, 16 threads: 64 KiB chunks and every waiting worker woken for each
// batch gave 0.41 M samples/s against 1.08 M at 4 threads.)
constexpr uint64_t kMinChunkBytes = 256 * 1024;

// Record bytes the calling worker read in its current chunk (per-sample reads).
thread_local uint64_t tl_record_bytes = 0;

}  // namespace

struct Assembly::Job {
  uint64_t b = 0;
  uint64_t first = 0;  // the batch's first sample in the rank's plan
  std::vector<uint64_t> ids;
  std::vector<uint8_t> padding;
  std::vector<uint32_t> uses;    // per sample: its shard use (Schedule::uses)
  std::vector<uint32_t> locals;  // per sample: its index within its shard
  BatchSamples samples;
  BatchLayout layout;
  uint32_t chunk_size = 1;
  uint32_t chunks = 0;
  std::atomic<uint32_t> next_chunk{0};
  std::atomic<uint32_t> chunks_left{0};
  std::atomic<uint64_t> workers{0};  // a bit per worker (mod 64) that filled a chunk
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> corrupt_skipped{0};  // counted when the batch is delivered
  std::mutex error_mu;  // the error path only
  Status error;
  uint64_t error_at = UINT64_MAX;  // first sample of the failed chunk reported
};

Assembly::Assembly(AssemblyConfig config, const EpochPlan& plan, const Schedule& schedule,
                   ShardSource& source, OrderedQueue<Result<Batch>>& out)
    : config_(std::move(config)), plan_(plan), schedule_(schedule), source_(source), out_(out) {
  limit_ = config_.window;
}

void Assembly::Start() {
  source_.AllowBuildUpTo(limit_);
  for (uint32_t i = 0; i < config_.threads; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

void Assembly::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) {
    if (w.joinable()) w.join();
  }
  workers_.clear();
}

void Assembly::Consumed(uint64_t next) {
  {
    std::lock_guard lock(mu_);
    limit_ = next + config_.window;
  }
  source_.AllowBuildUpTo(next + config_.window);
  // One worker to open the batch now allowed; it wakes helpers as it needs.
  cv_.notify_one();
}

void Assembly::WorkerLoop(uint32_t id) {
  if (config_.gpu_decode != nullptr && config_.options->decode.worker_nice > 0) {
    // Behind the copier thread that feeds the GPU (DecodeOptions::worker_nice).
    const auto tid = id_t(gettid());
    errno = 0;
    const int now = getpriority(PRIO_PROCESS, tid);
    if (errno == 0) {
      (void)setpriority(PRIO_PROCESS, tid,
                        std::min(19, now + int(config_.options->decode.worker_nice)));
    }
  }
  DecodeScratch scratch;
  std::shared_ptr<Job> job;
  while (true) {
    if (job) {
      const uint32_t c = job->next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (c < job->chunks) {
        FillChunk(*job, c, &scratch, id);
        if (job->chunks_left.fetch_sub(1, std::memory_order_acq_rel) == 1) Complete(*job);
        continue;
      }
    }
    job = NextJob();
    if (!job) return;
  }
}

// An open batch with chunks left to claim, oldest first; else opens the next
// batch (one opener at a time, so batches open in plan order); else waits.
std::shared_ptr<Assembly::Job> Assembly::NextJob() {
  std::unique_lock lock(mu_);
  while (true) {
    if (stop_) return nullptr;
    while (!open_.empty() &&
           open_.front()->next_chunk.load(std::memory_order_relaxed) >= open_.front()->chunks) {
      open_.pop_front();
    }
    for (const auto& j : open_) {
      if (j->next_chunk.load(std::memory_order_relaxed) < j->chunks) return j;
    }
    if (next_open_ >= plan_.num_batches() && !opening_) return nullptr;  // all built or claimed
    if (!opening_ && next_open_ < limit_) {
      opening_ = true;
      const uint64_t b = next_open_++;
      lock.unlock();
      std::shared_ptr<Job> job = Open(b);
      lock.lock();
      opening_ = false;
      if (job) {
        // Wake only as many idle workers as there are chunks for them: waking
        // all of them for every batch costs more than small batches' work.
        const uint32_t helpers = std::min<uint32_t>(idle_, job->chunks - 1);
        open_.push_back(std::move(job));
        for (uint32_t i = 0; i < helpers; ++i) cv_.notify_one();
      }
      continue;
    }
    idle_++;
    cv_.wait(lock);
    idle_--;
  }
}

// Waits for batch b's shards and lays it out; a batch that cannot be built
// (a shard failed, no memory for its block) is completed here with the
// error. Null when stopped or completed.
std::shared_ptr<Assembly::Job> Assembly::Open(uint64_t b) {
  bool stopped = false;
  Status st = source_.WaitForBatch(b, &stopped);
  if (stopped) return nullptr;
  auto job = std::make_shared<Job>();
  job->b = b;
  // What a worker does not expect fails this batch, not the process (the
  // message is built on that path only).
  try {
    st = Lay(*job, std::move(st));
  } catch (...) {
    st = internal::CurrentExceptionStatus("loader assembly worker, opening batch " +
                                          std::to_string(b));
  }
  if (!st.ok()) {
    job->failed = true;
    job->error = std::move(st);
    Complete(*job);
    return nullptr;
  }
  return job;
}

// Batch job.b's samples, and its layout once `shards` (WaitForBatch's) is OK.
Status Assembly::Lay(Job& job, Status shards) {
  const uint64_t b = job.b;
  uint64_t count;
  plan_.BatchRange(b, &job.first, &count);
  job.ids.resize(count);
  job.padding.resize(count);
  job.uses.resize(count);
  job.locals.resize(count);
  for (uint64_t k = 0; k < count; ++k) {
    uint32_t slot;
    const uint64_t j = job.first + k;
    const uint64_t id = plan_.RankSampleSlot(j, &slot);
    const uint32_t use = schedule_.UseOf(j, slot);
    job.ids[k] = id;
    job.padding[k] = plan_.IsPadding(j);
    job.uses[k] = use;
    job.locals[k] = uint32_t(id - config_.manifest->shards.first_sample(schedule_.uses[use].shard));
  }
  STOKER_RETURN_IF_ERROR(shards);
  job.samples = SamplesOf(job);
  const LoaderState after{plan_.epoch(), plan_.PositionAfter(b + 1)};
  STOKER_ASSIGN_OR_RETURN(
      job.layout,
      BatchBuilder::Layout(*config_.pool, *config_.columns, config_.options->decode, job.samples,
                           plan_.epoch(), b + config_.batch_offset, after));
  if (config_.gpu_decode != nullptr) {
    // The image column's slots; the workers leave the GPU's images there.
    for (size_t c = 0; c < config_.columns->size(); ++c) {
      if (!(*config_.columns)[c].decode) continue;
      job.layout.gpu = std::make_shared<GpuDecodeList>(
          &config_.options->decode, config_.gpu_decode->caps(), size_t(count),
          job.layout.column_offset[c], job.layout.image_bytes, config_.gpu_decode->cpu_share());
    }
  }
  job.chunk_size = ChunkSize(count);
  job.chunks = uint32_t((count + job.chunk_size - 1) / job.chunk_size);
  job.chunks_left = job.chunks;
  return Status::Ok();
}

uint32_t Assembly::ChunkSize(uint64_t count) const {
  const format::Manifest& m = *config_.manifest;
  const uint64_t mean =
      m.sample_count ? std::max<uint64_t>(1, m.payload_bytes / m.sample_count) : 1;
  const bool decode = !config_.options->decode.field.empty();
  uint64_t size =
      (count + config_.threads * kChunksPerWorker - 1) / (config_.threads * kChunksPerWorker);
  // Copies from memory are cheap per sample; reads (a system call each, maybe
  // a wait on the device) and decodes are not.
  if (!decode && !config_.sample_reads) size = std::max(size, kMinChunkBytes / mean);
  return uint32_t(std::clamp<uint64_t>(size, 1, count));
}

BatchSamples Assembly::SamplesOf(const Job& job) const {
  BatchSamples s;
  s.count = job.ids.size();
  s.seed = config_.options->seed;
  s.sample_ids = job.ids.data();
  s.padding = job.padding.data();
  auto use = [uses = job.uses.data()](size_t i) { return uses[i]; };
  auto local = [locals = job.locals.data()](size_t i) { return locals[i]; };
  s.check = [this, use, local](size_t i) {
    Status st = source_.view(use(i)).VerifySample(local(i));
    return st.ok() ? st : st.WithContext(config_.uri);
  };
  s.memory = [this, use, local](size_t i) { return source_.view(use(i)).Record(local(i)); };
  s.value = [this, use, local](size_t i, size_t c) {
    return source_.view(use(i)).Field(local(i), uint32_t((*config_.column_fields)[c]));
  };
  s.describe = [this, use, ids = job.ids.data()](size_t i) {
    const uint32_t shard = schedule_.uses[use(i)].shard;
    return config_.uri + "/" + config_.manifest->shards[shard].key + ": sample " +
           std::to_string(ids[i]);
  };
  if (config_.sample_reads) {
    s.length = [this, use, local](size_t i, size_t c) -> uint64_t {
      return source_.view(use(i)).FieldLength(local(i), uint32_t((*config_.column_fields)[c]));
    };
    s.read = [this, use, local](size_t i, std::span<std::byte* const> dst) {
      auto n = source_.ReadRecord(use(i), local(i), dst);
      if (!n.ok()) return n.status();
      tl_record_bytes += *n;
      return Status::Ok();
    };
  }
  return s;
}

void Assembly::FillChunk(Job& job, uint32_t chunk, DecodeScratch* scratch, uint32_t worker) {
  if (job.failed.load(std::memory_order_relaxed)) return;  // the batch fails anyway
  const uint64_t begin = uint64_t(chunk) * job.chunk_size;
  const uint64_t end = std::min<uint64_t>(job.ids.size(), begin + job.chunk_size);
  FillCounts counts;
  tl_record_bytes = 0;
  Status st;
  try {
    st = BatchBuilder::Fill(job.layout, *config_.columns, config_.options->decode, job.samples,
                            begin, end, scratch, &counts);
  } catch (...) {
    // A decoder's or a container's exception fails this batch, not the process.
    st = internal::CurrentExceptionStatus("loader assembly worker, batch " + std::to_string(job.b) +
                                          ", samples " + std::to_string(begin) + ".." +
                                          std::to_string(end));
  }
  job.workers.fetch_or(uint64_t{1} << (worker % 64), std::memory_order_relaxed);
  if (tl_record_bytes) LoaderCounters::Add(config_.counters->bytes_read, tl_record_bytes);
  if (counts.decoded) LoaderCounters::Add(config_.counters->decoded_cpu, counts.decoded);
  if (counts.decode_skipped) {
    job.corrupt_skipped.fetch_add(counts.decode_skipped, std::memory_order_relaxed);
  }
  if (st.ok()) return;
  std::lock_guard lock(job.error_mu);
  if (begin < job.error_at) {  // the earliest sample's error, whichever worker saw it first
    job.error = std::move(st);
    job.error_at = begin;
  }
  job.failed = true;
}

// The last chunk is done (its worker's writes are visible: acq_rel countdown).
void Assembly::Complete(Job& job) {
  Result<Batch> r = job.failed.load()
                        ? Result<Batch>(job.error)
                        : internal::CatchAsStatus("loader assembly worker", [&]() -> Result<Batch> {
                            return BatchBuilder::Finish(std::move(job.layout), *config_.columns,
                                                        config_.options->decode);
                          });
  if (r.ok()) BatchBuilder::SetCorruptSkipped(*r, job.corrupt_skipped.load());
  if (std::popcount(job.workers.load(std::memory_order_relaxed)) > 1) {
    LoaderCounters::Add(config_.counters->shared_batches, 1);
  }
  source_.BatchBuilt(job.b);
  out_.Put(job.b, std::move(r));
}

}  // namespace stoker
