// MeteringStore: a StoreWrapper that counts every operation, with its bytes,
// errors and latency, into the process's StoreCounters of its backend and
// pool. Counting is relaxed atomics only; no lock on any path.
#include <unordered_map>

#include "metrics/registry.h"

namespace stoker::metrics {
namespace {

// Reads through a queue: latency from Submit to the completion being
// reaped. The queue is used by one thread (ReadQueue's contract), so the map
// of requests in flight needs no lock.
class MeteredQueue final : public ReadQueueWrapper {
 public:
  MeteredQueue(std::unique_ptr<ReadQueue> target, std::shared_ptr<StoreCounters> c)
      : ReadQueueWrapper(std::move(target)), c_(std::move(c)) {}

  Status Submit(std::span<const ReadRequest> requests) override {
    // Our own tags, so that a caller's repeated tags stay apart.
    std::vector<ReadRequest> mine(requests.begin(), requests.end());
    const auto now = Clock::now();
    for (auto& r : mine) {
      const uint64_t id = next_++;
      inflight_.emplace(id, std::make_pair(r.tag, now));
      r.tag = id;
    }
    Status s = target()->Submit(mine);
    if (!s.ok()) {
      for (const auto& r : mine) inflight_.erase(r.tag);
    }
    return s;
  }

  Result<size_t> Wait(size_t min_completions, Deadline deadline,
                      std::vector<ReadCompletion>* out) override {
    const size_t first = out->size();
    Result<size_t> r = target()->Wait(min_completions, deadline, out);
    for (size_t i = first; i < out->size(); ++i) {
      ReadCompletion& c = (*out)[i];
      auto it = inflight_.find(c.tag);
      if (it == inflight_.end()) continue;
      c.tag = it->second.first;
      c_->Done(StoreOp::kRead, it->second.second, c.status, c.bytes);
      inflight_.erase(it);
    }
    return r;
  }

 private:
  std::shared_ptr<StoreCounters> c_;
  uint64_t next_ = 0;
  std::unordered_map<uint64_t, std::pair<uint64_t, Clock::time_point>> inflight_;
};

// Loads from a mapping (Map, CountMapped) are not store operations: not
// metered, forwarded.
class MeteredReader final : public ObjectReaderWrapper {
 public:
  MeteredReader(std::unique_ptr<ObjectReader> target, std::shared_ptr<StoreCounters> c)
      : ObjectReaderWrapper(std::move(target)), c_(std::move(c)) {}
  Result<size_t> ReadV(uint64_t offset, std::span<const std::span<std::byte>> dsts) override {
    const auto begin = Clock::now();
    Result<size_t> r = target()->ReadV(offset, dsts);
    c_->Done(StoreOp::kRead, begin, r.status(), r.ok() ? *r : 0);
    return r;
  }

 private:
  std::shared_ptr<StoreCounters> c_;
};

class MeteringStoreImpl final : public StoreWrapper {
 public:
  MeteringStoreImpl(std::shared_ptr<Store> target, std::shared_ptr<StoreCounters> c)
      : StoreWrapper(std::move(target)), c_(std::move(c)) {}

  StoreDescription Describe() const override { return DescribeWithLayer("metering"); }

  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& o) override {
    auto q = target()->NewReadQueue(o);
    if (!q.ok()) return q.status();
    return std::unique_ptr<ReadQueue>(std::make_unique<MeteredQueue>(std::move(*q), c_));
  }
  Result<size_t> Read(std::string_view k, uint64_t off, std::span<std::byte> dst) override {
    return Timed(
        StoreOp::kRead, [&] { return target()->Read(k, off, dst); }, [](size_t n) { return n; });
  }
  Result<std::vector<std::byte>> ReadAll(std::string_view k) override {
    return Timed(
        StoreOp::kRead, [&] { return target()->ReadAll(k); },
        [](const std::vector<std::byte>& v) { return v.size(); });
  }
  Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view key) override {
    auto r = target()->OpenReader(key);
    if (!r.ok()) {
      c_->Done(StoreOp::kRead, Clock::now(), r.status(), 0);
      return r.status();
    }
    return std::unique_ptr<ObjectReader>(std::make_unique<MeteredReader>(std::move(*r), c_));
  }

  // Every write, exclusive creates (claims: a checkpoint's sequence, an
  // automatic name) included, with an AlreadyExists among their errors.
  using StoreWrapper::Put;
  Status Put(std::string_view k, std::span<const std::byte> d, const WriteOptions& o) override {
    return Write([&] { return target()->Put(k, d, o); }, d.size());
  }

  Result<ObjectInfo> Stat(std::string_view k) override {
    return Timed(
        StoreOp::kStat, [&] { return target()->Stat(k); },
        [](const ObjectInfo&) { return size_t{0}; });
  }
  Result<std::vector<ObjectInfo>> List(std::string_view p) override {
    return Timed(
        StoreOp::kList, [&] { return target()->List(p); },
        [](const std::vector<ObjectInfo>&) { return size_t{0}; });
  }
  Result<std::vector<std::string>> ListKeys(std::string_view p) override {
    return Timed(
        StoreOp::kList, [&] { return target()->ListKeys(p); },
        [](const std::vector<std::string>&) { return size_t{0}; });
  }
  Status Remove(std::string_view k) override {
    const auto begin = Clock::now();
    Status s = target()->Remove(k);
    c_->Done(StoreOp::kRemove, begin, s, 0);
    return s;
  }
  Status RemoveFolder(std::string_view folder) override {
    const auto begin = Clock::now();
    Status s = target()->RemoveFolder(folder);
    c_->Done(StoreOp::kRemove, begin, s, 0);
    return s;
  }

 private:
  template <typename F, typename Bytes>
  auto Timed(StoreOp op, F f, Bytes bytes) -> decltype(f()) {
    const auto begin = Clock::now();
    auto r = f();
    c_->Done(op, begin, r.status(), r.ok() ? bytes(*r) : 0);
    return r;
  }
  template <typename F>
  Status Write(F f, size_t size) {
    const auto begin = Clock::now();
    Status s = f();
    c_->Done(StoreOp::kWrite, begin, s, size);
    return s;
  }

  std::shared_ptr<StoreCounters> c_;
};

}  // namespace

std::shared_ptr<Store> MeteringStore(std::shared_ptr<Store> target) {
  // Labelled by the backend (and RADOS pool) behind any decorators.
  const StoreDescription d = target->Describe();
  auto counters = Registry::Get().Store(d.kind, d.kind == "rados" ? d.location : "");
  return std::make_shared<MeteringStoreImpl>(std::move(target), std::move(counters));
}

}  // namespace stoker::metrics
