// How the ranks of a job meet before and around the collectives under test:
// small messages only (NCCL's unique id, argument summaries, bindings,
// per-size check results, timings). Two implementations: MPI (the launcher
// is an MPI one and the build has MPI) and TCP through rank 0 (comm.h).
//
// Thread safety: one thread calls a Bootstrap at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "stoker/comm.h"
#include "stoker/rank.h"
#include "stoker/status.h"

namespace stoker::comm {

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi" or "tcp HOST:PORT".
  virtual std::string description() const = 0;
  // Every rank's `mine`, by rank, on every rank. A rank that has gone away
  // is an error naming it (where the transport can tell).
  virtual Result<std::vector<std::string>> AllGather(const std::string& mine) = 0;
  // True for MPI: MPI is initialised and MPI_COMM_WORLD is the job.
  virtual bool is_mpi() const { return false; }
};

// Every rank's status, gathered: the first failure (lowest rank) on every
// rank, so that all ranks take the same path after a step one may fail.
Status AgreeOnStatus(Bootstrap& boot, const Status& mine);

// A rank's binding (and extra lines) as one message, and back.
std::string EncodeBinding(const RankBinding& b, const std::vector<std::string>& extra = {});
RankBinding DecodeBinding(const std::string& s, std::vector<std::string>* extra = nullptr);

// MPI when the build has it and `rank` comes from an MPI launcher (Open MPI,
// MPICH, Slurm), else TCP (needs MASTER_ADDR; MASTER_PORT or
// STOKER_COMM_PORT). `timeout_s` bounds the TCP set-up and each exchange.
Result<std::unique_ptr<Bootstrap>> MakeBootstrap(const RankInfo& rank, double timeout_s);
// The MPI one, or Unsupported when the build lacks MPI.
Result<std::unique_ptr<Bootstrap>> MakeMpiBootstrap(const RankInfo& rank);
Result<std::unique_ptr<Bootstrap>> MakeTcpBootstrap(const RankInfo& rank, double timeout_s);
// The MPI library's version string, empty without MPI.
std::string MpiLibraryVersion();

}  // namespace stoker::comm
