// Where this process stands in a job: world rank and size, rank and size on
// its node, and the node's index, read from the launcher's environment.
//
// One place for it, used by the loader, the checkpointer, the Python package
// and the comm tools, with or without MPI in the build: the launchers all say
// who a process is through environment variables, so no MPI call is needed.
//
//   launcher   world rank / size             local rank / size                    node
//   torchrun   RANK / WORLD_SIZE             LOCAL_RANK / LOCAL_WORLD_SIZE        GROUP_RANK
//   Open MPI   OMPI_COMM_WORLD_RANK / _SIZE  OMPI_COMM_WORLD_LOCAL_RANK / _SIZE   (none)
//   MPICH/PMI  PMI_RANK / PMI_SIZE           MPI_LOCALRANKID / MPI_LOCALNRANKS    (none)
//   Slurm      SLURM_PROCID / SLURM_NTASKS   SLURM_LOCALID / SLURM_NTASKS_PER_NODE SLURM_NODEID
//                                            (else SLURM_TASKS_PER_NODE, "4(x2),3")
//
// The first launcher, in this order, whose rank and size variables are set
// is the one used: torchrun started by srun sees both RANK and SLURM_PROCID,
// and torchrun's are the ranks of the job. A launcher's variables that are
// set but malformed or inconsistent (a rank not below the size, a rank
// variable without its size) are an InvalidArgument naming the variables;
// they are never silently replaced by another launcher's. A rank variable
// without its size variable is not a launcher (a stale RANK in a shell).
//
// Thread safety: DiscoverRank() reads the environment (getenv); call it while
// no other thread changes the environment. The other functions are pure.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "stoker/status.h"

namespace stoker {

struct RankInfo {
  int rank = 0;        // in the world, [0, world_size)
  int world_size = 1;  // number of processes in the job
  int local_rank = 0;  // among the processes on this node, [0, local_size)
  int local_size = 1;  // processes on this node; -1 where the launcher does not say
  // This node's index among the job's nodes, [0, num_nodes); -1 where the
  // launcher does not say (Open MPI, MPICH).
  int node = 0;
  int num_nodes = 1;  // -1 where the launcher does not say
  // "torchrun", "openmpi", "mpich", "slurm"; empty when no launcher started
  // this process (then rank 0 of 1).
  std::string launcher;

  bool launched() const { return !launcher.empty(); }
  // "rank 3/8 (local 3/4, node 0/2, from torchrun)"
  std::string ToString() const;
};

// Looks a variable up; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// From the process environment.
Result<RankInfo> DiscoverRank();
// From the given lookup (tests, and callers with their own environment).
Result<RankInfo> DiscoverRank(const EnvLookup& env);
// From a map (the Python binding passes os.environ's items).
Result<RankInfo> DiscoverRank(const std::map<std::string, std::string>& env);

// Every variable DiscoverRank reads, for callers that start processes with
// a clean environment (tests, `stoker tune comm`'s children).
std::vector<std::string> RankVariables();

// The usual ways to start N processes, for errors that say how to launch.
inline constexpr const char* kLaunchHint =
    "start it with a launcher: mpirun -np N ..., srun -n N ..., or torchrun --nproc-per-node N "
    "--no-python ...";

}  // namespace stoker
