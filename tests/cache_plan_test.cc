// The planned cache's bookkeeping against brute force: the eviction ranking
// kept between fetches (cache/ranking.h), the prefetch scan's memo
// (Planner::AheadMemo) and the jobs' slots (cache/jobs.h), on a dataset
// table of a thousand shards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "cache/folder.h"
#include "cache/jobs.h"
#include "cache/planner.h"
#include "cache/ranking.h"
#include "testutil.h"

namespace stoker::cache_internal {
namespace {

constexpr uint32_t kShards = 1000;

struct Table {
  testing::TempDir dir;
  FolderTables t;
  Planner planner{42, std::vector<uint32_t>(kShards, 4), 1};
  Planner::View v;
  std::vector<uint64_t> bytes = std::vector<uint64_t>(kShards, 1);

  Table() {
    const auto ds = dir.path() / "ds";
    std::filesystem::create_directories(ds);
    EXPECT_TRUE(t.Open(dir.path().string(), ds.string(), kShards).ok());
    PlanOptions plan;
    plan.seed = 3;
    plan.shuffle_window_shards = 4;
    EXPECT_TRUE(planner.Begin(plan, 0, 0, 0).ok());
    planner.AwaitNext();
    v = planner.Current();
  }
  void Put(uint32_t s) {
    t.At(s).state = kPresent;
    t.At(s).bytes = 1;
    t.header().used++;
  }
  void Drop(uint32_t s) {
    t.At(s).state = kAbsent;
    t.header().used--;
    t.dataset().dropped++;
  }
  // The present shard (not s) the node needs furthest ahead, not needed
  // again this epoch first: what a full ranking puts first.
  uint32_t Best() const {
    uint32_t best = kShards;
    bool best_far = false;
    uint64_t best_use = 0;
    for (uint32_t x = 0; x < kShards; ++x) {
      if (t.At(x).state != kPresent) continue;
      bool now;
      const uint64_t use = Planner::NextUse(v, t, x, false, &now);
      if (best == kShards || (!now && !best_far) || (!now == best_far && use > best_use)) {
        best = x;
        best_far = !now;
        best_use = use;
      }
    }
    return best;
  }
};

TEST(CachePlan, RankingIsKeptBetweenFetchesAndBuiltAgainAsTheNodeReads) {
  Table tb;
  for (uint32_t x = 0; x < kShards; x += 2) tb.Put(x);  // 500 present
  EvictionRanking r;
  // While nothing is read, each fetch takes the next best candidate, as a
  // ranking built for every fetch would, from the one ranking (and two
  // spare, for one a reader holds).
  for (int i = 0; i < 100; ++i) {
    const uint32_t want = tb.Best();
    auto got = r.Take(tb.v, tb.t, tb.bytes, /*s=*/1, /*mine=*/0, /*need=*/1);
    ASSERT_EQ(got.size(), 3u);
    ASSERT_EQ(got[0].shard, want) << "fetch " << i;
    tb.Drop(want);
  }
  EXPECT_EQ(r.builds(), 1u);
  // The node reads (the folder's clock moves): after a 32nd of the ranking's
  // length in reads it is built again.
  tb.t.header().tick += 500 / 32 + 1;
  auto got = r.Take(tb.v, tb.t, tb.bytes, 1, 0, 1);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].shard, tb.Best());
  EXPECT_EQ(r.builds(), 2u);
  // Nothing needed later than the shard being fetched: nothing offered (the
  // read is served uncached), without building again.
  EXPECT_TRUE(r.Take(tb.v, tb.t, tb.bytes, 1, kNever, 1).empty());
  EXPECT_EQ(r.builds(), 2u);
  // Bytes: candidates until they cover what is needed.
  got = r.Take(tb.v, tb.t, tb.bytes, 1, 0, 5);
  EXPECT_EQ(got.size(), 5u + 2);
  // A new epoch's plan: built again.
  PlanOptions plan;
  plan.seed = 3;
  plan.shuffle_window_shards = 4;
  ASSERT_TRUE(tb.planner.Begin(plan, 1, 0, 0).ok());
  tb.planner.AwaitNext();
  tb.v = tb.planner.Current();
  got = r.Take(tb.v, tb.t, tb.bytes, 1, 0, 1);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].shard, tb.Best());
  EXPECT_EQ(r.builds(), 3u);
}

TEST(CachePlan, LruRankingDropsShardsUsedSinceAndBuildsAgainWhenItRunsOut) {
  Table tb;
  for (uint32_t x = 0; x < 10; ++x) {
    tb.Put(x);
    tb.t.At(x).last_use = 100 + x;
  }
  EvictionRanking r;
  const Planner::View lru{};
  auto got = r.Take(lru, tb.t, tb.bytes, 50, 0, 1);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].shard, 0u);
  tb.Drop(0);
  tb.t.At(1).last_use = 200;  // used since: now the most recent
  got = r.Take(lru, tb.t, tb.bytes, 50, 0, 1);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].shard, 2u);
  EXPECT_EQ(got[1].shard, 3u);
  EXPECT_EQ(r.builds(), 1u);
  for (uint32_t x = 2; x < 10; ++x) tb.Drop(x);
  got = r.Take(lru, tb.t, tb.bytes, 50, 0, 1);  // ran out: built again, shard 1
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].shard, 1u);
  EXPECT_EQ(r.builds(), 2u);
}

TEST(CachePlan, PrefetchScanSkipsWhatCannotHaveChangedUntilAShardIsDropped) {
  Table tb;
  for (uint32_t x = 0; x < kShards; ++x) tb.Put(x);
  Planner::AheadMemo memo;
  EXPECT_TRUE(Planner::Ahead(tb.v, tb.t, 8, &memo).empty());
  EXPECT_EQ(memo.clean_from, 0u);  // the whole sequence seen there
  EXPECT_TRUE(memo.next_clean);
  // The shard the node needs first goes without the table's count moving:
  // the memo (rightly, had the count been kept) skips it...
  const uint32_t first = tb.v.cur->sequence()[0];
  tb.t.At(first).state = kAbsent;
  EXPECT_TRUE(Planner::Ahead(tb.v, tb.t, 8, &memo).empty());
  // ...and every real drop moves the count: it is found.
  tb.t.At(first).state = kPresent;
  tb.Drop(first);
  EXPECT_EQ(Planner::Ahead(tb.v, tb.t, 8, &memo), std::vector<uint32_t>{first});
  // Many absent: the soonest n, then after they are fetched, the next ones.
  for (uint32_t i = 1; i < 40; ++i) tb.Drop(tb.v.cur->sequence()[i]);
  auto ahead = Planner::Ahead(tb.v, tb.t, 8, &memo);
  ASSERT_EQ(ahead.size(), 8u);
  for (uint32_t s : ahead) tb.Put(s);
  auto more = Planner::Ahead(tb.v, tb.t, 8, &memo);
  ASSERT_EQ(more.size(), 8u);
  for (uint32_t s : more) EXPECT_EQ(std::count(ahead.begin(), ahead.end(), s), 0);
  // Fetched them all: clean again.
  for (uint32_t i = 0; i < 40; ++i) {
    if (tb.t.At(tb.v.cur->sequence()[i]).state == kAbsent) tb.Put(tb.v.cur->sequence()[i]);
  }
  EXPECT_TRUE(Planner::Ahead(tb.v, tb.t, 8, &memo).empty());
}

PlanOptions Seeded(uint64_t seed) {
  PlanOptions plan;
  plan.seed = seed;
  plan.shuffle_window_shards = 4;
  return plan;
}

TEST(CachePlan, JobsTakeASlotEachKeepItWhileAliveAndFreeItWhenGone) {
  Table tb;
  const std::string locks = (tb.dir.path() / "ds" / "jobs.lock").string();
  // Each JobSlots opens its own lock descriptions: as separate processes.
  auto a = std::make_unique<JobSlots>(locks);
  auto b = std::make_unique<JobSlots>(locks);
  auto a2 = std::make_unique<JobSlots>(locks);
  EXPECT_EQ(*a->Claim(tb.t, MakeJobSlot(Seeded(1), 0, 0, 0)), 0);
  EXPECT_EQ(*b->Claim(tb.t, MakeJobSlot(Seeded(2), 0, 0, 0)), 1);
  // Another rank of job a (same plan, another rank of the node): its slot.
  PlanOptions other_rank = Seeded(1);
  other_rank.world_size = 2;
  other_rank.rank = 1;
  PlanOptions first_rank = other_rank;
  first_rank.rank = 0;
  EXPECT_EQ(MakeJobSlot(other_rank, 0, 0, 0).identity, MakeJobSlot(first_rank, 0, 0, 0).identity);
  EXPECT_EQ(*a2->Claim(tb.t, MakeJobSlot(Seeded(1), 0, 3, 0)), 0);
  EXPECT_EQ(tb.t.Job(0).epoch, 3u) << "the epoch it is in";
  auto others = a->Others(tb.t);
  ASSERT_EQ(others.size(), 1u);
  EXPECT_EQ(others[0].first, 1u);
  EXPECT_EQ(others[0].second.seed, 2u);
  EXPECT_EQ(PlanOfJob(others[0].second).seed, 2u);
  // Job b ends (its lock is dropped): gone from the others, its slot taken
  // by a new job and cleared.
  tb.t.Marks(1, 7) = {1, 0xff};
  b.reset();
  EXPECT_TRUE(a->Others(tb.t).empty());
  JobSlots c(locks);
  EXPECT_EQ(*c.Claim(tb.t, MakeJobSlot(Seeded(3), 0, 0, 0)), 1);
  EXPECT_EQ(tb.t.Marks(1, 7).mask, 0u);
  // Every slot held by a live job: none for a fifth plan.
  JobSlots d(locks), e(locks), f(locks);
  EXPECT_EQ(*d.Claim(tb.t, MakeJobSlot(Seeded(4), 0, 0, 0)), 2);
  EXPECT_EQ(*e.Claim(tb.t, MakeJobSlot(Seeded(5), 0, 0, 0)), 3);
  EXPECT_EQ(*f.Claim(tb.t, MakeJobSlot(Seeded(6), 0, 0, 0)), -1);
}

TEST(CachePlan, AnotherJobsNeedsCountInTheEvictionKey) {
  Table tb;  // job 0, seed 3
  const std::string locks = (tb.dir.path() / "ds" / "jobs.lock").string();
  JobSlots mine(locks), theirs(locks);
  ASSERT_EQ(*mine.Claim(tb.t, MakeJobSlot(Seeded(3), 0, 0, 0)), 0);
  ASSERT_EQ(*theirs.Claim(tb.t, MakeJobSlot(Seeded(9), 0, 0, 0)), 1);
  Planner other(42, std::vector<uint32_t>(kShards, 4), 1);
  ASSERT_TRUE(other.Begin(Seeded(9), 0, 0, 1).ok());
  other.AwaitNext();
  const Planner::View them = other.Current();
  ASSERT_TRUE(tb.planner.SetOthers(mine.Others(tb.t)).ok());
  const Planner::View v = tb.planner.Current();
  ASSERT_EQ(v.others.size(), 1u);
  EXPECT_GT(v.generation, tb.v.generation);
  // This job reads a shard the other needs late in its epoch: for this job
  // alone it is done (needed next epoch); for the node, the other job's
  // need is its key.
  const uint32_t x = them.cur->RankOrder(0).back();
  tb.planner.OnRead(v, tb.t, x);
  bool now = true;
  const uint64_t alone = Planner::JobNextUse(v, tb.t, x, false, &now);
  EXPECT_FALSE(now);
  bool theirs_now = false;
  const uint64_t their_key = Planner::JobNextUse(them, tb.t, x, false, &theirs_now);
  EXPECT_TRUE(theirs_now);
  bool both_now = false;
  EXPECT_EQ(Planner::NextUse(v, tb.t, x, false, &both_now), std::min(alone, their_key));
  EXPECT_TRUE(both_now);
  // Without the other job, the key is this job's alone.
  ASSERT_TRUE(tb.planner.SetOthers({}).ok());
  EXPECT_EQ(Planner::NextUse(tb.planner.Current(), tb.t, x, false, &now), alone);
}

// A table of the previous layout (one set of progress and marks where the
// jobs' slots are now): its entries are kept, the rest is cleared, so no
// job reads the old bytes as a slot.
TEST(CachePlan, OlderTableIsTakenOverWithItsEntriesAndNoSlots) {
  testing::TempDir dir;
  const auto ds = dir.path() / "ds";
  std::filesystem::create_directories(ds);
  {
    std::vector<std::byte> old(DatasetTableBytes(kShards), std::byte{0x5a});
    DatasetHeader h{};
    h.magic = 0x33534443414b5453ull;  // "STKACDS3"
    h.shards = kShards;
    std::memcpy(old.data(), &h, sizeof h);
    for (uint32_t x = 0; x < kShards; ++x) {
      Entry e{};
      e.state = x % 2 ? kPresent : kAbsent;
      e.bytes = x % 2 ? 100 : 0;
      e.soon = 1;
      std::memcpy(old.data() + sizeof h + x * sizeof(Entry), &e, sizeof e);
    }
    std::FILE* f = std::fopen((ds / "table").c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(old.data(), 1, old.size(), f), old.size());
    std::fclose(f);
  }
  FolderTables t;
  ASSERT_TRUE(t.Open(dir.path().string(), ds.string(), kShards).ok());
  EXPECT_EQ(t.dataset().magic, kDatasetMagic);
  for (uint32_t x = 0; x < kShards; ++x) {
    ASSERT_EQ(t.At(x).state, x % 2 ? kPresent : kAbsent) << x;
    ASSERT_EQ(t.At(x).bytes, x % 2 ? 100u : 0u) << x;
    ASSERT_EQ(t.At(x).soon, 0u) << x;
  }
  for (uint32_t j = 0; j < kTableJobs; ++j) {
    EXPECT_EQ(t.Job(j).identity, 0u) << "slot " << j;
    EXPECT_EQ(t.Progress(j, 0).step, 0u);
    EXPECT_EQ(t.Marks(j, kShards - 1).mask, 0u);
  }
}

}  // namespace
}  // namespace stoker::cache_internal
