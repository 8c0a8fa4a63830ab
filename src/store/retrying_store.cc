// RetryingStore: see stoker/retrying_store.h.
#include "stoker/retrying_store.h"

#include <algorithm>
#include <thread>
#include <unordered_map>
#include <vector>

namespace stoker {
namespace {

std::chrono::milliseconds Backoff(const RetryOptions& o, uint32_t retry) {
  const auto d = o.first_backoff * (int64_t{1} << std::min<uint32_t>(retry - 1, 20));
  return std::min(d, o.max_backoff);
}

void Count(const RetryOptions& o) {
  if (o.retries != nullptr) o.retries->fetch_add(1, std::memory_order_relaxed);
}

// Whether a failed attempt (`retry` - 1 retries so far) is tried again,
// given when the first attempt started; sleeps the backoff when it is.
bool RetryAfterSleep(const RetryOptions& o, const Status& st, uint32_t retry, Deadline first) {
  if (st.ok() || !st.retryable() || retry > o.max_retries) return false;
  const auto delay = Backoff(o, retry);
  if (Clock::now() + delay > first + o.deadline) return false;
  Count(o);
  std::this_thread::sleep_for(delay);
  return true;
}

const Status& StatusOf(const Status& s) { return s; }
template <typename T>
const Status& StatusOf(const Result<T>& r) {
  return r.status();
}

// A retryable error that remained after `retries` retries, saying so.
Status AfterAttempts(const Status& st, uint32_t retries) {
  if (st.ok() || !st.retryable() || retries == 0) return st;
  return Status(st.code(), st.message() + " (after " + std::to_string(retries + 1) + " attempts)",
                true);
}

// Calls `attempt` until it succeeds, fails for good, or the retries or the
// deadline run out.
template <typename F>
auto WithRetries(const RetryOptions& o, F attempt) -> decltype(attempt()) {
  const Deadline first = Clock::now();
  auto r = attempt();
  uint32_t retry = 1;
  for (; !r.ok() && RetryAfterSleep(o, StatusOf(r), retry, first); ++retry) {
    r = attempt();
  }
  if (r.ok() || retry == 1) return r;
  return AfterAttempts(StatusOf(r), retry - 1);
}

// `see`, shown each byte of the object once over all attempts of a retried
// Put with an observer: an attempt shows it only the bytes past those an earlier
// attempt reached (the bytes are the same each time).
class ObserverOnce {
 public:
  explicit ObserverOnce(const PutObserver& see) : see_(see) {}
  // The observer for the next attempt.
  PutObserver Attempt() {
    at_ = 0;
    return [this](std::span<const std::byte> piece) {
      const uint64_t skip = shown_ > at_ ? shown_ - at_ : 0;
      at_ += piece.size();
      if (skip < piece.size()) {
        see_(piece.subspan(skip));
        shown_ = at_;
      }
    };
  }

 private:
  const PutObserver& see_;
  uint64_t shown_ = 0;  // over all attempts
  uint64_t at_ = 0;     // in this attempt
};

// Mapping (Map) is forwarded, not retried: its errors are not transient ones
// of a read.
class RetryingObjectReader final : public ObjectReaderWrapper {
 public:
  RetryingObjectReader(std::unique_ptr<ObjectReader> inner, const RetryOptions& o)
      : ObjectReaderWrapper(std::move(inner)), options_(o) {
    // A record read retries sooner than a whole-shard read: it is small and
    // a worker (not a queue) waits for it.
    options_.first_backoff = std::max(std::chrono::milliseconds(1), o.first_backoff / 5);
  }
  Result<size_t> ReadV(uint64_t offset, std::span<const std::span<std::byte>> dsts) override {
    return WithRetries(options_, [&] { return target()->ReadV(offset, dsts); });
  }

 private:
  RetryOptions options_;
};

// Resubmits a request that failed with a retryable error after its backoff,
// under a tag of its own; the caller sees one completion per request.
class RetryingReadQueue final : public ReadQueueWrapper {
 public:
  RetryingReadQueue(std::unique_ptr<ReadQueue> inner, const RetryOptions& o)
      : ReadQueueWrapper(std::move(inner)), options_(o) {}

  Status Submit(std::span<const ReadRequest> requests) override {
    std::vector<ReadRequest> own(requests.begin(), requests.end());
    const uint64_t first_id = next_id_;
    for (auto& r : own) {
      const uint64_t id = next_id_++;
      pending_.emplace(id, Pending{r, 0, Clock::now()});
      r.tag = id;
    }
    Status st = target()->Submit(own);
    if (!st.ok()) {
      for (uint64_t id = first_id; id < next_id_; ++id) pending_.erase(id);
    }
    return st;
  }

  Result<size_t> Wait(size_t min_completions, Deadline deadline,
                      std::vector<ReadCompletion>* out) override {
    min_completions = std::min(min_completions, Outstanding());
    std::vector<ReadCompletion> landed;
    while (true) {
      STOKER_RETURN_IF_ERROR(SubmitDue());
      STOKER_RETURN_IF_ERROR(Reap(0, Clock::now(), &landed));
      if (done_.size() >= min_completions || Clock::now() >= deadline) break;
      Deadline until = deadline;
      for (const auto& [due, id] : due_) until = std::min(until, due);
      if (target()->Outstanding() > 0) {
        STOKER_RETURN_IF_ERROR(Reap(1, until, &landed));
      } else {
        std::this_thread::sleep_until(until);
      }
    }
    const size_t n = done_.size();
    for (auto& c : done_) out->push_back(std::move(c));
    done_.clear();
    if (n < min_completions) {
      return TimedOut("read queue: " + std::to_string(n) + " of " +
                      std::to_string(min_completions) + " completions by the deadline");
    }
    return n;
  }

  size_t Outstanding() const override { return pending_.size() + done_.size(); }

  Status Reap(size_t min, Deadline until, std::vector<ReadCompletion>* landed) {
    landed->clear();
    auto w = target()->Wait(min, until, landed);
    if (!w.ok() && w.status().code() != Code::kTimedOut) return w.status();
    for (auto& c : *landed) OnLanded(std::move(c));
    return Status::Ok();
  }

 private:
  struct Pending {
    ReadRequest request;  // with the caller's tag
    uint32_t retries = 0;
    Deadline first;
  };

  Status SubmitDue() {
    if (due_.empty()) return Status::Ok();
    const auto now = Clock::now();
    std::vector<ReadRequest> again;
    for (auto it = due_.begin(); it != due_.end();) {
      if (it->first <= now) {
        ReadRequest r = pending_.at(it->second).request;
        r.tag = it->second;
        again.push_back(std::move(r));
        it = due_.erase(it);
      } else {
        ++it;
      }
    }
    return again.empty() ? Status::Ok() : target()->Submit(again);
  }

  void OnLanded(ReadCompletion c) {
    auto it = pending_.find(c.tag);
    if (it == pending_.end()) return;  // not ours: cannot happen
    Pending& p = it->second;
    const Status& st = c.status;
    if (!st.ok() && st.retryable() && p.retries < options_.max_retries) {
      const auto delay = Backoff(options_, p.retries + 1);
      const auto due = Clock::now() + delay;
      if (due <= p.first + options_.deadline) {
        p.retries++;
        Count(options_);
        due_.emplace_back(due, c.tag);
        return;
      }
    }
    c.tag = p.request.tag;
    c.status = AfterAttempts(c.status, p.retries);
    pending_.erase(it);
    done_.push_back(std::move(c));
  }

  const RetryOptions options_;
  uint64_t next_id_ = 0;
  std::unordered_map<uint64_t, Pending> pending_;   // submitted, not yet final
  std::vector<std::pair<Deadline, uint64_t>> due_;  // retries waiting for their backoff
  std::vector<ReadCompletion> done_;                // final completions, caller's tags
};

}  // namespace

Result<std::unique_ptr<ReadQueue>> RetryingStore::NewReadQueue(const ReadQueueOptions& o) {
  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ReadQueue> inner, target()->NewReadQueue(o));
  return std::unique_ptr<ReadQueue>(new RetryingReadQueue(std::move(inner), options_));
}

Result<size_t> RetryingStore::Read(std::string_view key, uint64_t offset,
                                   std::span<std::byte> dst) {
  return WithRetries(options_, [&] { return target()->Read(key, offset, dst); });
}

Result<std::vector<std::byte>> RetryingStore::ReadAll(std::string_view key) {
  return WithRetries(options_, [&] { return target()->ReadAll(key); });
}

Result<std::unique_ptr<ObjectReader>> RetryingStore::OpenReader(std::string_view key) {
  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> inner,
                          WithRetries(options_, [&] { return target()->OpenReader(key); }));
  return std::unique_ptr<ObjectReader>(new RetryingObjectReader(std::move(inner), options_));
}

Status RetryingStore::Put(std::string_view key, std::span<const std::byte> data,
                          const WriteOptions& options) {
  if (!options_.writes) return target()->Put(key, data, options);
  if (options.observer == nullptr) {
    return WithRetries(options_, [&] { return target()->Put(key, data, options); });
  }
  ObserverOnce once(*options.observer);
  return WithRetries(options_, [&] {
    const PutObserver see = once.Attempt();
    WriteOptions attempt = options;
    attempt.observer = &see;
    return target()->Put(key, data, attempt);
  });
}

}  // namespace stoker
