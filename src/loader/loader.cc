// The Loader: epoch plan -> whole-shard reads -> collate workers -> batches.
//
// Threads per epoch: one reader (submits shard reads through a ReadQueue,
// parses and validates each shard as it lands) and `threads` collate workers
// (build batches in any order, at most prefetch_batches ahead of the
// consumer). Next() hands batches out in plan order.
//
// With read_unit "sample" the reader is an index loader instead (IndexLoop:
// each shard's header and index, read synchronously, for the batches the
// workers may build), and the workers read each record straight into its
// batch (ReadRecord). Slots then hold only headers and indexes.
//
// Memory: shard buffers come from a fixed number of slots sized to the
// largest shard, computed from memory_budget; Open checks that the slots can
// hold every shard that one batch position keeps alive (see MaxLiveShards),
// which is what makes the reader/worker hand-off deadlock-free: the reader
// loads shards in order of first use, and a shard's slot is freed as soon as
// the last batch using it is built.
//
// Device delivery (options.device = "cuda:N") adds one copier thread per
// epoch between the workers and Next(): it takes built batches in plan order
// (so device memory is taken in the order it is given back, which keeps the
// bounded device pool deadlock-free), pins each batch buffer the first time
// it is used, and starts its copy on the stager's stream without waiting for
// it. Next() hands out batches whose copy has been started.
#include "stoker/loader.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "gpu/stager.h"
#include "loader/batch_builder.h"
#include "loader/batch_memory.h"
#include "stoker/gpu.h"
#include "stoker/plan.h"

namespace stoker {
namespace {

using format::Manifest;
using format::ShardView;

enum class ShardState { kPending, kReading, kReady, kFailed };

// Exponential backoff before retry `attempt` (1, 2, ...): a restarting OSD
// needs a moment.
std::chrono::milliseconds Backoff(uint32_t attempt, uint32_t first_ms = 50) {
  return std::chrono::milliseconds(uint64_t{first_ms} << std::min<uint32_t>(attempt - 1, 6));
}

// Per-epoch bookkeeping of one shard this rank uses.
struct ShardUse {
  uint32_t shard = 0;
  uint64_t first_batch = 0;
  uint64_t last_batch = 0;
  uint64_t batches_left = 0;  // batches not yet built that use this shard
  ShardState state = ShardState::kPending;
  Status error;
  // Whole shard, or (per-sample reads) header then index bytes.
  std::shared_ptr<BatchMemory> buffer;
  ShardView view;
  uint32_t attempts = 0;
  // Per-sample reads: the shard, open for the workers' record reads.
  std::shared_ptr<ObjectReader> object;
};

// Per-epoch pipeline state. Everything mutable is guarded by mu.
struct Epoch {
  EpochPlan plan;
  // For each of this rank's samples j: index into `uses`, and the sample's
  // index within its shard.
  std::vector<uint32_t> use_of_sample;
  std::vector<uint32_t> local_of_sample;
  // Distinct shard uses of each batch.
  std::vector<std::vector<uint32_t>> batch_uses;
  std::vector<ShardUse> uses;  // in order of first use: the read order

  std::mutex mu;
  std::condition_variable cv;  // any state change; waiters re-check
  bool stop = false;
  uint64_t slots_free = 0;
  uint64_t next_read = 0;     // next index in `uses` to read
  uint64_t next_build = 0;    // next batch a worker may take
  uint64_t next_consume = 0;  // next batch Next() returns
  std::map<uint64_t, Result<Batch>> ready;
  // Device delivery: batches whose copy to the GPU has been started. The
  // copier and Next() wait on condition variables of their own, so that
  // neither is woken by every worker's notify_all, nor wakes every worker.
  uint64_t next_copy = 0;  // next batch the copier takes from `ready`
  std::map<uint64_t, Result<Batch>> copied;
  std::condition_variable copy_cv;    // a batch landed in `ready`, or stop
  std::condition_variable copied_cv;  // a batch landed in `copied`

  Status failed;  // sticky: the first error delivered by Next()

  std::thread reader;
  std::vector<std::thread> workers;
  std::thread copier;

  explicit Epoch(EpochPlan p) : plan(std::move(p)) {}
};

// The most shard uses alive at any one batch: a use is alive from its first
// batch to its last.
uint64_t MaxLiveShards(const std::vector<ShardUse>& uses, uint64_t num_batches) {
  std::vector<int64_t> delta(num_batches + 1, 0);
  for (const auto& u : uses) {
    delta[u.first_batch]++;
    delta[u.last_batch + 1]--;
  }
  int64_t live = 0, best = 0;
  for (uint64_t b = 0; b < num_batches; ++b) {
    live += delta[b];
    best = std::max(best, live);
  }
  return uint64_t(best);
}

class LoaderImpl final : public Loader {
 public:
  LoaderImpl(std::shared_ptr<Store> store, Manifest manifest, LoaderOptions options,
             std::vector<ColumnSpec> columns, std::vector<int> column_fields, int device)
      : device_(device),
        store_(std::move(store)),
        manifest_(std::move(manifest)),
        options_(std::move(options)),
        columns_(std::move(columns)),
        column_fields_(std::move(column_fields)) {
    for (const auto& s : manifest_.shards) {
      shard_samples_.push_back(s.samples);
      max_shard_bytes_ = std::max(max_shard_bytes_, s.bytes);
    }
    const std::string& unit = options_.read_unit;
    const uint64_t mean_record =
        manifest_.sample_count ? manifest_.payload_bytes / manifest_.sample_count : 0;
    sample_reads_ = unit == "sample" || (unit == "auto" && !options_.direct_io &&
                                         mean_record >= kSampleReadMinBytes &&
                                         store_->local_reads());
    slot_bytes_ = max_shard_bytes_;
    if (sample_reads_) {
      slot_bytes_ = 0;
      for (uint32_t i = 0; i < manifest_.shards.size(); ++i) {
        uint64_t offset, length;
        ShardView::IndexRange(format::ExpectationFor(manifest_, i), &offset, &length);
        slot_bytes_ = std::max(slot_bytes_, format::kShardHeaderBytes + length);
      }
      first_column_of_field_.assign(manifest_.fields.size(), -1);
      for (size_t c = 0; c < column_fields_.size(); ++c) {
        int& first = first_column_of_field_[size_t(column_fields_[c])];
        if (first < 0) first = int(c);
      }
    }
    // Shard slots are all the size of the largest shard, so any slot serves
    // any shard and the budget arithmetic is exact.
    shard_pool_ = std::make_shared<BufferPool>(kDirectIoAlignment, SIZE_MAX, /*slack=*/false);
    // Pinned batch buffers own whole pages: two blocks sharing a page could
    // not both be registered with CUDA.
    batch_pool_ = std::make_shared<BufferPool>(device_ >= 0 ? kPinAlignment : kColumnAlignment,
                                               options_.prefetch_batches + 2,
                                               /*slack=*/true);
  }

  ~LoaderImpl() override { StopEpoch(); }

  Status Init() {
    // The slots the budget allows, after the batches built ahead.
    uint64_t batch_bytes = EstimatedBatchBytes();
    uint64_t reserve = batch_bytes * (options_.prefetch_batches + 1);
    if (slot_bytes_ == 0) {
      slots_ = 1;
    } else {
      slots_ = options_.memory_budget > reserve ? (options_.memory_budget - reserve) / slot_bytes_
                                                : 0;
    }
    if (device_ >= 0) {
      gpu::StagerOptions so;
      so.device = device_;
      so.memory_budget = options_.device_memory_budget;
      if (so.memory_budget == 0) {
        // Batches of the largest possible size, with the pool's 1/8 slack and
        // room for the layout's alignment.
        so.memory_budget = std::max<uint64_t>(
            64ull << 20, (options_.prefetch_batches + 4) * (batch_bytes + batch_bytes / 8 + 65536));
      }
      STOKER_ASSIGN_OR_RETURN(stager_, gpu::Stager::Open(so));
    }
    STOKER_RETURN_IF_ERROR(CheckResumeState(options_.start, manifest_, options_));
    return StartEpoch(options_.start.epoch, options_.start.position);
  }

  const Manifest& manifest() const override { return manifest_; }
  const LoaderOptions& options() const override { return options_; }

  Status StartEpoch(uint64_t epoch, uint64_t position) override {
    StopEpoch();
    PlanOptions po;
    po.seed = options_.seed;
    po.shuffle = options_.shuffle;
    po.shuffle_window_shards = options_.shuffle_window_shards;
    po.batch_size = options_.batch_size;
    po.rank = options_.rank;
    po.world_size = options_.world_size;
    po.drop_last = options_.drop_last;
    STOKER_ASSIGN_OR_RETURN(EpochPlan plan,
                            EpochPlan::Make(manifest_.Id64(), shard_samples_, po, epoch, position));
    auto e = std::make_unique<Epoch>(std::move(plan));
    BuildSchedule(*e);
    const uint64_t need = MaxLiveShards(e->uses, e->plan.num_batches());
    if (need > slots_) {
      const uint64_t reserve = EstimatedBatchBytes() * (options_.prefetch_batches + 1);
      return InvalidArgument(
          "memory_budget " + std::to_string(options_.memory_budget >> 20) +
          " MiB is too small: this plan keeps " + std::to_string(need) + " shards of up to " +
          std::to_string(slot_bytes_ >> 10) + " KiB alive at once; it needs at least " +
          std::to_string((need * slot_bytes_ + reserve + (1 << 20) - 1) >> 20) +
          " MiB (or a smaller shuffle_window_shards, batch_size or prefetch_batches)");
    }
    // No more slots than the plan can use at once: fewer buffers to fault in
    // and to keep, the same overlap.
    // Per-sample reads: a slot is a header and an index (a few KiB), and
    // the index loader fills slots only for batches the workers may build
    // (see IndexLoop), so it may run further ahead than reads_in_flight:
    // every worker needs its batch's shards at once.
    e->slots_free = std::min<uint64_t>(
        slots_, need + (sample_reads_ ? std::max<uint64_t>(options_.reads_in_flight, kIndexAhead)
                                      : options_.reads_in_flight));
    epoch_ = std::move(e);
    last_state_ = {epoch, position};
    Epoch* ep = epoch_.get();
    ep->reader = std::thread([this, ep] { sample_reads_ ? IndexLoop(*ep) : ReaderLoop(*ep); });
    uint32_t threads = options_.threads;
    if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
    for (uint32_t i = 0; i < threads; ++i) {
      ep->workers.emplace_back([this, ep] { WorkerLoop(*ep); });
    }
    if (stager_) ep->copier = std::thread([this, ep] { CopierLoop(*ep); });
    return Status::Ok();
  }

  Result<Batch> Next() override {
    if (!epoch_) return InvalidArgument("no epoch started (the last StartEpoch failed)");
    Epoch& e = *epoch_;
    std::unique_lock lock(e.mu);
    if (!e.failed.ok()) return e.failed;
    if (e.next_consume >= e.plan.num_batches()) {
      return OutOfRange("epoch " + std::to_string(e.plan.epoch()) + " is over");
    }
    const auto start = Clock::now();
    auto& from = stager_ ? e.copied : e.ready;
    if (stager_) {
      STOKER_RETURN_IF_ERROR(WaitForCopy(e, lock));
    } else {
      auto built = [&] { return e.ready.count(e.next_consume) > 0; };
      // Per-sample reads run in the workers, outside the reader's deadlines:
      // a read blocked in the kernel shows here, after read_timeout.
      if (!sample_reads_) {
        e.cv.wait(lock, built);
      } else if (!e.cv.wait_for(lock, options_.read_timeout, built)) {
        e.failed = NotBuiltInTime(e);
        return e.failed;
      }
    }
    const auto waited = Clock::now() - start;
    auto node = from.extract(e.next_consume);
    e.next_consume++;
    e.cv.notify_all();
    Result<Batch> r = std::move(node.mapped());
    if (!r.ok()) {
      e.failed = r.status();
      return r;
    }
    last_state_ = r->state_after();
    std::lock_guard stats_lock(stats_mu_);
    stats_.wait_time += waited;
    stats_.batches_delivered++;
    stats_.samples_delivered += r->size();
    return r;
  }

  uint64_t num_batches() const override { return epoch_ ? epoch_->plan.num_batches() : 0; }
  LoaderState state() const override { return last_state_; }
  std::string_view read_unit() const override { return sample_reads_ ? "sample" : "shard"; }
  LoaderStats stats() const override {
    LoaderStats s;
    {
      std::lock_guard lock(stats_mu_);
      s = stats_;
    }
    s.peak_buffer_bytes = shard_pool_->peak_bytes() + batch_pool_->peak_bytes();
    if (stager_) {
      const gpu::StagerStats g = stager_->stats();
      s.h2d_bytes = g.bytes;
      s.h2d_time = g.copy_time;
      s.device_bytes = g.device_bytes;
      s.peak_device_bytes = g.peak_device_bytes;
      s.pinned_bytes = g.pinned_bytes;
    }
    return s;
  }

 private:
  // Per-sample reads: shards whose index may be loaded ahead of the plan's
  // need, at most (each holds an open file descriptor).
  static constexpr uint64_t kIndexAhead = 256;
  // Pinned blocks are page-aligned and whole pages.
  static constexpr size_t kPinAlignment = 4096;

  // Next() with device delivery: waits for batch next_consume's copy to have
  // started. The copier takes device memory in plan order, so if it waits for
  // memory while working on the very batch Next() wants, only batches the
  // consumer holds can free some: after a grace period (another thread of
  // the consumer may be about to release one) that is an error, not a hang.
  Status WaitForCopy(Epoch& e, std::unique_lock<std::mutex>& lock) {
    constexpr auto kGrace = std::chrono::seconds(2);
    bool stuck = false;
    Clock::time_point stuck_since{};
    const Deadline unbuilt_deadline = Clock::now() + options_.read_timeout;
    while (e.copied.count(e.next_consume) == 0) {
      e.copied_cv.wait_for(lock, std::chrono::milliseconds(50));
      if (e.copied.count(e.next_consume) > 0) break;
      if (sample_reads_ && e.next_copy == e.next_consume && !stager_->waiting_for_memory() &&
          Clock::now() > unbuilt_deadline) {
        e.failed = NotBuiltInTime(e);  // see Next()
        return e.failed;
      }
      if (e.next_copy != e.next_consume || !stager_->waiting_for_memory()) {
        stuck = false;
        continue;
      }
      const auto now = Clock::now();
      if (!stuck) {
        stuck = true;
        stuck_since = now;
      }
      if (now - stuck_since >= kGrace) {
        const gpu::StagerStats g = stager_->stats();
        e.failed = NoSpace(
            DeviceName(device_) + ": the device memory for batches (" +
            std::to_string(g.device_bytes >> 20) +
            " MiB, device_memory_budget) is all held by batches already delivered and still "
            "alive; release batches sooner or raise device_memory_budget");
        return e.failed;
      }
    }
    return Status::Ok();
  }

  Status NotBuiltInTime(const Epoch& e) const {
    return TimedOut("batch " + std::to_string(e.next_consume) + " of epoch " +
                    std::to_string(e.plan.epoch()) + " was not built within read_timeout (" +
                    std::to_string(options_.read_timeout.count()) + " ms): a record read from " +
                    store_->uri() + " is blocked");
  }

  // ---- copier (device delivery) ---------------------------------------------
  void CopierLoop(Epoch& e) {
    const uint64_t nb = e.plan.num_batches();
    while (true) {
      uint64_t b;
      std::optional<Result<Batch>> r;
      {
        std::unique_lock lock(e.mu);
        e.copy_cv.wait(
            lock, [&] { return e.stop || e.next_copy >= nb || e.ready.count(e.next_copy) > 0; });
        if (e.stop || e.next_copy >= nb) return;
        b = e.next_copy;
        auto node = e.ready.extract(b);
        r.emplace(std::move(node.mapped()));
      }
      if (r->ok()) r.emplace(ToDevice(e, std::move(*r).value()));
      std::lock_guard lock(e.mu);
      e.copied.emplace(b, std::move(*r));
      e.next_copy++;
      e.copied_cv.notify_one();
    }
  }

  Result<Batch> ToDevice(Epoch& e, Batch batch) {
    const std::shared_ptr<BatchMemory>& mem = BatchBuilder::Memory(batch);
    const std::string what =
        "batch " + std::to_string(batch.index()) + " of epoch " + std::to_string(batch.epoch());
    if (!mem->pinned()) {
      auto pin = stager_->Pin(mem->data(), mem->capacity());
      if (!pin.ok()) return pin.status().WithContext(what);
      mem->set_pin(std::move(pin).value());
    }
    auto stopped = [&e] {
      std::lock_guard lock(e.mu);
      return e.stop;
    };
    auto copy = stager_->Copy({mem->data(), mem->size()}, mem, stopped);
    if (!copy.ok()) return copy.status().WithContext(what);
    BatchBuilder::AttachDevice(batch, std::move(copy).value());
    return batch;
  }

  uint64_t EstimatedBatchBytes() const {
    uint64_t per_sample = 16;
    const uint64_t avg_field = manifest_.max_sample_bytes;
    for (const auto& c : columns_) {
      if (c.decode) {
        per_sample += DecodedSampleBytes(options_.decode);
      } else if (c.type == format::FieldType::kInt64) {
        per_sample += 8;
      } else {
        per_sample += 8 + avg_field;
      }
    }
    return per_sample * options_.batch_size;
  }

  void BuildSchedule(Epoch& e) {
    const EpochPlan& p = e.plan;
    const uint64_t nb = p.num_batches();
    e.use_of_sample.resize(p.rank_samples());
    e.local_of_sample.resize(p.rank_samples());
    e.batch_uses.resize(nb);
    std::vector<int64_t> use_of_shard(manifest_.shards.size(), -1);
    std::vector<uint64_t> added_in_batch;  // per use: last batch it was added to, + 1
    for (uint64_t b = 0; b < nb; ++b) {
      uint64_t first, count;
      p.BatchRange(b, &first, &count);
      for (uint64_t j = first; j < first + count; ++j) {
        const uint64_t id = p.RankSample(j);
        const auto s = static_cast<uint32_t>(manifest_.ShardOf(id));
        if (use_of_shard[s] < 0) {
          use_of_shard[s] = int64_t(e.uses.size());
          ShardUse u;
          u.shard = s;
          u.first_batch = b;
          e.uses.push_back(std::move(u));
          added_in_batch.push_back(0);
        }
        const auto u = static_cast<uint32_t>(use_of_shard[s]);
        if (added_in_batch[u] != b + 1) {
          added_in_batch[u] = b + 1;
          e.batch_uses[b].push_back(u);
          e.uses[u].batches_left++;
          e.uses[u].last_batch = b;
        }
        e.use_of_sample[j] = u;
        e.local_of_sample[j] = static_cast<uint32_t>(id - manifest_.shards[s].first_sample);
      }
    }
  }

  void StopEpoch() {
    if (!epoch_) return;
    {
      std::lock_guard lock(epoch_->mu);
      epoch_->stop = true;
    }
    epoch_->cv.notify_all();
    epoch_->copy_cv.notify_all();
    if (epoch_->reader.joinable()) epoch_->reader.join();
    for (auto& w : epoch_->workers) {
      if (w.joinable()) w.join();
    }
    if (epoch_->copier.joinable()) epoch_->copier.join();
    epoch_.reset();  // shard buffers go back to the pool; batches in `ready` are freed
  }

  // ---- reader ---------------------------------------------------------------
  void ReaderLoop(Epoch& e) {
    ReadQueueOptions qo;
    qo.depth = std::max(1u, options_.reads_in_flight);
    qo.direct_io = options_.direct_io;
    auto queue_or = store_->NewReadQueue(qo);
    if (!queue_or.ok()) {
      FailAll(e, queue_or.status());
      return;
    }
    std::unique_ptr<ReadQueue> queue = std::move(queue_or).value();
    std::vector<ReadCompletion> done;
    std::vector<std::pair<uint64_t, Deadline>> retry_at;  // use index, when
    // use index -> its deadline: read_timeout from the first attempt, so a
    // dead cluster fails the epoch after read_timeout, retries included.
    std::map<uint64_t, Deadline> started;
    while (true) {
      std::vector<ReadRequest> batch;
      {
        std::unique_lock lock(e.mu);
        if (e.stop) break;
        // Retries first: they are older than anything new.
        const auto now = Clock::now();
        for (auto it = retry_at.begin(); it != retry_at.end();) {
          if (it->second <= now) {
            batch.push_back(RequestFor(e, it->first));
            it = retry_at.erase(it);
          } else {
            ++it;
          }
        }
        while (e.next_read < e.uses.size() && e.slots_free > 0 &&
               queue->Outstanding() + batch.size() < qo.depth) {
          ShardUse& u = e.uses[e.next_read];
          u.buffer = shard_pool_->Get(max_shard_bytes_);
          u.state = ShardState::kReading;
          e.slots_free--;
          batch.push_back(RequestFor(e, e.next_read));
          e.next_read++;
        }
        if (batch.empty() && queue->Outstanding() == 0 && retry_at.empty()) {
          if (e.next_read >= e.uses.size()) break;  // every shard read
          e.cv.wait(lock, [&] { return e.stop || e.slots_free > 0; });
          continue;
        }
      }
      for (const auto& r : batch) started.emplace(r.tag, Clock::now() + options_.read_timeout);
      if (!batch.empty()) {
        Status st = queue->Submit(batch);
        if (!st.ok()) {
          FailAll(e, st);
          break;
        }
      }
      done.clear();
      // Wake up now and then to notice stop, retries due and overdue reads.
      auto wait_or = queue->Wait(1, Clock::now() + std::chrono::milliseconds(50), &done);
      (void)wait_or;  // TimedOut just means nothing landed in this slice
      for (auto& c : done) {
        if (OnRead(e, c, &retry_at)) started.erase(c.tag);
      }
      const auto now = Clock::now();
      for (const auto& [use, deadline] : started) {
        if (deadline < now) {
          const auto& key = manifest_.shards[e.uses[use].shard].key;
          FailAll(e, TimedOut(store_->uri() + "/" + key + ": read did not complete within " +
                              std::to_string(options_.read_timeout.count()) + " ms"));
          // The queue still owns buffers of outstanding reads; its destructor
          // (below) waits for them before the buffers can be reused.
          return;
        }
      }
    }
  }

  ReadRequest RequestFor(Epoch& e, uint64_t use) {
    ShardUse& u = e.uses[use];
    const auto& info = manifest_.shards[u.shard];
    ReadRequest r;
    r.key = info.key;
    r.offset = 0;
    r.dst = {u.buffer->data(), info.bytes};
    r.tag = use;
    u.attempts++;
    return r;
  }

  // Handles a landed read; false when it is to be retried.
  bool OnRead(Epoch& e, const ReadCompletion& c,
              std::vector<std::pair<uint64_t, Deadline>>* retry) {
    ShardUse& u = e.uses[c.tag];
    const auto& info = manifest_.shards[u.shard];
    Status st = c.status;
    if (st.ok() && c.bytes != info.bytes) {
      st = Corruption(store_->uri() + "/" + info.key + ": truncated: read " +
                      std::to_string(c.bytes) + " bytes, the manifest says " +
                      std::to_string(info.bytes));
    }
    if (!st.ok() && st.retryable() && u.attempts <= options_.read_retries) {
      // Exponential backoff from 50 ms: a restarting OSD needs a moment.
      auto delay = Backoff(u.attempts);
      retry->emplace_back(c.tag, Clock::now() + delay);
      std::lock_guard lock(stats_mu_);
      stats_.read_retries++;
      return false;
    }
    if (st.ok()) {
      auto view = ShardView::Parse({u.buffer->data(), info.bytes},
                                   format::ExpectationFor(manifest_, u.shard));
      if (view.ok()) {
        u.view = std::move(view).value();
      } else {
        st = view.status().WithContext(store_->uri());
      }
    } else if (st.code() != Code::kCorruption) {
      st = st.WithContext("reading shard " + info.key + " of " + store_->uri());
    }
    {
      std::lock_guard lock(stats_mu_);
      stats_.shards_read += st.ok();
      stats_.bytes_read += st.ok() ? c.bytes : 0;
    }
    std::lock_guard lock(e.mu);
    u.state = st.ok() ? ShardState::kReady : ShardState::kFailed;
    u.error = st;
    e.cv.notify_all();
    return true;
  }


  // ---- per-sample reads: the index loader -------------------------------------
  // Takes the reader's place with read_unit "sample": loads each shard's
  // header and index, in order of first use, synchronously (a few small
  // reads, no thread hand-offs), for every batch the workers may build.
  // Keeping only reads_in_flight indexes ahead starved the workers on a
  // 16-core H200 machine: a 256 x 128 KiB batch spans ~16 shards of 4 MiB,
  // and 32 indexes ahead gave 14-16 GB/s (35-39 GB/s with 64 MiB shards);
  // loading for the whole build window gives 29. Cold shards still stream
  // in ahead: each loaded shard's records are handed to the kernel's
  // readahead (WillNeed) before the workers need them.
  void IndexLoop(Epoch& e) {
    while (true) {
      uint64_t use;
      {
        std::unique_lock lock(e.mu);
        // Shards of batches the workers may build now, no further: each
        // loaded shard holds an open file until its last batch is built.
        const uint64_t window = std::max(1u, options_.prefetch_batches);
        e.cv.wait(lock, [&] {
          return e.stop || e.next_read >= e.uses.size() ||
                 (e.slots_free > 0 && e.uses[e.next_read].first_batch < e.next_consume + window);
        });
        if (e.stop || e.next_read >= e.uses.size()) return;
        use = e.next_read++;
        e.slots_free--;
        e.uses[use].buffer = shard_pool_->Get(slot_bytes_);
        e.uses[use].state = ShardState::kReading;
      }
      ShardUse& u = e.uses[use];
      Status st = LoadIndex(u);
      for (uint32_t attempt = 1; !st.ok() && st.retryable() && attempt <= options_.read_retries;
           ++attempt) {
        {
          std::lock_guard lock(stats_mu_);
          stats_.read_retries++;
        }
        std::this_thread::sleep_for(Backoff(attempt));
        st = LoadIndex(u);
      }
      {
        std::lock_guard lock(stats_mu_);
        stats_.shards_read += st.ok();
      }
      std::lock_guard lock(e.mu);
      u.state = st.ok() ? ShardState::kReady : ShardState::kFailed;
      u.error = st;
      e.cv.notify_all();
    }
  }

  // Opens shard u, reads and checks its header and index into u.buffer
  // (header first, then the bytes holding the index), and hints its records.
  Status LoadIndex(ShardUse& u) {
    const auto& info = manifest_.shards[u.shard];
    const std::string what = store_->uri() + "/" + info.key;
    auto object = store_->OpenReader(info.key);
    if (!object.ok()) {
      return object.status().WithContext("opening shard " + info.key + " of " + store_->uri());
    }
    const format::ShardExpectation expect = format::ExpectationFor(manifest_, u.shard);
    uint64_t offset, length;
    ShardView::IndexRange(expect, &offset, &length);
    std::byte* base = u.buffer->data();
    const uint64_t header_bytes = std::min<uint64_t>(info.bytes, format::kShardHeaderBytes);
    const std::span<std::byte> header(base, header_bytes);
    const std::span<std::byte> tail(base + format::kShardHeaderBytes, length);
    for (const auto& [at, dst] : {std::pair{uint64_t{0}, header}, std::pair{offset, tail}}) {
      auto n = (*object)->ReadV(at, {&dst, 1});
      if (!n.ok()) return n.status().WithContext("reading shard " + info.key + " of " + store_->uri());
      if (*n != dst.size()) {
        return Corruption(what + ": truncated: read " + std::to_string(*n) + " bytes at offset " +
                          std::to_string(at) + ", expected " + std::to_string(dst.size()) +
                          " (the manifest says " + std::to_string(info.bytes) + " bytes in all)");
      }
    }
    {
      std::lock_guard lock(stats_mu_);
      stats_.bytes_read += header.size() + tail.size();
    }
    auto view = ShardView::ParseIndex(header, tail, offset, expect);
    if (!view.ok()) return view.status().WithContext(store_->uri());
    u.view = std::move(view).value();
    u.object = std::move(object).value();
    // The records, in the order the workers will want them: a cold shard
    // streams in from the device as a whole-shard read would.
    u.object->WillNeed(format::kShardHeaderBytes, u.view.index_offset());
    return Status::Ok();
  }

  void FailAll(Epoch& e, const Status& st) {
    std::lock_guard lock(e.mu);
    for (auto& u : e.uses) {
      if (u.state == ShardState::kPending || u.state == ShardState::kReading) {
        u.state = ShardState::kFailed;
        u.error = st;
      }
    }
    e.cv.notify_all();
  }

  // ---- collate workers ------------------------------------------------------
  void WorkerLoop(Epoch& e) {
    const uint64_t nb = e.plan.num_batches();
    while (true) {
      uint64_t b;
      Status shard_error;
      {
        std::unique_lock lock(e.mu);
        e.cv.wait(lock, [&] {
          return e.stop || e.next_build >= nb ||
                 e.next_build < e.next_consume + std::max(1u, options_.prefetch_batches);
        });
        if (e.stop || e.next_build >= nb) return;
        b = e.next_build++;
        // Wait for this batch's shards (or an error in one of them).
        e.cv.wait(lock, [&] {
          if (e.stop) return true;
          for (uint32_t u : e.batch_uses[b]) {
            if (e.uses[u].state != ShardState::kReady && e.uses[u].state != ShardState::kFailed) {
              return false;
            }
          }
          return true;
        });
        if (e.stop) return;
        for (uint32_t u : e.batch_uses[b]) {
          if (e.uses[u].state == ShardState::kFailed) {
            shard_error = e.uses[u].error;
            break;
          }
        }
      }
      Result<Batch> batch = shard_error.ok() ? BuildBatch(e, b) : Result<Batch>(shard_error);
      std::lock_guard lock(e.mu);
      for (uint32_t u : e.batch_uses[b]) {
        ShardUse& use = e.uses[u];
        if (--use.batches_left == 0 && use.buffer) {
          // Only a landed read may give its buffer back: a failed-over read
          // may still be in flight into it.
          if (use.state == ShardState::kReady) {
            use.buffer.reset();
            use.view = ShardView();
            use.object.reset();
            e.slots_free++;
          }
        }
      }
      e.ready.emplace(b, std::move(batch));
      e.cv.notify_all();
      e.copy_cv.notify_one();  // the copier, with device delivery
    }
  }

  Result<Batch> BuildBatch(Epoch& e, uint64_t b) {
    uint64_t first, count;
    e.plan.BatchRange(b, &first, &count);
    std::vector<uint64_t> ids(count);
    std::vector<uint8_t> padding(count);
    for (uint64_t k = 0; k < count; ++k) {
      ids[k] = e.plan.RankSample(first + k);
      padding[k] = e.plan.IsPadding(first + k);
    }
    BatchSamples s;
    // Every sample is checked before it is delivered.
    s.check = [&](size_t i) {
      const ShardUse& u = e.uses[e.use_of_sample[first + i]];
      Status st = u.view.VerifySample(e.local_of_sample[first + i]);
      return st.ok() ? st : st.WithContext(store_->uri());
    };
    s.memory = [&](size_t i) {
      const ShardUse& u = e.uses[e.use_of_sample[first + i]];
      return u.view.Record(e.local_of_sample[first + i]);
    };
    s.count = count;
    s.seed = options_.seed;
    s.sample_ids = ids.data();
    s.padding = padding.data();
    s.value = [&](size_t i, size_t c) {
      const ShardUse& u = e.uses[e.use_of_sample[first + i]];
      return u.view.Field(e.local_of_sample[first + i], uint32_t(column_fields_[c]));
    };
    s.describe = [&](size_t i) {
      const ShardUse& u = e.uses[e.use_of_sample[first + i]];
      return store_->uri() + "/" + manifest_.shards[u.shard].key + ": sample " +
             std::to_string(ids[i]);
    };
    uint64_t record_bytes = 0;
    if (sample_reads_) {
      s.length = [&](size_t i, size_t c) -> uint64_t {
        const ShardUse& u = e.uses[e.use_of_sample[first + i]];
        return u.view.FieldLength(e.local_of_sample[first + i], uint32_t(column_fields_[c]));
      };
      s.read = [&](size_t i, std::span<std::byte* const> dst) {
        const ShardUse& u = e.uses[e.use_of_sample[first + i]];
        auto n = ReadRecord(u, e.local_of_sample[first + i], dst);
        if (!n.ok()) return n.status();
        record_bytes += *n;
        return Status::Ok();
      };
    }
    Result<Batch> batch =
        BatchBuilder::Build(*batch_pool_, columns_, options_.decode, s, e.plan.epoch(),
                            b + BatchOffset(e), {e.plan.epoch(), e.plan.PositionAfter(b + 1)});
    if (record_bytes > 0) {
      std::lock_guard lock(stats_mu_);
      stats_.bytes_read += record_bytes;
    }
    return batch;
  }

  // Per-sample reads: sample `local` of use `u` straight into the batch, the
  // delivered fields to dst[column] and the others to scratch, in one
  // scatter read, then its checksum over the bytes just landed (in cache).
  // Returns the record's size.
  Result<uint64_t> ReadRecord(const ShardUse& u, uint32_t local, std::span<std::byte* const> dst) {
    const ShardView& v = u.view;
    const uint32_t fields = v.field_count();
    thread_local std::vector<std::byte> skipped;
    uint32_t len[format::kMaxFields];
    uint64_t record = 0, skipped_bytes = 0;
    for (uint32_t f = 0; f < fields; ++f) {
      len[f] = v.FieldLength(local, f);
      record += len[f];
      if (first_column_of_field_[f] < 0) skipped_bytes += len[f];
    }
    if (skipped.size() < skipped_bytes) skipped.resize(skipped_bytes);
    std::span<std::byte> pieces[format::kMaxFields];
    uint64_t at = 0;
    for (uint32_t f = 0; f < fields; ++f) {
      const int c = first_column_of_field_[f];
      if (c >= 0) {
        pieces[f] = {dst[size_t(c)], len[f]};
      } else {
        pieces[f] = {skipped.data() + at, len[f]};
        at += len[f];
      }
    }
    const std::span<const std::span<std::byte>> all(pieces, fields);
    const uint64_t offset = v.RecordOffset(local);
    auto where = [&] {
      return store_->uri() + "/" + v.key() + ": sample " + std::to_string(local) + " (global " +
             std::to_string(v.first_sample() + local) + ")";
    };
    Result<size_t> n = u.object->ReadV(offset, all);
    for (uint32_t attempt = 1; !n.ok() && n.status().retryable() && attempt <= options_.read_retries;
         ++attempt) {
      std::this_thread::sleep_for(Backoff(attempt, 10));
      n = u.object->ReadV(offset, all);
    }
    if (!n.ok()) return n.status().WithContext(where());
    if (*n != record) {
      return Corruption(where() + ": truncated: read " + std::to_string(*n) + " of its " +
                        std::to_string(record) + " bytes at offset " + std::to_string(offset));
    }
    uint64_t hash;
    if (fields == 1) {
      hash = format::Hash64(pieces[0]);
    } else {
      format::Hash64Stream h;
      for (const auto& p : all) h.Update(p);
      hash = h.Digest();
    }
    Status st = v.CheckRecord(local, hash);
    if (!st.ok()) return st.WithContext(store_->uri());
    // A field delivered twice: its other columns are copies.
    for (size_t c = 0; c < column_fields_.size(); ++c) {
      const int first = first_column_of_field_[size_t(column_fields_[c])];
      if (first != int(c)) std::memcpy(dst[c], dst[size_t(first)], len[column_fields_[c]]);
    }
    return record;
  }

  // Batches before the start position, so Batch::index counts from the
  // epoch's start also after a resume.
  uint64_t BatchOffset(const Epoch& e) const {
    const uint64_t per_step = uint64_t(options_.batch_size) * options_.world_size;
    return e.plan.start_position() / per_step;
  }

  const int device_;  // -1: host delivery
  std::shared_ptr<Store> store_;
  const Manifest manifest_;
  const LoaderOptions options_;
  const std::vector<ColumnSpec> columns_;
  const std::vector<int> column_fields_;  // manifest field index of each column
  std::vector<uint32_t> shard_samples_;
  uint64_t max_shard_bytes_ = 0;
  // read_unit "sample" (decided once, at Open), the size of one shard slot,
  // and which column receives each field (-1: read, checked, not delivered).
  bool sample_reads_ = false;
  uint64_t slot_bytes_ = 0;
  std::vector<int> first_column_of_field_;
  uint64_t slots_ = 0;
  std::shared_ptr<BufferPool> shard_pool_;
  std::shared_ptr<BufferPool> batch_pool_;
  // Device delivery; outlives every epoch (StopEpoch runs first).
  std::unique_ptr<gpu::Stager> stager_;
  std::unique_ptr<Epoch> epoch_;
  LoaderState last_state_;
  mutable std::mutex stats_mu_;
  LoaderStats stats_;
};

Status ValidateOptions(const LoaderOptions& o) {
  if (o.batch_size == 0) return InvalidArgument("batch_size must be at least 1");
  if (o.world_size == 0) return InvalidArgument("world_size must be at least 1");
  if (o.rank >= o.world_size) {
    return InvalidArgument("rank " + std::to_string(o.rank) + " must be below world_size " +
                           std::to_string(o.world_size));
  }
  if (o.reads_in_flight == 0) return InvalidArgument("reads_in_flight must be at least 1");
  if (o.shuffle_window_shards == 0) return InvalidArgument("shuffle_window_shards must be >= 1");
  STOKER_RETURN_IF_ERROR(ValidateDecodeOptions(o.decode));
  if (o.read_timeout.count() <= 0) return InvalidArgument("read_timeout must be positive");
  if (o.read_unit != "auto" && o.read_unit != "shard" && o.read_unit != "sample") {
    return InvalidArgument("read_unit must be auto, shard or sample, not '" + o.read_unit + "'");
  }
  if (o.read_unit == "sample" && o.direct_io) {
    return InvalidArgument(
        "read_unit sample cannot be used with direct_io: records are not block-aligned");
  }
  STOKER_RETURN_IF_ERROR(ParseDevice(o.device).status());
  return Status::Ok();
}

}  // namespace

Result<format::Manifest> ReadManifest(Store& store) {
  auto raw = store.ReadAll(format::kManifestKey);
  if (!raw.ok()) {
    if (raw.status().code() == Code::kNotFound) {
      return NotFound("no stoker dataset at " + store.uri() + " (no " +
                      std::string(format::kManifestKey) + ")");
    }
    return raw.status();
  }
  return format::DecodeManifest(*raw, store.uri() + "/" + std::string(format::kManifestKey));
}

Result<std::unique_ptr<Loader>> Loader::Open(std::string_view uri, const LoaderOptions& options) {
  STOKER_RETURN_IF_ERROR(ValidateOptions(options));
  STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(uri, options.store));
  return Open(std::move(store), options);
}

Result<std::unique_ptr<Loader>> Loader::Open(std::shared_ptr<Store> store,
                                             const LoaderOptions& options) {
  STOKER_RETURN_IF_ERROR(ValidateOptions(options));
  STOKER_ASSIGN_OR_RETURN(format::Manifest manifest, ReadManifest(*store));

  std::vector<ColumnSpec> columns;
  std::vector<int> fields;
  std::vector<std::string> wanted = options.fields;
  if (wanted.empty()) {
    for (const auto& f : manifest.fields) wanted.push_back(f.name);
  }
  bool decode_found = options.decode.field.empty();
  for (const auto& name : wanted) {
    const int f = manifest.FieldIndex(name);
    if (f < 0) {
      std::string have;
      for (const auto& x : manifest.fields) have += (have.empty() ? "" : ", ") + x.name;
      return InvalidArgument("no field '" + name + "' in " + store->uri() + " (fields: " + have +
                             ")");
    }
    ColumnSpec c{name, manifest.fields[f].type, name == options.decode.field};
    if (c.decode) {
      if (c.type != format::FieldType::kBytes) {
        return InvalidArgument("decode field '" + name + "' is not a bytes field");
      }
      decode_found = true;
    }
    columns.push_back(c);
    fields.push_back(f);
  }
  if (!decode_found) {
    return InvalidArgument("decode field '" + options.decode.field + "' is not among the fields " +
                           "delivered from " + store->uri());
  }
  STOKER_ASSIGN_OR_RETURN(const int device, ParseDevice(options.device));
  auto impl = std::make_unique<LoaderImpl>(std::move(store), std::move(manifest), options,
                                           std::move(columns), std::move(fields), device);
  STOKER_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Loader>(std::move(impl));
}

}  // namespace stoker
