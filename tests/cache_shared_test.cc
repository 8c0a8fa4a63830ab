// The node cache shared two ways: per-sample reads (the loader's read_unit
// "sample") served in ranges from cache files that the node fetched whole
// once, and two datasets in one cache folder under one limit: read by real
// loaders in two processes at once, and step by step (one dataset's fetches
// keep the other's shards its ranks are about to read).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <iterator>
#include <set>

#include "cache_testutil.h"
#include "stoker/loader.h"

namespace stoker {
namespace {

using namespace cache_testing;

// Reads of ranges through an ObjectReader of the cache, against the
// dataset's file.
std::string ReadRanges(Store& store, const Dataset& d, uint32_t s) {
  const auto& info = d.manifest.shards[s];
  auto r = store.OpenReader(info.key);
  if (!r.ok()) return r.status().ToString();
  std::vector<std::byte> want(info.bytes);
  std::ifstream f(d.uri + "/" + info.key, std::ios::binary);
  f.read(reinterpret_cast<char*>(want.data()), std::streamsize(want.size()));
  for (uint64_t at : {uint64_t{0}, uint64_t{100}, info.bytes / 2, info.bytes - 7}) {
    std::vector<std::byte> a(300), b(50);
    std::span<std::byte> parts[] = {a, b};
    auto n = (*r)->ReadV(at, parts);
    if (!n.ok()) return n.status().ToString();
    const uint64_t expect = std::min<uint64_t>(350, info.bytes - at);
    if (*n != expect) return "short read at " + std::to_string(at);
    for (uint64_t i = 0; i < expect; ++i) {
      const std::byte got = i < 300 ? a[i] : b[i - 300];
      if (got != want[at + i]) return "byte " + std::to_string(at + i) + " differs";
    }
  }
  return "";
}

TEST(NodeCacheShared, ReaderReadsRangesOfTheCacheFile) {
  TempDir t;
  Dataset d(t.path(), 60, 31);
  const std::string dir = (t.path() / "cache").string();
  CacheOptions o;
  o.policy = "lru";  // no prefetch: every fetch is this test's
  auto first = Open(d, dir, o);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(ReadRanges(**first, d, 0), "");
  CacheStats s = (*first)->stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.remote_bytes, d.manifest.shards[0].bytes) << "fetched whole, once";
  EXPECT_EQ(s.cache_bytes, 4u * 350 - (350 - 7)) << "the ranges, from the cache file";
  // Another process's view of the folder: a hit, nothing from the store.
  auto second = Open(d, dir, o);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(ReadRanges(**second, d, 0), "");
  EXPECT_EQ((*second)->stats().hits, 1u);
  EXPECT_EQ((*second)->stats().remote_bytes, 0u);
  // A cache file replaced behind the cache's back (its bytes changed): the
  // reader checks it whole, drops it and fetches the shard again.
  const std::string path = (*first)->dataset_dir() + "/00000000.stks";
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() / 2] ^= 0x5a;
  ASSERT_EQ(unlink(path.c_str()), 0);
  std::ofstream(path, std::ios::binary) << bytes;
  ASSERT_EQ(ReadRanges(**second, d, 0), "");
  EXPECT_EQ((*second)->stats().refetches, 1u);
  EXPECT_EQ((*second)->stats().remote_bytes, d.manifest.shards[0].bytes);
}

// Two ranks of one node with per-sample reads: each sample once per epoch,
// the dataset fetched once in epoch 1 and not at all in epoch 2, and the
// records read in ranges from the cache files (not a whole shard per rank);
// the same with the cache files mapped (read_unit "map"), whose loads count
// as cache bytes too.
class NodeCacheSharedUnits : public ::testing::TestWithParam<std::string> {};

TEST_P(NodeCacheSharedUnits, PerSampleReadsGoThroughTheCache) {
  const std::string unit = GetParam();
  TempDir t;
  Dataset d(t.path(), 400, 32);
  const std::string dir = (t.path() / "cache").string();
  auto results = InChildren(2, [&](int rank) -> std::string {
    LoaderOptions o;
    o.batch_size = 8;
    o.threads = 1;
    o.rank = uint32_t(rank);
    o.world_size = 2;
    o.read_unit = unit;
    o.cache_dir = dir;
    auto l = Loader::Open(d.uri, o);
    if (!l.ok()) return "ERR " + l.status().ToString();
    if ((*l)->read_unit() != unit) return "ERR read unit " + std::string((*l)->read_unit());
    std::string out;
    LoaderStats before;
    for (uint64_t e = 0; e < 2; ++e) {
      if (e > 0) {
        if (Status st = (*l)->StartEpoch(e); !st.ok()) return "ERR " + st.ToString();
      }
      out += DrainEpoch(**l);
      const LoaderStats s = (*l)->stats();
      const std::string k = std::to_string(e) + "=";
      out += "remote" + k + std::to_string(s.remote_bytes - before.remote_bytes) + " cache" + k +
             std::to_string(s.cache_bytes - before.cache_bytes) + " hits" + k +
             std::to_string(s.cache_hits - before.cache_hits) + " ";
      before = s;
    }
    return out;
  });
  std::map<uint64_t, int> seen;
  std::map<std::string, uint64_t> total;
  Tally(results, &seen, &total);
  ASSERT_EQ(seen.size(), d.manifest.sample_count);
  for (const auto& [id, n] : seen) ASSERT_EQ(n, 2) << "sample " << id << " (2 epochs)";
  EXPECT_EQ(total["remote0"], d.bytes) << "each shard fetched once by the node";
  EXPECT_EQ(total["remote1"], 0u);
  EXPECT_GE(total["hits1"], 2 * d.manifest.shards.size() - 2) << "every open a hit in epoch 2";
  // Each rank reads its own records (and each shard's header and index), not
  // whole shards: the two ranks together read about the dataset once.
  EXPECT_GT(total["cache1"], d.bytes / 2);
  EXPECT_LT(total["cache1"], d.bytes * 3 / 2);
}

INSTANTIATE_TEST_SUITE_P(Units, NodeCacheSharedUnits, ::testing::Values("sample", "map"),
                         [](const auto& info) { return info.param; });

// read_unit "auto" through the cache: per-sample reads where the cache can
// hold the whole dataset (each rank reads its own records from the cache
// files), whole shards through a smaller cache; every sample delivered
// either way.
TEST(NodeCacheShared, AutoReadsRecordsWhereTheCacheHoldsTheDataset) {
  TempDir t;
  Dataset d(t.path(), 48, 41, 1 << 20, 96 << 10);  // records of 96 KiB, about 10 a shard
  ASSERT_GE(d.manifest.shards.size(), 4u);
  uint64_t largest = 0;
  for (const auto& s : d.manifest.shards) largest = std::max(largest, s.bytes);
  struct Case {
    uint64_t limit;
    const char* unit;
  };
  for (const Case& c : {Case{0, "sample"}, Case{d.bytes, "sample"},
                        Case{std::max(largest * 2, d.bytes / 2), "shard"}}) {
    SCOPED_TRACE("cache_bytes " + std::to_string(c.limit));
    LoaderOptions o;
    o.batch_size = 8;
    o.threads = 2;
    o.cache_dir = (t.path() / ("cache" + std::to_string(c.limit))).string();
    o.cache_bytes = c.limit;
    auto l = Loader::Open(d.uri, o);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ((*l)->read_unit(), c.unit);
    std::set<uint64_t> ids;
    while (true) {
      auto b = (*l)->Next();
      if (!b.ok()) {
        ASSERT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
        break;
      }
      for (size_t i = 0; i < b->size(); ++i) {
        if (!b->padding()[i]) ids.insert(b->sample_ids()[i]);
      }
    }
    EXPECT_EQ(ids.size(), d.manifest.sample_count);
  }
}

// Two datasets (two jobs) in one folder under one limit, half of what both
// hold, read at once by a loader each in its own process: the folder never
// goes over the limit, both jobs complete every epoch with every sample,
// both hold shards in the cache at once (the space is shared), and the
// cache serves hits (no thrash).
TEST(NodeCacheShared, TwoDatasetsShareOneLimit) {
  TempDir t;
  Dataset a(t.path() / "a", 300, 33), b(t.path() / "b", 300, 34);
  ASSERT_NE(a.manifest.IdHex(), b.manifest.IdHex());
  const std::string dir = (t.path() / "cache").string();
  const uint64_t limit = (a.bytes + b.bytes) / 2;
  const std::string a_dir = dir + "/" + a.manifest.IdHex(), b_dir = dir + "/" + b.manifest.IdHex();
  std::atomic<bool> done{false}, both{false};
  std::atomic<uint64_t> peak{0};
  std::thread watch([&] {
    while (!done) {
      peak = std::max<uint64_t>(peak, LockedFolderBytes(dir));
      if (FolderBytes(a_dir) > 0 && FolderBytes(b_dir) > 0) both = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  const Dataset* sets[] = {&a, &b};
  const char* policies[] = {"planned", "lru"};
  auto results = InChildren(2, [&](int job) -> std::string {
    const Dataset& d = *sets[job];
    LoaderOptions o;
    o.batch_size = 8;
    o.threads = 1;
    o.shuffle_window_shards = 2;
    o.cache_dir = dir;
    o.cache_bytes = limit;
    o.cache_policy = policies[job];
    auto l = Loader::Open(d.uri, o);
    if (!l.ok()) return "ERR " + l.status().ToString();
    std::string out;
    uint64_t before = 0;
    for (uint64_t e = 0; e < 3; ++e) {
      if (e > 0) {
        if (Status st = (*l)->StartEpoch(e); !st.ok()) return "ERR " + st.ToString();
      }
      const std::string drained = DrainEpoch(**l);
      if (drained.starts_with("ERR")) return drained;
      std::istringstream in(drained);
      std::set<std::string> ids{std::istream_iterator<std::string>(in), {}};
      const uint64_t remote = (*l)->stats().remote_bytes;
      out += "samples" + std::to_string(e) + "=" + std::to_string(ids.size()) + " remote" +
             std::to_string(e) + "=" + std::to_string(remote - before) + " ";
      before = remote;
    }
    return out;
  });
  done = true;
  watch.join();
  uint64_t later = 0;  // remote bytes of epochs 2 and 3, both jobs
  for (int job = 0; job < 2; ++job) {
    const std::string& r = results[size_t(job)];
    ASSERT_EQ(r.find("ERR"), std::string::npos) << r;
    auto c = ParseCounts(r);
    for (int e = 0; e < 3; ++e) {
      const std::string k = std::to_string(e);
      EXPECT_EQ(c["samples" + k], sets[job]->manifest.sample_count) << "job " << job << " " << r;
      if (e > 0) later += c["remote" + k];
    }
  }
  EXPECT_LE(peak.load(), limit) << "the folder went over its limit";
  EXPECT_TRUE(both) << "the two datasets never held shards at the same time";
  EXPECT_LT(later, 2 * (a.bytes + b.bytes)) << "no hits at all in epochs 2 and 3";
  EXPECT_LE(LockedFolderBytes(dir), limit);
}

// Two datasets in one folder, step by step: B's fetches do not evict A's
// shards that A's ranks are about to read, and do evict them once A's
// ranks are done with them for the epoch.
TEST(NodeCacheShared, AnotherDatasetsShardsAboutToBeReadAreKept) {
  TempDir t;
  Dataset a(t.path() / "a", 200, 35, 16 << 10), b(t.path() / "b", 200, 36, 16 << 10);
  ASSERT_GE(a.manifest.shards.size(), 20u);
  const std::string dir = (t.path() / "cache").string();
  CacheOptions o;
  o.capacity_bytes = a.bytes / 3;
  o.prefetch_shards = 0;  // every fetch is this test's
  PlanOptions plan;       // two ranks of one node; both need every shard
  plan.shuffle = false;
  plan.world_size = 2;
  plan.batch_size = 4;
  auto a0 = Open(a, dir, o);
  ASSERT_TRUE(a0.ok()) << a0.status().ToString();
  ASSERT_TRUE((*a0)->BeginEpoch(plan, 0, 0).ok());
  // Rank 0 of A reads shards until the folder is full: each waits for rank 1.
  uint32_t n = 0;
  while (FolderBytes(dir) + a.manifest.shards[n].bytes <= o.capacity_bytes) {
    ASSERT_EQ(ReadAndCheck(**a0, a, n), "");
    n++;
  }
  const std::string a_dir = (*a0)->dataset_dir();
  const uint64_t a_held = FolderBytes(a_dir);
  ASSERT_GT(n, 3u);
  // B (another job, LRU) reads all its shards: A's stay.
  o.policy = "lru";
  auto b0 = Open(b, dir, o);
  ASSERT_TRUE(b0.ok());
  for (uint32_t s = 0; s < b.manifest.shards.size(); ++s) ASSERT_EQ(ReadAndCheck(**b0, b, s), "");
  EXPECT_EQ(FolderBytes(a_dir), a_held) << "B evicted shards A's rank 1 is about to read";
  EXPECT_LE(FolderBytes(dir), o.capacity_bytes);
  EXPECT_EQ((*b0)->stats().remote_bytes, b.bytes) << "B read its shards (uncached where no room)";
  // Rank 1 of A reads them too: done for the epoch, so B may take their room.
  o.policy = "planned";
  auto a1 = Open(a, dir, o);
  ASSERT_TRUE(a1.ok());
  plan.rank = 1;
  ASSERT_TRUE((*a1)->BeginEpoch(plan, 0, 0).ok());
  for (uint32_t s = 0; s < n; ++s) ASSERT_EQ(ReadAndCheck(**a1, a, s), "");
  EXPECT_EQ((*a1)->stats().remote_bytes, 0u) << "rank 1 found A's shards in the cache";
  for (uint32_t s = 0; s < b.manifest.shards.size(); ++s) ASSERT_EQ(ReadAndCheck(**b0, b, s), "");
  EXPECT_LT(FolderBytes(a_dir), a_held) << "B could not use the room of A's finished shards";
  EXPECT_GT(FolderBytes((*b0)->dataset_dir()), o.capacity_bytes - a_held);
  EXPECT_LE(FolderBytes(dir), o.capacity_bytes);
}

}  // namespace
}  // namespace stoker
