// The loader of token windows (token_loader.h): one epoch's window index
// (tokens.h), this rank's share of its positions, and a producer thread
// that reads each batch's windows (all of a batch's ranges submitted at
// once) and builds the batches in order, prefetch_batches ahead.
#include "loader/token_loader.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "core/thread_boundary.h"
#include "loader/batch_builder.h"

namespace stoker {

Result<format::DType> TokenDType(std::string_view name) {
  if (name == "int64") return format::DType::kInt64;
  if (name == "int32") return format::DType::kInt32;
  return InvalidArgument("sequence_dtype must be int64 or int32, not '" + std::string(name) + "'");
}

Status CheckTokenOptions(const LoaderOptions& o) {
  const char* bad = !o.decode.field.empty()                  ? "decode"
                    : !o.device.empty() && o.device != "cpu" ? "device"
                    : !o.cache_dir.empty()                   ? "cache_dir"
                    : o.node_affinity                        ? "node_affinity"
                    : !o.fields.empty()                      ? "fields"
                                                             : nullptr;
  if (bad) {
    return InvalidArgument(std::string("sequence_length (token windows) does not combine with ") +
                           bad + " in this build");
  }
  return TokenDType(o.sequence_dtype).status();
}

Result<Batch> BuildTokenBatch(BufferPool& pool, const TokenBatchSpec& spec,
                              std::span<const std::byte> tokens, std::span<const TokenPiece> pieces,
                              std::span<const size_t> first, std::span<const uint64_t> ids,
                              std::span<const int64_t> sources, uint64_t epoch, uint64_t index,
                              LoaderState state_after) {
  const size_t n = ids.size();
  const uint64_t row = uint64_t{spec.sequence_length} + 1;
  const uint32_t eb = format::DTypeBytes(spec.dtype);
  const ElementType element =
      spec.dtype == format::DType::kInt64 ? ElementType::kInt64 : ElementType::kInt32;
  std::vector<ColumnSpec> columns;
  auto fixed = [&](const char* name) {
    ColumnSpec c;
    c.name = name;
    c.type = format::FieldType::kArray;
    c.kind = ColumnKind::kFixed;
    c.element = element;
    c.shape = {int64_t(row)};
    c.item_bytes = row * eb;
    columns.push_back(c);
  };
  fixed("tokens");
  if (spec.positions) {
    fixed("positions");
    fixed("documents");
  }
  if (spec.sources) {
    ColumnSpec c;
    c.name = "source";
    c.type = format::FieldType::kInt64;
    c.kind = ColumnKind::kInt64;
    columns.push_back(c);
  }
  // Positions and documents: per token, from the pieces (a piece that starts
  // a document starts at its token 0).
  std::vector<std::byte> extra;
  if (spec.positions) {
    extra.resize(2 * n * row * eb);
    std::byte* pos = extra.data();
    std::byte* doc = extra.data() + n * row * eb;
    for (size_t w = 0; w < n; ++w) {
      uint64_t t = 0;
      int64_t d = 0;
      for (size_t p = first[w]; p < first[w + 1]; ++p, ++d) {
        for (uint32_t i = 0; i < pieces[p].count; ++i, ++t) {
          const int64_t position = int64_t(pieces[p].begin + i);
          const size_t at = (w * row + t) * eb;
          if (eb == 8) {
            std::memcpy(pos + at, &position, 8);
            std::memcpy(doc + at, &d, 8);
          } else {
            const int32_t p32 = int32_t(position), d32 = int32_t(d);
            std::memcpy(pos + at, &p32, 4);
            std::memcpy(doc + at, &d32, 4);
          }
        }
      }
    }
  }
  BatchSamples s;
  s.count = n;
  s.sample_ids = ids.data();
  s.value = [&](size_t i, size_t c) -> std::span<const std::byte> {
    if (c == 0) return tokens.subspan(i * row * eb, row * eb);
    if (spec.positions && c <= 2)
      return std::span<const std::byte>(extra).subspan(((c - 1) * n + i) * row * eb, row * eb);
    return std::as_bytes(sources.subspan(i, 1));
  };
  s.describe = [&](size_t i) { return "window " + std::to_string(ids[i]); };
  return BatchBuilder::Build(pool, columns, DecodeOptions{}, s, epoch, index, state_after);
}

namespace {

class TokenLoader final : public Loader {
 public:
  TokenLoader(std::shared_ptr<LoaderCounters> counters, std::unique_ptr<TokenDataset> ds,
              LoaderOptions options, format::DType dtype)
      : counters_(std::move(counters)), ds_(std::move(ds)), options_(std::move(options)) {
    spec_.sequence_length = options_.sequence_length;
    spec_.dtype = dtype;
    spec_.positions = options_.sequence_positions;
    pool_ = std::make_shared<BufferPool>(kColumnAlignment, options_.prefetch_batches + 4, false);
  }
  ~TokenLoader() override { Stop(); }

  const format::Manifest& manifest() const override { return ds_->manifest(); }
  const LoaderOptions& options() const override { return options_; }
  Status StartEpoch(uint64_t epoch, uint64_t position) override;
  Status Prefetch(uint64_t epoch) override {
    STOKER_RETURN_IF_ERROR(StartEpoch(epoch, 0));
    ahead_ = true;
    return Status::Ok();
  }
  // Open's start: kept for a StartEpoch of the same start (Prefetch).
  Status Begin(uint64_t epoch, uint64_t position) {
    STOKER_RETURN_IF_ERROR(StartEpoch(epoch, position));
    ahead_ = true;
    return Status::Ok();
  }
  Result<Batch> Next() override;
  uint64_t num_batches() const override { return num_batches_; }
  Result<uint64_t> BatchesFrom(uint64_t epoch, uint64_t position) const override;
  LoaderState state() const override { return last_state_; }
  LoaderStats stats() const override;
  std::string_view read_unit() const override { return "range"; }
  uint64_t epoch_positions() const override { return windows_.size(); }

 private:
  void Stop();
  void Produce();
  LoaderState StateAt(uint64_t position) const {
    return IdentifiedState(epoch_, position, ds_->manifest(), options_);
  }

  const std::shared_ptr<LoaderCounters> counters_;
  std::unique_ptr<TokenDataset> ds_;
  const LoaderOptions options_;
  TokenBatchSpec spec_;
  std::shared_ptr<BufferPool> pool_;

  // The epoch (set by StartEpoch while no producer runs).
  TokenWindows windows_;
  bool have_windows_ = false;
  uint64_t windows_epoch_ = 0;  // the epoch windows_ was built for
  uint64_t epoch_ = 0, start_ = 0, rank_windows_ = 0, num_batches_ = 0;
  // The producer runs an epoch started by Prefetch (or Open) and no Next()
  // came since: a StartEpoch of the same epoch and position keeps it.
  bool ahead_ = false;
  LoaderState last_state_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Result<Batch>> ready_;
  bool stop_ = false;
  uint64_t next_ = 0;  // next batch Next() returns
  Status failed_;
  std::thread producer_;
  std::atomic<uint64_t> bytes_read_{0};
};

void TokenLoader::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (producer_.joinable()) producer_.join();
  ready_.clear();
}

// A rank's windows of an epoch of `windows` from global `position`: the
// same count on every rank; the remainder is left out.
uint64_t RankWindows(uint64_t windows, uint64_t position, const LoaderOptions& o) {
  uint64_t n = (windows - position) / o.world_size;
  if (o.drop_last) n = n / o.batch_size * o.batch_size;
  return n;
}

Result<uint64_t> TokenLoader::BatchesFrom(uint64_t /*epoch*/, uint64_t position) const {
  // Every epoch has as many windows (the documents' order changes, not
  // their tokens); windows_ is built at open.
  if (position > windows_.size()) {
    return InvalidArgument("resume position " + std::to_string(position) +
                           " is past the end of the epoch (" + std::to_string(windows_.size()) +
                           " windows)");
  }
  return (RankWindows(windows_.size(), position, options_) + options_.batch_size - 1) /
         options_.batch_size;
}

Status TokenLoader::StartEpoch(uint64_t epoch, uint64_t position) {
  if (ahead_ && producer_.joinable() && epoch_ == epoch && start_ == position && next_ == 0 &&
      failed_.ok()) {
    return Status::Ok();  // read ahead, untouched: kept
  }
  ahead_ = false;
  Stop();
  // Until this epoch starts, Next() reports why it did not.
  num_batches_ = 0;
  next_ = 0;
  if (!have_windows_ || epoch != windows_epoch_) {
    windows_ = TokenWindows::Build(ds_->doc_tokens(), options_.sequence_length,
                                   ds_->manifest().Id64(), options_.shuffle, options_.seed, epoch);
    have_windows_ = true;
    windows_epoch_ = epoch;
  }
  if (position > windows_.size()) {
    return failed_ = InvalidArgument("resume position " + std::to_string(position) +
                           " is past the end of the epoch (" + std::to_string(windows_.size()) +
                           " windows of " + std::to_string(options_.sequence_length) +
                           " + 1 tokens)");
  }
  epoch_ = epoch;
  start_ = position;
  const uint64_t batch = options_.batch_size;
  rank_windows_ = RankWindows(windows_.size(), position, options_);
  num_batches_ = (rank_windows_ + batch - 1) / batch;
  last_state_ = StateAt(position);
  std::lock_guard lock(mu_);
  stop_ = false;
  next_ = 0;
  failed_ = Status::Ok();
  producer_ = std::thread([this] { Produce(); });
  return Status::Ok();
}

void TokenLoader::Produce() {
  auto reader = ds_->NewReader();
  const uint64_t world = options_.world_size, batch = options_.batch_size;
  const uint64_t row = uint64_t{options_.sequence_length} + 1;
  const uint32_t eb = format::DTypeBytes(spec_.dtype);
  std::vector<TokenPiece> pieces;
  std::vector<size_t> first;
  std::vector<uint64_t> ids;
  std::vector<std::byte> tokens;
  for (uint64_t b = 0; b < num_batches_; ++b) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || ready_.size() < std::max<uint32_t>(1, options_.prefetch_batches);
      });
      if (stop_) return;
    }
    // What the producer does not expect (a std::bad_alloc from the token
    // buffer) fails this batch, not the process.
    Result<Batch> out = internal::CatchAsStatus("token loader producer", [&]() -> Result<Batch> {
      if (!reader.ok()) return reader.status();
      const uint64_t j0 = b * batch, j1 = std::min(rank_windows_, j0 + batch);
      pieces.clear();
      first.assign(1, 0);
      ids.clear();
      for (uint64_t j = j0; j < j1; ++j) {
        const uint64_t k = windows_.WindowAt(start_ + j * world + options_.rank);
        windows_.Pieces(k, &pieces);
        first.push_back(pieces.size());
        ids.push_back(k);
      }
      tokens.resize(ids.size() * row * eb);
      const uint64_t before = (*reader)->bytes_read();
      Status st = (*reader)->Read(pieces, spec_.dtype, tokens);
      bytes_read_ += (*reader)->bytes_read() - before;
      STOKER_RETURN_IF_ERROR(st);
      const uint64_t index = start_ / (batch * world) + b;
      return BuildTokenBatch(*pool_, spec_, tokens, pieces, first, ids, {}, epoch_, index,
                             StateAt(start_ + j1 * world));
    });
    const bool failed = !out.ok();
    {
      std::lock_guard lock(mu_);
      ready_.push_back(std::move(out));
    }
    cv_.notify_all();
    if (failed) return;
  }
}

Result<Batch> TokenLoader::Next() {
  ahead_ = false;  // consumed: a StartEpoch now starts over
  if (!failed_.ok()) return failed_;
  if (next_ >= num_batches_) return OutOfRange("end of epoch " + std::to_string(epoch_));
  const auto t0 = Clock::now();
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty(); });
  Result<Batch> b = std::move(ready_.front());
  ready_.pop_front();
  lock.unlock();
  cv_.notify_all();
  LoaderCounters::AddSince(counters_->wait_ns, t0);
  if (!b.ok()) {
    failed_ = b.status();
    return failed_;
  }
  ++next_;
  last_state_ = b->state_after();
  LoaderCounters::Add(counters_->batches_delivered, 1);
  LoaderCounters::Add(counters_->samples_delivered, b->size());
  return b;
}

LoaderStats TokenLoader::stats() const {
  LoaderStats s;
  s.bytes_read = ds_->index_bytes_read() + bytes_read_.load();
  s.remote_bytes = s.bytes_read;
  s.samples_delivered = counters_->samples_delivered.load();
  s.batches_delivered = counters_->batches_delivered.load();
  s.read_retries = counters_->read_retries.load();
  s.wait_time = std::chrono::nanoseconds(counters_->wait_ns.load());
  s.peak_buffer_bytes = pool_->peak_bytes();
  return s;
}

}  // namespace

Result<std::unique_ptr<Loader>> OpenTokenLoader(std::shared_ptr<Store> store,
                                                format::Manifest manifest,
                                                const LoaderOptions& options,
                                                std::shared_ptr<LoaderCounters> counters) {
  STOKER_RETURN_IF_ERROR(CheckTokenOptions(options));
  STOKER_ASSIGN_OR_RETURN(const format::DType dtype, TokenDType(options.sequence_dtype));
  TokenDatasetOptions to;
  to.field = options.sequence_field;
  to.verify = options.sequence_verify;
  to.read_timeout = options.read_timeout;
  if (options.reads_in_flight > 0) to.reads_in_flight = options.reads_in_flight;
  STOKER_ASSIGN_OR_RETURN(auto ds, TokenDataset::Open(std::move(store), std::move(manifest), to));
  STOKER_RETURN_IF_ERROR(
      CheckResumeState(options.start, ds->manifest(), options).WithContext(ds->store().uri()));
  auto loader = std::make_unique<TokenLoader>(std::move(counters), std::move(ds), options, dtype);
  STOKER_RETURN_IF_ERROR(loader->Begin(options.start.epoch, options.start.position));
  return std::unique_ptr<Loader>(std::move(loader));
}

}  // namespace stoker
