// A ReadQueue over a store's synchronous Read, served by a few threads: the
// node cache's reads, each of which is a pread and a check (a hit) or a
// remote read, a check and a file write (a miss), none of which an io_uring
// or librados queue could do alone.
//
// Thread safety: as every ReadQueue (one submitter and reaper at a time).
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "stoker/store.h"

namespace stoker::cache_internal {

class CacheQueue final : public ReadQueue {
 public:
  // Reads through `store` (which must outlive the queue), up to `depth`
  // threads (at most 8), started as requests come.
  CacheQueue(Store* store, uint32_t depth) : store_(store), depth_(std::max(1u, depth)) {}
  ~CacheQueue() override;
  Status Submit(std::span<const ReadRequest> requests) override;
  Result<size_t> Wait(size_t min_completions, Deadline deadline,
                      std::vector<ReadCompletion>* out) override;
  size_t Outstanding() const override;

 private:
  void Serve();

  Store* store_;
  const uint32_t depth_;
  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<ReadRequest> pending_;
  std::vector<ReadCompletion> done_;
  std::vector<std::thread> threads_;
  size_t outstanding_ = 0;
  bool stop_ = false;
};

}  // namespace stoker::cache_internal
