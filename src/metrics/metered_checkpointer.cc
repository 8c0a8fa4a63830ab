// MeterCheckpointer: a Checkpointer decorator that counts its saves. A
// decorator, as MeterLoader is, and not counting inside the checkpointer,
// so that the checkpoint module knows nothing of metrics; it sees an
// asynchronous save's end through SaveHandle::OnDone, which does not count
// as asking the handle. Counting is relaxed atomics; nothing here is on a
// per-byte path.
#include "metrics/registry.h"

namespace stoker::metrics {
namespace {

// The start that a SaveStartedAt on this thread gave (the epoch: none).
thread_local Clock::time_point save_started_at{};

double Seconds(Clock::time_point begin, Clock::time_point end) {
  return std::chrono::duration<double>(end - begin).count();
}

uint64_t TensorBytes(std::span<const TensorRef> tensors) {
  uint64_t n = 0;
  for (const TensorRef& t : tensors) n += t.data.size();
  return n;
}

class MeteredCheckpointer final : public Checkpointer {
 public:
  explicit MeteredCheckpointer(std::unique_ptr<Checkpointer> target) : target_(std::move(target)) {}

  const std::string& uri() const override { return target_->uri(); }

  Status Save(std::string_view name, std::span<const TensorRef> tensors,
              const SaveOptions& options) override {
    const Clock::time_point begin = Start();
    const uint64_t bytes = TensorBytes(tensors);
    Status s = target_->Save(name, tensors, options);
    const Clock::time_point end = Clock::now();
    Stalled(begin, end);
    RecordCheckpointEnd(s.ok(), bytes, Seconds(begin, end));
    return s;
  }

  Result<SaveHandle> SaveAsync(std::string_view name, std::span<const TensorRef> tensors,
                               const SaveOptions& options) override {
    const Clock::time_point begin = Start();
    // Before the call: the caller may free its tensors once it returns.
    const uint64_t bytes = TensorBytes(tensors);
    Result<SaveHandle> h = target_->SaveAsync(name, tensors, options);
    const Clock::time_point end = Clock::now();
    Stalled(begin, end);
    if (!h.ok()) {
      RecordCheckpointEnd(false, bytes, Seconds(begin, end));
      return h;
    }
    h->OnDone([begin, bytes](const Status& s) {
      RecordCheckpointEnd(s.ok(), bytes, Seconds(begin, Clock::now()));
    });
    return h;
  }

  Result<std::vector<CheckpointListing>> List() override { return target_->List(); }
  Result<std::string> Latest() override { return target_->Latest(); }
  Result<std::string> ClaimName() override { return target_->ClaimName(); }
  Result<CheckpointManifest> ReadManifest(std::string_view name) override {
    return target_->ReadManifest(name);
  }
  Result<Restored> Restore(std::string_view name, const RestoreOptions& options) override {
    return target_->Restore(name, options);
  }
  Result<CheckpointManifest> RestoreInto(std::string_view name,
                                         std::span<const TensorDestination> dst,
                                         const RestoreOptions& options) override {
    return target_->RestoreInto(name, dst, options);
  }
  Status Verify(std::string_view name, CheckpointVerifyReport* report) override {
    return target_->Verify(name, report);
  }
  Status Remove(std::string_view name) override { return target_->Remove(name); }

 private:
  // When the save began: now, or earlier where a SaveStartedAt says so.
  static Clock::time_point Start() {
    const Clock::time_point now = Clock::now();
    const Clock::time_point given = save_started_at;
    return given != Clock::time_point{} && given < now ? given : now;
  }

  // The caller has its control back: a stall of the training step.
  static void Stalled(Clock::time_point begin, Clock::time_point end) {
    RecordCheckpointStall(Seconds(begin, end));
    StepTimeline::Get().Add(Phase::kCheckpoint, begin, end);
  }

  std::unique_ptr<Checkpointer> target_;
};

}  // namespace

SaveStartedAt::SaveStartedAt(Clock::time_point begin) : previous_(save_started_at) {
  save_started_at = begin;
}

SaveStartedAt::~SaveStartedAt() { save_started_at = previous_; }

std::unique_ptr<Checkpointer> MeterCheckpointer(std::unique_ptr<Checkpointer> checkpointer) {
  return std::make_unique<MeteredCheckpointer>(std::move(checkpointer));
}

Result<std::unique_ptr<Checkpointer>> OpenCheckpointer(std::string_view uri,
                                                       const CheckpointerOptions& options) {
  if (!Enabled()) {
    auto c = stoker::OpenCheckpointer(uri, options);
    if (!c.ok()) return c.status();
    return MeterCheckpointer(std::move(*c));
  }
  auto store = OpenStore(uri, options.store);
  if (!store.ok()) return store.status();
  return MeterCheckpointer(NewCheckpointer(MeteringStore(std::move(*store)), options));
}

}  // namespace stoker::metrics
