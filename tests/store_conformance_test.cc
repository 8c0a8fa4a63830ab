// One conformance suite run against every store backend: memory, POSIX with
// io_uring, POSIX with the thread pool, and any store named by the
// environment variable STOKER_TEST_STORE_URI (e.g. rados://pool/prefix; that
// instance skips when the variable is unset); each also seen through every
// decorator the tree puts in front of a store (RetryingStore, the NodeCache,
// the MeteringStore). Then what only the POSIX store promises (temporary
// files, direct I/O, errno mapping), key rules, OpenStore.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "stoker/cache.h"
#include "stoker/metrics.h"
#include "stoker/retrying_store.h"
#include "stoker/store.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::OpenPathForOthers;
using testing::PageCacheBypassUnavailable;
using testing::RandomBytes;
using testing::ResidentPages;
using testing::RunUnprivileged;
using testing::TempDir;
using namespace std::chrono_literals;

#define ASSERT_OK(expr)                                     \
  do {                                                      \
    const ::stoker::Status _s = (expr);                     \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s.ToString(); \
  } while (0)
#define EXPECT_OK(expr)                                     \
  do {                                                      \
    const ::stoker::Status _s = (expr);                     \
    EXPECT_TRUE(_s.ok()) << #expr << ": " << _s.ToString(); \
  } while (0)

std::vector<std::byte> Text(std::string_view s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

Deadline Far() { return Clock::now() + 60s; }

// Waits for every outstanding completion of `q`; fails the test on a timeout.
std::vector<ReadCompletion> Drain(ReadQueue& q) {
  std::vector<ReadCompletion> out;
  while (q.Outstanding() > 0) {
    Result<size_t> r = q.Wait(q.Outstanding(), Far(), &out);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) break;
  }
  return out;
}

// Runs `requests` through a new queue; completions sorted by tag.
std::vector<ReadCompletion> RunReads(Store& store, const std::vector<ReadRequest>& requests,
                                     ReadQueueOptions options = {}) {
  auto q = store.NewReadQueue(options);
  EXPECT_TRUE(q.ok()) << q.status().ToString();
  if (!q.ok()) return {};
  EXPECT_OK((*q)->Submit(requests));
  std::vector<ReadCompletion> out = Drain(**q);
  std::sort(out.begin(), out.end(),
            [](const ReadCompletion& a, const ReadCompletion& b) { return a.tag < b.tag; });
  return out;
}

// A buffer aligned for direct I/O.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n)
      : size(n),
        data(static_cast<std::byte*>(
            std::aligned_alloc(kDirectIoAlignment, n + 2 * kDirectIoAlignment))) {}
  ~AlignedBuffer() { std::free(data); }
  std::span<std::byte> span(size_t offset, size_t n) const { return {data + offset, n}; }
  size_t size;
  std::byte* data;
};

bool IoUringUsable(std::string* why) {
  StoreOptions o;
  o.posix_engine = "io_uring";
  TempDir dir;
  auto s = NewPosixStore(dir.str(), o);
  if (!s.ok()) *why = s.status().ToString();
  return s.ok();
}

// ---------------------------------------------------------------------------
// The conformance suite.

enum class Backend { kMemory, kPosixIoUring, kPosixThreads, kEnvUri };

// What the suite sees the backend through: nothing, or a decorator, which
// must keep every behaviour of what it wraps (and every capability, except
// what a decorator adds on purpose: the NodeCache's).
enum class Wrapper {
  kNone,
  // RetryingStore, writes retried too: it overrides the most of any wrapper.
  kRetrying,
  // The node cache of a dataset without shards: every key the suite uses is
  // one the cache passes to the store behind (its own shards are covered by
  // cache_test), through the cache's own read queue and readers.
  kNodeCache,
  // metrics::MeteringStore: counts every operation, its own queue and reader.
  kMetering,
};

struct BackendParam {
  Backend backend;
  Wrapper wrapper = Wrapper::kNone;
  bool wrapped() const { return wrapper != Wrapper::kNone; }
  bool operator==(Backend b) const { return backend == b; }
};

std::string BackendName(const ::testing::TestParamInfo<BackendParam>& info) {
  std::string w;
  switch (info.param.wrapper) {
    case Wrapper::kNone:
      break;
    case Wrapper::kRetrying:
      w = "Wrapped";  // the name this instance had before there were others
      break;
    case Wrapper::kNodeCache:
      w = "NodeCache";
      break;
    case Wrapper::kMetering:
      w = "Metered";
      break;
  }
  switch (info.param.backend) {
    case Backend::kMemory:
      return w + "Memory";
    case Backend::kPosixIoUring:
      return w + "PosixIoUring";
    case Backend::kPosixThreads:
      return w + "PosixThreads";
    case Backend::kEnvUri:
      return w + "EnvUri";
  }
  return "Unknown";
}

// So that gtest (and ctest) print the backend, not its bytes.
void PrintTo(BackendParam b, std::ostream* os) {
  *os << BackendName(::testing::TestParamInfo<BackendParam>(b, 0));
}

class StoreConformance : public ::testing::TestWithParam<BackendParam> {
 protected:
  void SetUp() override {
    SetUpBackend();
    if (store_ != nullptr && GetParam().wrapped()) {
      capabilities_of_target_ = store_->capabilities();
      local_reads_of_target_ = store_->local_reads();
      SetUpWrapper();
    }
  }

  void SetUpWrapper() {
    switch (GetParam().wrapper) {
      case Wrapper::kNone:
        break;
      case Wrapper::kRetrying: {
        // Must change nothing a healthy store does.
        RetryOptions retry;
        retry.writes = true;
        store_ = std::make_shared<RetryingStore>(store_, retry);
        break;
      }
      case Wrapper::kNodeCache: {
        CacheOptions o;
        o.dir = (tmp_.path() / "cache").string();
        auto c = OpenNodeCache(store_, format::Manifest{}, o);
        ASSERT_TRUE(c.ok()) << c.status().ToString();
        store_ = *c;
        break;
      }
      case Wrapper::kMetering:
        store_ = metrics::MeteringStore(store_);
        break;
    }
  }

  void SetUpBackend() {
    switch (GetParam().backend) {
      case Backend::kMemory:
        store_ = NewMemoryStore("conformance");
        break;
      case Backend::kPosixIoUring:
      case Backend::kPosixThreads: {
        StoreOptions o;
        o.posix_engine = GetParam() == Backend::kPosixIoUring ? "io_uring" : "threads";
        auto s = NewPosixStore((tmp_.path() / "root").string(), o);
        if (!s.ok() && s.status().code() == Code::kUnsupported) {
          GTEST_SKIP() << "io_uring is not available on this machine: " << s.status().ToString();
        }
        ASSERT_TRUE(s.ok()) << s.status().ToString();
        store_ = *s;
        ASSERT_EQ(store_->Describe().engine, o.posix_engine);
        break;
      }
      case Backend::kEnvUri: {
        const char* uri = std::getenv("STOKER_TEST_STORE_URI");
        if (uri == nullptr || *uri == '\0') {
          GTEST_SKIP() << "STOKER_TEST_STORE_URI is not set; set it to a store URI "
                          "(e.g. rados://POOL/PREFIX) to run this suite against that store";
        }
        auto s = OpenStore(uri);
        if (!s.ok() && s.status().code() == Code::kUnsupported) {
          GTEST_SKIP() << "STOKER_TEST_STORE_URI=" << uri
                       << " is not supported by this build: " << s.status().ToString();
        }
        ASSERT_TRUE(s.ok()) << "STOKER_TEST_STORE_URI=" << uri << ": " << s.status().ToString();
        store_ = *s;
        // A shared store may hold other objects: each test works under its own prefix.
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        std::string name = info->name();
        std::replace(name.begin(), name.end(), '/', '_');
        prefix_ = "stoker-conformance-" + std::to_string(::getpid()) + "-" +
                  std::to_string(Clock::now().time_since_epoch().count()) + "-" + name + "/";
        break;
      }
    }
  }

  void TearDown() override {
    if (store_ == nullptr || prefix_.empty()) return;
    auto all = store_->List(prefix_);
    if (all.ok()) {
      for (const ObjectInfo& o : *all) store_->Remove(o.key).ok();
    }
  }

  std::string K(std::string_view name) const { return prefix_ + std::string(name); }

  TempDir tmp_;
  std::shared_ptr<Store> store_;
  std::string prefix_;  // "" except for the STOKER_TEST_STORE_URI store
  StoreCapabilities capabilities_of_target_;
  bool local_reads_of_target_ = false;
};

// The Put options one by one, and where it matters both durabilities: what
// a Put with each promises on return holds on every store and wrapper.
const WriteOptions kDurable{};
const WriteOptions kDeferred{.durability = Durability::kDeferred};

std::string DurabilityName(const WriteOptions& o) {
  return o.durability == Durability::kDeferred ? "deferred" : "durable";
}

// Put with if_absent: exclusive (of many creators of one key at once, exactly
// one wins, and its bytes are the object's) and atomic, durable or deferred.
TEST_P(StoreConformance, PutIfAbsentIsExclusiveAndAtomic) {
  ASSERT_TRUE(store_->capabilities().exclusive_create)
      << "every store the suite runs creates exclusively";
  for (WriteOptions o : {kDurable, kDeferred}) {
    SCOPED_TRACE(DurabilityName(o));
    o.if_absent = true;
    const std::string dir = "c-" + DurabilityName(o) + "/";
    const auto data = RandomBytes(10000, 3);
    ASSERT_OK(store_->Put(K(dir + "one"), data, o));
    auto again = store_->Put(K(dir + "one"), RandomBytes(10, 4), o);
    EXPECT_EQ(again.code(), Code::kAlreadyExists) << again.ToString();
    auto back = store_->ReadAll(K(dir + "one"));
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(*back, data) << "a refused create leaves the object as it was";
    ASSERT_OK(store_->Put(K(dir + "empty"), {}, o));
    EXPECT_EQ(store_->Stat(K(dir + "empty"))->size, 0u);
    EXPECT_EQ(store_->Put(K(dir + "../x"), data, o).code(), Code::kInvalidArgument);
    // Without if_absent the same key is replaced.
    ASSERT_OK(store_->Put(K(dir + "one"), RandomBytes(10, 4)));
    EXPECT_EQ(store_->Stat(K(dir + "one"))->size, 10u);

    constexpr int kThreads = 8;
    std::atomic<int> won{0}, lost{0};
    std::vector<std::thread> threads;
    std::vector<std::vector<std::byte>> bodies;
    for (int t = 0; t < kThreads; ++t) bodies.push_back(RandomBytes(5000, 100 + t));
    int winner = -1;
    std::mutex mu;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        Status s = store_->Put(K(dir + "race"), bodies[t], o);
        if (s.ok()) {
          ++won;
          std::lock_guard l(mu);
          winner = t;
        } else if (s.code() == Code::kAlreadyExists) {
          ++lost;
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(won.load(), 1);
    EXPECT_EQ(lost.load(), kThreads - 1);
    ASSERT_GE(winner, 0);
    EXPECT_EQ(*store_->ReadAll(K(dir + "race")), bodies[winner]);
    auto listed = store_->List(K(dir));
    ASSERT_TRUE(listed.ok());
    EXPECT_EQ(listed->size(), 3u) << "no temporary object of a create is listed";
  }
  ASSERT_OK(store_->Sync());
}

// A deferred Put is whole, visible and replaces on return, as a durable one
// does; Sync() then succeeds, and again with nothing new to sync.
TEST_P(StoreConformance, PutDeferredIsVisibleAtOnceAndSyncs) {
  ASSERT_OK(store_->Sync());  // with nothing deferred
  std::vector<std::pair<std::string, std::vector<std::byte>>> written;
  for (size_t size : {size_t{0}, size_t{1}, size_t{4096}, (size_t{2} << 20) + 5}) {
    const std::string key = K("deferred/obj-" + std::to_string(size));
    ASSERT_OK(store_->Put(key, RandomBytes(size + 100, size), kDeferred));
    written.emplace_back(key, RandomBytes(size, size + 1));
    ASSERT_OK(store_->Put(key, written.back().second, kDeferred));
    auto got = store_->ReadAll(key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(*got == written.back().second) << key << ": replaced before any Sync";
  }
  ASSERT_OK(store_->Sync());
  ASSERT_OK(store_->Sync());  // a second one
  // The durable manifest after the deferred chunks: all of them are there.
  ASSERT_OK(store_->Put(K("deferred/record"), Text("names them"), kDurable));
  auto listed = store_->List(K("deferred/"));
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(listed->size(), written.size() + 1);
  for (const auto& [key, data] : written) {
    auto got = store_->ReadAll(key);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(*got == data) << key;
  }
}

TEST_P(StoreConformance, WrapperKeepsCapabilities) {
  if (!GetParam().wrapped()) {
    // The unwrapped backend: wrap it here, so every backend is checked.
    capabilities_of_target_ = store_->capabilities();
    local_reads_of_target_ = store_->local_reads();
    store_ = std::make_shared<StoreWrapper>(store_);
  }
  EXPECT_EQ(store_->capabilities().prefix_listing, capabilities_of_target_.prefix_listing);
  if (GetParam().wrapper == Wrapper::kNodeCache) {
    // The cache's readers map its files, or a copy, whatever the store behind
    // (ReaderMapsTheObjectWhereTheStoreCan holds it to that); local_reads
    // follows the cache's limit and folder.
    EXPECT_TRUE(store_->capabilities().mapped_reads);
  } else {
    EXPECT_EQ(store_->capabilities().mapped_reads, capabilities_of_target_.mapped_reads);
    EXPECT_EQ(store_->local_reads(), local_reads_of_target_);
  }
  EXPECT_EQ(store_->capabilities().exclusive_create, capabilities_of_target_.exclusive_create);
  // Deferred writes reach the backend's own deferral and its sync.
  ASSERT_OK(store_->Put(K("d/a"), RandomBytes(4096, 9), kDeferred));
  ASSERT_OK(store_->Sync());
  EXPECT_EQ(store_->Stat(K("d/a"))->size, 4096u);
  ASSERT_OK(store_->RemoveFolder(K("d/")));
  EXPECT_EQ(store_->Stat(K("d/a")).status().code(), Code::kNotFound);
}

TEST_P(StoreConformance, RoundTripsObjectsOfEverySize) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{(1 << 20) + 3}}) {
    SCOPED_TRACE("size " + std::to_string(size));
    const std::string key = K("obj-" + std::to_string(size));
    const auto data = RandomBytes(size, size + 1);
    ASSERT_OK(store_->Put(key, data));

    auto info = store_->Stat(key);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->key, key);
    EXPECT_EQ(info->size, size);

    auto all = store_->ReadAll(key);
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    EXPECT_TRUE(*all == data);

    std::vector<std::byte> buf(size + 10, std::byte{0x5a});
    auto n = store_->Read(key, 0, buf);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, size);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), buf.begin()));
    EXPECT_EQ(buf[size], std::byte{0x5a}) << "wrote past the end of the object";
  }
}

TEST_P(StoreConformance, RangedReadsIncludingPastTheEnd) {
  const auto data = RandomBytes(10000, 7);
  ASSERT_OK(store_->Put(K("r"), data));
  struct Case {
    uint64_t offset;
    size_t length;
    size_t expect;
  };
  const std::vector<Case> cases = {
      {0, 100, 100},  {4000, 1000, 1000}, {9990, 100, 10},           {10000, 10, 0},
      {20000, 10, 0}, {0, 10000, 10000},  {0, 20000, 10000},         {1, 9999, 9999},
      {9999, 1, 1},   {5000, 0, 0},       {uint64_t{1} << 40, 8, 0},
  };
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ReadRequest> requests;
  for (size_t i = 0; i < cases.size(); ++i) {
    bufs.emplace_back(cases[i].length + 1, std::byte{0xee});
    requests.push_back({K("r"), cases[i].offset, std::span(bufs.back()).first(cases[i].length), i});
  }
  // Synchronously, then all at once through a queue.
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("sync case " + std::to_string(i));
    std::vector<std::byte> buf(cases[i].length);
    auto n = store_->Read(K("r"), cases[i].offset, buf);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(*n, cases[i].expect);
    EXPECT_TRUE(std::equal(buf.begin(), buf.begin() + *n,
                           data.begin() + std::min<uint64_t>(cases[i].offset, data.size())));
  }
  auto done = RunReads(*store_, requests);
  ASSERT_EQ(done.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("queued case " + std::to_string(i));
    EXPECT_EQ(done[i].tag, i);
    ASSERT_TRUE(done[i].status.ok()) << done[i].status.ToString();
    EXPECT_EQ(done[i].bytes, cases[i].expect);
    const auto begin = data.begin() + std::min<uint64_t>(cases[i].offset, data.size());
    EXPECT_TRUE(std::equal(begin, begin + done[i].bytes, bufs[i].begin()));
    EXPECT_EQ(bufs[i][cases[i].length], std::byte{0xee}) << "wrote past dst";
  }
}

TEST_P(StoreConformance, MissingObjectIsNotFoundEverywhere) {
  const std::string key = K("no/such-object");
  std::vector<std::byte> buf(16);
  EXPECT_EQ(store_->Stat(key).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->Read(key, 0, buf).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->ReadAll(key).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->Remove(key).code(), Code::kNotFound);
  const Status st = store_->Stat(key).status();
  EXPECT_NE(st.message().find("no/such-object"), std::string::npos) << st.ToString();

  // In a queue: only that request fails, the others succeed.
  ASSERT_OK(store_->Put(K("here"), Text("hello")));
  std::vector<std::byte> a(8), b(8), c(0);
  auto done = RunReads(*store_, {{key, 0, a, 1}, {K("here"), 0, b, 2}, {key, 0, c, 3}});
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0].status.code(), Code::kNotFound) << done[0].status.ToString();
  EXPECT_NE(done[0].status.message().find("no/such-object"), std::string::npos);
  EXPECT_TRUE(done[1].status.ok()) << done[1].status.ToString();
  EXPECT_EQ(done[1].bytes, 5u);
  EXPECT_EQ(done[2].status.code(), Code::kNotFound) << "a zero-length read still needs the object";
}

TEST_P(StoreConformance, FolderOfKeysIsNotAnObject) {
  ASSERT_OK(store_->Put(K("dir/obj"), Text("x")));
  std::vector<std::byte> buf(4);
  EXPECT_EQ(store_->Stat(K("dir")).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->Read(K("dir"), 0, buf).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->ReadAll(K("dir")).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->Remove(K("dir")).code(), Code::kNotFound);
  auto done = RunReads(*store_, {{K("dir"), 0, buf, 9}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status.code(), Code::kNotFound) << done[0].status.ToString();
  EXPECT_TRUE(store_->Stat(K("dir/obj")).ok());
}

TEST_P(StoreConformance, PutReplaces) {
  ASSERT_OK(store_->Put(K("k"), RandomBytes(100000, 1)));
  const auto second = RandomBytes(10, 2);
  ASSERT_OK(store_->Put(K("k"), second));
  auto all = store_->ReadAll(K("k"));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_TRUE(*all == second);
  EXPECT_EQ(store_->Stat(K("k"))->size, 10u);
  auto listed = store_->List(K("k"));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].size, 10u);
}

// WriteOptions::observer sees every byte a Put stores, in order, once, with
// every other option; what it sees is what a read returns.
TEST_P(StoreConformance, PutObserverSeesEveryByteOnceInOrder) {
  for (WriteOptions o : {kDurable, kDeferred}) {
    for (bool if_absent : {false, true}) {
      o.if_absent = if_absent;
      for (size_t size : {size_t{0}, size_t{1}, size_t{300} << 10, (size_t{9} << 20) + 7}) {
        const std::string key =
            K("seen-" + DurabilityName(o) + (if_absent ? "-new-" : "-") + std::to_string(size));
        SCOPED_TRACE(key);
        const std::vector<std::byte> want = RandomBytes(size, size + 5);
        std::vector<std::byte> seen;
        size_t calls = 0;
        const PutObserver see = [&](std::span<const std::byte> p) {
          seen.insert(seen.end(), p.begin(), p.end());
          ++calls;
        };
        o.observer = &see;
        ASSERT_OK(store_->Put(key, want, o));
        EXPECT_TRUE(seen == want) << "shown " << seen.size() << " bytes of " << size;
        if (size > 0) {
          EXPECT_GE(calls, 1u);
        }
        auto got = store_->ReadAll(key);
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        EXPECT_TRUE(*got == want);
      }
    }
  }
  ASSERT_OK(store_->Sync());
}

// A reader racing a writer sees one whole version or the other, never a mix
// or a prefix.
TEST_P(StoreConformance, ReadersNeverSeeHalfAPut) {
  const std::vector<std::byte> a(64 << 10, std::byte{0xaa});
  const std::vector<std::byte> b(96 << 10, std::byte{0xbb});
  ASSERT_OK(store_->Put(K("atomic"), a));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; i < 60 && !stop; ++i) EXPECT_OK(store_->Put(K("atomic"), i % 2 ? a : b));
    stop = true;
  });
  // Joins the writer however the reader below returns (ASSERT returns early).
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Joiner() {
      stop = true;
      t.join();
    }
  } joiner{stop, writer};
  auto q = store_->NewReadQueue({});
  ASSERT_TRUE(q.ok());
  std::vector<std::byte> buf(128 << 10);
  int reads = 0;
  while (!stop || reads < 5) {
    ++reads;
    ReadRequest r{K("atomic"), 0, buf, 1};
    ASSERT_OK((*q)->Submit({&r, 1}));
    std::vector<ReadCompletion> out;
    ASSERT_TRUE((*q)->Wait(1, Far(), &out).ok());
    ASSERT_EQ(out.size(), 1u);
    ASSERT_TRUE(out[0].status.ok()) << out[0].status.ToString();
    const std::byte first = buf[0];
    ASSERT_TRUE((first == std::byte{0xaa} && out[0].bytes == a.size()) ||
                (first == std::byte{0xbb} && out[0].bytes == b.size()))
        << "read " << out[0].bytes << " bytes starting with " << int(first);
    ASSERT_TRUE(std::all_of(buf.begin(), buf.begin() + out[0].bytes, [&](std::byte x) {
      return x == first;
    })) << "a read mixed two versions";

    auto all = store_->ReadAll(K("atomic"));
    if (all.ok()) {
      ASSERT_TRUE(*all == a || *all == b) << "ReadAll returned " << all->size() << " bytes";
    } else {
      // Allowed only as a retryable "changed while read".
      ASSERT_TRUE(all.status().retryable()) << all.status().ToString();
    }
  }
}

TEST_P(StoreConformance, ListsByPrefixSorted) {
  auto empty = store_->List(K(""));
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->empty()) << "a fresh store lists nothing";

  const std::map<std::string, size_t> objects = {{"a/1", 1}, {"a/2", 22}, {"a/sub/deep/3", 333},
                                                 {"ab", 4},  {"b", 0},    {"a-z", 5}};
  // Put in an order unlike the sorted one.
  for (auto it = objects.rbegin(); it != objects.rend(); ++it) {
    ASSERT_OK(store_->Put(K(it->first), RandomBytes(it->second, 3)));
  }
  auto keys = [&](std::string_view prefix) {
    std::vector<std::string> out;
    auto listed = store_->List(K(prefix));
    EXPECT_TRUE(listed.ok()) << listed.status().ToString();
    if (!listed.ok()) return out;
    for (const ObjectInfo& o : *listed) {
      EXPECT_EQ(o.size, objects.at(o.key.substr(prefix_.size()))) << o.key;
      out.push_back(o.key.substr(prefix_.size()));
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(keys(""), (V{"a-z", "a/1", "a/2", "a/sub/deep/3", "ab", "b"}));
  EXPECT_EQ(keys("a/"), (V{"a/1", "a/2", "a/sub/deep/3"}));
  EXPECT_EQ(keys("a"), (V{"a-z", "a/1", "a/2", "a/sub/deep/3", "ab"}));
  EXPECT_EQ(keys("a/s"), (V{"a/sub/deep/3"}));
  EXPECT_EQ(keys("a/sub/deep/3"), (V{"a/sub/deep/3"}));
  EXPECT_EQ(keys("a/sub/deep/3x"), V{});
  EXPECT_EQ(keys("zzz"), V{});
  EXPECT_EQ(keys("zzz/"), V{});
  EXPECT_EQ(keys("b/"), V{}) << "an object is not a folder";
}

// ListKeys is List without the sizes (which it may skip fetching): the
// same keys, in the same order, for every prefix.
TEST_P(StoreConformance, ListKeysIsListWithoutSizes) {
  for (const char* key : {"k/1", "k/2", "k/sub/3", "kx", "l"}) {
    ASSERT_OK(store_->Put(K(key), RandomBytes(7, 1)));
  }
  for (const char* prefix : {"", "k/", "k", "k/sub/", "nothing/"}) {
    auto listed = store_->List(K(prefix));
    auto keys = store_->ListKeys(K(prefix));
    ASSERT_TRUE(listed.ok() && keys.ok()) << keys.status().ToString();
    std::vector<std::string> want;
    for (const ObjectInfo& o : *listed) want.push_back(o.key);
    EXPECT_EQ(*keys, want) << prefix;
  }
  EXPECT_EQ(store_->ListKeys("../x").status().code(), Code::kInvalidArgument);
}

TEST_P(StoreConformance, RemoveThenNotFound) {
  ASSERT_OK(store_->Put(K("gone/x"), Text("bye")));
  ASSERT_OK(store_->Put(K("gone/y"), Text("stays")));
  ASSERT_OK(store_->Remove(K("gone/x")));
  EXPECT_EQ(store_->Stat(K("gone/x")).status().code(), Code::kNotFound);
  std::vector<std::byte> buf(8);
  EXPECT_EQ(store_->Read(K("gone/x"), 0, buf).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->Remove(K("gone/x")).code(), Code::kNotFound);
  auto listed = store_->List(K("gone/"));
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].key, K("gone/y"));
  // And it can come back.
  ASSERT_OK(store_->Put(K("gone/x"), Text("again")));
  EXPECT_EQ(store_->Stat(K("gone/x"))->size, 5u);
}

// RemoveEmptyFolder never takes a folder that holds an object; an absent
// one is NotFound.
TEST_P(StoreConformance, RemoveEmptyFolderKeepsObjects) {
  ASSERT_OK(store_->Put(K("ef/a/b"), Text("x")));
  auto r = store_->RemoveEmptyFolder(K("ef/"), std::chrono::seconds(0));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(*r);
  EXPECT_TRUE(store_->Stat(K("ef/a/b")).ok());
  EXPECT_EQ(store_->RemoveEmptyFolder(K("never-was/"), std::chrono::seconds(0)).status().code(),
            Code::kNotFound);
}

// RemoveFolder removes every object under the folder, at any depth, and
// nothing beside it (a key that only shares the folder's name as a prefix
// stays); an empty or absent folder is fine; a bad folder is refused.
TEST_P(StoreConformance, RemoveFolderRemovesEverythingUnderItAndNothingElse) {
  for (const char* k : {"rf/a", "rf/b/c", "rf/b/d/e", "rfx", "rf-sibling/a"}) {
    ASSERT_OK(store_->Put(K(k), Text(k)));
  }
  ASSERT_OK(store_->RemoveFolder(K("rf/")));
  for (const char* k : {"rf/a", "rf/b/c", "rf/b/d/e"}) {
    EXPECT_EQ(store_->Stat(K(k)).status().code(), Code::kNotFound) << k;
  }
  auto listed = store_->List(K("rf"));
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].key, K("rf-sibling/a"));
  EXPECT_EQ((*listed)[1].key, K("rfx"));
  ASSERT_OK(store_->RemoveFolder(K("rf/")));         // already gone
  ASSERT_OK(store_->RemoveFolder(K("never-was/")));  // never there
  // And the folder can be written again.
  ASSERT_OK(store_->Put(K("rf/a"), Text("again")));
  EXPECT_EQ(store_->Stat(K("rf/a"))->size, 5u);
  for (const std::string bad : {"rf", "", "/", "../", "a/../", ".hidden/", "a//"}) {
    EXPECT_EQ(store_->RemoveFolder(bad).code(), Code::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(store_->Stat(K("rf/a")).ok());
}

TEST_P(StoreConformance, InvalidKeysRejectedEverywhere) {
  const std::vector<std::string> bad = {"../x",
                                        "/abs",
                                        "a//b",
                                        "",
                                        "a/./b",
                                        "a/..",
                                        ".",
                                        "a/",
                                        "x/../../etc/passwd",
                                        std::string("a\0b", 3)};
  std::vector<std::byte> buf(4);
  for (const std::string& raw : bad) {
    // The prefix of the shared store stays in front so nothing escapes it.
    const std::string key = raw.empty() || raw[0] == '/' ? raw : K(raw);
    SCOPED_TRACE("key " + key);
    EXPECT_EQ(ValidateKey(key).code(), Code::kInvalidArgument);
    EXPECT_EQ(store_->Put(key, Text("x")).code(), Code::kInvalidArgument);
    EXPECT_EQ(store_->Stat(key).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(store_->Remove(key).code(), Code::kInvalidArgument);
    EXPECT_EQ(store_->Read(key, 0, buf).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(store_->ReadAll(key).status().code(), Code::kInvalidArgument);
    auto done = RunReads(*store_, {{key, 0, buf, 5}});
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].tag, 5u);
    EXPECT_EQ(done[0].status.code(), Code::kInvalidArgument) << done[0].status.ToString();
  }
  for (std::string prefix : {"../", "/abs", "a//", "a/../"}) {
    if (prefix[0] != '/') prefix = K(prefix);
    EXPECT_EQ(store_->List(prefix).status().code(), Code::kInvalidArgument) << prefix;
  }
  auto listed = store_->List(K(""));
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty()) << "a rejected Put left an object";
}

TEST_P(StoreConformance, ZeroDepthQueueRejected) {
  ReadQueueOptions o;
  o.depth = 0;
  EXPECT_EQ(store_->NewReadQueue(o).status().code(), Code::kInvalidArgument);
}

TEST_P(StoreConformance, ManyRequestsAtDepth8) {
  const size_t size = (1 << 20) + 3;
  const auto data = RandomBytes(size, 11);
  ASSERT_OK(store_->Put(K("many"), data));
  ASSERT_OK(store_->Put(K("many2"), RandomBytes(5000, 12)));
  constexpr int kRequests = 500;
  constexpr std::byte kSentinel{0x77};
  std::mt19937_64 rng(42);
  struct Expect {
    uint64_t offset;
    size_t length;
    size_t bytes;
  };
  std::vector<Expect> expect;
  std::vector<std::vector<std::byte>> bufs;
  std::vector<ReadRequest> requests;
  for (int i = 0; i < kRequests; ++i) {
    const uint64_t offset = rng() % (size + 1000);
    const size_t length = i % 50 == 0 ? 0 : rng() % 20000;
    const size_t bytes = offset >= size ? 0 : std::min<uint64_t>(length, size - offset);
    expect.push_back({offset, length, bytes});
    bufs.emplace_back(length + 1, kSentinel);
    // Tags unrelated to positions, to check they are carried, not inferred.
    requests.push_back(
        {K("many"), offset, std::span(bufs.back()).first(length), uint64_t(i) * 7919 + 13});
  }
  ReadQueueOptions o;
  o.depth = 8;
  auto q = store_->NewReadQueue(o);
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  // Half at once, then the rest while completions are being reaped.
  ASSERT_OK((*q)->Submit(std::span(requests).first(kRequests / 2)));
  EXPECT_EQ((*q)->Outstanding(), size_t{kRequests / 2});
  std::vector<ReadCompletion> out;
  auto r = (*q)->Wait(3, Far(), &out);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GE(*r, 3u);
  EXPECT_EQ(out.size(), *r);
  ASSERT_OK((*q)->Submit(std::span(requests).subspan(kRequests / 2)));
  EXPECT_EQ((*q)->Outstanding(), kRequests - out.size());
  while ((*q)->Outstanding() > 0) {
    const size_t before = out.size();
    auto w = (*q)->Wait(std::min<size_t>(10, (*q)->Outstanding()), Far(), &out);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(out.size() - before, *w);
  }
  ASSERT_EQ(out.size(), size_t{kRequests});
  std::set<uint64_t> seen;
  for (const ReadCompletion& c : out) {
    ASSERT_EQ((c.tag - 13) % 7919, 0u);
    const size_t i = (c.tag - 13) / 7919;
    ASSERT_LT(i, size_t{kRequests});
    EXPECT_TRUE(seen.insert(c.tag).second) << "tag " << c.tag << " completed twice";
    ASSERT_TRUE(c.status.ok()) << c.status.ToString();
    ASSERT_EQ(c.bytes, expect[i].bytes) << "request " << i;
    EXPECT_TRUE(std::equal(bufs[i].begin(), bufs[i].begin() + c.bytes,
                           data.begin() + std::min<uint64_t>(expect[i].offset, size)))
        << "request " << i;
    EXPECT_TRUE(std::all_of(bufs[i].begin() + c.bytes, bufs[i].end(),
                            [&](std::byte b) { return b == kSentinel; }))
        << "request " << i << " wrote beyond the bytes it reported";
  }
}

// A deadline in the past still reaps what is ready; it returns TimedOut
// exactly when fewer than asked were there, and loses nothing either way.
TEST_P(StoreConformance, WaitWithPastDeadline) {
  ASSERT_OK(store_->Put(K("p"), RandomBytes(300000, 5)));
  auto q = store_->NewReadQueue({});
  ASSERT_TRUE(q.ok());
  std::vector<ReadCompletion> out;
  // Nothing outstanding: nothing to wait for, so not a timeout.
  auto none = (*q)->Wait(5, Clock::now() - 1s, &out);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(*none, 0u);

  constexpr int kN = 50;
  std::vector<std::vector<std::byte>> bufs(kN, std::vector<std::byte>(4096));
  std::vector<ReadRequest> requests;
  for (int i = 0; i < kN; ++i)
    requests.push_back({K("p"), uint64_t(i) * 4096, bufs[i], uint64_t(i)});
  ASSERT_OK((*q)->Submit(requests));
  const auto give_up = Clock::now() + 30s;
  int timeouts = 0;
  while ((*q)->Outstanding() > 0 && Clock::now() < give_up) {
    const size_t want = (*q)->Outstanding();
    const size_t before = out.size();
    auto r = (*q)->Wait(want, Clock::now() - 1s, &out);
    const size_t got = out.size() - before;
    EXPECT_EQ((*q)->Outstanding(), want - got);
    if (r.ok()) {
      EXPECT_EQ(*r, got);
      EXPECT_GE(got, want);
    } else {
      ++timeouts;
      EXPECT_EQ(r.status().code(), Code::kTimedOut) << r.status().ToString();
      EXPECT_TRUE(r.status().retryable());
      EXPECT_LT(got, want);
    }
    if (GetParam() == Backend::kMemory && GetParam().wrapper != Wrapper::kNodeCache) {
      // (The node cache's queue serves reads on its own threads.)
      EXPECT_TRUE(r.ok()) << "memory reads complete in Submit";
    }
  }
  EXPECT_EQ(out.size(), size_t{kN}) << "a past deadline must still make progress";
  for (const ReadCompletion& c : out) {
    EXPECT_TRUE(c.status.ok());
    EXPECT_EQ(c.bytes, 4096u);
  }
  RecordProperty("timeouts", timeouts);
}

TEST_P(StoreConformance, WaitForMoreThanOutstandingReturns) {
  ASSERT_OK(store_->Put(K("m"), Text("0123456789")));
  auto q = store_->NewReadQueue({});
  ASSERT_TRUE(q.ok());
  std::vector<std::byte> a(4), b(4), c(4);
  const std::vector<ReadRequest> requests = {
      {K("m"), 0, a, 1}, {K("m"), 4, b, 2}, {K("m"), 8, c, 3}};
  ASSERT_OK((*q)->Submit(requests));
  const auto start = Clock::now();
  std::vector<ReadCompletion> out;
  auto r = (*q)->Wait(1000, Clock::now() + 20s, &out);
  EXPECT_LT(Clock::now() - start, 10s) << "Wait did not cap min_completions at Outstanding()";
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 3u);
  EXPECT_EQ((*q)->Outstanding(), 0u);
  std::sort(out.begin(), out.end(), [](auto& x, auto& y) { return x.tag < y.tag; });
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].bytes, 2u);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(c.data()), 2), "89");
  // And with nothing outstanding, immediately.
  auto again = (*q)->Wait(1000, Clock::now() + 20s, &out);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0u);
  EXPECT_LT(Clock::now() - start, 10s);
}

// Destroying a queue with reads in flight waits for (or cancels) them: once
// the destructor returns, nothing writes into the caller's buffers.
TEST_P(StoreConformance, QueueDestroyedWithReadsInFlight) {
  const size_t size = 4 << 20;
  ASSERT_OK(store_->Put(K("big"), RandomBytes(size, 9)));
  for (int round = 0; round < 5; ++round) {
    std::vector<std::vector<std::byte>> bufs(64, std::vector<std::byte>(256 << 10));
    {
      ReadQueueOptions o;
      o.depth = 16;
      auto q = store_->NewReadQueue(o);
      ASSERT_TRUE(q.ok());
      std::vector<ReadRequest> requests;
      for (size_t i = 0; i < bufs.size(); ++i) {
        requests.push_back({K("big"), (i * (256 << 10)) % size, bufs[i], i});
      }
      ASSERT_OK((*q)->Submit(requests));
      if (round % 2 == 1) {
        std::vector<ReadCompletion> out;
        (*q)->Wait(2, Far(), &out).ok();
      }
    }  // destroyed with most reads outstanding
    for (auto& b : bufs) std::fill(b.begin(), b.end(), std::byte{0x42});
    std::this_thread::sleep_for(20ms);
    for (auto& b : bufs) {
      ASSERT_TRUE(std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0x42}; }))
          << "a read wrote into a buffer after its queue was destroyed";
    }
  }
}

TEST_P(StoreConformance, ConcurrentPutsAndReads) {
  constexpr int kThreads = 4;
  constexpr int kIterations = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto q = store_->NewReadQueue({});
      ASSERT_TRUE(q.ok());
      for (int i = 0; i < kIterations; ++i) {
        const std::string key = K("t" + std::to_string(t) + "/o" + std::to_string(i));
        const auto data = RandomBytes((t * 7919 + i * 104729) % 70000, t * 1000 + i);
        EXPECT_OK(store_->Put(key, data));
        // Everyone also rewrites one shared object: whole-object contents are
        // the writer's id repeated, its size a function of the id.
        EXPECT_OK(store_->Put(K("shared"), std::vector<std::byte>(1000 + t * 100, std::byte(t))));

        std::vector<std::byte> buf(data.size());
        ReadRequest r{key, 0, buf, uint64_t(i)};
        EXPECT_OK((*q)->Submit({&r, 1}));
        std::vector<ReadCompletion> out;
        EXPECT_TRUE((*q)->Wait(1, Far(), &out).ok());
        EXPECT_EQ(out.size(), 1u);
        if (out.size() == 1) {
          EXPECT_TRUE(out[0].status.ok()) << out[0].status.ToString();
          EXPECT_EQ(out[0].tag, uint64_t(i));
          EXPECT_EQ(out[0].bytes, data.size());
        }
        EXPECT_TRUE(buf == data) << key;

        auto shared = store_->ReadAll(K("shared"));
        if (shared.ok()) {
          ASSERT_FALSE(shared->empty());
          const int writer = int(shared->front());
          EXPECT_EQ(shared->size(), size_t(1000 + writer * 100));
          EXPECT_TRUE(std::all_of(shared->begin(), shared->end(),
                                  [&](std::byte b) { return b == std::byte(writer); }));
        } else {
          EXPECT_TRUE(shared.status().retryable()) << shared.status().ToString();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  auto listed = store_->List(K("t"));
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), size_t{kThreads * kIterations});
}

TEST_P(StoreConformance, ObjectReaderScattersConsecutiveBytesAndStopsAtTheEnd) {
  const auto data = RandomBytes(100000, 91);
  ASSERT_OK(store_->Put(K("r/obj"), data));
  auto reader = store_->OpenReader(K("r/obj"));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto read = [&](uint64_t offset, std::vector<size_t> sizes, size_t want) {
    std::vector<std::vector<std::byte>> bufs;
    std::vector<std::span<std::byte>> pieces;
    for (size_t n : sizes) bufs.emplace_back(n, std::byte{0xEE});
    for (auto& b : bufs) pieces.emplace_back(b);
    auto n = (*reader)->ReadV(offset, pieces);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    ASSERT_EQ(*n, want) << "at " << offset;
    size_t at = 0;
    for (const auto& b : bufs) {
      for (size_t i = 0; i < b.size(); ++i, ++at) {
        const std::byte expect = at < want ? data[offset + at] : std::byte{0xEE};
        ASSERT_EQ(b[i], expect) << "byte " << at << " from " << offset;
      }
    }
  };
  read(1000, {0, 10, 4096, 70000}, 74106);
  read(0, {100000}, 100000);
  read(99990, {5, 20}, 10);  // short at the end; the rest untouched
  read(100000, {8}, 0);
  read(200000, {8}, 0);
  // From many threads at once, one reader.
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < 20; ++k) read(uint64_t(t) * 20000 + k * 7, {3000, 5}, 3005);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(store_->OpenReader(K("r/missing")).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->OpenReader(K("r/../obj")).status().code(), Code::kInvalidArgument);
}

// Where the store says its objects can be mapped (files, memory), a reader
// maps the whole object, once, and keeps showing the bytes it mapped after
// a Put replaces the object; elsewhere Map is Unsupported.
TEST_P(StoreConformance, ReaderMapsTheObjectWhereTheStoreCan) {
  const auto data = RandomBytes(100000, 92);
  ASSERT_OK(store_->Put(K("m/obj"), data));
  auto reader = store_->OpenReader(K("m/obj"));
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  auto m = (*reader)->Map();
  if (!store_->capabilities().mapped_reads) {
    EXPECT_EQ(m.status().code(), Code::kUnsupported) << m.status().ToString();
    return;
  }
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->size(), data.size());
  EXPECT_TRUE(std::equal(m->begin(), m->end(), data.begin()));
  auto again = (*reader)->Map();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), m->data()) << "mapped once";
  ASSERT_OK(store_->Put(K("m/obj"), RandomBytes(10, 3)));
  EXPECT_TRUE(std::equal(m->begin(), m->end(), data.begin())) << "replaced, not rewritten";
  ASSERT_OK(store_->Put(K("m/empty"), {}));
  auto empty = store_->OpenReader(K("m/empty"));
  ASSERT_TRUE(empty.ok());
  auto em = (*empty)->Map();
  ASSERT_TRUE(em.ok()) << em.status().ToString();
  EXPECT_TRUE(em->empty());
}

INSTANTIATE_TEST_SUITE_P(AllBackends, StoreConformance,
                         ::testing::ValuesIn([] {
                           std::vector<BackendParam> all;
                           for (Wrapper w : {Wrapper::kNone, Wrapper::kRetrying,
                                             Wrapper::kNodeCache, Wrapper::kMetering}) {
                             for (Backend b : {Backend::kMemory, Backend::kPosixIoUring,
                                               Backend::kPosixThreads, Backend::kEnvUri}) {
                               all.push_back({b, w});
                             }
                           }
                           return all;
                         }()),
                         BackendName);

// ---------------------------------------------------------------------------
// What only the POSIX store promises, for each engine.

class PosixStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    root_ = tmp_.path() / "data" / "root";
    auto s = Open(root_);
    if (!s.ok() && s.status().code() == Code::kUnsupported) {
      GTEST_SKIP() << "io_uring is not available on this machine: " << s.status().ToString();
    }
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = *s;
  }

  Result<std::shared_ptr<Store>> Open(const fs::path& root) {
    StoreOptions o;
    o.posix_engine = GetParam();
    return NewPosixStore(root.string(), o);
  }

  // Every name under the root, relative, folders with a trailing '/'.
  std::set<std::string> Tree() const {
    std::set<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(root_)) {
      out.insert(fs::relative(e.path(), root_).string() + (e.is_directory() ? "/" : ""));
    }
    return out;
  }

  TempDir tmp_;
  fs::path root_;
  std::shared_ptr<Store> store_;
};

TEST_P(PosixStoreTest, LocalReadsOnDiskAndMemoryFileSystemsOnly) {
  // The test's own folder is on a local disk (or tmpfs) on every machine
  // this suite runs on; /dev/shm is tmpfs; /proc is neither.
  EXPECT_TRUE(store_->local_reads()) << root_;
  if (fs::is_directory("/dev/shm")) {
    auto shm = NewPosixStore("/dev/shm");
    ASSERT_TRUE(shm.ok());
    EXPECT_TRUE((*shm)->local_reads());
  }
  auto proc = NewPosixStore("/proc/self");
  ASSERT_TRUE(proc.ok());
  EXPECT_FALSE((*proc)->local_reads());
  EXPECT_TRUE(NewMemoryStore()->local_reads());
  EXPECT_TRUE(StoreWrapper(store_).local_reads()) << "a wrapper keeps its store's reads";
}

TEST_P(PosixStoreTest, ObjectReaderKeepsReadingTheFileItOpened) {
  ASSERT_OK(store_->Put("a", RandomBytes(5000, 1)));
  auto reader = store_->OpenReader("a");
  ASSERT_TRUE(reader.ok());
  const auto old = RandomBytes(5000, 1);
  ASSERT_OK(store_->Put("a", RandomBytes(10, 2)));  // replaced by rename
  std::vector<std::byte> got(5000);
  std::span<std::byte> piece(got);
  auto n = (*reader)->ReadV(0, {&piece, 1});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 5000u);
  EXPECT_EQ(got, old);
  EXPECT_EQ(store_->OpenReader("folder-not-object").status().code(), Code::kNotFound);
  ASSERT_OK(store_->Put("dir/x", RandomBytes(1, 3)));
  auto dir = store_->OpenReader("dir");
  EXPECT_EQ(dir.status().code(), Code::kNotFound) << dir.status().ToString();
  EXPECT_NE(dir.status().message().find("is a folder"), std::string::npos);
}

TEST_P(PosixStoreTest, RootIsCreatedByTheFirstPut) {
  EXPECT_FALSE(fs::exists(root_));
  auto listed = store_->List("");
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(store_->Stat("x").status().code(), Code::kNotFound);
  ASSERT_OK(store_->Put("x/y/z", Text("deep")));
  EXPECT_EQ(testing::ReadFile(root_ / "x" / "y" / "z"), Text("deep"));
}

TEST_P(PosixStoreTest, PutLeavesNoTemporaryFile) {
  ASSERT_OK(store_->Put("a/b", RandomBytes(100000, 1)));
  ASSERT_OK(store_->Put("a/b", RandomBytes(10, 2)));
  ASSERT_OK(store_->Put("c", Text("c")));
  EXPECT_EQ(Tree(), (std::set<std::string>{"a/", "a/b", "c"}));
}

TEST_P(PosixStoreTest, LeftoverTemporaryFilesAreInvisible) {
  ASSERT_OK(store_->Put("ds/shard-1", Text("one")));
  // What a writer killed between write and rename leaves behind.
  testing::WriteFile(root_ / "ds" / ".shard-2.tmp.12345.0", Text("half"));
  testing::WriteFile(root_ / ".top.tmp.1.1", Text("half"));
  auto listed = store_->List("");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].key, "ds/shard-1");
  EXPECT_EQ(store_->List("ds/.")->size(), 0u);
  EXPECT_EQ(store_->Stat("ds/.shard-2.tmp.12345.0").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(store_->Stat("ds/shard-2").status().code(), Code::kNotFound);
}

TEST_P(PosixStoreTest, FailedPutRemovesItsTemporaryFileAndKeepsTheOldObject) {
  ASSERT_OK(store_->Put("obj", Text("old")));
  // In a child: RLIMIT_FSIZE makes write(2) fail (EFBIG) part way through.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{64 << 10, 64 << 10};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    const Status st = store_->Put("obj", RandomBytes(1 << 20, 3));
    ::_exit(st.ok() ? 1 : st.code() == Code::kIoError ? 0 : 2);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFEXITED(wstatus));
  EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "1: Put succeeded past RLIMIT_FSIZE; 2: wrong code";
  EXPECT_EQ(Tree(), (std::set<std::string>{"obj"}));
  EXPECT_EQ(*store_->ReadAll("obj"), Text("old"));
}

// ENOSPC, on a 64 KiB tmpfs mounted in a private mount namespace of a child
// process (root, or an unprivileged user namespace).
TEST_P(PosixStoreTest, FullFilesystemIsNoSpace) {
  const fs::path small = tmp_.path() / "small";
  fs::create_directories(small);
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipefd[0]);
    auto report = [&](const std::string& msg) {
      (void)!::write(pipefd[1], msg.data(), msg.size());
      ::_exit(0);
    };
    const uid_t uid = ::geteuid();
    const gid_t gid = ::getegid();
    if (::unshare(CLONE_NEWNS) != 0) {
      if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
        report(std::string("SKIP cannot make a mount namespace: ") + std::strerror(errno));
      }
      std::ofstream("/proc/self/setgroups") << "deny";
      std::ofstream("/proc/self/uid_map") << "0 " << uid << " 1";
      std::ofstream("/proc/self/gid_map") << "0 " << gid << " 1";
    }
    ::mount("none", "/", "none", MS_REC | MS_PRIVATE, nullptr);
    if (::mount("tmpfs", small.c_str(), "tmpfs", 0, "size=64k") != 0) {
      report(std::string("SKIP cannot mount a tmpfs: ") + std::strerror(errno));
    }
    auto s = Open(small / "root");
    if (!s.ok()) report("FAIL open: " + s.status().ToString());
    const Status st = (*s)->Put("dir/too-big", RandomBytes(1 << 20, 4));
    if (st.code() != Code::kNoSpace) report("FAIL expected NoSpace, got " + st.ToString());
    if (st.message().find("too-big") == std::string::npos) report("FAIL message: " + st.message());
    for (const auto& e : fs::recursive_directory_iterator(small / "root")) {
      if (e.is_regular_file()) report("FAIL left behind " + e.path().string());
    }
    const Status small_put = (*s)->Put("dir/fits", Text("ok"));
    if (!small_put.ok()) report("FAIL small Put after ENOSPC: " + small_put.ToString());
    // The same with direct writes (tmpfs may refuse O_DIRECT: then the
    // buffered fallback meets the full disk).
    StoreOptions direct;
    direct.posix_engine = GetParam();
    direct.direct_writes = true;
    auto d = NewPosixStore((small / "root").string(), direct);
    if (!d.ok()) report("FAIL open direct: " + d.status().ToString());
    const Status dst = (*d)->Put("dir/too-big-direct", RandomBytes(2 << 20, 5));
    if (dst.code() != Code::kNoSpace)
      report("FAIL direct: expected NoSpace, got " + dst.ToString());
    if (dst.message().find("too-big-direct") == std::string::npos) {
      report("FAIL direct message: " + dst.message());
    }
    for (const auto& e : fs::recursive_directory_iterator(small / "root")) {
      if (e.is_regular_file() && e.path().filename() != "fits") {
        report("FAIL direct left behind " + e.path().string());
      }
    }
    report("OK " + st.ToString());
  }
  ::close(pipefd[1]);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof(buf))) > 0) msg.append(buf, size_t(n));
  ::close(pipefd[0]);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  if (msg.starts_with("SKIP")) GTEST_SKIP() << msg.substr(5);
  EXPECT_TRUE(msg.starts_with("OK")) << msg;
}

TEST_P(PosixStoreTest, ErrorsNameThePathAndTheCall) {
  std::vector<std::byte> buf(4);
  const std::string path = (root_ / "missing").string();
  auto r = store_->Read("missing", 0, buf);
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(r.status().message().find("open " + path), std::string::npos) << r.status().ToString();
  auto done = RunReads(*store_, {{"missing", 0, buf, 1}});
  ASSERT_EQ(done.size(), 1u);
  EXPECT_NE(done[0].status.message().find("open " + path), std::string::npos)
      << done[0].status.ToString();
  EXPECT_NE(store_->Stat("missing").status().message().find("stat " + path), std::string::npos);
  EXPECT_NE(store_->Remove("missing").message().find("unlink " + path), std::string::npos);
}

TEST_P(PosixStoreTest, ObjectInTheWayOfAFolder) {
  ASSERT_OK(store_->Put("a", Text("file")));
  const Status st = store_->Put("a/b", Text("x"));
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
  EXPECT_EQ(*store_->ReadAll("a"), Text("file"));
  EXPECT_EQ(store_->Stat("a/b").status().code(), Code::kNotFound);
}

TEST_P(PosixStoreTest, DirectIoReadsAlignedRanges) {
  const size_t size = 3 * kDirectIoAlignment + 100;
  const auto data = RandomBytes(size, 21);
  ASSERT_OK(store_->Put("d", data));
  AlignedBuffer buf(4 * kDirectIoAlignment);
  std::fill(buf.data, buf.data + buf.size, std::byte{0x11});
  ReadQueueOptions o;
  o.direct_io = true;
  const size_t A = kDirectIoAlignment;
  auto q = store_->NewReadQueue(o);
  ASSERT_TRUE(q.ok());
  struct Case {
    uint64_t offset;
    size_t length;
    size_t expect;
  };
  const std::vector<Case> cases = {
      {0, 2 * A, 2 * A},          // aligned, inside
      {A, 3 * A, 2 * A + 100},    // runs past the unaligned end: short
      {2 * A, A + 100, A + 100},  // unaligned length ending exactly at the end
      {0, 50, 50},                // unaligned length, no aligned part
      {3 * A, 4 * A, 100},        // only the tail exists
      {4 * A, A, 0},              // past the end
      {A, A + 7, A + 7},          // unaligned length inside the object
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    std::fill(buf.data, buf.data + buf.size + A, std::byte{0x11});
    ReadRequest r{"d", cases[i].offset, buf.span(0, cases[i].length), i};
    ASSERT_OK((*q)->Submit({&r, 1}));
    std::vector<ReadCompletion> out;
    ASSERT_TRUE((*q)->Wait(1, Far(), &out).ok());
    ASSERT_EQ(out.size(), 1u);
    if (out[0].status.code() == Code::kUnsupported) {
      GTEST_SKIP() << "this filesystem rejects O_DIRECT: " << out[0].status.ToString();
    }
    ASSERT_TRUE(out[0].status.ok()) << out[0].status.ToString();
    EXPECT_EQ(out[0].bytes, cases[i].expect);
    EXPECT_TRUE(std::equal(buf.data, buf.data + out[0].bytes,
                           data.begin() + std::min<uint64_t>(cases[i].offset, size)));
    EXPECT_TRUE(std::all_of(buf.data + cases[i].length, buf.data + buf.size + A, [](std::byte b) {
      return b == std::byte{0x11};
    })) << "wrote past dst";
  }
}

// RemoveFolder takes the folder itself: the hidden temporary files a killed
// Put leaves (which List never shows) and the emptied sub-folders go too.
TEST_P(PosixStoreTest, RemoveFolderTakesTemporaryFilesAndSubFolders) {
  ASSERT_OK(store_->Put("ck/rank-0/000.chunk", RandomBytes(1000, 1)));
  ASSERT_OK(store_->Put("ck/rank-1/000.chunk", RandomBytes(1000, 2)));
  ASSERT_OK(store_->Put("keep", RandomBytes(10, 3)));
  // What a Put killed between its write and its rename leaves.
  testing::WriteFile(root_ / "ck/rank-0/.001.chunk.tmp.4242.7", RandomBytes(5000, 4));
  fs::create_directories(root_ / "ck/rank-2");
  testing::WriteFile(root_ / "ck/rank-2/.000.chunk.tmp.4242.8", RandomBytes(5000, 5));
  auto listed = store_->List("ck/");
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->size(), 2u);  // the temporary files are not objects
  ASSERT_OK(store_->RemoveFolder("ck/"));
  EXPECT_FALSE(fs::exists(root_ / "ck"));
  EXPECT_EQ(Tree(), std::set<std::string>{"keep"});
  // A symbolic link in the folder is removed, not followed.
  const fs::path outside = tmp_.path() / "outside";
  testing::WriteFile(outside / "precious", RandomBytes(10, 6));
  fs::create_directories(root_ / "ln");
  fs::create_symlink(outside, root_ / "ln" / "link");
  ASSERT_OK(store_->RemoveFolder("ln/"));
  EXPECT_TRUE(fs::exists(outside / "precious"));
  EXPECT_FALSE(fs::exists(root_ / "ln"));
}

// RemoveEmptyFolder takes a folder only when it holds nothing but folders
// and temporary files unchanged for the idle time (what a writer killed
// after its mkdir, or before its rename, leaves), and a writer's Put into a
// folder removed under it still lands.
TEST_P(PosixStoreTest, RemoveEmptyFolderTakesOnlyIdleEmptyFolders) {
  const auto hour_ago = fs::file_time_type::clock::now() - std::chrono::hours(1);
  auto age = [&](const fs::path& p) {
    for (const auto& e : fs::recursive_directory_iterator(p)) fs::last_write_time(e, hour_ago);
    fs::last_write_time(p, hour_ago);
  };
  const std::chrono::seconds minute(60);
  auto removed = [](const Result<bool>& r) { return r.ok() && *r; };
  fs::create_directories(root_ / "dead/rank-00000");
  fs::create_directories(root_ / "fresh/rank-00000");
  fs::create_directories(root_ / "tmp/rank-00000");
  testing::WriteFile(root_ / "tmp/rank-00000/.000.chunk.tmp.4242.9", RandomBytes(10, 1));
  fs::create_directories(root_ / "freshtmp/rank-00000");
  testing::WriteFile(root_ / "freshtmp/rank-00000/.000.chunk.tmp.4242.8", RandomBytes(10, 1));
  fs::create_directories(root_ / "other/rank-00000");
  testing::WriteFile(root_ / "other/rank-00000/.hidden", RandomBytes(10, 1));
  ASSERT_OK(store_->Put("obj/rank-00000/000.chunk", RandomBytes(10, 2)));
  for (const char* d : {"dead", "tmp", "obj", "other"}) age(root_ / d);
  age(root_ / "freshtmp");
  fs::last_write_time(root_ / "freshtmp/rank-00000/.000.chunk.tmp.4242.8",
                      fs::file_time_type::clock::now());  // a writer at it
  EXPECT_TRUE(removed(store_->RemoveEmptyFolder("dead/", minute)));
  EXPECT_FALSE(fs::exists(root_ / "dead"));
  // A killed writer's temporary file, idle: taken with its folders.
  EXPECT_TRUE(removed(store_->RemoveEmptyFolder("tmp/", minute)));
  EXPECT_FALSE(fs::exists(root_ / "tmp"));
  for (const char* d : {"fresh/", "freshtmp/", "other/", "obj/"}) {
    auto r = store_->RemoveEmptyFolder(d, minute);
    ASSERT_TRUE(r.ok()) << d << r.status().ToString();
    EXPECT_FALSE(*r) << d;
  }
  EXPECT_TRUE(fs::exists(root_ / "fresh/rank-00000"));
  EXPECT_TRUE(fs::exists(root_ / "freshtmp/rank-00000/.000.chunk.tmp.4242.8"));
  EXPECT_TRUE(fs::exists(root_ / "other/rank-00000/.hidden"));
  EXPECT_TRUE(store_->Stat("obj/rank-00000/000.chunk").ok());
  EXPECT_EQ(store_->RemoveEmptyFolder("dead/", minute).status().code(), Code::kNotFound);
  EXPECT_EQ(store_->RemoveEmptyFolder("obj/rank-00000/000.chunk/", minute).status().code(),
            Code::kNotFound);
  EXPECT_EQ(store_->RemoveEmptyFolder("../", minute).status().code(), Code::kInvalidArgument);
  // Idle 0: the fresh one is old enough; then a Put recreates its folder.
  EXPECT_TRUE(removed(store_->RemoveEmptyFolder("fresh/", std::chrono::seconds(0))));
  ASSERT_OK(store_->Put("fresh/rank-00000/000.chunk", RandomBytes(10, 3)));
}

// Durability through a power cut (testing::PowerCutDisk): a Put is durable
// when it returns; a deferred Put once Sync() has returned OK,
// so that an object Put after the sync (a checkpoint's part record) never
// survives a crash without the deferred objects before it (its chunks). The
// control: a file written without any sync is lost, so the cut does drop
// what was not made durable and the test can fail.
TEST_P(PosixStoreTest, PutsAndSyncedDeferredPutsSurviveAPowerCut) {
  if (std::string why = testing::PowerCutDisk::Unavailable(); !why.empty()) {
    GTEST_SKIP() << "no power-cut disk: " << why;
  }
  testing::PowerCutDisk disk;
  struct Case {
    std::string key;
    std::vector<std::byte> data;
  };
  // Sizes below and above the direct-write threshold (1 MiB), with and
  // without an unaligned tail; nested keys as a checkpoint's chunks are.
  std::vector<Case> synced;
  size_t n = 0;
  for (size_t size : {size_t{0}, size_t{100}, size_t{300} << 10, size_t{1} << 20,
                      (size_t{2} << 20) + 5, (size_t{9} << 20) + 4096}) {
    for (int i = 0; i < 2; ++i, ++n) {
      synced.push_back({"ck/rank-0000" + std::to_string(i) + "/" + std::to_string(n) + ".chunk",
                        RandomBytes(size, 300 + n)});
    }
  }
  const std::vector<std::byte> record = RandomBytes(5000, 1);
  for (bool direct : {false, true}) {
    const fs::path root = disk.path() / (direct ? "direct" : "buffered");
    {
      StoreOptions o;
      o.posix_engine = GetParam();
      o.direct_writes = direct;
      auto s = NewPosixStore(root.string(), o);
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      ASSERT_OK((*s)->Put("before", record));
      // As a checkpoint's chunks are written: deferred, checksummed.
      const PutObserver see = [](std::span<const std::byte>) {};
      for (const Case& c : synced) {
        ASSERT_OK(
            (*s)->Put(c.key, c.data, {.durability = Durability::kDeferred, .observer = &see}));
      }
      ASSERT_OK((*s)->Sync());
      ASSERT_OK((*s)->Put("ck/record", record));
      // Deferred and never synced: may be lost, whole or in part.
      for (int i = 0; i < 4; ++i) {
        ASSERT_OK((*s)->Put("ck/after-" + std::to_string(i), RandomBytes(3 << 20, i),
                            {.durability = Durability::kDeferred, .observer = &see}));
      }
    }  // the store closes its descriptor on the root before the unmount
    testing::WriteFile(root / "control", RandomBytes(64 << 10, 2));
    ASSERT_EQ(disk.Cut(), "");
    disk.Remount();
    EXPECT_TRUE(!fs::exists(root / "control") || fs::file_size(root / "control") == 0)
        << "a file never synced survived the cut: the test cannot tell durable from not";
    auto s = NewPosixStore(root.string());
    ASSERT_TRUE(s.ok());
    for (const std::string key : {"before", "ck/record"}) {
      auto got = (*s)->ReadAll(key);
      ASSERT_TRUE(got.ok()) << (direct ? "direct: " : "buffered: ") << got.status().ToString();
      EXPECT_TRUE(*got == record) << key;
    }
    for (const Case& c : synced) {
      auto got = (*s)->ReadAll(c.key);
      ASSERT_TRUE(got.ok()) << (direct ? "direct: " : "buffered: ") << got.status().ToString();
      EXPECT_TRUE(*got == c.data) << c.key << ": " << got->size() << " bytes of " << c.data.size();
    }
  }
}

// StoreOptions::direct_writes: every size (below the 1 MiB threshold, at
// it, around the 8 MiB write block, with and without an unaligned tail),
// from aligned and unaligned memory, reads back exactly and atomically
// replaces; the body of a large object is not left in the page cache.
TEST_P(PosixStoreTest, DirectWritesRoundTripEverySizeAndBypassThePageCache) {
  StoreOptions o;
  o.posix_engine = GetParam();
  o.direct_writes = true;
  auto opened = NewPosixStore(root_.string(), o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store& store = **opened;
  const std::string bypass = PageCacheBypassUnavailable(tmp_.path());
  const size_t M = 1 << 20, A = kDirectIoAlignment;
  AlignedBuffer buf(20 * M + 2 * A);
  uint64_t seed = 100;
  for (size_t size :
       {size_t{0}, size_t{1}, A - 1, M - 1, M, M + 1, 8 * M, 8 * M + A + 3, 16 * M + 777}) {
    for (size_t misalign : {size_t{0}, size_t{1}, size_t{64}}) {
      const std::string key = "direct/" + std::to_string(size) + "-" + std::to_string(misalign);
      const std::vector<std::byte> want = RandomBytes(size, ++seed);
      std::span<std::byte> src = buf.span(misalign, size);
      std::copy(want.begin(), want.end(), src.begin());
      // Half the writes show their bytes as they go (the checkpointer's
      // hash): through the bounce buffer, straight, and the buffered tail.
      if (seed % 2 == 0) {
        ASSERT_OK(store.Put(key, src));
      } else {
        std::vector<std::byte> seen;
        const PutObserver see = [&](std::span<const std::byte> p) {
          seen.insert(seen.end(), p.begin(), p.end());
        };
        ASSERT_OK(store.Put(key, src, {.observer = &see}));
        EXPECT_TRUE(seen == want) << key << ": shown " << seen.size() << " bytes of " << size;
      }
      auto got = store.ReadAll(key);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(*got == want) << key;
      // Replaced by a shorter object: nothing of the longer one remains.
      if (size >= M) {
        ASSERT_OK(store.Put(key, std::span<const std::byte>(want).first(size - A - 1)));
        auto shorter = store.ReadAll(key);
        ASSERT_TRUE(shorter.ok());
        EXPECT_TRUE(std::equal(shorter->begin(), shorter->end(), want.begin()) &&
                    shorter->size() == size - A - 1)
            << key;
        ASSERT_OK(store.Put(key, src));
      }
      if (size >= M && bypass.empty()) {
        // The object now at `key` is a new file written past the page
        // cache: at most the page of its buffered tail is cached.
        const long resident = ResidentPages(root_ / key);
        EXPECT_GE(resident, 0);
        EXPECT_LE(resident, 1) << key << ": " << resident << " of " << (size + A - 1) / A
                               << " pages cached after a direct write";
      }
    }
  }
  // The same objects written without direct_writes are cached: the check
  // above can tell the two apart.
  if (bypass.empty()) {
    const std::vector<std::byte> data = RandomBytes(4 * M, 7);
    ASSERT_OK(store_->Put("buffered", data));
    EXPECT_GT(ResidentPages(root_ / "buffered"), long(2 * M / A));
  } else {
    std::cout << "[  NOTE    ] page-cache checks not run: " << bypass << "\n";
  }
  for (const std::string& name : Tree()) EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
}

TEST_P(PosixStoreTest, DirectIoRejectsUnalignedOffsetOrBuffer) {
  ASSERT_OK(store_->Put("d", RandomBytes(3 * kDirectIoAlignment, 22)));
  AlignedBuffer buf(2 * kDirectIoAlignment);
  ReadQueueOptions o;
  o.direct_io = true;
  auto done = RunReads(*store_,
                       {{"d", 100, buf.span(0, kDirectIoAlignment), 1},
                        {"d", 0, buf.span(1, kDirectIoAlignment), 2},
                        {"d", 0, buf.span(0, kDirectIoAlignment), 3}},
                       o);
  ASSERT_EQ(done.size(), 3u);
  EXPECT_EQ(done[0].status.code(), Code::kInvalidArgument) << done[0].status.ToString();
  EXPECT_EQ(done[1].status.code(), Code::kInvalidArgument) << done[1].status.ToString();
  if (done[2].status.code() != Code::kUnsupported) {
    EXPECT_TRUE(done[2].status.ok()) << done[2].status.ToString();
  }
}

// As root the check runs in a child that has dropped to nobody, whom the
// file's mode 000 stops (root's CAP_DAC_OVERRIDE would read it).
TEST_P(PosixStoreTest, PermissionDenied) {
  ASSERT_OK(store_->Put("locked", Text("secret")));
  fs::permissions(root_ / "locked", fs::perms::none);
  OpenPathForOthers(root_);
  const std::string engine = GetParam();
  const fs::path root = root_;
  const std::string failure = RunUnprivileged([&]() -> std::string {
    StoreOptions o;
    o.posix_engine = engine;
    auto store = NewPosixStore(root.string(), o);
    if (!store.ok()) return "open: " + store.status().ToString();
    std::vector<std::byte> buf(8);
    auto r = (*store)->Read("locked", 0, buf);
    if (r.status().code() != Code::kPermissionDenied) return "Read: " + r.status().ToString();
    if (r.status().message().find((root / "locked").string()) == std::string::npos) {
      return "Read's error does not name the file: " + r.status().ToString();
    }
    auto done = RunReads(**store, {{"locked", 0, buf, 1}});
    if (done.size() != 1) return "queue read: " + std::to_string(done.size()) + " completions";
    if (done[0].status.code() != Code::kPermissionDenied) {
      return "queue read: " + done[0].status.ToString();
    }
    return "";
  });
  EXPECT_EQ(failure, "");
}

// A read that cannot finish (a FIFO nobody writes) makes Wait time out with
// nothing appended; the request completes once a writer shows up (with the
// data, or an error: a FIFO is not an object, and pread(2) refuses it).
TEST_P(PosixStoreTest, WaitTimesOutWhileAReadIsBlocked) {
  fs::create_directories(root_);
  ASSERT_EQ(::mkfifo((root_ / "fifo").c_str(), 0644), 0);
  auto q = store_->NewReadQueue({});
  ASSERT_TRUE(q.ok());
  std::vector<std::byte> buf(16);
  ReadRequest r{"fifo", 0, buf, 77};
  ASSERT_OK((*q)->Submit({&r, 1}));
  std::vector<ReadCompletion> out;
  const auto start = Clock::now();
  auto w = (*q)->Wait(1, Clock::now() + 100ms, &out);
  EXPECT_GE(Clock::now() - start, 90ms);
  EXPECT_EQ(w.status().code(), Code::kTimedOut) << w.status().ToString();
  EXPECT_TRUE(w.status().retryable());
  EXPECT_TRUE(out.empty());
  EXPECT_EQ((*q)->Outstanding(), 1u);

  // The read's open(2) returns once this writer opens; the engine may then
  // fail the read (pread on a FIFO is ESPIPE) and close its end before the
  // write below, which then gets EPIPE: SIGPIPE must not kill the test.
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGPIPE, &ignore, &previous), 0);
  const int fd = ::open((root_ / "fifo").c_str(), O_WRONLY);  // meets the read's open
  ASSERT_GE(fd, 0);
  const ssize_t wrote = ::write(fd, "hello", 5);
  const int write_errno = errno;
  ::close(fd);
  ::sigaction(SIGPIPE, &previous, nullptr);
  EXPECT_TRUE(wrote == 5 || (wrote < 0 && write_errno == EPIPE)) << std::strerror(write_errno);
  w = (*q)->Wait(1, Far(), &out);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tag, 77u);
  EXPECT_EQ((*q)->Outstanding(), 0u);
  if (out[0].status.ok()) {
    EXPECT_EQ(out[0].bytes, 5u);
    EXPECT_EQ(std::string(reinterpret_cast<char*>(buf.data()), 5), "hello");
  }
}

// io_uring opens in the ring, so a queue whose open blocks forever (a FIFO
// with no writer; a hung network filesystem) can still be destroyed.
TEST_P(PosixStoreTest, DestroyingAQueueCancelsABlockedOpen) {
  if (GetParam() == "threads") {
    GTEST_SKIP() << "the thread engine cannot interrupt a blocked open(2): its queue's "
                    "destructor waits for the worker";
  }
  fs::create_directories(root_);
  ASSERT_EQ(::mkfifo((root_ / "fifo").c_str(), 0644), 0);
  ASSERT_OK(store_->Put("obj", RandomBytes(1 << 20, 1)));
  std::vector<std::byte> a(16), b(1 << 20);
  const auto start = Clock::now();
  {
    auto q = store_->NewReadQueue({});
    ASSERT_TRUE(q.ok());
    const std::vector<ReadRequest> requests = {{"fifo", 0, a, 1}, {"obj", 0, b, 2}};
    ASSERT_OK((*q)->Submit(requests));
    std::vector<ReadCompletion> out;
    EXPECT_EQ((*q)->Wait(2, Clock::now() + 20ms, &out).status().code(), Code::kTimedOut);
  }
  EXPECT_LT(Clock::now() - start, 5s);
}

// As QueueDestroyedWithReadsInFlight, with the page cache dropped first so
// that the reads really are in flight (from the device) when the queue dies.
TEST_P(PosixStoreTest, QueueDestroyedWithUncachedReadsInFlight) {
  const size_t size = 8 << 20;
  ASSERT_OK(store_->Put("big", RandomBytes(size, 9)));
  for (bool direct : {false, true}) {
    SCOPED_TRACE(direct ? "direct_io" : "buffered");
    for (int round = 0; round < 3; ++round) {
      const int fd = ::open((root_ / "big").c_str(), O_RDONLY);
      ASSERT_GE(fd, 0);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // the data is fsync'ed, so clean
      ::close(fd);
      constexpr size_t kChunk = 256 << 10;
      AlignedBuffer buf(size);
      std::fill(buf.data, buf.data + size, std::byte{0});
      {
        ReadQueueOptions o;
        o.depth = 32;
        o.direct_io = direct;
        auto q = store_->NewReadQueue(o);
        ASSERT_TRUE(q.ok());
        std::vector<ReadRequest> requests;
        for (size_t off = 0; off < size; off += kChunk) {
          requests.push_back({"big", off, buf.span(off, kChunk), off});
        }
        ASSERT_OK((*q)->Submit(requests));
      }
      std::fill(buf.data, buf.data + size, std::byte{0x42});
      std::this_thread::sleep_for(50ms);
      ASSERT_TRUE(std::all_of(buf.data, buf.data + size, [](std::byte x) {
        return x == std::byte{0x42};
      })) << "a read wrote into a buffer after its queue was destroyed";
    }
  }
}

TEST_P(PosixStoreTest, QueueOutlivesItsStore) {
  ASSERT_OK(store_->Put("x", Text("still here")));
  auto q = store_->NewReadQueue({});
  ASSERT_TRUE(q.ok());
  store_.reset();
  std::vector<std::byte> buf(32);
  ReadRequest r{"x", 0, buf, 1};
  ASSERT_OK((*q)->Submit({&r, 1}));
  std::vector<ReadCompletion> out;
  ASSERT_TRUE((*q)->Wait(1, Far(), &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].bytes, 10u);
}

// A request submitted after a Put returned sees the new object, even while
// reads of the old one are still in flight in the same queue.
TEST_P(PosixStoreTest, ReadAfterPutSeesTheNewObject) {
  const std::vector<std::byte> v1(1 << 20, std::byte{1});
  const std::vector<std::byte> v2(1 << 20, std::byte{2});
  ASSERT_OK(store_->Put("v", v1));
  auto q = store_->NewReadQueue({});
  ASSERT_TRUE(q.ok());
  std::vector<std::vector<std::byte>> old_bufs(8, std::vector<std::byte>(1 << 20));
  std::vector<ReadRequest> old_reads;
  for (size_t i = 0; i < old_bufs.size(); ++i) old_reads.push_back({"v", 0, old_bufs[i], i});
  ASSERT_OK((*q)->Submit(old_reads));
  ASSERT_OK(store_->Put("v", v2));
  std::vector<std::byte> buf(1 << 20);
  ReadRequest r{"v", 0, buf, 100};
  ASSERT_OK((*q)->Submit({&r, 1}));
  auto done = Drain(**q);
  ASSERT_EQ(done.size(), 9u);
  EXPECT_TRUE(buf == v2) << "read after Put returned the replaced object";
}

TEST_P(PosixStoreTest, RelativeRootIsResolvedWhenOpened) {
  const fs::path cwd = fs::current_path();
  fs::current_path(tmp_.path());
  StoreOptions o;
  o.posix_engine = GetParam();
  auto s = OpenStore("rel/root", o);
  fs::current_path(cwd);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->uri(), "rel/root");
  ASSERT_OK((*s)->Put("k", Text("v")));
  EXPECT_TRUE(fs::exists(tmp_.path() / "rel" / "root" / "k"));
}

INSTANTIATE_TEST_SUITE_P(Engines, PosixStoreTest, ::testing::Values("io_uring", "threads"),
                         [](const auto& info) { return info.param; });

// Both engines give the same completions for the same requests.
TEST(PosixEngines, AgreeOnEveryOutcome) {
  std::string why;
  if (!IoUringUsable(&why)) GTEST_SKIP() << "io_uring is not available: " << why;
  TempDir tmp;
  StoreOptions ou, ot;
  ou.posix_engine = "io_uring";
  ot.posix_engine = "threads";
  auto uring = NewPosixStore(tmp.str(), ou);
  auto threads = NewPosixStore(tmp.str(), ot);
  ASSERT_TRUE(uring.ok() && threads.ok());
  const auto data = RandomBytes(50000, 31);
  ASSERT_OK((*uring)->Put("obj", data));
  ASSERT_OK((*uring)->Put("dir/inner", data));
  struct Case {
    std::string key;
    uint64_t offset;
    size_t length;
  };
  const std::vector<Case> cases = {{"obj", 0, 50000},    {"obj", 100, 999},   {"obj", 49990, 64},
                                   {"obj", 50000, 10},   {"obj", 1 << 30, 1}, {"obj", 7, 0},
                                   {"missing", 0, 10},   {"dir", 0, 10},      {"../x", 0, 1},
                                   {"dir/inner", 1, 10}, {"", 0, 1}};
  auto run = [&](Store& store) {
    std::vector<std::vector<std::byte>> bufs;
    std::vector<ReadRequest> requests;
    for (size_t i = 0; i < cases.size(); ++i) {
      bufs.emplace_back(cases[i].length);
      requests.push_back({cases[i].key, cases[i].offset, bufs.back(), i});
    }
    ReadQueueOptions o;
    o.depth = 3;
    return std::make_pair(RunReads(store, requests, o), bufs);
  };
  auto [cu, bu] = run(**uring);
  auto [ct, bt] = run(**threads);
  ASSERT_EQ(cu.size(), cases.size());
  ASSERT_EQ(ct.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i) + " key " + cases[i].key);
    EXPECT_EQ(cu[i].status.code(), ct[i].status.code());
    EXPECT_EQ(cu[i].status.message(), ct[i].status.message());
    EXPECT_EQ(cu[i].bytes, ct[i].bytes);
    EXPECT_TRUE(bu[i] == bt[i]);
  }
}

// The forwarding bases of a decorator's readers and queues pass every call
// on: one that overrides nothing keeps mapped reads, readahead hints and the
// counting of mapped loads.
TEST(StoreWrappers, ReaderAndQueueWrappersForwardEveryCall) {
  struct Recorder final : ObjectReader {
    explicit Recorder(std::vector<std::string>* c) : calls(c) {}
    Result<size_t> ReadV(uint64_t offset, std::span<const std::span<std::byte>> dsts) override {
      calls->push_back("ReadV " + std::to_string(offset) + " " + std::to_string(dsts.size()));
      return size_t{3};
    }
    void WillNeed(uint64_t offset, uint64_t length) override {
      calls->push_back("WillNeed " + std::to_string(offset) + " " + std::to_string(length));
    }
    Result<std::span<const std::byte>> Map() override {
      calls->push_back("Map");
      return std::span<const std::byte>(bytes);
    }
    void CountMapped(uint64_t n) override { calls->push_back("CountMapped " + std::to_string(n)); }
    std::vector<std::string>* calls;
    std::vector<std::byte> bytes = std::vector<std::byte>(10, std::byte{7});
  };
  std::vector<std::string> calls;
  auto recorder = std::make_unique<Recorder>(&calls);
  const std::byte* mapped = recorder->bytes.data();
  ObjectReaderWrapper reader(std::move(recorder));
  std::vector<std::byte> buf(4);
  const std::span<std::byte> one[] = {buf};
  EXPECT_EQ(*reader.ReadV(5, one), 3u);
  reader.WillNeed(1, 2);
  auto m = reader.Map();
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->data(), mapped);
  reader.CountMapped(9);
  EXPECT_EQ(calls, (std::vector<std::string>{"ReadV 5 1", "WillNeed 1 2", "Map", "CountMapped 9"}));

  auto store = NewMemoryStore("queue-wrapper");
  ASSERT_OK(store->Put("k", Text("hello")));
  auto q = store->NewReadQueue({});
  ASSERT_TRUE(q.ok());
  ReadQueueWrapper queue(std::move(*q));
  std::vector<std::byte> dst(8);
  const ReadRequest r{"k", 1, dst, 42};
  ASSERT_OK(queue.Submit({&r, 1}));
  EXPECT_EQ(queue.Outstanding(), 1u);
  std::vector<ReadCompletion> out;
  auto n = queue.Wait(1, Far(), &out);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tag, 42u);
  EXPECT_EQ(out[0].bytes, 4u);
  EXPECT_EQ(queue.Outstanding(), 0u);
}

TEST(PosixEngines, Selection) {
  TempDir tmp;
  ::unsetenv("STOKER_POSIX_ENGINE");
  StoreOptions o;
  o.posix_engine = "threads";
  auto t = NewPosixStore(tmp.str(), o);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->Describe().engine, "threads");
  EXPECT_EQ((*t)->Describe().kind, "posix");
  EXPECT_EQ((*t)->Describe().location, tmp.str());
  // Decorators do not hide the backend, and say they are there.
  const StoreDescription wrapped =
      metrics::MeteringStore(std::make_shared<RetryingStore>(*t, RetryOptions{}))->Describe();
  EXPECT_EQ(wrapped.engine, "threads");
  EXPECT_EQ(wrapped.layers, (std::vector<std::string>{"metering", "retry"}));
  EXPECT_EQ(wrapped.ToString(), "posix " + tmp.str() + " (threads) through metering, retry");

  o.posix_engine = "auto";
  auto a = NewPosixStore(tmp.str(), o);
  ASSERT_TRUE(a.ok());
  std::string why;
  EXPECT_EQ((*a)->Describe().engine, IoUringUsable(&why) ? "io_uring" : "threads");

  // The environment overrides "auto" only.
  ::setenv("STOKER_POSIX_ENGINE", "threads", 1);
  auto e = NewPosixStore(tmp.str(), o);
  ::setenv("STOKER_POSIX_ENGINE", "bogus", 1);
  auto bogus_env = NewPosixStore(tmp.str(), o);
  o.posix_engine = "threads";
  auto forced = NewPosixStore(tmp.str(), o);
  ::unsetenv("STOKER_POSIX_ENGINE");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->Describe().engine, "threads");
  EXPECT_EQ(bogus_env.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bogus_env.status().message().find("STOKER_POSIX_ENGINE"), std::string::npos);
  ASSERT_TRUE(forced.ok()) << forced.status().ToString();

  o.posix_engine = "fast";
  EXPECT_EQ(NewPosixStore(tmp.str(), o).status().code(), Code::kInvalidArgument);
  const StoreDescription memory = NewMemoryStore("described")->Describe();
  EXPECT_EQ(memory.kind, "memory");
  EXPECT_EQ(memory.location, "described");
  EXPECT_EQ(memory.engine, "");
}

// Runs in a fresh process (a death test re-executes the binary, so the cached
// io_uring probe starts empty), under a seccomp filter that refuses
// io_uring_setup with EPERM, as Docker's default profile does. Exits 0 when
// "auto" falls back to threads and a forced io_uring is Unsupported.
void CheckEnginesWithIoUringBlocked() {
  auto fail = [](const std::string& why) {
    std::fprintf(stderr, "%s\n", why.c_str());
    std::_Exit(1);
  };
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
    fail(std::string("cannot install a seccomp filter: ") + std::strerror(errno));
  }
  ::unsetenv("STOKER_POSIX_ENGINE");
  TempDir tmp;
  auto store = NewPosixStore(tmp.str());
  if (!store.ok()) fail("auto: " + store.status().ToString());
  const std::string engine = (*store)->Describe().engine;
  if (engine != "threads") fail("auto chose " + engine);
  if (!(*store)->Put("k", Text("works")).ok()) fail("Put failed");
  std::vector<std::byte> buf(8);
  auto done = RunReads(**store, {{"k", 0, buf, 1}});
  if (done.size() != 1 || !done[0].status.ok() || done[0].bytes != 5) fail("read failed");
  StoreOptions o;
  o.posix_engine = "io_uring";
  const Status forced = NewPosixStore(tmp.str(), o).status();
  if (forced.code() != Code::kUnsupported) fail("forced io_uring: " + forced.ToString());
  if (forced.message().find("io_uring_queue_init") == std::string::npos) {
    fail("forced io_uring does not say why: " + forced.ToString());
  }
  std::_Exit(0);
}

TEST(PosixEngines, AutoFallsBackWhenIoUringIsBlocked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(CheckEnginesWithIoUringBlocked(), ::testing::ExitedWithCode(0), "");
}

// ---------------------------------------------------------------------------
// Keys, URIs, and the default synchronous reads.

TEST(ValidateKey, AcceptsAndRejects) {
  for (std::string_view good : {"a", "a/b", "ds/shard-000001.stk", "a\\b", "a.b/c..d", "x/y.",
                                "with space/ok", "ünïcode/ok"}) {
    EXPECT_TRUE(ValidateKey(good).ok()) << good << ": " << ValidateKey(good).ToString();
  }
  for (std::string_view bad :
       {"", "/a", "a/", "a//b", ".", "..", "../a", "a/..", "a/./b", ".hidden", "a/.tmp.1.2"}) {
    const Status st = ValidateKey(bad);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
  }
  const Status nul = ValidateKey(std::string_view("a\0b", 3));
  EXPECT_EQ(nul.code(), Code::kInvalidArgument);
  EXPECT_NE(nul.message().find("a\\x00b"), std::string::npos)
      << "NUL shown escaped: " << nul.message();
  EXPECT_NE(ValidateKey("a//b").message().find("\"a//b\""), std::string::npos);
}

TEST(OpenStore, PicksTheBackendFromTheUri) {
  TempDir tmp;
  auto one = OpenStore("mem://shared-name");
  auto two = OpenStore("mem://shared-name");
  auto other = OpenStore("mem://other-name");
  ASSERT_TRUE(one.ok() && two.ok() && other.ok());
  EXPECT_EQ(one->get(), two->get()) << "same name, same store";
  EXPECT_NE(one->get(), other->get());
  ASSERT_OK((*one)->Put("k", Text("v")));
  EXPECT_TRUE((*two)->Stat("k").ok());
  EXPECT_EQ((*other)->Stat("k").status().code(), Code::kNotFound);
  EXPECT_EQ((*one)->uri(), "mem://shared-name");
  EXPECT_EQ(OpenStore("mem://").status().code(), Code::kInvalidArgument);

  const std::string uri = "file://" + tmp.str() + "/with%20space";
  auto f = OpenStore(uri);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->uri(), uri);
  EXPECT_FALSE((*f)->Describe().engine.empty());
  EXPECT_EQ((*f)->Describe().location, tmp.str() + "/with space");
  ASSERT_OK((*f)->Put("k", Text("v")));
  EXPECT_TRUE(fs::exists(tmp.path() / "with space" / "k"));

  auto plain = OpenStore(tmp.str() + "/with space");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE((*plain)->Stat("k").ok());

  for (const std::string bad : {"file://host/x", "file://", "file:///x?y=1", "file:///x%zz", ""}) {
    EXPECT_EQ(OpenStore(bad).status().code(), Code::kInvalidArgument) << bad;
  }
  const Status unknown = OpenStore("s3://bucket/x").status();
  EXPECT_EQ(unknown.code(), Code::kInvalidArgument);
  EXPECT_NE(unknown.message().find("s3://bucket/x"), std::string::npos) << unknown.message();
#ifndef STOKER_HAVE_RADOS
  const Status rados = OpenStore("rados://pool/prefix").status();
  EXPECT_EQ(rados.code(), Code::kUnsupported);
  EXPECT_NE(rados.message().find("STOKER_WITH_RADOS"), std::string::npos) << rados.message();
#endif
}

// A store that keeps the default Read and ReadAll, with a Stat that can lie,
// to show that ReadAll notices an object changing size between its Stat and
// its read.
class LyingStore final : public Store {
 public:
  explicit LyingStore(std::shared_ptr<Store> real) : real_(std::move(real)) {}
  const std::string& uri() const override { return real_->uri(); }
  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& o) override {
    return real_->NewReadQueue(o);
  }
  using Store::Put;
  Status Put(std::string_view k, std::span<const std::byte> d, const WriteOptions& o) override {
    return real_->Put(k, d, o);
  }
  Result<ObjectInfo> Stat(std::string_view k) override {
    auto info = real_->Stat(k);
    if (info.ok()) info->size = static_cast<uint64_t>(int64_t(info->size) + lie);
    return info;
  }
  Result<std::vector<ObjectInfo>> List(std::string_view p) override { return real_->List(p); }
  Status Remove(std::string_view k) override { return real_->Remove(k); }
  int lie = 0;

 private:
  std::shared_ptr<Store> real_;
};

TEST(DefaultReads, ReadAllNoticesASizeChange) {
  LyingStore store(NewMemoryStore());
  const auto data = RandomBytes(1000, 1);
  ASSERT_OK(store.Put("k", data));
  auto all = store.ReadAll("k");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_TRUE(*all == data);
  std::vector<std::byte> buf(10);
  auto n = store.Read("k", 995, buf);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 5u);
  EXPECT_EQ(store.Read("nope", 0, buf).status().code(), Code::kNotFound);
  for (int lie : {-1, +1, -1000}) {
    store.lie = lie;
    auto changed = store.ReadAll("k");
    EXPECT_EQ(changed.status().code(), Code::kIoError) << lie;
    EXPECT_TRUE(changed.status().retryable());
    EXPECT_NE(changed.status().message().find("changed size"), std::string::npos);
  }
}

}  // namespace
}  // namespace stoker
