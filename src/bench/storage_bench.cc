// The storage benchmark (see stoker/storage_bench.h).
//
// Latency is measured per operation from submission to completion as the
// caller sees it: Put's return for writes, the reap from the ReadQueue for
// reads (Wait is always called for one completion, so a completion is
// reaped as soon as it lands).
#include "bench/storage_bench.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

namespace stoker {
namespace {

using Seconds = std::chrono::duration<double>;

// Memory the read patterns may take for buffers (depth x object size).
constexpr uint64_t kMaxBufferBytes = 4ull << 30;

// How long one read may take before the benchmark gives up on the store.
// Backends have their own, shorter timeouts (RADOS: 30 s); this only keeps a
// store without one (a hung NFS mount) from hanging the benchmark forever.
constexpr auto kReadDeadline = std::chrono::seconds(300);

std::vector<std::byte> Pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = std::byte(rng() & 0xff);
  return out;
}

std::string RunName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0' || host[0] == '.') {
    std::snprintf(host, sizeof(host), "host");
  }
  for (char* p = host; *p != '\0'; ++p) {
    if (*p == '/') *p = '_';
  }
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return std::string(host) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now).count());
}

class Bench {
 public:
  Bench(Store& store, const StorageBenchOptions& o) : store_(store), o_(o) {
    run_ = o.prefix.empty() ? RunName() + "/" : o.prefix + "/" + RunName() + "/";
  }

  std::string Key(uint32_t i) const {
    char name[32];
    std::snprintf(name, sizeof(name), "obj-%06u", i);
    return run_ + name;
  }
  const std::string& run() const { return run_; }

  // `depth` threads Put whole objects, cycling over the objects, until
  // `seconds` are up and every object exists.
  Result<PatternResult> Write(double seconds) {
    const std::vector<std::byte> data = Pattern(o_.object_bytes, o_.seed);
    std::atomic<uint64_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    Status first_error;
    std::vector<double> latencies;
    uint64_t ops = 0;
    const auto start = Clock::now();
    const auto until = start + std::chrono::duration_cast<Clock::duration>(Seconds(seconds));
    auto worker = [&] {
      std::vector<double> mine;
      while (!failed) {
        const uint64_t n = next.fetch_add(1);
        if (n >= o_.objects && Clock::now() >= until) break;
        const auto t0 = Clock::now();
        Status st = store_.Put(Key(uint32_t(n % o_.objects)), data);
        const auto t1 = Clock::now();
        if (!st.ok()) {
          std::lock_guard lock(mu);
          if (first_error.ok()) first_error = st;
          failed = true;
          break;
        }
        mine.push_back(Seconds(t1 - t0).count());
      }
      std::lock_guard lock(mu);
      ops += mine.size();
      latencies.insert(latencies.end(), mine.begin(), mine.end());
    };
    std::vector<std::thread> threads;
    for (uint32_t i = 0; i < o_.depth; ++i) threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    const double secs = Seconds(Clock::now() - start).count();
    if (!first_error.ok()) return first_error.WithContext("write pattern");
    PatternResult r;
    r.name = "write";
    r.ops = ops;
    r.bytes = ops * o_.object_bytes;
    r.seconds = secs;
    r.latency = SummarizeLatencies(latencies);
    return r;
  }

  // Reads through one queue, keeping `depth` in flight. `next` gives the
  // (object, offset) of the i-th read; `more(i)` whether to issue read i.
  template <typename Next, typename More>
  Result<PatternResult> Reads(std::string name, size_t length, Next next, More more,
                              bool whole_object) {
    ReadQueueOptions qo;
    qo.depth = o_.depth;
    STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ReadQueue> queue, store_.NewReadQueue(qo));
    std::vector<std::vector<std::byte>> bufs(o_.depth, std::vector<std::byte>(length));
    std::vector<Clock::time_point> issued_at(o_.depth);
    std::vector<double> latencies;
    uint64_t issued = 0, bytes = 0;
    const auto start = Clock::now();
    auto issue = [&](uint32_t slot) -> Status {
      const auto [object, offset] = next(issued);
      ReadRequest r{Key(object), offset, bufs[slot], slot};
      issued_at[slot] = Clock::now();
      ++issued;
      return queue->Submit({&r, 1});
    };
    for (uint32_t slot = 0; slot < o_.depth && more(issued); ++slot) {
      STOKER_RETURN_IF_ERROR(issue(slot).WithContext(name + " pattern"));
    }
    std::vector<ReadCompletion> done;
    while (queue->Outstanding() > 0) {
      done.clear();
      auto w = queue->Wait(1, Clock::now() + kReadDeadline, &done);
      if (!w.ok()) return w.status().WithContext(name + " pattern");
      const auto now = Clock::now();
      for (const ReadCompletion& c : done) {
        if (!c.status.ok()) return c.status.WithContext(name + " pattern");
        if (whole_object && c.bytes != length) {
          return IoError(name + " pattern: read " + std::to_string(c.bytes) + " bytes of a " +
                         std::to_string(length) + "-byte object (changed under the benchmark?)");
        }
        latencies.push_back(Seconds(now - issued_at[c.tag]).count());
        bytes += c.bytes;
        if (more(issued)) {
          STOKER_RETURN_IF_ERROR(issue(uint32_t(c.tag)).WithContext(name + " pattern"));
        }
      }
    }
    PatternResult r;
    r.name = std::move(name);
    r.ops = latencies.size();
    r.bytes = bytes;
    r.seconds = Seconds(Clock::now() - start).count();
    r.latency = SummarizeLatencies(latencies);
    return r;
  }

  Result<PatternResult> Seq() {
    const auto until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(Seconds(o_.seconds));
    return Reads(
        "seq", o_.object_bytes,
        [&](uint64_t i) { return std::pair<uint32_t, uint64_t>(uint32_t(i % o_.objects), 0); },
        [&, until](uint64_t i) { return i < o_.objects || Clock::now() < until; },
        /*whole_object=*/true);
  }

  Result<PatternResult> Rand() {
    const auto until =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(Seconds(o_.seconds));
    std::mt19937_64 rng(o_.seed * 7919 + 1);
    const uint64_t blocks = std::max<uint64_t>(1, o_.object_bytes / o_.random_read_bytes);
    return Reads(
        "rand", o_.random_read_bytes,
        [&](uint64_t) {
          const auto object = uint32_t(rng() % o_.objects);
          return std::pair<uint32_t, uint64_t>(object, (rng() % blocks) * o_.random_read_bytes);
        },
        [&, until](uint64_t i) { return i < o_.depth || Clock::now() < until; },
        /*whole_object=*/false);
  }

  // Removes every object of the run; those never written are not an error.
  Status Cleanup() {
    Status first;
    for (uint32_t i = 0; i < o_.objects; ++i) {
      Status st = store_.Remove(Key(i));
      if (!st.ok() && st.code() != Code::kNotFound && first.ok()) first = st;
    }
    return first;
  }

 private:
  Store& store_;
  const StorageBenchOptions& o_;
  std::string run_;
};

Status Validate(const StorageBenchOptions& o) {
  if (o.object_bytes == 0) return InvalidArgument("object size must be at least 1 byte");
  if (o.objects == 0) return InvalidArgument("objects must be at least 1");
  if (o.depth == 0) return InvalidArgument("depth must be at least 1");
  if (!(o.seconds >= 0) || o.seconds > 86400) {
    return InvalidArgument("seconds must be between 0 and 86400");
  }
  if (o.random_read_bytes == 0 || o.random_read_bytes > o.object_bytes) {
    return InvalidArgument("random read size must be between 1 byte and the object size");
  }
  if (uint64_t(o.depth) * o.object_bytes > kMaxBufferBytes) {
    return InvalidArgument(
        "depth x object size is " + std::to_string((uint64_t(o.depth) * o.object_bytes) >> 20) +
        " MiB of read buffers; at most " + std::to_string(kMaxBufferBytes >> 20) + " MiB");
  }
  if (!o.write && !o.seq && !o.rand) return InvalidArgument("no pattern selected");
  if (!o.prefix.empty()) STOKER_RETURN_IF_ERROR(ValidateKey(o.prefix).WithContext("prefix"));
  return Status::Ok();
}

}  // namespace

LatencySummary SummarizeLatencies(std::vector<double>& samples) {
  LatencySummary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  auto rank = [&](double p) {
    const auto k = static_cast<size_t>(std::ceil(p * double(samples.size())));
    return samples[std::min(samples.size(), std::max<size_t>(k, 1)) - 1];
  };
  s.p50 = rank(0.50);
  s.p99 = rank(0.99);
  s.p999 = rank(0.999);
  s.max = samples.back();
  double sum = 0;
  for (double x : samples) sum += x;
  s.mean = sum / double(samples.size());
  return s;
}

Result<StorageBenchResult> RunStorageBench(Store& store, const StorageBenchOptions& options) {
  STOKER_RETURN_IF_ERROR(Validate(options));
  Bench bench(store, options);
  StorageBenchResult result;
  result.uri = store.uri();
  result.run_prefix = bench.run();
  result.options = options;

  Status st;
  {
    // Without the write pattern, the objects are still written once first.
    Result<PatternResult> w = bench.Write(options.write ? options.seconds : 0);
    if (!w.ok()) {
      st = w.status();
    } else if (options.write) {
      result.patterns.push_back(std::move(w).value());
    }
  }
  if (st.ok() && options.seq) {
    auto r = bench.Seq();
    if (r.ok()) {
      result.patterns.push_back(std::move(r).value());
    } else {
      st = r.status();
    }
  }
  if (st.ok() && options.rand) {
    auto r = bench.Rand();
    if (r.ok()) {
      result.patterns.push_back(std::move(r).value());
    } else {
      st = r.status();
    }
  }
  if (options.cleanup) {
    Status clean = bench.Cleanup();
    if (st.ok() && !clean.ok()) st = clean.WithContext("removing the benchmark's objects");
  }
  if (!st.ok()) return st.WithContext("bench storage " + store.uri());
  return result;
}

}  // namespace stoker
