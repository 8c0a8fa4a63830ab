#include "ckpt/parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

namespace stoker::ckpt {

size_t Workers(size_t n, uint32_t threads) {
  return std::max<size_t>(1, std::min<size_t>(threads, n));
}

Status ParallelFor(size_t n, uint32_t threads, const std::function<Status(size_t, size_t)>& fn) {
  if (n == 0) return Status::Ok();
  const size_t t = Workers(n, threads);
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status first;
  auto work = [&](size_t worker) {
    for (;;) {
      if (failed.load(std::memory_order_relaxed)) return;
      size_t i = next.fetch_add(1);
      if (i >= n) return;
      Status s = fn(i, worker);
      if (!s.ok()) {
        std::lock_guard<std::mutex> l(mu);
        if (first.ok()) first = std::move(s);
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t i = 1; i < t; ++i) pool.emplace_back(work, i);
  work(0);
  for (auto& th : pool) th.join();
  return first;
}

std::string JoinNames(const std::vector<std::string>& v, size_t max) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < max; ++i) {
    if (i) out += ", ";
    out += v[i];
  }
  if (v.size() > max) out += ", and " + std::to_string(v.size() - max) + " more";
  return out;
}

std::vector<std::string> TensorsIn(const RankPart& part, uint64_t offset, uint64_t bytes) {
  std::vector<std::string> out;
  auto it = std::upper_bound(part.tensors.begin(), part.tensors.end(), offset,
                             [](uint64_t o, const TensorInfo& t) { return o < t.offset; });
  if (it != part.tensors.begin()) --it;
  for (; it != part.tensors.end() && it->offset < offset + bytes; ++it) {
    if (it->bytes > 0 && it->offset + it->bytes > offset) out.push_back(it->name);
  }
  return out;
}

std::string ChunkContext(const RankPart& part, const ChunkInfo& chunk) {
  return " (rank " + std::to_string(part.rank) + ", tensors " +
         JoinNames(TensorsIn(part, chunk.offset, chunk.bytes)) + ")";
}

}  // namespace stoker::ckpt

namespace stoker::ckpt {

Status WithRetries(const RetryPolicy& policy, const std::function<Status()>& op) {
  auto backoff = policy.backoff;
  for (uint32_t attempt = 0;; ++attempt) {
    Status s = op();
    if (s.ok() || !s.retryable()) return s;
    if (attempt >= policy.retries) {
      return Status(s.code(), s.message() + " (after " + std::to_string(attempt + 1) + " attempts)",
                    true);
    }
    std::this_thread::sleep_for(backoff);
    backoff *= 2;
  }
}

}  // namespace stoker::ckpt
