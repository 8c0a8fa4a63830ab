#include "cache/cache_queue.h"

#include <algorithm>

namespace stoker::cache_internal {

CacheQueue::~CacheQueue() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

Status CacheQueue::Submit(std::span<const ReadRequest> requests) {
  std::lock_guard lock(mu_);
  if (stop_) return Cancelled("cache read queue is shut down");
  for (const auto& r : requests) pending_.push_back(r);
  outstanding_ += requests.size();
  while (threads_.size() < std::min<size_t>(depth_, 8) && threads_.size() < outstanding_) {
    threads_.emplace_back([this] { Serve(); });
  }
  cv_.notify_all();
  return Status::Ok();
}

Result<size_t> CacheQueue::Wait(size_t min_completions, Deadline deadline,
                                std::vector<ReadCompletion>* out) {
  std::unique_lock lock(mu_);
  const size_t want = std::min(min_completions, outstanding_);
  const bool met = done_cv_.wait_until(lock, deadline, [&] { return done_.size() >= want; });
  const size_t n = done_.size();
  for (auto& c : done_) out->push_back(std::move(c));
  done_.clear();
  outstanding_ -= n;
  if (!met) return TimedOut("cache read queue: fewer completions than asked by the deadline");
  return n;
}

size_t CacheQueue::Outstanding() const {
  std::lock_guard lock(mu_);
  return outstanding_;
}

void CacheQueue::Serve() {
  while (true) {
    ReadRequest r;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopped, nothing left
      r = std::move(pending_.front());
      pending_.pop_front();
    }
    ReadCompletion c = ReadNow(*store_, r);
    {
      std::lock_guard lock(mu_);
      done_.push_back(std::move(c));
    }
    done_cv_.notify_all();
  }
}

}  // namespace stoker::cache_internal
