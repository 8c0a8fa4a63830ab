// The node's topology (hwloc): NUMA nodes and their cores, GPUs and NICs
// and the NUMA node each hangs off, and what follows for binding ranks: the
// launcher line to use for N ranks a node, and a check of each rank's actual
// binding (sched_getaffinity) against its GPU's and NIC's NUMA node.
//
// A rank's GPU is the (local rank mod GPU count)-th GPU in PCI order, as
// CUDA orders them with CUDA_DEVICE_ORDER=PCI_BUS_ID; its NIC is the
// nearest network device (same NUMA node as the GPU where there is one).
//
// STOKER_TOPO_FILE names a JSON file (the format of `stoker topo --json`'s
// "topology" object) read instead of the machine: for tests of machines
// this one is not, e.g. two NUMA nodes with four GPUs on a one-node VM.
//
// Thread safety: values; LoadTopology may be called from any thread.
#pragma once

#include <string>
#include <vector>

#include "stoker/comm.h"
#include "stoker/status.h"

namespace stoker {

struct TopoNuma {
  int index = 0;
  std::vector<int> cpus;  // logical CPU (PU) numbers
  int cores = 0;          // physical cores
  uint64_t memory_bytes = 0;
};

struct TopoDevice {
  std::string kind;       // "gpu" or "nic"
  std::string pci;        // "0000:17:00.0"
  std::string name;       // "NVIDIA H200", "mlx5_0 / ib0", "eth0"
  int numa = -1;          // -1: not attached to one (virtual machines)
  std::vector<int> cpus;  // the CPUs local to it
};

struct Topology {
  std::string source;  // "hwloc 2.9.0" or the STOKER_TOPO_FILE path
  int cores = 0;
  int pus = 0;
  std::vector<TopoNuma> numa;
  std::vector<TopoDevice> gpus;  // PCI order
  std::vector<TopoDevice> nics;
};

// This machine's topology, or STOKER_TOPO_FILE's. Unsupported when built
// without hwloc and no file is named.
Result<Topology> LoadTopology();

// The topology as a JSON object (the format STOKER_TOPO_FILE reads).
std::string TopologyJson(const Topology& topo);

// The launcher lines for `ranks_per_node` ranks: an `mpirun --map-by ...
// --bind-to ...` line, a `numactl` prefix per local rank, and why.
struct BindingAdvice {
  std::string mpirun;
  std::vector<std::string> numactl;  // by local rank
  std::string reason;
};
BindingAdvice AdviseBinding(const Topology& topo, int ranks_per_node);

// "0-3,8,10-11"
std::string CpuListString(const std::vector<int>& cpus);

// The CPUs this process may run on (sched_getaffinity).
std::vector<int> AffinityCpus();

// This process's binding: CPU set, the NUMA node holding it, the GPU and
// NIC of its local rank (see above). `gpu` overrides the GPU's PCI id when
// the caller knows the device in use (the nccl backend).
RankBinding CurrentBinding(const Topology* topo, const RankInfo& rank, const std::string& gpu);

// What is wrong with one rank's binding: empty when it sits on its GPU's
// NUMA node (and its NIC's, where the NIC is on one); else one line per
// problem, e.g. "bound to CPUs 0-63 (NUMA 0,1), its GPU 0000:17:00.0 is on
// NUMA 1".
std::vector<std::string> CheckBinding(const Topology& topo, const RankBinding& binding,
                                      const std::vector<int>& cpus);

// Every rank of a job (run under a launcher) checks its own binding; every
// rank gets all ranks' results, by rank. Outside a launcher: InvalidArgument
// saying how to launch it.
struct RankBindingCheck {
  RankBinding binding;
  std::vector<std::string> problems;  // empty: the rank is where it should be
};
Result<std::vector<RankBindingCheck>> CheckJobBinding(double timeout_s);

}  // namespace stoker
