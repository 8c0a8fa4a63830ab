// The emulated network round trip (see bench.h): RoundTrip, and a store
// wrapper whose every operation pays it. `stoker demo` puts the same
// RoundTrip on both sides of its comparison: each per-file open + read, and
// each stoker store operation.
#include <algorithm>
#include <deque>
#include <thread>
#include <unordered_map>

#include "bench/bench.h"

namespace stoker {
namespace {

// A read queue whose completions are held until the round trip after the
// target reported them: requests in flight wait out their latencies
// together, as asynchronous requests to a network store do.
class LatencyReadQueue final : public ReadQueueWrapper {
 public:
  LatencyReadQueue(std::unique_ptr<ReadQueue> target, std::shared_ptr<RoundTrip> round_trip)
      : ReadQueueWrapper(std::move(target)), round_trip_(std::move(round_trip)) {}

  Status Submit(std::span<const ReadRequest> requests) override {
    for (size_t i = 0; i < requests.size(); ++i) round_trip_->Count();
    return target()->Submit(requests);
  }

  Result<size_t> Wait(size_t min_completions, Deadline deadline,
                      std::vector<ReadCompletion>* out) override {
    min_completions = std::min(min_completions, Outstanding());
    size_t moved = 0;
    while (true) {
      // Collect what the target has finished, without blocking.
      std::vector<ReadCompletion> done;
      auto polled = target()->Wait(0, Clock::now(), &done);
      if (!polled.ok() && polled.status().code() != Code::kTimedOut) return polled.status();
      const auto due = Clock::now() + round_trip_->latency();
      for (auto& c : done) held_.push_back({due, std::move(c)});
      // Hand over those whose round trip is over (held_ is in due order).
      const auto now = Clock::now();
      while (!held_.empty() && held_.front().due <= now) {
        out->push_back(std::move(held_.front().completion));
        held_.pop_front();
        ++moved;
      }
      if (moved >= min_completions) return moved;
      if (now >= deadline) {
        return TimedOut("read queue: fewer completions than asked by the deadline");
      }
      if (!held_.empty()) {
        std::this_thread::sleep_until(std::min(held_.front().due, deadline));
      } else {
        // Nothing held: block on the target for its next completion.
        std::vector<ReadCompletion> next;
        auto got = target()->Wait(1, deadline, &next);
        if (!got.ok() && got.status().code() != Code::kTimedOut) return got.status();
        const auto next_due = Clock::now() + round_trip_->latency();
        for (auto& c : next) held_.push_back({next_due, std::move(c)});
      }
    }
  }

  size_t Outstanding() const override { return target()->Outstanding() + held_.size(); }

 private:
  struct Held {
    Clock::time_point due;
    ReadCompletion completion;
  };
  const std::shared_ptr<RoundTrip> round_trip_;
  std::deque<Held> held_;
};

class LatencyStore final : public StoreWrapper {
 public:
  LatencyStore(std::shared_ptr<Store> target, std::shared_ptr<RoundTrip> round_trip)
      : StoreWrapper(std::move(target)), round_trip_(std::move(round_trip)) {}

  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& o) override {
    STOKER_ASSIGN_OR_RETURN(auto q, StoreWrapper::NewReadQueue(o));
    return std::unique_ptr<ReadQueue>(
        std::make_unique<LatencyReadQueue>(std::move(q), round_trip_));
  }
  Result<size_t> Read(std::string_view k, uint64_t off, std::span<std::byte> dst) override {
    round_trip_->Pay();
    return StoreWrapper::Read(k, off, dst);
  }
  Result<std::vector<std::byte>> ReadAll(std::string_view k) override {
    round_trip_->Pay();
    return StoreWrapper::ReadAll(k);
  }
  using StoreWrapper::Put;
  Status Put(std::string_view k, std::span<const std::byte> d, const WriteOptions& o) override {
    round_trip_->Pay();
    return StoreWrapper::Put(k, d, o);
  }
  Result<ObjectInfo> Stat(std::string_view k) override {
    round_trip_->Pay();
    return StoreWrapper::Stat(k);
  }
  Result<std::vector<ObjectInfo>> List(std::string_view p) override {
    round_trip_->Pay();
    return StoreWrapper::List(p);
  }
  Result<std::vector<std::string>> ListKeys(std::string_view p) override {
    round_trip_->Pay();
    return StoreWrapper::ListKeys(p);
  }
  Status Remove(std::string_view k) override {
    round_trip_->Pay();
    return StoreWrapper::Remove(k);
  }

 private:
  const std::shared_ptr<RoundTrip> round_trip_;
};

}  // namespace

void RoundTrip::Pay() {
  Count();
  if (latency_.count() > 0) std::this_thread::sleep_for(latency_);
}

std::shared_ptr<Store> NewLatencyStore(std::shared_ptr<Store> target,
                                       std::shared_ptr<RoundTrip> round_trip) {
  return std::make_shared<LatencyStore>(std::move(target), std::move(round_trip));
}

}  // namespace stoker
