// The Loader: the stages of one epoch, joined by ordered queues.
//
//   schedule (schedule.h: the plan's shard uses, first and last batch)
//     -> shard source (shard_source.h: whole shards through a ReadQueue, or
//        per-sample reads' indexes; bounded slots)
//     -> batch assembly (assembly.h: all workers build each batch, a chunk
//        of samples at a time)
//     -> [device stage (device_stage.h: the copy to the GPU, in plan order)]
//     -> Next(), in plan order.
//
// Memory is sized once per epoch (memory_plan.h). Retries are the store's:
// Open wraps the store in a RetryingStore. This file holds the glue: options,
// the epoch's start and stop, Next() and the statistics.
#include "stoker/loader.h"

#include <algorithm>
#include <thread>

#include "gpu/stager.h"
#include "loader/assembly.h"
#include "loader/batch_builder.h"
#include "loader/batch_memory.h"
#include "loader/counters.h"
#include "loader/device_stage.h"
#include "loader/gpu_decode.h"
#include "loader/memory_plan.h"
#include "loader/schedule.h"
#include "loader/shard_source.h"
#include "loader/token_loader.h"
#include "stoker/cache.h"
#include "stoker/gpu.h"
#include "stoker/plan.h"
#include "stoker/retrying_store.h"

namespace stoker {
namespace {

using format::Manifest;
using format::ShardView;

// Per-sample reads: shards whose index may be loaded ahead of the plan's
// need, at most (each holds an open file descriptor).
constexpr uint64_t kIndexAhead = 256;
// Pinned blocks are page-aligned and whole pages.
constexpr size_t kPinAlignment = 4096;

// One epoch's stages. Destroyed in reverse order: the device stage and the
// assembly before the source whose buffers they read.
struct Epoch {
  EpochPlan plan;
  Schedule schedule;
  MemoryPlan memory;
  std::unique_ptr<OrderedQueue<Result<Batch>>> built;
  std::unique_ptr<ShardSource> source;
  std::unique_ptr<Assembly> assembly;
  std::unique_ptr<DeviceStage> device;
  uint64_t next_consume = 0;  // next batch Next() returns
  Status failed;              // sticky: the first error delivered by Next()

  explicit Epoch(EpochPlan p) : plan(std::move(p)) {}
  void Stop() {
    if (built) built->Stop();
    if (source) source->Stop();
    if (assembly) assembly->Stop();
    if (device) device->Stop();
  }
  ~Epoch() {
    Stop();
    device.reset();
    assembly.reset();
    source.reset();
  }
};

class LoaderImpl final : public Loader {
 public:
  LoaderImpl(std::shared_ptr<LoaderCounters> counters, std::shared_ptr<Store> store,
             Manifest manifest, LoaderOptions options, std::vector<ColumnSpec> columns,
             std::vector<int> column_fields, int device);
  ~LoaderImpl() override { epoch_.reset(); }

  Status Init();
  // Before Init: why the decode device cannot decode (DeliveryDevice).
  void set_decode_path(std::string p) { decode_path_ = std::move(p); }
  void set_cache(std::shared_ptr<NodeCache> cache) { cache_ = std::move(cache); }
  const Manifest& manifest() const override { return manifest_; }
  const LoaderOptions& options() const override { return options_; }
  Status StartEpoch(uint64_t epoch, uint64_t position) override;
  Status Prefetch(uint64_t epoch) override;
  Result<Batch> Next() override;
  uint64_t num_batches() const override { return epoch_ ? epoch_->plan.num_batches() : 0; }
  Result<uint64_t> BatchesFrom(uint64_t epoch, uint64_t position) const override;
  LoaderState state() const override { return last_state_; }
  std::string_view read_unit() const override {
    return mapped_reads_ ? "map" : sample_reads_ ? "sample" : "shard";
  }
  LoaderStats stats() const override;

 private:
  Result<MemoryPlan> SizeMemory(const Schedule& schedule) const;
  void StartStages(Epoch& e);
  Status NotBuiltInTime(const Epoch& e) const;
  uint64_t EstimatedBatchBytes() const;
  // Batches before the start position, so Batch::index counts from the
  // epoch's start also after a resume.
  uint64_t BatchOffset(const Epoch& e) const {
    const uint64_t per_step = uint64_t(options_.batch_size) * options_.world_size;
    return e.plan.start_position() / per_step;
  }

  // Shared with the stages and the RetryingStore around store_ (declared
  // first: destroyed last).
  const std::shared_ptr<LoaderCounters> counters_;
  const int device_;  // -1: host delivery
  std::shared_ptr<Store> store_;
  // store_ itself when the loader reads through the node cache, else null.
  std::shared_ptr<NodeCache> cache_;
  const Manifest manifest_;
  const LoaderOptions options_;
  const std::vector<ColumnSpec> columns_;
  const std::vector<int> column_fields_;  // manifest field index of each column
  std::vector<uint32_t> shard_samples_;
  // read_unit "sample" or "map" (decided once, at Open), the size of one
  // shard slot, and which column receives each field (-1: read, checked, not
  // delivered).
  bool sample_reads_ = false;
  bool mapped_reads_ = false;
  uint64_t slot_bytes_ = 0;
  std::vector<int> first_column_of_field_;
  uint32_t threads_ = 1;
  uint64_t machine_memory_ = 0;  // available when the loader opened
  std::shared_ptr<BufferPool> shard_pool_;
  std::shared_ptr<BufferPool> batch_pool_;
  // Device delivery; outlives every epoch.
  std::unique_ptr<gpu::Stager> stager_;
  // The GPU decode (DecodeOptions::device), null when the workers decode
  // everything; decode_path_ says which ran, for stats().
  std::unique_ptr<GpuDecode> gpu_decode_;
  std::string decode_path_;
  std::unique_ptr<Epoch> epoch_;
  // epoch_ was started by Prefetch (or Open) and no Next() came since: a
  // StartEpoch of the same epoch and position keeps it.
  bool ahead_ = false;
  LoaderState last_state_;
};

// reads_in_flight 0: the workers' count (the machine's cores when threads
// is 0), within [kAutoReadsMin, kAutoReadsMax]; options() reports it.
LoaderOptions WithDefaultsResolved(LoaderOptions o) {
  if (o.reads_in_flight == 0) {
    const uint32_t threads =
        o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
    o.reads_in_flight = std::clamp(threads, kAutoReadsMin, kAutoReadsMax);
  }
  return o;
}

LoaderImpl::LoaderImpl(std::shared_ptr<LoaderCounters> counters, std::shared_ptr<Store> store,
                       Manifest manifest, LoaderOptions options, std::vector<ColumnSpec> columns,
                       std::vector<int> column_fields, int device)
    : counters_(std::move(counters)),
      device_(device),
      manifest_(std::move(manifest)),
      options_(WithDefaultsResolved(std::move(options))),
      columns_(std::move(columns)),
      column_fields_(std::move(column_fields)) {
  uint64_t max_shard_bytes = 0;
  const format::ShardTable& shards = manifest_.shards;
  shard_samples_.reserve(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    shard_samples_.push_back(shards.samples(i));
    max_shard_bytes = std::max(max_shard_bytes, shards.bytes(i));
  }
  store_ = std::move(store);
  const std::string& unit = options_.read_unit;
  const uint64_t mean_record =
      manifest_.sample_count ? manifest_.payload_bytes / manifest_.sample_count : 0;
  mapped_reads_ = unit == "map";
  sample_reads_ = unit == "sample" || mapped_reads_ ||
                  (unit == "auto" && !options_.direct_io && mean_record >= kSampleReadMinBytes &&
                   store_->local_reads());
  // Shard slots are all the size of the largest shard (or index), so any
  // slot serves any shard and the budget arithmetic is exact.
  slot_bytes_ = max_shard_bytes;
  if (sample_reads_) {
    slot_bytes_ = 0;
    // IndexRange needs a shard's size and sample count only: no key made
    // per shard.
    format::ShardExpectation e;
    e.field_count = uint32_t(manifest_.fields.size());
    for (size_t i = 0; i < shards.size(); ++i) {
      e.samples = shards.samples(i);
      e.bytes = shards.bytes(i);
      uint64_t offset, length;
      ShardView::IndexRange(e, &offset, &length);
      slot_bytes_ = std::max(slot_bytes_, format::kShardHeaderBytes + length);
    }
    first_column_of_field_.assign(manifest_.fields.size(), -1);
    for (size_t c = 0; c < column_fields_.size(); ++c) {
      int& first = first_column_of_field_[size_t(column_fields_[c])];
      if (first < 0) first = int(c);
    }
  }
  threads_ =
      options_.threads ? options_.threads : std::max(1u, std::thread::hardware_concurrency());
  machine_memory_ = MachineAvailableMemory();
  shard_pool_ = std::make_shared<BufferPool>(kDirectIoAlignment, SIZE_MAX, /*slack=*/false);
  // Pinned batch buffers own whole pages: two blocks sharing a page could
  // not both be registered with CUDA.
  batch_pool_ = std::make_shared<BufferPool>(device_ >= 0 ? kPinAlignment : kColumnAlignment,
                                             options_.prefetch_batches + 2, /*slack=*/true);
}

Status LoaderImpl::Init() {
  if (device_ >= 0) {
    gpu::StagerOptions so;
    so.device = device_;
    so.memory_budget = options_.device_memory_budget;
    if (so.memory_budget == 0) {
      // Batches of the largest possible size, with the pool's 1/8 slack and
      // room for the layout's alignment.
      const uint64_t batch_bytes = EstimatedBatchBytes();
      so.memory_budget = std::max<uint64_t>(
          64ull << 20, (options_.prefetch_batches + 4) * (batch_bytes + batch_bytes / 8 + 65536));
    }
    const Result<int> decode_device = ParseDevice(options_.decode.device);
    if (!options_.decode.field.empty() && decode_device.ok() && *decode_device >= 0) {
      // The GPU decode's share (nvJPEG's buffers and a batch's decoded
      // windows): a quarter of a budget that was set, taken from it; by
      // default a quarter of the batches' room (at least 128 MiB) on top.
      const bool set = options_.device_memory_budget != 0;
      const uint64_t decode_budget =
          set ? so.memory_budget / 4 : std::max<uint64_t>(128ull << 20, so.memory_budget / 4);
      gpu_decode_ = GpuDecode::Open(device_, options_.decode, decode_budget, &decode_path_);
      if (gpu_decode_ && set) so.memory_budget -= decode_budget;
    }
    STOKER_ASSIGN_OR_RETURN(stager_, gpu::Stager::Open(so));
  }
  if (decode_path_.empty() && !options_.decode.field.empty()) decode_path_ = "cpu";
  STOKER_RETURN_IF_ERROR(
      CheckResumeState(options_.start, manifest_, options_).WithContext(store_->uri()));
  STOKER_RETURN_IF_ERROR(StartEpoch(options_.start.epoch, options_.start.position));
  ahead_ = true;  // kept for a StartEpoch of the same start (Prefetch)
  return Status::Ok();
}

Result<MemoryPlan> LoaderImpl::SizeMemory(const Schedule& schedule) const {
  MemoryNeeds n;
  n.budget = options_.memory_budget;
  n.slot_bytes = slot_bytes_;
  n.live_shards = schedule.MaxLiveShards();
  // Per-sample reads: a slot is a header and an index (a few KiB), and the
  // index loader fills slots for every batch the workers may build, so it
  // may run further ahead than reads_in_flight.
  n.reads_ahead = sample_reads_ ? std::max<uint64_t>(options_.reads_in_flight, kIndexAhead)
                                : options_.reads_in_flight;
  n.batch_bytes = EstimatedBatchBytes();
  n.prefetch = std::max(1u, options_.prefetch_batches);
  n.max_sample_bytes = manifest_.max_sample_bytes;
  n.batch_size = options_.batch_size;
  return PlanMemory(n, machine_memory_);
}

Result<uint64_t> LoaderImpl::BatchesFrom(uint64_t epoch, uint64_t position) const {
  if (epoch_ && epoch_->plan.epoch() == epoch && epoch_->plan.start_position() == position) {
    return epoch_->plan.num_batches();
  }
  STOKER_ASSIGN_OR_RETURN(EpochPlan plan, EpochPlan::Make(manifest_.Id64(), shard_samples_,
                                                          PlanOptionsOf(options_), epoch, position));
  return plan.num_batches();
}

Status LoaderImpl::Prefetch(uint64_t epoch) {
  STOKER_RETURN_IF_ERROR(StartEpoch(epoch, 0));
  ahead_ = true;
  return Status::Ok();
}

Status LoaderImpl::StartEpoch(uint64_t epoch, uint64_t position) {
  if (ahead_ && epoch_ && epoch_->plan.epoch() == epoch &&
      epoch_->plan.start_position() == position && epoch_->next_consume == 0) {
    return Status::Ok();  // read ahead by Prefetch (or Open), untouched: kept
  }
  ahead_ = false;
  epoch_.reset();
  const PlanOptions po = PlanOptionsOf(options_);
  STOKER_ASSIGN_OR_RETURN(EpochPlan plan,
                          EpochPlan::Make(manifest_.Id64(), shard_samples_, po, epoch, position));
  if (cache_) STOKER_RETURN_IF_ERROR(cache_->BeginEpoch(po, epoch, position));
  auto e = std::make_unique<Epoch>(std::move(plan));
  e->schedule = BuildSchedule(e->plan);
  STOKER_ASSIGN_OR_RETURN(e->memory, SizeMemory(e->schedule));
  StartStages(*e);
  epoch_ = std::move(e);
  last_state_ = {epoch, position};
  return Status::Ok();
}

void LoaderImpl::StartStages(Epoch& e) {
  const uint32_t window = e.memory.prefetch;
  e.built = std::make_unique<OrderedQueue<Result<Batch>>>(window);
  ShardSourceConfig sc;
  sc.store = store_;
  sc.manifest = &manifest_;
  sc.options = &options_;
  sc.sample_reads = sample_reads_;
  sc.mapped_reads = mapped_reads_;
  sc.slot_bytes = slot_bytes_;
  sc.slots = e.memory.slots;
  sc.pool = shard_pool_;
  sc.counters = counters_.get();
  sc.first_column_of_field = first_column_of_field_;
  sc.column_fields = column_fields_;
  for (const ColumnSpec& c : columns_) sc.decoded_columns.push_back(c.decode);
  e.source = std::make_unique<ShardSource>(std::move(sc), e.schedule);
  AssemblyConfig ac;
  ac.manifest = &manifest_;
  ac.options = &options_;
  ac.uri = store_->uri();
  ac.columns = &columns_;
  ac.column_fields = &column_fields_;
  ac.sample_reads = sample_reads_;
  ac.pool = batch_pool_;
  ac.counters = counters_.get();
  ac.gpu_decode = gpu_decode_.get();
  ac.threads = threads_;
  ac.window = window;
  ac.batch_offset = BatchOffset(e);
  e.assembly = std::make_unique<Assembly>(std::move(ac), e.plan, e.schedule, *e.source, *e.built);
  if (stager_) {
    e.device = std::make_unique<DeviceStage>(*stager_, device_, *e.built, e.plan.num_batches(),
                                             window, gpu_decode_.get(), counters_.get());
  }
  e.source->Start();
  e.assembly->Start();
  if (e.device) e.device->Start();
}

Result<Batch> LoaderImpl::Next() {
  ahead_ = false;  // consumed: a StartEpoch now starts over
  if (!epoch_) return InvalidArgument("no epoch started (the last StartEpoch failed)");
  Epoch& e = *epoch_;
  if (!e.failed.ok()) return e.failed;
  if (e.next_consume >= e.plan.num_batches()) {
    return OutOfRange("epoch " + std::to_string(e.plan.epoch()) + " is over");
  }
  const auto start = Clock::now();
  // Per-sample reads run in the workers, outside the source's deadlines: a
  // read blocked in the kernel shows here, after read_timeout.
  const Deadline unbuilt = sample_reads_ ? start + options_.read_timeout : Deadline::max();
  Result<Batch> r = Status::Ok();
  if (e.device) {
    r = e.device->Take(e.next_consume, unbuilt, NotBuiltInTime(e));
  } else if (auto v = e.built->Take(e.next_consume, unbuilt)) {
    r = std::move(*v);
  } else {
    r = NotBuiltInTime(e);
  }
  LoaderCounters::AddSince(counters_->wait_ns, start);
  e.next_consume++;
  e.assembly->Consumed(e.next_consume);
  if (!r.ok()) {
    e.failed = r.status();
    return r;
  }
  last_state_ = r->state_after();
  LoaderCounters& c = *counters_;
  LoaderCounters::Add(c.batches_delivered, 1);
  LoaderCounters::Add(c.samples_delivered, r->size());
  // Counted at delivery: a batch built ahead (the next epoch's, read ahead)
  // has not been seen by the user.
  if (r->corrupt_skipped()) LoaderCounters::Add(c.decode_skipped, r->corrupt_skipped());
  return r;
}

LoaderStats LoaderImpl::stats() const {
  const LoaderCounters& c = *counters_;
  auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  LoaderStats s;
  s.shards_read = get(c.shards_read);
  s.bytes_read = get(c.bytes_read);
  s.samples_delivered = get(c.samples_delivered);
  s.batches_delivered = get(c.batches_delivered);
  s.read_retries = get(c.read_retries);
  s.wait_time = std::chrono::nanoseconds(get(c.wait_ns));
  s.decode_skipped = get(c.decode_skipped);
  s.shared_batches = get(c.shared_batches);
  s.peak_buffer_bytes = shard_pool_->peak_bytes() + batch_pool_->peak_bytes();
  s.remote_bytes = s.bytes_read;
  if (cache_) {
    const CacheStats cs = cache_->stats();
    s.remote_bytes = cs.uncached ? s.bytes_read : cs.remote_bytes;
    s.cache_bytes = cs.cache_bytes;
    s.cache_hits = cs.hits;
    s.cache_misses = cs.misses;
    s.cache_fetch_waits = cs.fetch_waits;
    s.cache_evictions = cs.evictions;
    s.cache_refetches = cs.refetches;
  }
  if (stager_) {
    const gpu::StagerStats g = stager_->stats();
    s.h2d_bytes = g.bytes;
    s.h2d_time = g.copy_time;
    s.device_bytes = g.device_bytes;
    s.peak_device_bytes = g.peak_device_bytes;
    s.pinned_bytes = g.pinned_bytes;
  }
  if (gpu_decode_) {
    s.device_bytes += gpu_decode_->device_bytes();
    s.peak_device_bytes += gpu_decode_->peak_device_bytes();
    s.decode_cpu_share = gpu_decode_->cpu_share();
  }
  s.decoded_hardware = get(c.decoded_hardware);
  s.decoded_cuda = get(c.decoded_cuda);
  s.decoded_cpu = get(c.decoded_cpu);
  s.decode_path = decode_path_;
  s.copier_wait_time = std::chrono::nanoseconds(get(c.copier_wait_ns));
  s.gpu_decode_time = std::chrono::nanoseconds(get(c.gpu_decode_ns));
  s.gpu_decode_wait_time = std::chrono::nanoseconds(get(c.gpu_decode_wait_ns));
  s.copier_cpu_time = std::chrono::nanoseconds(get(c.copier_cpu_ns));
  return s;
}

Status LoaderImpl::NotBuiltInTime(const Epoch& e) const {
  return TimedOut("batch " + std::to_string(e.next_consume) + " of epoch " +
                  std::to_string(e.plan.epoch()) + " was not built within read_timeout (" +
                  std::to_string(options_.read_timeout.count()) + " ms): a record read from " +
                  store_->uri() + " is blocked");
}

uint64_t LoaderImpl::EstimatedBatchBytes() const {
  uint64_t per_sample = 16;
  for (const auto& c : columns_) {
    const ColumnKind kind = KindOf(c);
    if (kind == ColumnKind::kImage) {
      per_sample += DecodedSampleBytes(options_.decode);
    } else if (kind == ColumnKind::kInt64) {
      per_sample += 8;
    } else if (kind == ColumnKind::kFixed) {
      per_sample += c.item_bytes;
    } else if (kind == ColumnKind::kRagged) {
      // A length and a row offset; padded, every sample may take the
      // longest's rows, which fit in the largest record.
      per_sample += 16 + manifest_.max_sample_bytes;
    } else {
      per_sample += 8 + manifest_.max_sample_bytes;
    }
  }
  return per_sample * options_.batch_size;
}

Status ValidateOptions(const LoaderOptions& o) {
  if (o.batch_size == 0) return InvalidArgument("batch_size must be at least 1");
  if (o.world_size == 0) return InvalidArgument("world_size must be at least 1");
  if (o.rank >= o.world_size) {
    return InvalidArgument("rank " + std::to_string(o.rank) + " must be below world_size " +
                           std::to_string(o.world_size));
  }
  if (o.shuffle_window_shards == 0) return InvalidArgument("shuffle_window_shards must be >= 1");
  STOKER_RETURN_IF_ERROR(ValidateDecodeOptions(o.decode));
  if (o.read_timeout.count() <= 0) return InvalidArgument("read_timeout must be positive");
  if (o.read_unit != "auto" && o.read_unit != "shard" && o.read_unit != "sample" &&
      o.read_unit != "map") {
    return InvalidArgument("read_unit must be auto, shard, sample or map, not '" + o.read_unit +
                           "'");
  }
  if (o.ragged != "padded" && o.ragged != "offsets") {
    return InvalidArgument("ragged must be padded or offsets, not '" + o.ragged + "'");
  }
  if ((o.read_unit == "sample" || o.read_unit == "map") && o.direct_io) {
    return InvalidArgument("read_unit " + o.read_unit +
                           " cannot be used with direct_io: records are not block-aligned");
  }
  STOKER_RETURN_IF_ERROR(ParseDevice(o.device).status());
  return Status::Ok();
}

}  // namespace

PlanOptions PlanOptionsOf(const LoaderOptions& o) {
  PlanOptions po;
  po.seed = o.seed;
  po.shuffle = o.shuffle;
  po.shuffle_window_shards = o.shuffle_window_shards;
  po.batch_size = o.batch_size;
  po.rank = o.rank;
  po.world_size = o.world_size;
  po.drop_last = o.drop_last;
  po.node_affinity = o.node_affinity;
  po.ranks_per_node = o.ranks_per_node;
  return po;
}

Result<std::unique_ptr<Loader>> Loader::Open(std::string_view uri, const LoaderOptions& options) {
  STOKER_RETURN_IF_ERROR(ValidateOptions(options));
  STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(uri, options.store));
  return Open(std::move(store), options);
}

Result<std::unique_ptr<Loader>> Loader::Open(std::shared_ptr<Store> store,
                                             const LoaderOptions& options) {
  STOKER_RETURN_IF_ERROR(ValidateOptions(options));
  // Retries wrap the store, so that every read (the manifest's too) has them.
  auto counters = std::make_shared<LoaderCounters>();
  if (options.read_retries > 0) {
    RetryOptions ro;
    ro.max_retries = options.read_retries;
    ro.deadline = options.read_timeout;
    ro.retries = &counters->read_retries;
    store = std::make_shared<RetryingStore>(std::move(store), ro);
  }
  STOKER_ASSIGN_OR_RETURN(format::Manifest manifest, ReadManifest(*store));
  if (options.sequence_length > 0) {  // token windows (token_loader.h)
    return OpenTokenLoader(std::move(store), std::move(manifest), options, std::move(counters));
  }
  std::shared_ptr<NodeCache> cache;
  if (!options.cache_dir.empty()) {  // the node cache, in front of the retries
    CacheOptions co;
    co.dir = options.cache_dir;
    co.capacity_bytes = options.cache_bytes;
    co.policy = options.cache_policy;
    co.ranks_per_node = options.ranks_per_node;
    co.fallback_uncached = options.cache_fallback;
    STOKER_ASSIGN_OR_RETURN(cache, OpenNodeCache(std::move(store), manifest, co));
    store = cache;
  }

  std::vector<ColumnSpec> columns;
  std::vector<int> fields;
  std::vector<std::string> wanted = options.fields;
  if (wanted.empty()) {
    // A token field's block checksums are the format's, not the user's
    // data: delivered only when named.
    for (const auto& f : manifest.fields) {
      if (f.block_sums_of.empty()) wanted.push_back(f.name);
    }
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
    ColumnSpec c = ColumnSpecFor(manifest.fields[f], name == options.decode.field,
                                 options.ragged == "padded");
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
  if (options.read_unit == "map" && !store->capabilities().mapped_reads) {
    return InvalidArgument("read_unit map reads the shard files mapped into memory, and " +
                           store->uri() +
                           " cannot be mapped (a local folder or the node cache can): use "
                           "read_unit sample or shard");
  }
  std::string decode_unavailable;  // the decode device's reason for the CPU path
  STOKER_ASSIGN_OR_RETURN(const int device, DeliveryDevice(options, &decode_unavailable));
  auto impl =
      std::make_unique<LoaderImpl>(std::move(counters), std::move(store), std::move(manifest),
                                   options, std::move(columns), std::move(fields), device);
  impl->set_decode_path(std::move(decode_unavailable));
  impl->set_cache(std::move(cache));
  STOKER_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Loader>(std::move(impl));
}

}  // namespace stoker
