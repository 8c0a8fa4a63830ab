#include "ckpt/parallel.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>

#include "core/thread_boundary.h"
#include "stoker/retrying_store.h"

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
      // An exception must not leave a std::thread (std::terminate): it is
      // the item's error.
      Status s;
      try {
        s = fn(i, worker);
      } catch (...) {
        s = internal::CurrentExceptionStatus("checkpoint worker, item " + std::to_string(i));
      }
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

std::shared_ptr<Store> WithWriteRetries(std::shared_ptr<Store> store, uint32_t retries,
                                        std::chrono::milliseconds backoff) {
  RetryOptions o;
  o.writes = true;
  o.max_retries = retries;
  o.first_backoff = backoff;
  // Doubling without a cap or a deadline: the number of retries bounds the
  // wait.
  o.max_backoff = std::chrono::hours(24);
  o.deadline = std::chrono::hours(24 * 365);
  return std::make_shared<RetryingStore>(std::move(store), o);
}

}  // namespace stoker::ckpt
