// The per-file baseline (see bench.h): each worker builds whole batches, one
// file open + read + close per sample, as a DataLoader worker running
// ImageFolder does, then collates with the Loader's own code.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "core/file_util.h"
#include "loader/batch_builder.h"
#include "bench/bench.h"
#include "stoker/plan.h"

namespace stoker {
namespace {

class PerFileLoaderImpl final : public PerFileLoader {
 public:
  PerFileLoaderImpl(PackSources sources, LoaderOptions options,
                    std::shared_ptr<RoundTrip> round_trip, std::shared_ptr<Store> files)
      : sources_(std::move(sources)),
        options_(std::move(options)),
        round_trip_(std::move(round_trip)),
        files_(std::move(files)) {
    columns_ = {{"image", format::FieldType::kBytes, !options_.decode.field.empty()},
                {"label", format::FieldType::kInt64, false}};
    pool_ = std::make_shared<BufferPool>(kColumnAlignment, options_.prefetch_batches + 2, true);
  }
  ~PerFileLoaderImpl() override { Stop(); }

  Status StartEpoch(uint64_t epoch) override {
    Stop();
    epoch_ = epoch;
    order_.resize(sources_.files.size());
    std::iota(order_.begin(), order_.end(), 0);
    if (options_.shuffle) {
      Rng rng(MixSeed({options_.seed, epoch}));
      Permute(std::span<uint64_t>(order_), rng);
    }
    const uint64_t n = order_.size(), bs = options_.batch_size;
    num_batches_ = options_.drop_last ? n / bs : (n + bs - 1) / bs;
    stop_ = false;
    next_build_ = next_consume_ = 0;
    ready_.clear();
    uint32_t threads = options_.threads ? options_.threads : std::thread::hardware_concurrency();
    for (uint32_t i = 0; i < std::max(1u, threads); ++i) workers_.emplace_back([this] { Work(); });
    return Status::Ok();
  }

  Result<Batch> Next() override {
    std::unique_lock lock(mu_);
    if (next_consume_ >= num_batches_) return OutOfRange("epoch over");
    cv_.wait(lock, [&] { return ready_.count(next_consume_) > 0; });
    auto node = ready_.extract(next_consume_++);
    cv_.notify_all();
    return std::move(node.mapped());
  }

  uint64_t num_batches() const override { return num_batches_; }
  uint64_t bytes_read() const override { return bytes_read_.load(); }

 private:
  void Stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  void Work() {
    std::vector<std::vector<std::byte>> files;
    std::vector<int64_t> labels;
    std::vector<uint64_t> ids;
    while (true) {
      uint64_t b;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] {
          return stop_ || next_build_ >= num_batches_ ||
                 next_build_ < next_consume_ + std::max(1u, options_.prefetch_batches);
        });
        if (stop_ || next_build_ >= num_batches_) return;
        b = next_build_++;
      }
      const uint64_t first = b * options_.batch_size;
      const uint64_t count = std::min<uint64_t>(options_.batch_size, order_.size() - first);
      files.resize(count);
      labels.resize(count);
      ids.resize(count);
      Status st;
      for (uint64_t k = 0; k < count && st.ok(); ++k) {
        ids[k] = order_[first + k];
        const PackSource& src = sources_.files[ids[k]];
        if (round_trip_) round_trip_->Pay();  // the file's open + read
        if (files_) {
          auto object = files_->ReadAll(src.path);
          st = object.status();
          if (object.ok()) files[k] = std::move(*object);
        } else {
          st = internal::ReadWholeFile(src.path, &files[k]);  // as Python does
        }
        bytes_read_ += files[k].size();
        labels[k] = src.label;
      }
      Result<Batch> batch = st;
      if (st.ok()) {
        BatchSamples s;
        s.count = count;
        s.sample_ids = ids.data();
        s.seed = options_.seed;
        s.value = [&](size_t i, size_t c) -> std::span<const std::byte> {
          if (c == 0) return files[i];
          return std::as_bytes(std::span<const int64_t>(&labels[i], 1));
        };
        s.describe = [&](size_t i) { return sources_.files[ids[i]].path; };
        batch = BatchBuilder::Build(*pool_, columns_, options_.decode, s, epoch_, b,
                                    {epoch_, std::min<uint64_t>(first + count, order_.size())});
      }
      std::lock_guard lock(mu_);
      ready_.emplace(b, std::move(batch));
      cv_.notify_all();
    }
  }

  const PackSources sources_;
  const LoaderOptions options_;
  const std::shared_ptr<RoundTrip> round_trip_;
  const std::shared_ptr<Store> files_;
  std::vector<ColumnSpec> columns_;
  std::shared_ptr<BufferPool> pool_;
  std::vector<uint64_t> order_;
  uint64_t epoch_ = 0;
  uint64_t num_batches_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t next_build_ = 0, next_consume_ = 0;
  std::map<uint64_t, Result<Batch>> ready_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace

Result<std::unique_ptr<PerFileLoader>> PerFileLoader::Open(PackSources sources,
                                                           const LoaderOptions& options,
                                                           std::shared_ptr<RoundTrip> round_trip,
                                                           std::shared_ptr<Store> files) {
  if (options.batch_size == 0) return InvalidArgument("batch_size must be at least 1");
  if (sources.files.empty()) return InvalidArgument("no files");
  auto impl = std::make_unique<PerFileLoaderImpl>(std::move(sources), options,
                                                  std::move(round_trip), std::move(files));
  STOKER_RETURN_IF_ERROR(impl->StartEpoch(0));
  return std::unique_ptr<PerFileLoader>(std::move(impl));
}

}  // namespace stoker
