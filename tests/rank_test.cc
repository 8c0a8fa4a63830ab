// Rank discovery over the environments of each launcher (rank.h).
#include "stoker/rank.h"

#include <gtest/gtest.h>

namespace stoker {
namespace {

using Env = std::map<std::string, std::string>;

RankInfo Ok(const Env& env) {
  auto r = DiscoverRank(env);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : RankInfo{};
}

std::string Error(const Env& env) {
  auto r = DiscoverRank(env);
  EXPECT_FALSE(r.ok()) << "accepted: " << (r.ok() ? r->ToString() : "");
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  return r.status().message();
}

TEST(RankTest, NoLauncherIsRankZeroOfOne) {
  RankInfo r = Ok({});
  EXPECT_FALSE(r.launched());
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  EXPECT_EQ(r.local_size, 1);
  // salloc's shell: a size without a rank is not a launched process.
  EXPECT_FALSE(Ok({{"SLURM_NTASKS", "8"}}).launched());
  // A stale RANK alone is no launcher either.
  EXPECT_FALSE(Ok({{"RANK", "1"}}).launched());
}

TEST(RankTest, Torchrun) {
  RankInfo r = Ok({{"RANK", "5"},
                   {"WORLD_SIZE", "16"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "4"},
                   {"GROUP_RANK", "1"},
                   {"GROUP_WORLD_SIZE", "4"}});
  EXPECT_EQ(r.launcher, "torchrun");
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.world_size, 16);
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 4);
  EXPECT_EQ(r.node, 1);
  EXPECT_EQ(r.num_nodes, 4);
  EXPECT_EQ(r.ToString(), "rank 5/16 (local 1/4, node 1/4, from torchrun)");
}

TEST(RankTest, OpenMpi) {
  RankInfo r = Ok({{"OMPI_COMM_WORLD_RANK", "3"},
                   {"OMPI_COMM_WORLD_SIZE", "8"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                   {"OMPI_COMM_WORLD_NODE_RANK", "3"}});
  EXPECT_EQ(r.launcher, "openmpi");
  EXPECT_EQ(r.rank, 3);
  EXPECT_EQ(r.local_rank, 3);
  EXPECT_EQ(r.local_size, 4);
  EXPECT_EQ(r.node, -1);  // Open MPI does not say which node
  // All on one node: then the node is known.
  r = Ok({{"OMPI_COMM_WORLD_RANK", "1"},
          {"OMPI_COMM_WORLD_SIZE", "4"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(r.node, 0);
  EXPECT_EQ(r.num_nodes, 1);
}

TEST(RankTest, MpichHydra) {
  RankInfo r = Ok(
      {{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "1"}});
  EXPECT_EQ(r.launcher, "mpich");
  EXPECT_EQ(r.rank, 2);
  EXPECT_EQ(r.world_size, 3);
  EXPECT_EQ(r.local_size, 1);
}

TEST(RankTest, SlurmWithTasksPerNodeList) {
  Env env = {{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "11"}, {"SLURM_LOCALID", "1"},
             {"SLURM_NODEID", "2"}, {"SLURM_NNODES", "3"},  {"SLURM_TASKS_PER_NODE", "4(x2),3"}};
  RankInfo r = Ok(env);
  EXPECT_EQ(r.launcher, "slurm");
  EXPECT_EQ(r.rank, 9);
  EXPECT_EQ(r.local_size, 3);  // node 2 holds 3 tasks
  EXPECT_EQ(r.node, 2);
  EXPECT_EQ(r.num_nodes, 3);
  env["SLURM_NODEID"] = "0";
  EXPECT_EQ(Ok(env).local_size, 4);
  env["SLURM_NTASKS_PER_NODE"] = "2";  // --ntasks-per-node wins
  EXPECT_EQ(Ok(env).local_size, 2);
  env.erase("SLURM_NTASKS_PER_NODE");
  env["SLURM_TASKS_PER_NODE"] = "4(y2)";
  EXPECT_NE(Error(env).find("SLURM_TASKS_PER_NODE='4(y2)'"), std::string::npos);
  // Local rank without any size: the size is unknown, not invented.
  RankInfo bare = Ok({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(bare.local_rank, 1);
  EXPECT_EQ(bare.local_size, -1);
}

TEST(RankTest, TorchrunUnderSrunIsTorchrun) {
  RankInfo r = Ok({{"SLURM_PROCID", "1"},
                   {"SLURM_NTASKS", "2"},
                   {"RANK", "5"},
                   {"WORLD_SIZE", "16"},
                   {"LOCAL_RANK", "5"},
                   {"LOCAL_WORLD_SIZE", "8"}});
  EXPECT_EQ(r.launcher, "torchrun");
  EXPECT_EQ(r.rank, 5);
}

TEST(RankTest, InconsistentValuesAreNamed) {
  EXPECT_EQ(Error({{"RANK", "4"}, {"WORLD_SIZE", "4"}}),
            "RANK=4 is not below WORLD_SIZE=4 (from torchrun)");
  EXPECT_EQ(Error({{"RANK", "0"}, {"WORLD_SIZE", "four"}}),
            "environment variable WORLD_SIZE='four' is not a non-negative integer");
  EXPECT_EQ(Error({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}),
            "environment variable RANK='-1' is not a non-negative integer");
  EXPECT_EQ(Error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "WORLD_SIZE=0 (from torchrun)");
  EXPECT_EQ(
      Error({{"OMPI_COMM_WORLD_RANK", "1"},
             {"OMPI_COMM_WORLD_SIZE", "4"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
      "OMPI_COMM_WORLD_LOCAL_RANK=2 is not below OMPI_COMM_WORLD_LOCAL_SIZE=2 (from openmpi)");
  EXPECT_EQ(Error({{"PMI_RANK", "1"},
                   {"PMI_SIZE", "2"},
                   {"MPI_LOCALRANKID", "0"},
                   {"MPI_LOCALNRANKS", "3"}}),
            "MPI_LOCALNRANKS=3 is above PMI_SIZE=2 (from mpich)");
  EXPECT_EQ(Error({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MPI_LOCALNRANKS", "2"}}),
            "MPI_LOCALNRANKS is set but MPI_LOCALRANKID is not (from mpich)");
  EXPECT_EQ(Error({{"SLURM_PROCID", "1"},
                   {"SLURM_NTASKS", "2"},
                   {"SLURM_NODEID", "2"},
                   {"SLURM_NNODES", "2"}}),
            "SLURM_NODEID=2 is not below SLURM_NNODES=2 (from slurm)");
  EXPECT_EQ(Error({{"RANK", "1"},
                   {"WORLD_SIZE", "4"},
                   {"LOCAL_RANK", "1"},
                   {"LOCAL_WORLD_SIZE", "4"},
                   {"GROUP_RANK", "1"}}),
            "LOCAL_WORLD_SIZE equals WORLD_SIZE (one node) but GROUP_RANK=1 (from torchrun)");
  // A broken launcher is not replaced by the next one in line.
  EXPECT_EQ(Error({{"RANK", "9"},
                   {"WORLD_SIZE", "2"},
                   {"OMPI_COMM_WORLD_RANK", "1"},
                   {"OMPI_COMM_WORLD_SIZE", "2"}}),
            "RANK=9 is not below WORLD_SIZE=2 (from torchrun)");
}

TEST(RankTest, ProcessEnvironmentAndVariableList) {
  auto vars = RankVariables();
  EXPECT_NE(std::find(vars.begin(), vars.end(), "SLURM_NODEID"), vars.end());
  EXPECT_NE(std::find(vars.begin(), vars.end(), "OMPI_COMM_WORLD_LOCAL_SIZE"), vars.end());
  for (const auto& v : vars) unsetenv(v.c_str());
  setenv("PMI_RANK", "1", 1);
  setenv("PMI_SIZE", "2", 1);
  auto r = DiscoverRank();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->launcher, "mpich");
  EXPECT_EQ(r->rank, 1);
}

}  // namespace
}  // namespace stoker
