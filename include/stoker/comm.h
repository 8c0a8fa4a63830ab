// Collectives benchmark: the operations a training job's ranks run
// (allreduce of gradients, allgather/reducescatter of sharded states,
// broadcast, alltoall, ring sendrecv), timed over a sweep of message sizes
// with nccl-tests' definitions of time and bandwidth, every result checked.
//
// Backends:
//   mpi   host memory through MPI (whatever transport Open MPI picks, UCX
//         included); present when built with STOKER_WITH_MPI.
//         Allreduce from 1 MiB up is stoker's own ring over nonblocking
//         point-to-point (src/comm/mpi_ring.h: Open MPI's algorithms copy
//         the input to the output and add through a scratch buffer malloc'd
//         per call, which above 32 MiB page-faults on every call; the ring
//         does neither), below it MPI_Allreduce. The
//         variables that choose (read when the backend starts):
//           STOKER_COMM_MPI_ALLREDUCE  auto (default), ring (every size) or
//                                      mpi (MPI_Allreduce, Open MPI's choice)
//           STOKER_COMM_MPI_SEGMENT    the ring's message size in bytes.
//                                      Default: 262144 (256 KiB)
//           STOKER_COMM_MPI_SLEEP_US   the ring's sleep between polls once a
//                                      wait has spun 100 us (oversubscribed
//                                      ranks give their core to the peer
//                                      they wait for). Default: 20; 0 spins.
//   nccl  device memory through NCCL; libnccl.so.2 and the CUDA driver
//         (libcuda.so.1) are loaded at run time (dlopen), so the same binary
//         runs where they are missing and says Unsupported, naming what is
//         missing. STOKER_NCCL_LIBRARY names the NCCL library file when it is
//         not on the loader's path (e.g. the one in torch's wheel).
//
// Processes come from a launcher (mpirun, srun, torchrun; rank.h). They meet
// ("bootstrap") through MPI where the build has it and the launcher is an MPI
// one, else over TCP: rank 0 listens on MASTER_ADDR at STOKER_COMM_PORT
// (default MASTER_PORT + 1; torchrun sets both MASTER_ variables) and every
// other rank connects; NCCL's unique id, the argument check, the bindings and
// the result checks travel over it.
//
// Numbers (nccl-tests, doc/PERFORMANCE.md): `bytes` is the operation's size
// as nccl-tests counts it (allgather: the gathered total; reducescatter: the
// input; alltoall: one rank's send buffer); time is the mean over iterations
// of one rank, averaged over ranks; algbw = bytes / time; busbw = algbw x
// factor, the factor being 2(n-1)/n for allreduce, (n-1)/n for allgather,
// reducescatter and alltoall, 1 for broadcast and sendrecv.
//
// Checks: inputs are small integers that depend on the rank and the element
// index, exact in every dtype, so every output element has one exact
// expected value (sums included, for up to 256 ranks in bfloat16). A wrong
// element fails the run on every rank with Corruption naming the rank, the
// operation, the size and the element.
//
// Failure: a rank that stops making progress for `timeout_s` (a peer died
// or hangs) reports TimedOut, naming what it was doing, through
// CommBenchOptions::on_stall, from the watchdog's thread. A collective
// cannot be cancelled, so the rank's own thread may never return: the
// caller decides what follows (`stoker bench comm` prints the message and
// exits with code 18, since waiting longer helps no one). The message names
// the ranks of its node that stopped (no heartbeat: each rank rewrites
// /dev/shm/stoker-comm-JOB-RANK every 200 ms) or lag behind; a dead rank is
// also named by the launcher (mpirun) or the TCP bootstrap. Should the
// collective return after all, RunCommBench returns that TimedOut.
//
// Thread safety: RunCommBench runs one benchmark at a time per process.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/rank.h"
#include "stoker/status.h"

namespace stoker {

enum class CommOp { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kAllToAll, kSendRecv };
enum class CommDtype { kFloat32, kBFloat16, kFloat16, kInt32 };

std::string_view CommOpName(CommOp op);           // "allreduce", ...
std::string_view CommDtypeName(CommDtype dtype);  // "float32", ...
Result<CommOp> ParseCommOp(std::string_view name);
Result<CommDtype> ParseCommDtype(std::string_view name);
size_t CommDtypeSize(CommDtype dtype);
const std::vector<CommOp>& AllCommOps();
const std::vector<CommDtype>& AllCommDtypes();
// nccl-tests' bus bandwidth factor for `ranks` ranks.
double BusBandwidthFactor(CommOp op, int ranks);

struct CommBenchOptions {
  std::string backend = "mpi";  // "mpi" or "nccl"
  std::vector<CommOp> ops = AllCommOps();
  std::vector<CommDtype> dtypes = {CommDtype::kFloat32};
  uint64_t min_bytes = 8;           // Default: 8 B (nccl-tests' -b)
  uint64_t max_bytes = 1ull << 30;  // Default: 1 GiB (nccl-tests' -e 1G)
  double step_factor = 2;           // Default: 2, sizes doubling (nccl-tests' -f 2)
  int warmup = 5;                   // Default: 5 untimed runs per size (nccl-tests' -w)
  int iters = 20;                   // Default: 20 timed runs per size (nccl-tests' -n)
  // Seconds without progress after which a rank gives up (see above).
  // Default: 120 s: longer than NCCL's communicator set-up on a large job.
  double timeout_s = 120;
  // Called once, from the watchdog's thread, when timeout_s passes without
  // progress (see above), with the TimedOut that says where; it may end the
  // process (the rank's thread is likely blocked for good). Must be
  // thread-safe. Default: null: the message goes to stderr and the rank
  // keeps waiting.
  std::function<void(const Status&)> on_stall;
  // The arguments as given, compared across ranks before anything runs, so
  // that a rank started with other arguments is named instead of hanging in
  // a collective of another size. Empty: the options' own summary is used.
  std::string arguments;
};

struct CommResult {
  CommOp op = CommOp::kAllReduce;
  CommDtype dtype = CommDtype::kFloat32;
  uint64_t bytes = 0;      // nccl-tests' size (see above)
  uint64_t count = 0;      // elements per rank buffer, as the API call takes it
  double time_us = 0;      // mean per iteration, averaged over ranks
  double max_time_us = 0;  // the slowest rank's mean
  double algbw_gbps = 0;   // GB/s, 1e9 bytes
  double busbw_gbps = 0;
  // Where the backend chose the algorithm: "stoker ring" or "MPI_Allreduce"
  // (the mpi backend's allreduce); empty where the library chooses.
  std::string algorithm;
};

// Where one rank runs: what `stoker topo --check` judges.
struct RankBinding {
  int rank = 0;
  int local_rank = 0;
  std::string host;
  std::string cpus;  // sched_getaffinity, as a list "0-3,8"
  int numa = -1;     // the NUMA node holding all its CPUs; -1: several or unknown
  std::string gpu;   // PCI bus id of its GPU (nccl), empty for mpi
  std::string nic;   // the network device nearest to it (hwloc), empty if none
};

struct CommEnvironment {
  std::string backend;
  std::string library_version;  // "Open MPI v4.1.4, ..." or "NCCL 2.27.3"
  std::string bootstrap;        // "mpi" or "tcp MASTER_ADDR:PORT"
  // NCCL_*, OMPI_MCA_*, UCX_*, PMIX_MCA_* variables as the ranks saw them
  // (rank 0's).
  std::map<std::string, std::string> variables;
};

struct CommReport {
  RankInfo rank;  // this process
  CommEnvironment environment;
  std::vector<RankBinding> bindings;  // every rank's, by rank
  std::vector<CommResult> results;
};

// Runs the benchmark on every rank of the job; every rank returns the same
// report (but its own `rank`). Outside a launcher: InvalidArgument saying how
// to launch it. A backend the build or the machine lacks: Unsupported.
Result<CommReport> RunCommBench(const CommBenchOptions& options);

// The sizes of the sweep: min, min x factor, ..., up to max (max included).
std::vector<uint64_t> CommSizes(const CommBenchOptions& options);

// ---- tuning ---------------------------------------------------------------
//
// NCCL reads NCCL_ALGO / NCCL_PROTO, and Open MPI its MCA parameters, once,
// when the communicator (MPI) starts; so each setting is measured by a fresh
// job: `launcher stoker bench comm ... --json` with the setting in its
// environment (mpirun also gets `-x VAR` for each, for other nodes). The
// settings are run in turn, `repeats` rounds over all of them, so that drift
// of the machine spreads over all settings alike.

struct CommTuneSetting {
  std::string name;                        // "default", "Ring/LL128", "ring (4)"
  std::map<std::string, std::string> env;  // empty for the default
};

// Settings to sweep: nccl: NCCL_ALGO in Ring, Tree, NVLS, CollnetDirect,
// CollnetChain x NCCL_PROTO in Simple, LL, LL128 (a pair the machine lacks
// fails its runs and is reported as unavailable); mpi: stoker's ring with
// other segment sizes and spinning waits, MPI_Allreduce with Open MPI's own
// choice, and its tuned allreduce algorithms 1-6 (STOKER_COMM_MPI_* above).
// The default (no variable set) comes first.
Result<std::vector<CommTuneSetting>> CommTuneSettings(const std::string& backend, CommOp op);

struct CommTuneOptions {
  std::string backend = "nccl";
  // The command that starts the job, e.g. {"mpirun", "-np", "8"} or
  // {"torchrun", "--nproc-per-node", "8", "--no-python"}. Required.
  std::vector<std::string> launcher;
  std::string stoker = "/proc/self/exe";  // the binary the job runs
  CommOp op = CommOp::kAllReduce;
  CommDtype dtype = CommDtype::kFloat32;
  uint64_t min_bytes = 25ull << 20;  // Default: 25 MiB, DDP's gradient bucket
  uint64_t max_bytes = 25ull << 20;
  double step_factor = 4;
  int repeats = 3;  // Default: 3 runs of every setting
  int warmup = 5;
  int iters = 20;
  double timeout_s = 300;  // a child job taking longer is killed, its setting failed
  // Only these settings (names as CommTuneSettings gives them), plus the
  // default; empty: all.
  std::vector<std::string> only;
};

struct CommTuneSize {
  uint64_t bytes = 0;
  double default_busbw = 0;   // median over repeats, GB/s
  double default_spread = 0;  // (max - min) / median of the default's runs
  std::string best;           // the setting with the highest median
  double best_busbw = 0;
  double best_spread = 0;
  double gain = 0;             // best / default - 1
  bool beats_default = false;  // gain above both spreads
};

struct CommTuneReport {
  std::vector<CommTuneSetting> settings;
  std::vector<std::string> unavailable;  // "NVLS/LL: <why>"
  // What busbw below holds: "busbw", or "algbw" for a job of one rank,
  // whose bus bandwidth is 0 by nccl-tests' definition (factor 2(n-1)/n).
  std::string metric = "busbw";
  // Every run: busbw[setting][size index][repeat], GB/s.
  std::vector<std::vector<std::vector<double>>> busbw;
  std::vector<CommTuneSize> sizes;
  // The setting for the environment file: the one whose geometric mean
  // gain over the sizes is highest, if it beats the default beyond the
  // noise (the mean spread); else the default.
  CommTuneSetting recommended;
  double recommended_gain = 0;
  double noise = 0;
  int world_size = 0;
};

Result<CommTuneReport> TuneComm(const CommTuneOptions& options);

// The environment file for `report`: comments saying what was measured,
// then `export VAR=value` per variable of the recommended setting (none
// when the default is best).
std::string CommTuneEnvFile(const CommTuneOptions& options, const CommTuneReport& report);

}  // namespace stoker
