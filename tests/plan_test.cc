// Properties of the epoch plan: exactly-once coverage across ranks, the same
// order for the same inputs, another for another epoch or seed, resume equal
// to the uninterrupted run, and a generator fixed bit for bit.
#include "stoker/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>

namespace stoker {
namespace {

std::vector<uint32_t> Shards(std::initializer_list<uint32_t> counts) { return counts; }

// A shard layout with uneven shards, as pack produces for varied sample sizes.
std::vector<uint32_t> UnevenShards(size_t shards, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint32_t> out;
  for (size_t i = 0; i < shards; ++i) out.push_back(1 + static_cast<uint32_t>(rng.Below(40)));
  return out;
}

PlanOptions Opts(uint32_t batch, uint32_t rank, uint32_t world, bool drop_last, uint64_t seed = 7) {
  PlanOptions o;
  o.seed = seed;
  o.batch_size = batch;
  o.rank = rank;
  o.world_size = world;
  o.drop_last = drop_last;
  o.shuffle_window_shards = 3;
  return o;
}

std::vector<uint64_t> RankSamples(const EpochPlan& p) {
  std::vector<uint64_t> out;
  for (uint64_t b = 0; b < p.num_batches(); ++b) {
    uint64_t first, count;
    p.BatchRange(b, &first, &count);
    for (uint64_t j = first; j < first + count; ++j) out.push_back(p.RankSample(j));
  }
  return out;
}

TEST(RngTest, GoldenStream) {
  // These values pin the generator: if they change, every saved resume state
  // and every cross-machine comparison breaks. Do not update them casually.
  Rng rng(0);
  const uint64_t a = rng.Next(), b = rng.Next(), c = rng.Next();
  Rng again(0);
  EXPECT_EQ(again.Next(), a);
  EXPECT_EQ(again.Next(), b);
  EXPECT_EQ(again.Next(), c);
  EXPECT_EQ(a, 0x99ec5f36cb75f2b4ull);
  EXPECT_EQ(b, 0xbf6e1f784956452aull);
  EXPECT_EQ(c, 0x1a5f849d4933e6e0ull);
  EXPECT_EQ(MixSeed({1, 2, 3}), MixSeed({1, 2, 3}));
  EXPECT_NE(MixSeed({1, 2, 3}), MixSeed({3, 2, 1}));
}

TEST(RngTest, BelowIsInRangeAndRoughlyUniform) {
  Rng rng(42);
  std::vector<int> hist(10);
  for (int i = 0; i < 100000; ++i) {
    uint64_t v = rng.Below(10);
    ASSERT_LT(v, 10u);
    hist[v]++;
  }
  for (int h : hist) {
    EXPECT_GT(h, 9000);
    EXPECT_LT(h, 11000);
  }
  EXPECT_EQ(rng.Below(1), 0u);
}

TEST(RngTest, PermuteIsAPermutation) {
  std::vector<int> v(1000);
  for (int i = 0; i < 1000; ++i) v[i] = i;
  Rng rng(3);
  Permute(std::span<int>(v), rng);
  std::vector<int> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  int fixed = 0;
  for (int i = 0; i < 1000; ++i) fixed += v[i] == i;
  EXPECT_LT(fixed, 10);  // a shuffle, not the identity
}

TEST(PermutationTest, IsABijectionForEverySize) {
  for (uint64_t n = 0; n <= 300; ++n) {
    Permutation p(n, MixSeed({n, 42}));
    std::vector<bool> hit(n, false);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = p(i);
      ASSERT_LT(v, n) << "n " << n << " i " << i;
      ASSERT_FALSE(hit[v]) << "n " << n << ": " << v << " twice";
      hit[v] = true;
    }
  }
}

TEST(PermutationTest, KeyedAndNotTheIdentity) {
  const uint64_t n = 1000;
  Permutation a(n, 1), b(n, 2), again(n, 1);
  int fixed = 0, same = 0;
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_EQ(a(i), again(i));
    fixed += a(i) == i;
    same += a(i) == b(i);
  }
  EXPECT_LT(fixed, 10);
  EXPECT_LT(same, 10);
}

TEST(PermutationTest, LargeSizesStayInRange) {
  // A window of 10^9 samples (a billion-sample dataset in one window).
  for (uint64_t n : {uint64_t{1} << 32, uint64_t{1000000007}, uint64_t{3}}) {
    Permutation p(n, 9);
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < 2000 && i < n; ++i) {
      ASSERT_LT(p(i), n);
      seen.insert(p(i));
    }
    EXPECT_EQ(seen.size(), std::min<uint64_t>(n, 2000));
  }
}

TEST(PlanTest, GoldenOrder) {
  // Pins order version 2 (kPlanOrderVersion) for the global shuffle: a change
  // here changes every run's order and must bump the version.
  auto p = EpochPlan::Make(11, Shards({3, 2, 4, 1, 3, 2}), Opts(1, 0, 1, false), 1);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::vector<uint64_t> got;
  for (uint64_t j = 0; j < p->rank_samples(); ++j) got.push_back(p->RankSample(j));
  const std::vector<uint64_t> want = {11, 10, 12, 4, 14, 13, 3, 2, 5, 6, 8, 1, 0, 7, 9};
  EXPECT_EQ(got, want);
  Permutation q(10, 12345);
  std::vector<uint64_t> perm;
  for (uint64_t i = 0; i < 10; ++i) perm.push_back(q(i));
  EXPECT_EQ(perm, (std::vector<uint64_t>{9, 4, 7, 1, 8, 6, 2, 0, 5, 3}));
}

TEST(PlanTest, GlobalOrderIsAPermutation) {
  auto shards = UnevenShards(20, 1);
  auto p = EpochPlan::Make(99, shards, Opts(4, 0, 1, false), 0);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::vector<uint64_t> order;
  for (uint64_t i = 0; i < p->dataset_samples(); ++i) order.push_back(p->SampleAtPosition(i));
  std::sort(order.begin(), order.end());
  for (uint64_t i = 0; i < order.size(); ++i) ASSERT_EQ(order[i], i);
}

// Every sample exactly once per epoch across all ranks, world sizes 1..8,
// padding accounted for; every rank the same number of batches.
TEST(PlanTest, ExactlyOnceAcrossRanks) {
  for (uint64_t layout_seed : {1, 2, 3}) {
    auto shards = UnevenShards(5 + layout_seed * 7, layout_seed);
    uint64_t n = 0;
    for (auto s : shards) n += s;
    for (uint32_t world = 1; world <= 8; ++world) {
      for (uint32_t batch : {1u, 3u, 8u}) {
        for (bool drop_last : {false, true}) {
          std::map<uint64_t, int> seen;
          uint64_t padding = 0, batches = UINT64_MAX;
          for (uint32_t r = 0; r < world; ++r) {
            auto p = EpochPlan::Make(5, shards, Opts(batch, r, world, drop_last), 2);
            ASSERT_TRUE(p.ok());
            if (batches == UINT64_MAX) batches = p->num_batches();
            ASSERT_EQ(p->num_batches(), batches) << "rank " << r << " of " << world;
            for (uint64_t j = 0; j < p->rank_samples(); ++j) {
              seen[p->RankSample(j)]++;
              padding += p->IsPadding(j);
            }
          }
          SCOPED_TRACE("world " + std::to_string(world) + " batch " + std::to_string(batch) +
                       " drop_last " + std::to_string(drop_last));
          uint64_t total = 0, dups = 0;
          for (auto& [id, c] : seen) {
            ASSERT_LT(id, n);
            total += c;
            dups += c - 1;
          }
          if (drop_last) {
            EXPECT_EQ(dups, 0u);
            EXPECT_EQ(padding, 0u);
            EXPECT_EQ(total, batches * batch * world);
            EXPECT_LT(n - total, uint64_t(batch) * world);  // only the tail is dropped
          } else {
            EXPECT_EQ(seen.size(), n);  // nothing missed
            EXPECT_EQ(dups, padding);   // repeats are exactly the padding
            EXPECT_LT(padding, world);
            EXPECT_EQ(total, n + padding);
          }
        }
      }
    }
  }
}

TEST(PlanTest, SameInputsSameOrder) {
  auto shards = UnevenShards(30, 9);
  auto a = EpochPlan::Make(11, shards, Opts(5, 1, 3, false), 4);
  auto b = EpochPlan::Make(11, shards, Opts(5, 1, 3, false), 4);
  EXPECT_EQ(RankSamples(*a), RankSamples(*b));
}

TEST(PlanTest, OtherEpochSeedOrDatasetGivesOtherOrder) {
  auto shards = UnevenShards(30, 9);
  auto base = RankSamples(*EpochPlan::Make(11, shards, Opts(5, 0, 1, false), 4));
  EXPECT_NE(base, RankSamples(*EpochPlan::Make(11, shards, Opts(5, 0, 1, false), 5)));
  EXPECT_NE(base, RankSamples(*EpochPlan::Make(11, shards, Opts(5, 0, 1, false, 8), 4)));
  EXPECT_NE(base, RankSamples(*EpochPlan::Make(12, shards, Opts(5, 0, 1, false), 4)));
}

TEST(PlanTest, NoShuffleIsPackedOrder) {
  auto shards = Shards({3, 2, 4});
  PlanOptions o = Opts(2, 0, 1, false);
  o.shuffle = false;
  auto p = EpochPlan::Make(1, shards, o, 0);
  std::vector<uint64_t> want = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(RankSamples(*p), want);
}

TEST(PlanTest, WindowKeepsSamplesOfFewShardsTogether) {
  // With a window of one shard, consecutive samples come from one shard at a
  // time: the loader then needs only one shard in memory per window.
  std::vector<uint32_t> shards(10, 16);
  PlanOptions o = Opts(16, 0, 1, false);
  o.shuffle_window_shards = 1;
  auto p = EpochPlan::Make(1, shards, o, 0);
  for (uint64_t b = 0; b < p->num_batches(); ++b) {
    std::set<uint64_t> shard_ids;
    for (uint64_t j = b * 16; j < (b + 1) * 16; ++j) shard_ids.insert(p->RankSample(j) / 16);
    EXPECT_EQ(shard_ids.size(), 1u);
  }
  // ...and within the shard the samples are shuffled.
  std::vector<uint64_t> first16;
  for (uint64_t j = 0; j < 16; ++j) first16.push_back(p->RankSample(j) % 16);
  EXPECT_FALSE(std::is_sorted(first16.begin(), first16.end()));
}

// Resume from any batch boundary equals the uninterrupted run.
TEST(PlanTest, ResumeEqualsUninterrupted) {
  auto shards = UnevenShards(12, 4);
  for (uint32_t world : {1u, 2u, 3u, 5u}) {
    for (bool drop_last : {false, true}) {
      for (uint32_t r = 0; r < world; ++r) {
        auto full = EpochPlan::Make(3, shards, Opts(4, r, world, drop_last), 1);
        auto all = RankSamples(*full);
        for (uint64_t k = 0; k <= full->num_batches(); ++k) {
          auto resumed =
              EpochPlan::Make(3, shards, Opts(4, r, world, drop_last), 1, full->PositionAfter(k));
          ASSERT_TRUE(resumed.ok());
          auto rest = RankSamples(*resumed);
          std::vector<uint64_t> want(all.begin() + std::min<uint64_t>(k * 4, all.size()),
                                     all.end());
          ASSERT_EQ(rest, want) << "world " << world << " rank " << r << " after " << k;
          ASSERT_EQ(resumed->num_batches(), full->num_batches() - k);
        }
      }
    }
  }
}

// The position is global: a job stopped at world 4 and resumed at world 2
// still sees every sample exactly once (no padding involved before the end).
TEST(PlanTest, ResumeOnAnotherWorldSizeCoversTheRest) {
  auto shards = UnevenShards(12, 6);
  uint64_t n = 0;
  for (auto s : shards) n += s;
  std::map<uint64_t, int> seen;
  const uint64_t k = 3;
  uint64_t position = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    auto p = EpochPlan::Make(3, shards, Opts(4, r, 4, false), 0);
    for (uint64_t j = 0; j < k * 4; ++j) seen[p->RankSample(j)]++;
    position = p->PositionAfter(k);
  }
  EXPECT_EQ(position, k * 4 * 4);
  uint64_t padding = 0;
  for (uint32_t r = 0; r < 2; ++r) {
    auto p = EpochPlan::Make(3, shards, Opts(4, r, 2, false), 0, position);
    for (uint64_t j = 0; j < p->rank_samples(); ++j) {
      seen[p->RankSample(j)]++;
      padding += p->IsPadding(j);
    }
  }
  EXPECT_EQ(seen.size(), n);
  uint64_t dups = 0;
  for (auto& [id, c] : seen) dups += c - 1;
  EXPECT_EQ(dups, padding);
}

TEST(PlanTest, BadArguments) {
  auto shards = Shards({4, 4});
  EXPECT_EQ(EpochPlan::Make(1, shards, Opts(0, 0, 1, false), 0).status().code(),
            Code::kInvalidArgument);
  auto bad_rank = EpochPlan::Make(1, shards, Opts(2, 3, 3, false), 0);
  EXPECT_EQ(bad_rank.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad_rank.status().message().find("rank 3"), std::string::npos);
  EXPECT_EQ(EpochPlan::Make(1, shards, Opts(2, 0, 0, false), 0).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(EpochPlan::Make(1, shards, Opts(2, 0, 1, false), 0, 9).status().code(),
            Code::kInvalidArgument);
  auto at_end = EpochPlan::Make(1, shards, Opts(2, 0, 1, false), 0, 8);
  ASSERT_TRUE(at_end.ok());
  EXPECT_EQ(at_end->num_batches(), 0u);
}

TEST(PlanTest, EmptyDataset) {
  std::vector<uint32_t> none;
  auto p = EpochPlan::Make(1, none, Opts(2, 0, 1, false), 0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->num_batches(), 0u);
}

// ---- node affinity --------------------------------------------------------

PlanOptions Affine(uint32_t rank, uint32_t world, uint32_t per_node, bool drop_last = false) {
  PlanOptions o = Opts(4, rank, world, drop_last);
  o.node_affinity = true;
  o.ranks_per_node = per_node;
  return o;
}

// Shard of each sample id.
std::vector<uint32_t> ShardOf(const std::vector<uint32_t>& shards) {
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < shards.size(); ++s) out.insert(out.end(), shards[s], s);
  return out;
}

TEST(PlanAffinityTest, ExactlyOnceAndEachShardOnOneNodeForTheRun) {
  const auto shards = UnevenShards(23, 5);
  const auto shard_of = ShardOf(shards);
  const uint64_t n = shard_of.size();
  const uint32_t world = 6, per_node = 3;
  std::map<uint32_t, uint32_t> node_of_shard;
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::map<uint64_t, int> seen;
    uint64_t batches = 0;
    for (uint32_t r = 0; r < world; ++r) {
      auto p = EpochPlan::Make(9, shards, Affine(r, world, per_node), epoch);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      if (r == 0) batches = p->num_batches();
      EXPECT_EQ(p->num_batches(), batches) << "every rank gets the same batch count";
      for (uint64_t j = 0; j < p->rank_samples(); ++j) {
        const uint64_t id = p->RankSample(j);
        const uint32_t s = shard_of[id];
        auto [it, fresh] = node_of_shard.emplace(s, r / per_node);
        EXPECT_EQ(it->second, r / per_node) << "shard " << s << " read by two nodes";
        if (!p->IsPadding(j)) seen[id]++;
      }
    }
    ASSERT_EQ(seen.size(), n) << "epoch " << epoch;
    for (const auto& [id, count] : seen) ASSERT_EQ(count, 1) << "sample " << id;
  }
  // Both nodes got a part.
  std::set<uint32_t> nodes;
  for (const auto& [s, node] : node_of_shard) nodes.insert(node);
  EXPECT_EQ(nodes.size(), 2u);
}

TEST(PlanAffinityTest, GoldenOrder) {
  // Pins the node-affine order: a change here changes every run's order.
  const auto shards = Shards({3, 2, 4, 1, 3, 2});
  std::vector<uint64_t> got;
  for (uint32_t r = 0; r < 4; ++r) {
    auto p = EpochPlan::Make(11, shards, Affine(r, 4, 2), 1);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    for (uint64_t j = 0; j < p->rank_samples(); ++j) got.push_back(p->RankSample(j));
    got.push_back(999);
  }
  // Order version 2 (kPlanOrderVersion): windows permuted by Permutation.
  const std::vector<uint64_t> want = {0, 1,  14, 4, 999, 2, 3,  13, 0,  999,
                                      9, 10, 5,  8, 999, 7, 12, 6,  11, 999};
  EXPECT_EQ(got, want);
}

TEST(PlanAffinityTest, ResumeEqualsUninterruptedOnTheSameWorld) {
  const auto shards = UnevenShards(17, 8);
  for (bool drop_last : {false, true}) {
    for (uint32_t r = 0; r < 4; ++r) {
      auto full = EpochPlan::Make(3, shards, Affine(r, 4, 2, drop_last), 2);
      ASSERT_TRUE(full.ok());
      const auto all = RankSamples(*full);
      for (uint64_t k = 0; k <= full->num_batches(); ++k) {
        auto rest =
            EpochPlan::Make(3, shards, Affine(r, 4, 2, drop_last), 2, full->PositionAfter(k));
        ASSERT_TRUE(rest.ok()) << rest.status().ToString();
        const auto tail = RankSamples(*rest);
        ASSERT_EQ(tail.size(), all.size() - std::min<size_t>(all.size(), k * 4));
        EXPECT_TRUE(std::equal(tail.begin(), tail.end(), all.end() - tail.size()));
      }
    }
  }
}

// ForRank shares the order and gives what Make gives for that rank; every
// step lies in exactly one visit, whose slots hold the step's shard.
TEST(PlanTest, ForRankAndVisitsAgreeWithRankSamples) {
  const auto shards = UnevenShards(23, 5);
  for (bool affine : {false, true}) {
    for (bool drop_last : {false, true}) {
      for (uint64_t start : {uint64_t{0}, uint64_t{8}, uint64_t{96}}) {
        PlanOptions o = affine ? Affine(0, 4, 2, drop_last) : Opts(3, 0, 4, drop_last);
        if (affine && start % (4 * o.batch_size) != 0) continue;
        auto base = EpochPlan::Make(21, shards, o, 3, start);
        ASSERT_TRUE(base.ok()) << base.status().ToString();
        for (uint32_t r = 0; r < 4; ++r) {
          SCOPED_TRACE("affine " + std::to_string(affine) + " drop_last " +
                       std::to_string(drop_last) + " start " + std::to_string(start) +
                       " rank " + std::to_string(r));
          o.rank = r;
          auto made = EpochPlan::Make(21, shards, o, 3, start);
          auto shared = base->ForRank(r);
          ASSERT_TRUE(made.ok() && shared.ok());
          EXPECT_EQ(shared->rank(), r);
          ASSERT_EQ(shared->rank_samples(), made->rank_samples());
          EXPECT_EQ(shared->num_batches(), made->num_batches());
          EXPECT_EQ(RankSamples(*shared), RankSamples(*made));
          const auto visits = shared->RankVisits();
          uint64_t next_step = 0;
          for (const RankVisit& v : visits) {
            ASSERT_EQ(v.first_step, next_step);
            ASSERT_LE(v.first_step, v.last_step);
            ASSERT_LT(v.first_slot, v.end_slot);
            ASSERT_LE(v.end_slot, shared->num_slots());
            for (uint64_t j = v.first_step; j <= v.last_step; ++j) {
              uint32_t slot = 0;
              const uint64_t id = shared->RankSampleSlot(j, &slot);
              ASSERT_EQ(id, shared->RankSample(j));
              ASSERT_GE(slot, v.first_slot) << "step " << j;
              ASSERT_LT(slot, v.end_slot) << "step " << j;
              const uint32_t shard = shared->ShardAtSlot(slot);
              uint64_t first = 0;
              for (uint32_t s = 0; s < shard; ++s) first += shards[s];
              ASSERT_GE(id, first);
              ASSERT_LT(id, first + shards[shard]);
            }
            next_step = v.last_step + 1;
          }
          EXPECT_EQ(next_step, shared->rank_samples());
        }
      }
    }
  }
}

TEST(PlanAffinityTest, BadArguments) {
  const auto shards = UnevenShards(5, 1);
  EXPECT_EQ(EpochPlan::Make(1, shards, Affine(0, 6, 4), 0).status().code(),
            Code::kInvalidArgument);  // 4 does not divide 6
  EXPECT_EQ(EpochPlan::Make(1, shards, Affine(0, 4, 2), 0, 3).status().code(),
            Code::kInvalidArgument);  // not a whole step
  EXPECT_EQ(EpochPlan::Make(1, Shards({5, 5}), Affine(0, 6, 2), 0).status().code(),
            Code::kInvalidArgument);  // 3 nodes, 2 shards
}

}  // namespace
}  // namespace stoker
