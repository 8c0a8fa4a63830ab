// PlanOptionsOf (stoker/loader.h): the loader's options that decide the
// order reach the epoch plan, each one, so that a caller building an
// EpochPlan from LoaderOptions gets the loader's own order (issue 35).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "stoker/loader.h"
#include "stoker/plan.h"

namespace stoker {
namespace {

// Every field of the plan's options against the loader's.
void ExpectCopied(const LoaderOptions& o) {
  const PlanOptions p = PlanOptionsOf(o);
  EXPECT_EQ(p.seed, o.seed);
  EXPECT_EQ(p.shuffle, o.shuffle);
  EXPECT_EQ(p.shuffle_window_shards, o.shuffle_window_shards);
  EXPECT_EQ(p.batch_size, o.batch_size);
  EXPECT_EQ(p.rank, o.rank);
  EXPECT_EQ(p.world_size, o.world_size);
  EXPECT_EQ(p.drop_last, o.drop_last);
  EXPECT_EQ(p.node_affinity, o.node_affinity);
  EXPECT_EQ(p.ranks_per_node, o.ranks_per_node);
}

TEST(PlanOptionsOfTest, EveryOrderFieldIsCopied) {
  ExpectCopied(LoaderOptions{});  // batch_size: the loader's 256, not the plan's 1
  LoaderOptions o;
  o.seed = 0x5eed;
  o.shuffle = false;
  o.shuffle_window_shards = 3;
  o.batch_size = 17;
  o.rank = 5;
  o.world_size = 8;
  o.drop_last = true;
  o.node_affinity = true;
  o.ranks_per_node = 4;
  ExpectCopied(o);
}

// A plan built from them splits the dataset over the loader's world in its
// batch size (padding included).
TEST(PlanOptionsOfTest, ThePlanUsesTheLoadersWorldAndBatchSize) {
  const std::vector<uint32_t> shard_samples = {10, 7, 13, 1, 9};
  for (uint32_t rank = 0; rank < 3; ++rank) {
    LoaderOptions o;
    o.batch_size = 4;
    o.rank = rank;
    o.world_size = 3;
    auto plan = EpochPlan::Make(42, shard_samples, PlanOptionsOf(o), 0, 0);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    // 40 samples over 3 ranks: 14 each with padding, 4 batches of 4, 4, 4, 2.
    EXPECT_EQ(plan->num_batches(), 4u) << rank;
  }
}

}  // namespace
}  // namespace stoker
