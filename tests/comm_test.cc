// The comm module's pure parts: sizes, bus bandwidth factors, names, the
// exactness of the checked values in every dtype, binding advice and checks.
#include "stoker/comm.h"

#include <gtest/gtest.h>

#include "comm/values.h"
#include "stoker/topo.h"

namespace stoker {
namespace {

TEST(CommTest, SizesFollowNcclTestsSweep) {
  CommBenchOptions o;  // 8 B .. 1 GiB, doubling
  const auto sizes = CommSizes(o);
  ASSERT_EQ(sizes.size(), 28u);
  EXPECT_EQ(sizes.front(), 8u);
  EXPECT_EQ(sizes.back(), 1ull << 30);
  o.min_bytes = o.max_bytes = 25 << 20;
  EXPECT_EQ(CommSizes(o), std::vector<uint64_t>{25u << 20});
  o.min_bytes = 1000;
  o.max_bytes = 5000;
  o.step_factor = 4;
  EXPECT_EQ(CommSizes(o), (std::vector<uint64_t>{1000, 4000, 5000}));  // max included
}

TEST(CommTest, BusBandwidthFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CommOp::kAllReduce, 8), 2.0 * 7 / 8);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CommOp::kAllGather, 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CommOp::kReduceScatter, 4), 3.0 / 4);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CommOp::kAllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CommOp::kBroadcast, 8), 1);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CommOp::kSendRecv, 8), 1);
  EXPECT_DOUBLE_EQ(BusBandwidthFactor(CommOp::kAllReduce, 1), 0);
}

TEST(CommTest, NamesRoundTripAndBadNamesAreNamed) {
  for (CommOp op : AllCommOps()) EXPECT_EQ(*ParseCommOp(CommOpName(op)), op);
  for (CommDtype d : AllCommDtypes()) EXPECT_EQ(*ParseCommDtype(CommDtypeName(d)), d);
  auto bad = ParseCommOp("allreduse");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'allreduse'"), std::string::npos);
  EXPECT_FALSE(ParseCommDtype("float64").ok());
}

TEST(CommTest, CheckedValuesAreExactInEveryDtype) {
  using namespace comm;
  // Every integer a sum can reach is exact: 256 in bfloat16, 2048 in float16.
  for (int v = 0; v <= 256; ++v) EXPECT_EQ(Bf16ToFloat(FloatToBf16(float(v))), v);
  for (int v = 0; v <= 2048; ++v) EXPECT_EQ(F16ToFloat(FloatToF16(float(v))), v);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(257)), 256);  // round to nearest even
  for (int ranks : {1, 2, 4, 8, 64, 256}) {
    for (CommDtype d : AllCommDtypes()) {
      const int range = ValueRange(d, ranks);
      ASSERT_GE(range, 1);
      const double largest_sum = double(range) * ranks;
      if (d == CommDtype::kBFloat16) {
        EXPECT_LE(largest_sum, 256) << ranks;
      }
      if (d == CommDtype::kFloat16) {
        EXPECT_LE(largest_sum, 2048) << ranks;
      }
    }
  }
  // Inputs depend on the rank and the index.
  EXPECT_NE(InputValue(0, 5, 8), InputValue(1, 5, 8));
  EXPECT_NE(InputValue(0, 5, 8), InputValue(0, 6, 8));
  uint16_t buf[2];
  Store(CommDtype::kBFloat16, buf, 1, 7);
  EXPECT_EQ(Load(CommDtype::kBFloat16, buf, 1), 7);
}

Topology TwoSockets() {
  Topology t;
  t.cores = t.pus = 8;
  t.numa = {{0, {0, 1, 2, 3}, 4, 0}, {1, {4, 5, 6, 7}, 4, 0}};
  for (int i = 0; i < 4; ++i) {
    TopoDevice g;
    g.kind = "gpu";
    g.pci = "0000:1" + std::to_string(i) + ":00.0";
    g.numa = i / 2;
    t.gpus.push_back(g);
  }
  TopoDevice nic;
  nic.kind = "nic";
  nic.name = "mlx5_1";
  nic.pci = "0000:80:00.0";
  nic.numa = 1;
  t.nics.push_back(nic);
  return t;
}

TEST(TopoTest, AdviceFollowsNumaNodesAndGpus) {
  const BindingAdvice a = AdviseBinding(TwoSockets(), 4);
  EXPECT_EQ(a.mpirun, "mpirun -np 4 --map-by ppr:2:numa:PE=2 --bind-to core --report-bindings");
  ASSERT_EQ(a.numactl.size(), 4u);
  EXPECT_EQ(a.numactl[0], "numactl --cpunodebind=0 --membind=0");
  EXPECT_EQ(a.numactl[3], "numactl --cpunodebind=1 --membind=1");
  // More ranks than cores on a node: bound to the node, not to cores.
  EXPECT_NE(AdviseBinding(TwoSockets(), 16).mpirun.find("--bind-to numa"), std::string::npos);
}

TEST(TopoTest, CheckNamesTheGpuAndNicOffTheBinding) {
  const Topology t = TwoSockets();
  RankBinding b;
  b.local_rank = 3;  // GPU 3, NUMA 1; the NIC on NUMA 1 too
  EXPECT_TRUE(CheckBinding(t, b, {4, 5}).empty());
  auto off = CheckBinding(t, b, {0, 1});
  ASSERT_EQ(off.size(), 2u);
  EXPECT_EQ(off[0],
            "bound to CPUs 0-1 (NUMA 0), but its GPU 0000:13:00.0 (local rank 3 -> GPU 3) is on "
            "NUMA 1 (CPUs 4-7)");
  EXPECT_NE(off[1].find("its NIC mlx5_1 (0000:80:00.0) is on NUMA 1"), std::string::npos);
  b.local_rank = 0;  // GPU 0 on NUMA 0, nearest NIC on NUMA 1: off either way
  EXPECT_EQ(CheckBinding(t, b, {0, 1}).size(), 1u);
  EXPECT_EQ(CpuListString({7, 0, 1, 2, 5}), "0-2,5,7");
}

}  // namespace
}  // namespace stoker
