// The ordered hand-off between the loader's stages (internal): values with
// indexes 0, 1, 2, ... are put in any order, from any thread, and taken in
// index order by one consumer.
//
// Bounded by construction: producers put index i only while
// i < (next index taken) + capacity (the loader's build window), so a ring
// of `capacity` slots holds every value put and not yet taken, and neither
// side allocates per value. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "stoker/store.h"

namespace stoker {

template <typename T>
class OrderedQueue final {
 public:
  explicit OrderedQueue(size_t capacity) : ring_(capacity) {}

  void Put(uint64_t index, T value) {
    {
      std::lock_guard lock(mu_);
      ring_[index % ring_.size()].emplace(std::move(value));
    }
    cv_.notify_all();
  }

  // Value `index` (the next one to take), once it is there; nullopt when
  // `until` passes first or Stop was called.
  std::optional<T> Take(uint64_t index, Deadline until = Deadline::max()) {
    std::unique_lock lock(mu_);
    auto& slot = ring_[index % ring_.size()];
    auto there = [&] { return stopped_ || slot.has_value(); };
    if (until == Deadline::max()) {
      cv_.wait(lock, there);
    } else if (!cv_.wait_until(lock, until, there)) {
      return std::nullopt;
    }
    if (!slot.has_value()) return std::nullopt;
    std::optional<T> v = std::move(slot);
    slot.reset();
    return v;
  }

  // Whether value `index` is there now (without taking it). `index` must
  // lie within the build window: the next index taken + capacity.
  bool Ready(uint64_t index) {
    std::lock_guard lock(mu_);
    return ring_[index % ring_.size()].has_value();
  }

  size_t capacity() const { return ring_.size(); }

  void Stop() {
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::vector<std::optional<T>> ring_;
};

}  // namespace stoker
