// One way of running the collectives under test (MPI on host memory, NCCL on
// device memory), behind the benchmark loop of comm_bench.cc.
//
// Thread safety: one thread at a time.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "comm/bootstrap.h"
#include "stoker/comm.h"

namespace stoker::comm {

class CollectiveBackend {
 public:
  virtual ~CollectiveBackend() = default;
  // "Open MPI v4.1.4 ..." / "NCCL 2.27.3".
  virtual std::string version() const = 0;
  // PCI bus id of the device in use; empty for host memory.
  virtual std::string device() const { return ""; }
  // Send and receive buffers of `bytes` each (the largest size).
  virtual Status Allocate(size_t bytes) = 0;
  // Fills the send buffer from host memory.
  virtual Status Upload(const void* host, size_t bytes) = 0;
  // Copies the receive buffer's first `bytes` to host memory.
  virtual Status Download(void* host, size_t bytes) = 0;
  // Puts `bytes` at `offset` of the receive buffer: how a fault-injecting
  // decorator corrupts a result (tests/comm/comm_faults.cc).
  virtual Status Poke(size_t offset, const void* host, size_t bytes) = 0;
  // Clears the receive buffer (so a check cannot pass on stale results).
  virtual Status ClearOutput(size_t bytes) = 0;
  // Starts one operation; `count` elements per rank buffer (comm.h). Root of
  // broadcast: rank 0. sendrecv: to rank+1, from rank-1.
  virtual Status Run(CommOp op, CommDtype dtype, size_t count) = 0;
  // Waits for every operation started (a no-op where Run blocks).
  virtual Status Wait() = 0;
  // The algorithm Run uses for `op` at `count` elements of `dtype`, where the
  // backend chooses it ("stoker ring", "MPI_Allreduce"); empty where the
  // library does (NCCL).
  virtual std::string Algorithm(CommOp op, CommDtype dtype, size_t count) const {
    (void)op, (void)dtype, (void)count;
    return "";
  }
};

Result<std::unique_ptr<CollectiveBackend>> MakeMpiBackend(Bootstrap& bootstrap);
Result<std::unique_ptr<CollectiveBackend>> MakeNcclBackend(Bootstrap& bootstrap,
                                                           const RankInfo& rank);

// Wraps the backend RunBench made, given this rank and the world size. The
// test binary's fault injection (tests/comm/comm_faults.cc) is one; the
// product's RunCommBench passes none, so no fault can be switched on in it.
using BackendDecorator = std::function<std::unique_ptr<CollectiveBackend>(
    std::unique_ptr<CollectiveBackend> backend, int rank, int size)>;

// RunCommBench (comm.h) on the backend `decorate` returns (empty: the one
// made).
Result<CommReport> RunBench(const CommBenchOptions& options, const BackendDecorator& decorate);

}  // namespace stoker::comm
