// Mixtures of token datasets (include/stoker/mix.h): the step plan (each
// source's share, the slots' order, each slot's window), the sources' own
// epochs, and a producer thread that reads each step's windows (one read
// per source per step, every range submitted at once) and builds the
// batches ahead.
#include "stoker/mix.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "loader/batch_memory.h"
#include "loader/token_loader.h"
#include "stoker/dataset.h"
#include "stoker/plan.h"
#include "stoker/tokens.h"

namespace stoker {

std::vector<uint32_t> MixCounts(std::span<const double> weights, uint32_t batch, uint64_t seed,
                                uint64_t step) {
  const size_t n = weights.size();
  std::vector<uint32_t> counts(n, 0);
  if (n == 0) return counts;
  double sum = 0;
  for (double w : weights) sum += w;
  std::vector<double> frac(n);
  uint64_t given = 0;
  for (size_t i = 0; i < n; ++i) {
    const double q = weights[i] / sum * batch;
    const double base = std::floor(q);
    counts[i] = static_cast<uint32_t>(std::min<double>(base, batch));
    frac[i] = q - base;
    given += counts[i];
  }
  const uint64_t extra = batch > given ? batch - given : 0;
  // Systematic sampling: points u, u + 1, ... over the fractions laid end to
  // end; each fraction is < 1, so a source gets at most one point.
  Rng rng(MixSeed({seed, step, 0x6d6978636f756e74ull}));
  const double u = double(rng.Next() >> 11) * 0x1.0p-53;
  double cum = 0;
  uint64_t next = 0;
  std::vector<uint8_t> got(n, 0);
  for (size_t i = 0; i < n && next < extra; ++i) {
    cum += frac[i];
    if (u + double(next) < cum) {
      ++counts[i];
      got[i] = 1;
      ++next;
    }
  }
  // Rounding can leave a point past the last fraction: the largest
  // fractions not yet given one take the rest.
  while (next < extra) {
    size_t best = n;
    for (size_t i = 0; i < n; ++i) {
      if (!got[i] && (best == n || frac[i] > frac[best])) best = i;
    }
    if (best == n) best = 0;
    ++counts[best];
    got[best] = 1;
    ++next;
  }
  return counts;
}

namespace {

std::string Name(size_t i, const MixSource& s) {
  return "source " + std::to_string(i) + " (" + s.uri + ")";
}

Status CheckWeights(std::span<const double> w, std::span<const MixSource> sources,
                    const std::string& where) {
  if (w.size() != sources.size()) {
    return InvalidArgument(where + " has " + std::to_string(w.size()) + " weights for " +
                           std::to_string(sources.size()) + " sources");
  }
  for (size_t i = 0; i < w.size(); ++i) {
    if (!(w[i] > 0) || !std::isfinite(w[i])) {
      return InvalidArgument(Name(i, sources[i]) + ": weight " + std::to_string(w[i]) +
                             (where.empty() ? "" : " (" + where + ")") +
                             " must be positive and finite");
    }
  }
  return Status::Ok();
}

struct Source {
  MixSource spec;
  std::unique_ptr<TokenDataset> ds;
  uint64_t epoch_windows = 0;
  // A few epochs' window indexes, by epoch (a step may span two).
  std::map<uint64_t, std::shared_ptr<const TokenWindows>> windows;
};

class MixImpl final : public Mix {
 public:
  MixImpl(std::vector<Source> sources, MixOptions options, format::DType dtype)
      : sources_(std::move(sources)), options_(std::move(options)) {
    for (const Source& s : sources_) specs_.push_back(s.spec);
    spec_.sequence_length = options_.sequence_length;
    spec_.dtype = dtype;
    spec_.positions = options_.sequence_positions;
    spec_.sources = true;
    pool_ = std::make_shared<BufferPool>(kColumnAlignment, options_.prefetch_batches + 4, false);
    windows_given_.assign(sources_.size(), 0);
  }
  ~MixImpl() override { Stop(); }

  Status Start(const MixState& s);
  Result<Batch> Next() override;
  MixState state() const override { return last_state_; }
  Status CheckState(const MixState& s) const override;
  MixStats stats() const override;
  const std::vector<MixSource>& sources() const override { return specs_; }
  std::vector<double> WeightsAt(uint64_t step) const override;
  MixState Identified(uint64_t step, std::vector<uint64_t> positions) const;
  double open_seconds = 0;

 private:
  void Stop();
  void Produce();
  // One step's rows for this rank; *given: per source, the windows in them.
  Result<Batch> BuildStep(uint64_t step, std::vector<uint64_t>* positions,
                          std::vector<std::unique_ptr<TokenReader>>* readers,
                          std::vector<uint64_t>* given);
  const TokenWindows& WindowsOf(Source& s, uint64_t epoch);

  std::vector<Source> sources_;
  std::vector<MixSource> specs_;
  const MixOptions options_;
  TokenBatchSpec spec_;
  std::shared_ptr<BufferPool> pool_;

  MixState start_, last_state_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Built {
    Result<Batch> batch;
    MixState after;
    std::vector<uint64_t> given;  // per source, windows in this rank's rows
  };
  std::deque<Built> ready_;
  bool stop_ = false;
  Status failed_;
  std::thread producer_;
  std::atomic<uint64_t> bytes_read_{0};
  // Delivered to the consumer (not built ahead), under mu_.
  std::vector<uint64_t> windows_given_;  // per source
  uint64_t steps_ = 0;
};

std::vector<double> MixImpl::WeightsAt(uint64_t step) const {
  std::vector<double> w;
  for (const MixSource& s : specs_) w.push_back(s.weight);
  for (const MixSchedulePoint& p : options_.schedule) {
    if (p.step <= step) w = p.weights;
  }
  return w;
}

MixState MixImpl::Identified(uint64_t step, std::vector<uint64_t> positions) const {
  MixState s;
  s.step = step;
  s.positions = std::move(positions);
  for (const Source& src : sources_) s.dataset_ids.push_back(src.ds->manifest().IdHex());
  s.weights = WeightsAt(step == 0 ? 0 : step - 1);
  s.seed = options_.seed;
  s.shuffle = options_.shuffle;
  s.sequence_length = options_.sequence_length;
  s.batch_size = options_.batch_size;
  return s;
}

Status MixImpl::CheckState(const MixState& s) const {
  const std::string what = "mixture resume state (step " + std::to_string(s.step) + ")";
  if (s.version != kMixStateVersion) {
    return InvalidArgument(what + " has version " + std::to_string(s.version) +
                           ", this stoker reads " + std::to_string(kMixStateVersion));
  }
  if (s.positions.size() != sources_.size() || s.dataset_ids.size() != sources_.size()) {
    return InvalidArgument(what + " was saved for " + std::to_string(s.dataset_ids.size()) +
                           " sources, this mixture has " + std::to_string(sources_.size()));
  }
  const MixState mine = Identified(s.step, s.positions);
  for (size_t i = 0; i < sources_.size(); ++i) {
    if (s.dataset_ids[i] != mine.dataset_ids[i]) {
      return InvalidArgument(what + " was saved with dataset " + s.dataset_ids[i] + " as " +
                             Name(i, specs_[i]) + ", which is dataset " + mine.dataset_ids[i]);
    }
  }
  if (s.weights != mine.weights) {
    std::string a, b;
    for (double w : s.weights) a += (a.empty() ? "" : ", ") + std::to_string(w);
    for (double w : mine.weights) b += (b.empty() ? "" : ", ") + std::to_string(w);
    return InvalidArgument(
        what + " was saved with weights [" + a + "], this mixture has [" + b +
        "] there: change weights with a schedule point at a step >= " + std::to_string(s.step));
  }
  auto differs = [&](const char* name, uint64_t saved, uint64_t have) {
    return InvalidArgument(what + " was saved with " + name + " " + std::to_string(saved) +
                           ", this mixture has " + std::to_string(have));
  };
  if (s.seed != mine.seed) return differs("seed", s.seed, mine.seed);
  if (s.shuffle != mine.shuffle) return differs("shuffle", s.shuffle, mine.shuffle);
  if (s.sequence_length != mine.sequence_length) {
    return differs("sequence_length", s.sequence_length, mine.sequence_length);
  }
  if (s.batch_size != mine.batch_size) return differs("batch_size", s.batch_size, mine.batch_size);
  return Status::Ok();
}

const TokenWindows& MixImpl::WindowsOf(Source& s, uint64_t epoch) {
  auto it = s.windows.find(epoch);
  if (it != s.windows.end()) return *it->second;
  while (s.windows.size() >= 2) s.windows.erase(s.windows.begin());
  auto w = std::make_shared<const TokenWindows>(
      TokenWindows::Build(s.ds->doc_tokens(), options_.sequence_length, s.ds->manifest().Id64(),
                          options_.shuffle, options_.seed, epoch));
  return *s.windows.emplace(epoch, std::move(w)).first->second;
}

Result<Batch> MixImpl::BuildStep(uint64_t step, std::vector<uint64_t>* positions,
                                 std::vector<std::unique_ptr<TokenReader>>* readers,
                                 std::vector<uint64_t>* given) {
  given->assign(sources_.size(), 0);
  const size_t n = sources_.size();
  const std::vector<double> weights = WeightsAt(step);
  const std::vector<uint32_t> counts = MixCounts(weights, options_.batch_size, options_.seed, step);
  // The step's slots: (source, its k-th draw this step), in a drawn order.
  std::vector<std::pair<uint32_t, uint32_t>> slots;
  slots.reserve(options_.batch_size);
  for (uint32_t i = 0; i < n; ++i) {
    for (uint32_t k = 0; k < counts[i]; ++k) slots.emplace_back(i, k);
  }
  if (options_.shuffle) {
    Rng rng(MixSeed({options_.seed, step, 0x6d69786f72646572ull}));
    Permute(std::span(slots), rng);
  }
  const uint32_t per_rank = options_.batch_size / options_.world_size;
  const size_t first = size_t(options_.rank) * per_rank;
  const uint64_t row = uint64_t{options_.sequence_length} + 1;
  const uint32_t eb = format::DTypeBytes(spec_.dtype);
  // Each window's pieces, and per source the rows it fills.
  std::vector<std::vector<TokenPiece>> window_pieces(per_rank);
  std::vector<uint64_t> ids(per_rank);
  std::vector<int64_t> source_of(per_rank);
  for (uint32_t j = 0; j < per_rank; ++j) {
    const auto [i, k] = slots[first + j];
    Source& s = sources_[i];
    const uint64_t q = (*positions)[i] + k;
    const TokenWindows& w = WindowsOf(s, q / s.epoch_windows);
    const uint64_t window = w.WindowAt(q % s.epoch_windows);
    w.Pieces(window, &window_pieces[j]);
    ids[j] = window;
    source_of[j] = i;
  }
  std::vector<std::byte> tokens(per_rank * row * eb);
  std::vector<TokenPiece> pieces;
  std::vector<std::byte> part;
  for (uint32_t i = 0; i < n; ++i) {
    pieces.clear();
    std::vector<uint32_t> rows;
    for (uint32_t j = 0; j < per_rank; ++j) {
      if (source_of[j] != int64_t(i)) continue;
      pieces.insert(pieces.end(), window_pieces[j].begin(), window_pieces[j].end());
      rows.push_back(j);
    }
    if (rows.empty()) continue;
    if (!(*readers)[i]) {
      STOKER_ASSIGN_OR_RETURN((*readers)[i], sources_[i].ds->NewReader());
    }
    part.resize(rows.size() * row * eb);
    const uint64_t before = (*readers)[i]->bytes_read();
    Status st = (*readers)[i]->Read(pieces, spec_.dtype, part);
    bytes_read_ += (*readers)[i]->bytes_read() - before;
    if (!st.ok()) return st.WithContext(Name(i, specs_[i]));
    for (size_t r = 0; r < rows.size(); ++r) {
      std::memcpy(tokens.data() + rows[r] * row * eb, part.data() + r * row * eb, row * eb);
    }
    (*given)[i] = rows.size();
  }
  std::vector<TokenPiece> flat;
  std::vector<size_t> starts{0};
  for (const auto& p : window_pieces) {
    flat.insert(flat.end(), p.begin(), p.end());
    starts.push_back(flat.size());
  }
  for (size_t i = 0; i < n; ++i) (*positions)[i] += counts[i];
  return BuildTokenBatch(*pool_, spec_, tokens, flat, starts, ids, source_of, 0, step,
                         LoaderState(0, step + 1));
}

void MixImpl::Produce() {
  std::vector<uint64_t> positions = start_.positions;
  std::vector<std::unique_ptr<TokenReader>> readers(sources_.size());
  for (uint64_t step = start_.step;; ++step) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || ready_.size() < std::max<uint32_t>(1, options_.prefetch_batches);
      });
      if (stop_) return;
    }
    std::vector<uint64_t> given;
    Result<Batch> b = BuildStep(step, &positions, &readers, &given);
    const bool failed = !b.ok();
    MixState after = Identified(step + 1, positions);
    {
      std::lock_guard lock(mu_);
      ready_.push_back({std::move(b), std::move(after), std::move(given)});
    }
    cv_.notify_all();
    if (failed) return;
  }
}

Status MixImpl::Start(const MixState& s) {
  start_ = s;
  last_state_ = s;
  producer_ = std::thread([this] { Produce(); });
  return Status::Ok();
}

void MixImpl::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (producer_.joinable()) producer_.join();
}

Result<Batch> MixImpl::Next() {
  if (!failed_.ok()) return failed_;
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !ready_.empty(); });
  Built built = std::move(ready_.front());
  ready_.pop_front();
  if (built.batch.ok()) {
    ++steps_;
    for (size_t i = 0; i < built.given.size(); ++i) windows_given_[i] += built.given[i];
  }
  lock.unlock();
  cv_.notify_all();
  if (!built.batch.ok()) {
    failed_ = built.batch.status();
    return failed_;
  }
  last_state_ = std::move(built.after);
  return std::move(built.batch);
}

MixStats MixImpl::stats() const {
  MixStats s;
  s.bytes_read = bytes_read_.load();
  for (const Source& src : sources_) {
    s.bytes_read += src.ds->index_bytes_read();
    s.epoch_windows.push_back(src.epoch_windows);
  }
  {
    std::lock_guard lock(const_cast<std::mutex&>(mu_));
    s.steps = steps_;
    s.windows = windows_given_;
  }
  s.open_seconds = open_seconds;
  return s;
}

}  // namespace

Result<std::unique_ptr<Mix>> Mix::Open(std::vector<MixSource> specs, const MixOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (specs.empty()) return InvalidArgument("a mixture needs at least one source");
  if (o.sequence_length == 0) return InvalidArgument("a mixture needs sequence_length >= 1");
  if (o.batch_size == 0) return InvalidArgument("batch_size must be at least 1");
  if (o.world_size == 0 || o.rank >= o.world_size) {
    return InvalidArgument("rank " + std::to_string(o.rank) + " must be below world_size " +
                           std::to_string(o.world_size));
  }
  if (o.batch_size % o.world_size != 0) {
    return InvalidArgument("the mixture's batch_size " + std::to_string(o.batch_size) +
                           " (the global batch) is not a multiple of world_size " +
                           std::to_string(o.world_size));
  }
  STOKER_ASSIGN_OR_RETURN(const format::DType dtype, TokenDType(o.sequence_dtype));
  std::vector<double> base;
  for (size_t i = 0; i < specs.size(); ++i) {
    base.push_back(specs[i].weight);
    if (specs[i].sequence_length != 0 && specs[i].sequence_length != o.sequence_length) {
      return InvalidArgument(Name(i, specs[i]) + ": sequence_length " +
                             std::to_string(specs[i].sequence_length) +
                             " differs from the mixture's " + std::to_string(o.sequence_length) +
                             " (every source gives windows of one length)");
    }
  }
  STOKER_RETURN_IF_ERROR(CheckWeights(base, specs, ""));
  uint64_t previous = 0;
  for (const MixSchedulePoint& p : o.schedule) {
    const std::string where = "schedule point at step " + std::to_string(p.step);
    if (p.step <= previous) {
      return InvalidArgument(where + ": schedule steps must be >= 1 and increasing");
    }
    previous = p.step;
    STOKER_RETURN_IF_ERROR(CheckWeights(p.weights, specs, where));
  }
  // Open the sources, a few at a time.
  std::vector<Source> sources(specs.size());
  std::vector<Status> errors(specs.size());
  const size_t threads = std::min<size_t>(specs.size(), o.open_threads ? o.open_threads : 8);
  std::atomic<size_t> next{0};
  auto open_one = [&](size_t i) -> Status {
    Source& s = sources[i];
    s.spec = specs[i];
    STOKER_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, OpenStore(specs[i].uri, o.store));
    STOKER_ASSIGN_OR_RETURN(format::Manifest m, ReadManifest(*store));
    TokenDatasetOptions to;
    to.field = specs[i].field;
    to.verify = o.sequence_verify;
    STOKER_ASSIGN_OR_RETURN(s.ds, TokenDataset::Open(std::move(store), std::move(m), to));
    const uint64_t t = s.ds->total_tokens();
    s.epoch_windows = t > o.sequence_length ? (t - 1) / o.sequence_length : 0;
    if (s.epoch_windows == 0) {
      return InvalidArgument("it has " + std::to_string(t) + " tokens, fewer than one window of " +
                             std::to_string(o.sequence_length) + " + 1");
    }
    return Status::Ok();
  };
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < specs.size();) errors[i] = open_one(i);
    });
  }
  for (auto& th : pool) th.join();
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!errors[i].ok()) return errors[i].WithContext(Name(i, specs[i]));
  }
  auto mix = std::make_unique<MixImpl>(std::move(sources), o, dtype);
  MixState start = o.start;
  if (start.positions.empty() && start.dataset_ids.empty() && start.step == 0) {
    start = mix->Identified(0, std::vector<uint64_t>(specs.size(), 0));
  }
  STOKER_RETURN_IF_ERROR(mix->CheckState(start));
  mix->open_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  STOKER_RETURN_IF_ERROR(mix->Start(start));
  return std::unique_ptr<Mix>(std::move(mix));
}

}  // namespace stoker
