// The thread-pool read engine of the POSIX store, for when io_uring is not
// available (seccomp, old kernels, io_uring disabled) or not wanted.
//
// The store owns one pool; each ReadQueue holds up to `depth` turns in the
// pool's line. A worker taking a turn reads one request with pread (open,
// read, close: a worker never holds a file between requests) and delivers the
// completion to its queue under the queue's mutex. Reads block in the kernel,
// which is why the pool has more threads than cores by default.
#include <algorithm>

#include "store/posix_internal.h"
#include "store/store_internal.h"

namespace stoker::posix {

IoThreadPool::IoThreadPool(uint32_t threads) {
  threads_.reserve(threads);
  try {
    for (uint32_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
  } catch (...) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
    throw;
  }
}

IoThreadPool::~IoThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void IoThreadPool::Post(std::shared_ptr<Client> client) {
  {
    std::lock_guard lock(mu_);
    line_.push_back(std::move(client));
  }
  cv_.notify_one();
}

void IoThreadPool::Loop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !line_.empty(); });
    if (stop_) return;
    std::shared_ptr<Client> client = std::move(line_.front());
    line_.pop_front();
    lock.unlock();
    const bool again = client->RunOne();
    lock.lock();
    if (again) {
      line_.push_back(std::move(client));
    } else {
      // Drop the reference outside the lock: it may be the last one.
      lock.unlock();
      client.reset();
      lock.lock();
    }
  }
}

namespace {

// A queue's state shared with the pool's workers. It lives as long as the
// queue or any turn of it still in the pool's line, whichever is longer.
class ThreadQueueCore final : public IoThreadPool::Client {
 public:
  struct Pending {
    std::string key;
    uint64_t offset;
    std::span<std::byte> dst;
    uint64_t tag;
  };

  ThreadQueueCore(std::string root, const ReadQueueOptions& options)
      : root_(std::move(root)), depth_(options.depth), direct_(options.direct_io) {}

  // Queues requests; returns how many new turns the caller must post.
  uint32_t Add(std::span<const ReadRequest> requests) {
    std::lock_guard lock(mu_);
    for (const ReadRequest& r : requests) {
      pending_.push_back({r.key, r.offset, r.dst, r.tag});
    }
    // Each turn in line but not running takes one pending request; add turns
    // until every pending request has one or depth turns exist.
    uint32_t posted = 0;
    while (turns_ < depth_ && turns_ - running_ < pending_.size()) {
      ++turns_;
      ++posted;
    }
    return posted;
  }

  bool RunOne() override {
    Pending p;
    {
      std::lock_guard lock(mu_);
      if (closed_ || pending_.empty()) {
        --turns_;
        return false;
      }
      p = std::move(pending_.front());
      pending_.pop_front();
      ++running_;
    }
    ReadCompletion c = ReadRange(root_, p.key, p.offset, p.dst, p.tag, direct_);
    std::lock_guard lock(mu_);
    --running_;
    ready_.push_back(std::move(c));
    const bool again = !closed_ && !pending_.empty();
    if (!again) --turns_;
    // One waiter at most (the owner, in Wait or the destructor).
    cv_.notify_one();
    return again;
  }

  // Waits for `min` ready completions or the deadline; moves all ready ones.
  size_t Take(size_t min, Deadline deadline, std::vector<ReadCompletion>* out) {
    std::unique_lock lock(mu_);
    return store_internal::TakeReady(lock, cv_, ready_, min, deadline, out);
  }

  // Drops requests not yet started and waits for the running ones, which
  // write into caller memory until they finish.
  void Close() {
    std::unique_lock lock(mu_);
    closed_ = true;
    pending_.clear();
    cv_.wait(lock, [this] { return running_ == 0; });
  }

 private:
  const std::string root_;
  const uint32_t depth_;
  const bool direct_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;        // guarded by mu_
  std::vector<ReadCompletion> ready_;  // guarded by mu_
  uint32_t turns_ = 0;                 // guarded by mu_; in line or running
  uint32_t running_ = 0;               // guarded by mu_
  bool closed_ = false;                // guarded by mu_
};

class ThreadReadQueue final : public ReadQueue {
 public:
  ThreadReadQueue(std::shared_ptr<IoThreadPool> pool, std::string root,
                  const ReadQueueOptions& options)
      : pool_(std::move(pool)),
        core_(std::make_shared<ThreadQueueCore>(std::move(root), options)) {}

  ~ThreadReadQueue() override { core_->Close(); }

  Status Submit(std::span<const ReadRequest> requests) override {
    const uint32_t turns = core_->Add(requests);
    outstanding_ += requests.size();
    for (uint32_t i = 0; i < turns; ++i) pool_->Post(core_);
    return Status::Ok();
  }

  Result<size_t> Wait(size_t min_completions, Deadline deadline,
                      std::vector<ReadCompletion>* out) override {
    return store_internal::WaitOn(*core_, min_completions, deadline, out, &outstanding_,
                                  "read queue");
  }

  size_t Outstanding() const override { return outstanding_; }

 private:
  std::shared_ptr<IoThreadPool> pool_;  // kept alive while the queue is
  std::shared_ptr<ThreadQueueCore> core_;
  size_t outstanding_ = 0;  // owner thread only
};

}  // namespace

Result<std::unique_ptr<ReadQueue>> NewThreadReadQueue(std::shared_ptr<IoThreadPool> pool,
                                                      std::string root,
                                                      const ReadQueueOptions& options) {
  return std::unique_ptr<ReadQueue>(
      std::make_unique<ThreadReadQueue>(std::move(pool), std::move(root), options));
}

}  // namespace stoker::posix
