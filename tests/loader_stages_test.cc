// The loader's stages: all workers on one batch, memory that does not grow
// from epoch to epoch, automatic memory sizing, retries as a store wrapper,
// and skipping corrupt images.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "loader/memory_plan.h"
#include "stoker/loader.h"
#include "stoker/pack.h"
#include "stoker/retrying_store.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

// Random files of `min`..`max` bytes packed into shards of `shard_bytes`;
// `contents` by sample id.
struct Packed {
  testing::TempDir dir;
  std::string uri;
  std::vector<std::vector<std::byte>> contents;

  Packed(uint32_t files, size_t min, size_t max, uint64_t shard_bytes) {
    const fs::path root = dir.path() / "src";
    std::vector<std::vector<std::byte>> by_file;
    for (uint32_t i = 0; i < files; ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "c%u/f%05u.bin", i % 3, i);
      by_file.push_back(testing::RandomBytes(min + (i * 7919) % (max - min + 1), i + 7));
      testing::WriteFile(root / name, by_file.back());
    }
    auto sources = ScanImageFolder(root.string());
    EXPECT_TRUE(sources.ok()) << sources.status().ToString();
    std::map<std::string, size_t> index;  // ScanImageFolder's order -> our files
    for (uint32_t i = 0; i < files; ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "c%u/f%05u.bin", i % 3, i);
      index[(root / name).string()] = i;
    }
    PackOptions po;
    po.shard_bytes = shard_bytes;
    uri = (dir.path() / "ds").string();
    auto m = Pack(root.string(), uri, po);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    for (uint64_t i : PackedOrder(sources->files.size(), po)) {
      contents.push_back(by_file.at(index.at(sources->files[i].path)));
    }
  }
};

// Reads the rest of the epoch, checking every sample's bytes; returns the ids.
std::vector<uint64_t> ReadChecked(Loader& l, const Packed& p) {
  std::vector<uint64_t> ids;
  while (true) {
    auto b = l.Next();
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
      return ids;
    }
    const auto* image = b->bytes("image");
    if (image == nullptr) return ids;
    for (size_t i = 0; i < b->size(); ++i) {
      const uint64_t id = b->sample_ids()[i];
      const auto& want = p.contents.at(id);
      auto got = image->data.subspan(image->offsets[i], image->offsets[i + 1] - image->offsets[i]);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end())) << "sample " << id;
      ids.push_back(id);
    }
  }
}

LoaderOptions Small(uint32_t batch) {
  LoaderOptions o;
  o.batch_size = batch;
  o.threads = 2;
  o.seed = 5;
  o.shuffle_window_shards = 3;
  return o;
}

// Record reads that take a millisecond each (a slow disk): a batch takes long
// enough that every worker, however busy the machine, gets to join it.
class SlowRecords final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view key) override {
    STOKER_ASSIGN_OR_RETURN(auto inner, target()->OpenReader(key));
    return std::unique_ptr<ObjectReader>(std::make_unique<Reader>(std::move(inner)));
  }

 private:
  struct Reader final : ObjectReader {
    explicit Reader(std::unique_ptr<ObjectReader> r) : inner(std::move(r)) {}
    Result<size_t> ReadV(uint64_t o, std::span<const std::span<std::byte>> d) override {
      if (o > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return inner->ReadV(o, d);
    }
    std::unique_ptr<ObjectReader> inner;
  };
};

TEST(LoaderStagesTest, AllWorkersBuildEachBatch) {
  Packed p(320, 2000, 6000, 64 << 10);
  LoaderOptions o = Small(32);
  o.threads = 8;
  o.prefetch_batches = 1;  // one batch at a time: only its chunks can spread the work
  o.read_unit = "sample";
  auto l = Loader::Open(std::make_shared<SlowRecords>(*OpenStore(p.uri)), o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const auto start = Clock::now();
  auto ids = ReadChecked(**l, p);
  const auto took = Clock::now() - start;
  EXPECT_EQ(std::set<uint64_t>(ids.begin(), ids.end()).size(), 320u);
  // 10 batches of 32 one-millisecond reads: 320 ms on one worker.
  EXPECT_GE((*l)->stats().shared_batches, 8u);
  std::printf("10 batches of 32 1-ms reads with 8 workers: %.0f ms (one worker: >= 320)\n",
              std::chrono::duration<double, std::milli>(took).count());
}

TEST(LoaderStagesTest, PoolMemoryDoesNotGrowFromEpochToEpoch) {
  Packed p(600, 100, 12000, 128 << 10);
  LoaderOptions o = Small(32);
  o.read_unit = "shard";
  o.shuffle = false;  // every epoch the same plan: any growth is the pool's
  auto l = Loader::Open(p.uri, o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  uint64_t after_second = 0;
  for (uint64_t epoch = 0; epoch < 8; ++epoch) {
    if (epoch > 0) {
      ASSERT_TRUE((*l)->StartEpoch(epoch).ok());
    }
    EXPECT_EQ(ReadChecked(**l, p).size(), 600u);
    if (epoch == 1) after_second = (*l)->stats().peak_buffer_bytes;
  }
  // Batch sizes vary with their samples; the pool reuses its blocks. Which
  // batches are in flight at once depends on timing, so the peak may still
  // take one more block: never one per epoch.
  const uint64_t one_batch = 32 * (12000 + 8) + 4096;
  EXPECT_LE((*l)->stats().peak_buffer_bytes, after_second + one_batch + one_batch / 4);
}

TEST(LoaderStagesTest, DefaultBudgetFitsBigSamplesAndWideWindows) {
  // Samples of 150-300 KB in 1 MiB shards, a window of 8 shards: the plan
  // keeps many shards alive at once.
  Packed p(80, 150000, 300000, 1 << 20);
  LoaderOptions o = Small(32);
  o.read_unit = "shard";
  o.shuffle_window_shards = 8;
  o.memory_budget = 4 << 20;
  auto refused = Loader::Open(p.uri, o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("memory_budget 4 MiB is too small"), std::string::npos)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("needs at least"), std::string::npos);
  o.memory_budget = 0;  // the default
  auto l = Loader::Open(p.uri, o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(ReadChecked(**l, p).size(), 80u);
  EXPECT_EQ(LoaderOptions().memory_budget, 0u);
}

TEST(MemoryPlanTest, ExplicitBudgetIsObeyedOrRefused) {
  MemoryNeeds n{.budget = 64 << 20,
                .slot_bytes = 4 << 20,
                .live_shards = 10,
                .reads_ahead = 8,
                .batch_bytes = 4 << 20,
                .prefetch = 4,
                .max_sample_bytes = 16 << 10,
                .batch_size = 256};
  auto p = PlanMemory(n, 64ull << 30);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->slots, 11u);  // (64 - 4 x 5) / 4, within live + ahead
  EXPECT_EQ(p->prefetch, 4u);
  n.budget = 32 << 20;
  auto refused = PlanMemory(n, 64ull << 30);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("memory_budget 32 MiB is too small"), std::string::npos)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("needs at least 60 MiB"), std::string::npos)
      << refused.status().ToString();
}

TEST(MemoryPlanTest, AutomaticShrinksTheOverlapBeforeRefusing) {
  MemoryNeeds n{.budget = 0,
                .slot_bytes = 4 << 20,
                .live_shards = 100,
                .reads_ahead = 8,
                .batch_bytes = 100 << 20,
                .prefetch = 4,
                .max_sample_bytes = 400 << 10,
                .batch_size = 256};
  // Plenty: the whole overlap.
  auto big = PlanMemory(n, 64ull << 30);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->slots, 108u);
  EXPECT_EQ(big->prefetch, 4u);
  // 2 GiB available: a quarter (512 MiB) cannot hold 400 MiB of shards and 5
  // batches; reads and batches ahead shrink, the shards the plan needs stay.
  auto tight = PlanMemory(n, 2ull << 30);
  ASSERT_TRUE(tight.ok()) << tight.status().ToString();
  EXPECT_EQ(tight->slots, 100u);
  EXPECT_EQ(tight->prefetch, 1u);
  EXPECT_GE(tight->budget, 600u << 20);  // beyond the quarter: what one batch needs
  // 500 MiB available: one batch ahead needs 600 MiB: refused, naming sizes.
  auto refused = PlanMemory(n, 500ull << 20);
  ASSERT_FALSE(refused.ok());
  const std::string m = refused.status().message();
  EXPECT_NE(m.find("samples of up to 1 MiB"), std::string::npos) << m;
  EXPECT_NE(m.find("600 MiB"), std::string::npos) << m;
  EXPECT_NE(m.find("500 MiB available"), std::string::npos) << m;
}

// Fails the first `fail` reads of every object (queue, Read and ReadV alike)
// with a retryable error, then reads normally: an OSD that restarts.
class FlakyReads final : public StoreWrapper {
 public:
  FlakyReads(std::shared_ptr<Store> target, int fail, Status error = Unavailable("OSD restarting"))
      : StoreWrapper(std::move(target)), fail_(fail), error_(std::move(error)) {}

  bool Fails(std::string_view key) {
    std::lock_guard lock(mu_);
    return attempts_[std::string(key)]++ < fail_;
  }
  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& o) override {
    STOKER_ASSIGN_OR_RETURN(auto inner, target()->NewReadQueue(o));
    return std::unique_ptr<ReadQueue>(std::make_unique<Queue>(std::move(inner), this));
  }
  Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view key) override {
    STOKER_ASSIGN_OR_RETURN(auto inner, target()->OpenReader(key));
    return std::unique_ptr<ObjectReader>(std::make_unique<Reader>(std::move(inner), this, key));
  }
  Result<size_t> Read(std::string_view key, uint64_t offset, std::span<std::byte> dst) override {
    if (Fails(key)) return error_;
    return StoreWrapper::Read(key, offset, dst);
  }
  Result<std::vector<std::byte>> ReadAll(std::string_view key) override {
    if (Fails(key)) return error_;
    return StoreWrapper::ReadAll(key);
  }

 private:
  struct Queue final : ReadQueue {
    Queue(std::unique_ptr<ReadQueue> q, FlakyReads* s) : inner(std::move(q)), store(s) {}
    Status Submit(std::span<const ReadRequest> requests) override {
      std::vector<ReadRequest> pass;
      for (const auto& r : requests) {
        if (store->Fails(r.key)) {
          failed.push_back({r.tag, store->error_, 0});
        } else {
          pass.push_back(r);
        }
      }
      return pass.empty() ? Status::Ok() : inner->Submit(pass);
    }
    Result<size_t> Wait(size_t min, Deadline d, std::vector<ReadCompletion>* out) override {
      const size_t own = failed.size();
      for (auto& c : failed) out->push_back(std::move(c));
      failed.clear();
      auto n = inner->Wait(min > own ? min - own : 0, d, out);
      if (!n.ok()) return n;
      return *n + own;
    }
    size_t Outstanding() const override { return inner->Outstanding() + failed.size(); }
    std::unique_ptr<ReadQueue> inner;
    FlakyReads* store;
    std::vector<ReadCompletion> failed;
  };
  struct Reader final : ObjectReader {
    Reader(std::unique_ptr<ObjectReader> r, FlakyReads* s, std::string_view k)
        : inner(std::move(r)), store(s), key(k) {}
    Result<size_t> ReadV(uint64_t o, std::span<const std::span<std::byte>> d) override {
      if (store->Fails(key + "#record")) return store->error_;
      return inner->ReadV(o, d);
    }
    std::unique_ptr<ObjectReader> inner;
    FlakyReads* store;
    std::string key;
  };

  std::mutex mu_;
  std::map<std::string, int> attempts_;
  const int fail_;
  const Status error_;
};

RetryOptions FastRetries(std::atomic<uint64_t>* counter) {
  RetryOptions o;
  o.first_backoff = std::chrono::milliseconds(2);
  o.retries = counter;
  return o;
}

TEST(RetryingStoreTest, QueueReadsAndRecordReadsAreRetried) {
  Packed p(30, 1000, 2000, 16 << 10);
  std::atomic<uint64_t> retries{0};
  auto flaky = std::make_shared<FlakyReads>(*OpenStore(p.uri), 2);
  RetryingStore store(flaky, FastRetries(&retries));
  auto objects = store.List("shards/");
  ASSERT_TRUE(objects.ok() && objects->size() >= 2);
  auto q = store.NewReadQueue({});
  ASSERT_TRUE(q.ok());
  std::vector<std::vector<std::byte>> bufs(objects->size());
  std::vector<ReadRequest> reqs;
  for (size_t i = 0; i < objects->size(); ++i) {
    bufs[i].resize((*objects)[i].size);
    reqs.push_back({(*objects)[i].key, 0, bufs[i], 100 + i});
  }
  ASSERT_TRUE((*q)->Submit(reqs).ok());
  std::vector<ReadCompletion> done;
  while (done.size() < reqs.size()) {
    ASSERT_TRUE((*q)->Wait(1, Clock::now() + std::chrono::seconds(10), &done).ok());
  }
  EXPECT_EQ((*q)->Outstanding(), 0u);
  std::set<uint64_t> tags;
  for (const auto& c : done) {
    EXPECT_TRUE(c.status.ok()) << c.status.ToString();
    EXPECT_EQ(c.bytes, (*objects)[c.tag - 100].size);
    tags.insert(c.tag);
  }
  EXPECT_EQ(tags.size(), reqs.size());  // one completion per request, the caller's tags
  EXPECT_EQ(retries.load(), 2 * reqs.size());
  auto reader = store.OpenReader((*objects)[0].key);
  ASSERT_TRUE(reader.ok());
  std::vector<std::byte> head(64);
  std::span<std::byte> dst(head);
  auto n = (*reader)->ReadV(0, {&dst, 1});
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 64u);
  EXPECT_EQ(retries.load(), 2 * reqs.size() + 2);
}

TEST(RetryingStoreTest, GivesUpAfterItsRetriesOrItsDeadlineAndNeverRetriesTheFinal) {
  Packed p(10, 1000, 2000, 16 << 10);
  std::atomic<uint64_t> retries{0};
  auto always = std::make_shared<FlakyReads>(*OpenStore(p.uri), 1000);
  RetryOptions o = FastRetries(&retries);
  o.max_retries = 3;
  RetryingStore store(always, o);
  auto r = store.ReadAll(format::kManifestKey);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_EQ(retries.load(), 3u);
  // Past the deadline no retry starts.
  retries = 0;
  o.first_backoff = std::chrono::milliseconds(40);
  o.max_retries = 100;
  o.deadline = std::chrono::milliseconds(100);
  RetryingStore short_deadline(always, o);
  const auto start = Clock::now();
  EXPECT_FALSE(short_deadline.ReadAll(format::kManifestKey).ok());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  EXPECT_LE(retries.load(), 2u);
  // Not retryable (a missing object): tried once.
  retries = 0;
  RetryingStore healthy(std::make_shared<FlakyReads>(*OpenStore(p.uri), 0), FastRetries(&retries));
  auto q = healthy.NewReadQueue({});
  std::vector<std::byte> buf(16);
  ASSERT_TRUE((*q)->Submit(std::vector<ReadRequest>{{"no/such/object", 0, buf, 7}}).ok());
  std::vector<ReadCompletion> done;
  ASSERT_TRUE((*q)->Wait(1, Clock::now() + std::chrono::seconds(5), &done).ok());
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].tag, 7u);
  EXPECT_EQ(done[0].status.code(), Code::kNotFound) << done[0].status.ToString();
  EXPECT_EQ(retries.load(), 0u);
}

TEST(RetryingStoreTest, LoaderOverAFlakyStoreDeliversEverythingAndCountsRetries) {
  Packed p(200, 1000, 3000, 32 << 10);
  // "map": FlakyReads' readers do not pass Map on, so its records are read
  // with preads, as "sample" (the loader's fallback), and retried.
  for (const char* unit : {"shard", "sample", "map"}) {
    auto flaky = std::make_shared<FlakyReads>(*OpenStore(p.uri), 1);
    LoaderOptions o = Small(16);
    o.read_unit = unit;
    auto l = Loader::Open(flaky, o);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ(ReadChecked(**l, p).size(), 200u) << unit;
    EXPECT_GT((*l)->stats().read_retries, 0u) << unit;
  }
  // read_retries 0: no wrapper, the first failure is the epoch's error.
  auto flaky = std::make_shared<FlakyReads>(*OpenStore(p.uri), 1);
  LoaderOptions o = Small(16);
  o.read_unit = "shard";
  o.read_retries = 0;
  auto l = Loader::Open(flaky, o);
  if (l.ok()) {
    auto b = (*l)->Next();
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), Code::kUnavailable) << b.status().ToString();
  } else {
    EXPECT_EQ(l.status().code(), Code::kUnavailable) << l.status().ToString();  // the manifest
  }
}

// Whole-shard reads that never complete: a cluster that stopped answering.
class HungQueue final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions&) override {
    return std::unique_ptr<ReadQueue>(std::make_unique<Queue>());
  }

 private:
  struct Queue final : ReadQueue {
    Status Submit(std::span<const ReadRequest> r) override {
      outstanding += r.size();
      return Status::Ok();
    }
    Result<size_t> Wait(size_t, Deadline d, std::vector<ReadCompletion>*) override {
      std::this_thread::sleep_until(std::min(d, Clock::now() + std::chrono::milliseconds(20)));
      return TimedOut("nothing landed");
    }
    size_t Outstanding() const override { return outstanding; }
    size_t outstanding = 0;
  };
};

TEST(LoaderStagesTest, HungShardReadsAreATimeoutNamingTheShardNotAHang) {
  Packed p(40, 1000, 2000, 16 << 10);
  LoaderOptions o = Small(8);
  o.read_unit = "shard";
  o.threads = 4;
  o.read_timeout = std::chrono::milliseconds(300);
  auto l = Loader::Open(std::make_shared<HungQueue>(*OpenStore(p.uri)), o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const auto start = Clock::now();
  auto b = (*l)->Next();
  const auto waited = Clock::now() - start;
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kTimedOut) << b.status().ToString();
  EXPECT_NE(b.status().message().find(p.uri + "/shards/"), std::string::npos)
      << b.status().ToString();
  EXPECT_NE(b.status().message().find("did not complete within 300 ms"), std::string::npos)
      << b.status().ToString();
  EXPECT_LT(waited, std::chrono::seconds(3));
  // The loader stays failed, and closes cleanly.
  EXPECT_EQ((*l)->Next().status().code(), Code::kTimedOut);
}

#ifdef STOKER_HAVE_TURBOJPEG
TEST(LoaderStagesTest, CorruptImagesAreSkippedAndCountedWhenAsked) {
  Packed p(40, 100, 200, 16 << 10);  // random bytes: no sample is a JPEG
  LoaderOptions o = Small(8);
  o.decode.field = "image";
  o.decode.height = o.decode.width = 16;
  auto strict = Loader::Open(p.uri, o);
  ASSERT_TRUE(strict.ok());
  auto err = (*strict)->Next();
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.status().code(), Code::kCorruption);
  EXPECT_NE(err.status().message().find(p.uri), std::string::npos) << err.status().ToString();
  EXPECT_NE(err.status().message().find("shards/"), std::string::npos) << err.status().ToString();
  EXPECT_NE(err.status().message().find(": sample "), std::string::npos) << err.status().ToString();
  o.decode.skip_corrupt = true;
  auto l = Loader::Open(p.uri, o);
  ASSERT_TRUE(l.ok());
  uint64_t samples = 0, skipped = 0;
  for (auto b = (*l)->Next(); b.ok(); b = (*l)->Next()) {
    const auto* image = b->image("image");
    ASSERT_NE(image, nullptr);
    EXPECT_TRUE(std::all_of(image->data.begin(), image->data.end(),
                            [](std::byte x) { return x == std::byte{0}; }));
    EXPECT_EQ(b->corrupt_skipped(), b->size());
    samples += b->size();
    skipped += b->corrupt_skipped();
  }
  EXPECT_EQ(samples, 40u);
  EXPECT_EQ(skipped, 40u);
  EXPECT_EQ((*l)->stats().decode_skipped, 40u);
  // The next epoch, built ahead but not yet taken, is not counted.
  ASSERT_TRUE((*l)->StartEpoch(1).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ((*l)->stats().decode_skipped, 40u);
  ASSERT_TRUE((*l)->Next().ok());
  EXPECT_EQ((*l)->stats().decode_skipped, 48u);
}
#endif

}  // namespace
}  // namespace stoker
