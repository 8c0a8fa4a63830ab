// The node's need order (cache/need_order.h) against a straightforward
// reference (every rank's plan made on its own, one pass per rank over every
// slot it visits, per-rank arrays per shard), on small datasets with several
// ranks, nodes and jobs; and its sharing through the cache folder
// (cache/shared_orders.h): one process computes and writes it, the others map
// it; a stale, cut or corrupt file is computed again; a computing process
// that dies or hangs does not hold the others up.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <vector>

#include "cache/folder.h"
#include "cache/need_order.h"
#include "cache/planner.h"
#include "cache/shared_orders.h"
#include "testutil.h"

namespace stoker::cache_internal {
namespace {

constexpr uint64_t kDataset = 0x5eed;

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What the need order was computed as before it was shared: per rank r of
// the node and shard s, where s comes in r's reads, and per shard the first
// step at which any rank needs it.
struct Reference {
  uint64_t steps = 0;
  std::vector<uint64_t> first_step;                // per shard
  std::vector<std::vector<uint32_t>> rank_first;   // per local rank, per shard
  std::vector<std::vector<uint32_t>> rank_order;   // per local rank
  std::vector<uint32_t> sequence;
};

Reference MakeReference(std::span<const uint32_t> shard_samples, const PlanOptions& plan,
                        uint32_t ranks_per_node, uint64_t epoch, uint64_t position) {
  const uint32_t world = std::max(1u, plan.world_size);
  const uint32_t rpn = ranks_per_node ? ranks_per_node : plan.ranks_per_node;
  const uint32_t per_node = rpn == 0 ? world : std::min(rpn, world);
  const uint32_t first = plan.rank / per_node * per_node;
  const uint32_t end = std::min(world, first + per_node);
  const size_t n = shard_samples.size();
  Reference ref;
  ref.first_step.assign(n, kNever);
  for (uint32_t r = first; r < end; ++r) {
    PlanOptions po = plan;
    po.rank = r;
    auto p = EpochPlan::Make(kDataset, shard_samples, po, epoch, position);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    ref.steps = std::max(ref.steps, p->rank_samples());
    std::vector<uint32_t> at(n, kNoStep);
    std::vector<uint32_t> order;
    for (const RankVisit& v : p->RankVisits()) {
      for (uint32_t k = v.first_slot; k < v.end_slot; ++k) {
        const uint32_t s = p->ShardAtSlot(k);
        if (at[s] == kNoStep) {
          at[s] = uint32_t(order.size());
          order.push_back(s);
        }
        ref.first_step[s] = std::min(ref.first_step[s], v.first_step);
      }
    }
    ref.rank_first.push_back(std::move(at));
    ref.rank_order.push_back(std::move(order));
  }
  std::vector<std::pair<uint64_t, uint32_t>> by_step;
  for (uint32_t s = 0; s < n; ++s) {
    if (ref.first_step[s] != kNever) by_step.emplace_back(ref.first_step[s], s);
  }
  std::sort(by_step.begin(), by_step.end());
  for (const auto& [step, s] : by_step) ref.sequence.push_back(s);
  return ref;
}

void ExpectSame(const NeedOrder& o, const Reference& ref, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(o.ranks(), ref.rank_first.size());
  EXPECT_EQ(o.steps(), ref.steps);
  ASSERT_EQ(o.shards(), ref.first_step.size());
  for (uint32_t s = 0; s < o.shards(); ++s) {
    ASSERT_EQ(o.FirstStep(s), ref.first_step[s]) << "shard " << s;
  }
  ASSERT_EQ(std::vector<uint32_t>(o.sequence().begin(), o.sequence().end()), ref.sequence);
  for (uint32_t r = 0; r < o.ranks(); ++r) {
    ASSERT_EQ(std::vector<uint32_t>(o.RankOrder(r).begin(), o.RankOrder(r).end()),
              ref.rank_order[r])
        << "rank " << r;
    for (uint32_t s = 0; s < o.shards(); ++s) {
      ASSERT_EQ(o.RankFirst(r, s), ref.rank_first[r][s]) << "rank " << r << " shard " << s;
    }
  }
}

// Every sample a rank of the node takes comes from a shard the order has it
// read, no later than the step it takes it at.
void ExpectCoversSamples(const NeedOrder& o, std::span<const uint32_t> shard_samples,
                         const PlanOptions& plan, uint64_t epoch, uint64_t position,
                         uint32_t first_rank) {
  std::vector<uint32_t> shard_of;
  for (uint32_t s = 0; s < shard_samples.size(); ++s) shard_of.insert(shard_of.end(), shard_samples[s], s);
  for (uint32_t r = 0; r < o.ranks(); ++r) {
    PlanOptions po = plan;
    po.rank = first_rank + r;
    auto p = EpochPlan::Make(kDataset, shard_samples, po, epoch, position);
    ASSERT_TRUE(p.ok());
    for (uint64_t j = 0; j < p->rank_samples(); ++j) {
      const uint32_t s = shard_of[p->RankSample(j)];
      ASSERT_NE(o.RankFirst(r, s), kNoStep) << "rank " << r << " step " << j;
      ASSERT_LE(o.FirstStep(s), j) << "rank " << r << " step " << j;
    }
  }
}

// Uneven shards, some empty.
std::vector<uint32_t> Shards(size_t n, uint64_t seed) {
  std::vector<uint32_t> out(n);
  uint64_t x = seed;
  for (auto& v : out) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = uint32_t(x >> 60) % 9;  // 0..8 samples
  }
  return out;
}

struct Case {
  std::string name;
  PlanOptions plan;
  uint32_t ranks_per_node = 0;
  uint64_t position = 0;
};

std::vector<Case> Cases() {
  std::vector<Case> out;
  auto base = [](uint32_t world, uint32_t rank) {
    PlanOptions p;
    p.seed = 11;
    p.shuffle_window_shards = 4;
    p.batch_size = 3;
    p.world_size = world;
    p.rank = rank;
    return p;
  };
  out.push_back({"one rank", base(1, 0)});
  out.push_back({"8 ranks, one node", base(8, 3)});
  Case padded{"8 ranks, padding wraps", base(8, 7)};
  padded.plan.batch_size = 5;
  out.push_back(padded);
  Case dropped{"8 ranks, drop_last", base(8, 2)};
  dropped.plan.drop_last = true;
  out.push_back(dropped);
  out.push_back({"8 ranks, 4 a node, second node", base(8, 6), 4});
  out.push_back({"resumed mid-epoch", base(8, 1), 0, 301});
  Case unshuffled{"unshuffled", base(6, 4)};
  unshuffled.plan.shuffle = false;
  out.push_back(unshuffled);
  Case affinity{"node affinity", base(8, 5)};
  affinity.plan.node_affinity = true;
  affinity.plan.ranks_per_node = 4;
  out.push_back(affinity);
  Case window1{"window of one shard, 3 ranks", base(3, 1)};
  window1.plan.shuffle_window_shards = 1;
  out.push_back(window1);
  return out;
}

TEST(CacheOrder, ComputedOrderEqualsTheReference) {
  const std::vector<uint32_t> shards = Shards(203, 5);
  for (const Case& c : Cases()) {
    for (uint64_t epoch : {0u, 1u, 4u}) {
      const std::string what = c.name + ", epoch " + std::to_string(epoch);
      auto o = NeedOrder::Compute(kDataset, shards, c.plan, c.ranks_per_node, epoch, c.position);
      ASSERT_TRUE(o.ok()) << what << ": " << o.status().ToString();
      ExpectSame(*o, MakeReference(shards, c.plan, c.ranks_per_node, epoch, c.position), what);
      const uint32_t first = o->key().job.rank;
      ExpectCoversSamples(*o, shards, c.plan, epoch, c.position, first);
      EXPECT_EQ(o->local_rank(), c.plan.rank - first);
    }
  }
}

TEST(CacheOrder, RanksReadingTheSameWindowsShareOneArray) {
  const std::vector<uint32_t> shards(400, 6);
  PlanOptions p;
  p.seed = 2;
  p.world_size = 8;
  p.batch_size = 4;
  auto o = NeedOrder::Compute(kDataset, shards, p, 0, 0, 0);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->groups(), 1u) << "the global shuffle: every rank visits every window";
  EXPECT_EQ(o->ranks(), 8u);
  p.shuffle = false;  // each rank reads only the shards holding its steps
  p.world_size = 2;
  p.batch_size = 1;
  const std::vector<uint32_t> ones(10, 1);
  auto u = NeedOrder::Compute(kDataset, ones, p, 0, 0, 0);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->groups(), 2u);
  ExpectSame(*u, MakeReference(ones, p, 0, 0, 0), "unshuffled, a shard a sample");
}

TEST(CacheOrder, TooManyRanksOnANodeIsRefused) {
  PlanOptions p;
  p.world_size = kMaxNodeRanks + 1;
  auto o = NeedOrder::Compute(kDataset, std::vector<uint32_t>(100, 1), p, 0, 0, 0);
  EXPECT_EQ(o.status().code(), Code::kInvalidArgument);
}

// Two jobs (two seeds) and the ranks of each, as separate processes (each its
// own SharedOrders) on one folder: each job's order is computed once, by the
// first rank to want it, and mapped by the others; all equal the reference.
TEST(CacheOrder, OneRankComputesEachJobsOrderTheOthersMapIt) {
  testing::TempDir dir;
  const std::vector<uint32_t> shards = Shards(150, 9);
  for (uint64_t seed : {1u, 2u}) {
    PlanOptions p;
    p.seed = seed;
    p.shuffle_window_shards = 3;
    p.batch_size = 2;
    p.world_size = 4;
    uint64_t written = 0, mapped = 0;
    for (uint32_t r = 0; r < 4; ++r) {
      SharedOrders orders(dir.str());
      p.rank = r;
      auto o = orders.Get(kDataset, shards, p, 0, 3, 0);
      ASSERT_TRUE(o.ok()) << o.status().ToString();
      EXPECT_EQ((*o)->local_rank(), r);
      ExpectSame(**o, MakeReference(shards, p, 0, 3, 0), "seed " + std::to_string(seed));
      written += orders.written();
      mapped += orders.mapped();
    }
    EXPECT_EQ(written, 1u) << "seed " << seed;
    EXPECT_EQ(mapped, 3u) << "seed " << seed;
  }
}

TEST(CacheOrder, StaleCutOrCorruptFilesAreComputedAgain) {
  testing::TempDir dir;
  const std::vector<uint32_t> shards = Shards(120, 3);
  PlanOptions p;
  p.world_size = 2;
  p.shuffle_window_shards = 4;
  const Reference ref = MakeReference(shards, p, 0, 1, 0);
  const std::string path =
      SharedOrders(dir.str()).Path(MakeOrderKey(kDataset, shards.size(), p, 0, 1, 0));
  // Another position's order under the name (a run resumed elsewhere).
  {
    SharedOrders orders(dir.str());
    ASSERT_TRUE(orders.Get(kDataset, shards, p, 0, 1, 17).ok());
    ASSERT_TRUE(std::filesystem::exists(path));
  }
  auto again = [&](const std::string& what) {
    SharedOrders orders(dir.str());
    auto o = orders.Get(kDataset, shards, p, 0, 1, 0);
    ASSERT_TRUE(o.ok()) << what;
    EXPECT_EQ(orders.mapped(), 0u) << what;
    EXPECT_EQ(orders.written(), 1u) << what;
    ExpectSame(**o, ref, what);
  };
  again("another position's");
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 8);
  again("cut short");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(size / 2));
    const char x = 0x55;
    f.write(&x, 1);
  }
  again("a byte changed");
  SharedOrders last(dir.str());
  ASSERT_TRUE(last.Get(kDataset, shards, p, 0, 1, 0).ok());
  EXPECT_EQ(last.mapped(), 1u) << "the good file is taken";
}

// The process computing an order is killed holding its lock: the kernel drops
// the lock and the waiting one computes it at once, not after the bound.
TEST(CacheOrder, ADeadComputerDoesNotHoldTheOthersUp) {
  testing::TempDir dir;
  const std::vector<uint32_t> shards = Shards(100, 4);
  PlanOptions p;
  p.world_size = 4;
  p.rank = 2;
  const OrderKey key = MakeOrderKey(kDataset, shards.size(), p, 0, 0, 0);
  SharedOrders orders(dir.str(), std::chrono::milliseconds(60000));
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ByteLock held;
    auto got = held.Lock(orders.LockPath(), SharedOrders::LockByte(key), true, false);
    const char c = got.ok() && *got ? 1 : 0;
    (void)!write(ready[1], &c, 1);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 1) << "the child took the lock";
  const auto t0 = std::chrono::steady_clock::now();
  auto got = std::async(std::launch::async, [&] { return orders.Get(kDataset, shards, p, 0, 0, 0); });
  EXPECT_EQ(got.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
      << "it waits for the computing process";
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  auto o = got.get();
  const double waited = SecondsSince(t0);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_LT(waited, 10.0);
  EXPECT_EQ(orders.written(), 1u);
  ExpectSame(**o, MakeReference(shards, p, 0, 0, 0), "after the holder died");
  close(ready[0]);
  close(ready[1]);
}

// A live process holds the lock and never writes: after the bound, the
// waiting one computes its own.
TEST(CacheOrder, AStuckComputerIsWaitedForOnlyUntilTheBound) {
  testing::TempDir dir;
  const std::vector<uint32_t> shards = Shards(100, 6);
  PlanOptions p;
  p.world_size = 2;
  const OrderKey key = MakeOrderKey(kDataset, shards.size(), p, 0, 0, 0);
  SharedOrders orders(dir.str(), std::chrono::milliseconds(200));
  ByteLock stuck;  // another description: as another process
  ASSERT_TRUE(*stuck.Lock(orders.LockPath(), SharedOrders::LockByte(key), true, false));
  const auto t0 = std::chrono::steady_clock::now();
  auto o = orders.Get(kDataset, shards, p, 0, 0, 0);
  const double waited = SecondsSince(t0);
  ASSERT_TRUE(o.ok());
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 5.0);
  EXPECT_EQ(orders.written(), 0u) << "not written without the lock";
  ExpectSame(**o, MakeReference(shards, p, 0, 0, 0), "computed alone");
}

// The planner takes this epoch's order from what it prepared during the
// last one, prepares the next's in the background, and a second process's
// planner maps both.
TEST(CacheOrder, PlannerPreparesTheNextEpochsOrderAndTheNodeSharesIt) {
  testing::TempDir dir;
  const std::vector<uint32_t> shards = Shards(180, 8);
  PlanOptions p;
  p.seed = 4;
  p.shuffle_window_shards = 4;
  p.world_size = 4;
  SharedOrders mine(dir.str()), theirs(dir.str());
  Planner a(kDataset, shards, 0), b(kDataset, shards, 0);
  a.ShareThrough(&mine);
  b.ShareThrough(&theirs);
  ASSERT_OK(a.Begin(p, 0, 0, 0));
  a.AwaitNext();
  EXPECT_EQ(mine.written(), 2u) << "epochs 0 and 1";
  Planner::View v = a.Current();
  ASSERT_TRUE(v.cur && v.next);
  ExpectSame(*v.cur, MakeReference(shards, p, 0, 0, 0), "epoch 0");
  ExpectSame(*v.next, MakeReference(shards, p, 0, 1, 0), "epoch 1");
  PlanOptions p3 = p;
  p3.rank = 3;
  ASSERT_OK(b.Begin(p3, 0, 0, 0));
  b.AwaitNext();
  EXPECT_EQ(theirs.written(), 0u);
  EXPECT_EQ(theirs.mapped(), 2u);
  EXPECT_EQ(b.Current().cur->local_rank(), 3u);
  // Epoch 1: the prepared order, not computed again; epoch 2's is made, and
  // epoch 0's file goes.
  const std::shared_ptr<const NeedOrder> prepared = v.next;
  ASSERT_OK(a.Begin(p, 1, 0, 0));
  EXPECT_EQ(a.Current().cur, prepared);
  a.AwaitNext();
  EXPECT_EQ(mine.written(), 3u);
  ExpectSame(*a.Current().next, MakeReference(shards, p, 0, 2, 0), "epoch 2");
  EXPECT_FALSE(std::filesystem::exists(mine.Path(MakeOrderKey(kDataset, shards.size(), p, 0, 0, 0))));
  // A jump (a resume elsewhere): computed then.
  ASSERT_OK(a.Begin(p, 7, 5, 0));
  ExpectSame(*a.Current().cur, MakeReference(shards, p, 0, 7, 5), "epoch 7 from 5");
}

}  // namespace
}  // namespace stoker::cache_internal
