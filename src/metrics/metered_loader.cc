// MeterLoader: a Loader decorator. Next() is timed (two clock reads, one
// histogram observation, relaxed atomic adds); the loader's own stats are
// read by the registry when it collects, not here.
#include "metrics/registry.h"

namespace stoker::metrics {
namespace {

class MeteredLoader final : public Loader {
 public:
  explicit MeteredLoader(std::unique_ptr<Loader> target)
      : target_(std::move(target)), watch_(std::make_shared<LoaderWatch>()) {
    watch_->loader = target_.get();
    Registry::Get().Watch(watch_);
  }

  ~MeteredLoader() override {
    // The last counts go into the totals before the loader goes away, so a
    // scrape after it still has them.
    {
      std::lock_guard lock(watch_->mu);
      Registry::Get().Fold(*watch_, target_->stats());
      watch_->loader = nullptr;
    }
    target_.reset();
  }

  const format::Manifest& manifest() const override { return target_->manifest(); }
  const LoaderOptions& options() const override { return target_->options(); }
  Status StartEpoch(uint64_t epoch, uint64_t position) override {
    return target_->StartEpoch(epoch, position);
  }
  Status Prefetch(uint64_t epoch) override { return target_->Prefetch(epoch); }

  Result<Batch> Next() override {
    const auto begin = Clock::now();
    Result<Batch> r = target_->Next();
    const auto end = Clock::now();
    auto& registry = Registry::Get();
    registry.data_wait.Observe(std::chrono::duration<double>(end - begin).count());
    auto& timeline = StepTimeline::Get();
    timeline.Add(Phase::kData, begin, end);
    if (r.ok()) {
      const uint64_t bytes = r->buffer().size();
      registry.delivered_bytes.fetch_add(bytes, std::memory_order_relaxed);
      timeline.AddDelivered(r->size(), bytes);
    }
    return r;
  }

  uint64_t num_batches() const override { return target_->num_batches(); }
  Result<uint64_t> BatchesFrom(uint64_t epoch, uint64_t position) const override {
    return target_->BatchesFrom(epoch, position);
  }
  LoaderState state() const override { return target_->state(); }
  LoaderStats stats() const override { return target_->stats(); }
  std::string_view read_unit() const override { return target_->read_unit(); }
  uint64_t epoch_positions() const override { return target_->epoch_positions(); }

 private:
  std::unique_ptr<Loader> target_;
  std::shared_ptr<LoaderWatch> watch_;
};

}  // namespace

std::unique_ptr<Loader> MeterLoader(std::unique_ptr<Loader> loader) {
  return std::make_unique<MeteredLoader>(std::move(loader));
}

Result<std::unique_ptr<Loader>> OpenLoader(std::string_view uri, const LoaderOptions& options) {
  if (!Enabled() && !StepTimeline::Get().active()) return Loader::Open(uri, options);
  if (!Enabled()) {
    // Steps are timed but nothing is published: the data wait is needed,
    // the store's counters are not.
    auto loader = Loader::Open(uri, options);
    if (!loader.ok()) return loader.status();
    return MeterLoader(std::move(*loader));
  }
  auto store = OpenStore(uri, options.store);
  if (!store.ok()) return store.status();
  auto loader = Loader::Open(MeteringStore(std::move(*store)), options);
  if (!loader.ok()) return loader.status();
  return MeterLoader(std::move(*loader));
}

}  // namespace stoker::metrics
