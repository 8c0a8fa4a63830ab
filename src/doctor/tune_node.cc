// tune node: the node's sysctl, limits, mpirun mapping, NCCL environment and
// MPS commands, from what the doctor reads. Text only: nothing is changed.
#include <algorithm>
#include <map>

#include "doctor/internal.h"
#include "stoker/tune.h"

namespace stoker {
namespace {

// KEY=VALUE lines of an env file; "export " and comments allowed.
Result<std::vector<std::string>> ReadEnvFile(const std::string& path) {
  auto env = NewNodeEnv("/");
  STOKER_ASSIGN_OR_RETURN(std::string text, env->ReadFile(path));
  std::vector<std::string> out;
  for (std::string line : doctor::SplitLines(text)) {
    line = doctor::Trim(line);
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind("export ", 0) == 0) line = doctor::Trim(line.substr(7));
    const auto eq = line.find('=');
    if (eq == std::string::npos || eq == 0) {
      return InvalidArgument(path + ": '" + line + "' is not a KEY=VALUE line");
    }
    out.push_back(line);
  }
  return out;
}

}  // namespace

std::string NodeTuning::Text() const {
  std::string s = "# stoker tune node: settings for this node (nothing here was applied)\n";
  for (const auto& n : notes) s += "#   found: " + n + "\n";
  if (!doctor.empty()) {
    s += "\n# ---- stoker doctor's findings here, to fix by hand\n";
    for (const auto& d : doctor) s += "# " + d + "\n";
  }
  s += "\n# ---- sysctl: /etc/sysctl.d/90-stoker.conf, then sysctl --system\n";
  for (const auto& l : sysctl) s += l + "\n";
  s += "\n# ---- limits: /etc/security/limits.d/90-stoker.conf (services: LimitMEMLOCK=infinity)\n";
  for (const auto& l : limits) s += l + "\n";
  s += "\n# ---- ranks: one per GPU, bound next to it\n" + mpirun + "\n";
  s += "\n# ---- NCCL environment\n";
  for (const auto& l : nccl_env) s += (l.rfind('#', 0) == 0 ? l : "export " + l) + "\n";
  s += "\n# ---- MPS (GPU sharing between processes): to run by hand, as root; stoker never does\n";
  for (const auto& l : mps) s += l + "\n";
  return s;
}

Result<NodeTuning> PlanNodeTuning(const NodeTuneOptions& o) {
  std::shared_ptr<NodeEnv> env = o.env ? o.env : NewNodeEnv(o.sysroot);
  const NodeFacts f = GatherNodeFacts(*env);
  NodeTuning t;
  const int numa = std::max<int>(1, int(f.numa.size()));
  const int cpus = f.online_cpus > 0 ? f.online_cpus : 1;
  t.notes.push_back(std::to_string(numa) + " NUMA node(s), " + std::to_string(cpus) + " CPUs, " +
                    doctor::BytesText(f.mem_total) + " memory, kernel " +
                    (f.kernel.empty() ? "unknown" : f.kernel));
  t.notes.push_back(std::to_string(f.gpus.size()) + " GPU(s), " + std::to_string(f.nics.size()) +
                    " NIC(s)");
  for (const auto& u : f.unreadable) t.notes.push_back("could not read: " + u);
  // The quick checks' problems, with their fixes (the measuring ones are
  // for `stoker doctor` itself: they take seconds and need folders).
  DoctorOptions d;
  d.env = env;
  for (const auto& c : DoctorChecks()) {
    if (!c.exclusive) d.only.push_back(c.name);
  }
  if (auto report = RunDoctor(d); report.ok()) {
    for (const auto& c : report->checks) {
      if (c.state != CheckState::kWarn && c.state != CheckState::kFail) continue;
      t.doctor.push_back(std::string(CheckStateName(c.state)) + " " + c.name + ": " + c.summary +
                         (c.fix.empty() ? "" : " | fix: " + c.fix));
    }
  }

  // Dirty page cache: the checkpoint writes and the node cache's fills are
  // large sequential writes; bounded dirty bytes (not a share of a large
  // memory) keep writeback steady instead of a multi-second flush that
  // stalls readers. 256 MiB / 1 GiB, or 1% / 4% of memory when that is less.
  const uint64_t mem = f.mem_total ? f.mem_total : (64ull << 30);
  const uint64_t bg = std::min<uint64_t>(256ull << 20, mem / 100);
  const uint64_t dirty = std::min<uint64_t>(1ull << 30, mem / 25);
  t.sysctl.push_back("vm.dirty_background_bytes = " + std::to_string(bg) +
                     "  # start writeback early (checkpoint and cache writes)");
  t.sysctl.push_back("vm.dirty_bytes = " + std::to_string(dirty) +
                     "  # a writer blocks past this, not the whole node");
  t.sysctl.push_back("vm.swappiness = 1  # keep the loader's and the pinned buffers' pages in RAM");
  t.sysctl.push_back("vm.zone_reclaim_mode = 0  # allocate remotely rather than reclaim cache");
  if (numa > 1) {
    t.sysctl.push_back("kernel.numa_balancing = 0  # ranks are bound; do not migrate their pages");
  }
  // Ceph's messenger reads 4 MiB objects over TCP: large socket buffers keep
  // a window of several objects open on a 100 Gb/s link.
  t.sysctl.push_back("net.core.rmem_max = 268435456  # Ceph/NCCL sockets may grow to 256 MiB");
  t.sysctl.push_back("net.core.wmem_max = 268435456");
  t.sysctl.push_back("net.ipv4.tcp_rmem = 4096 87380 134217728");
  t.sysctl.push_back("net.ipv4.tcp_wmem = 4096 65536 134217728");
  t.sysctl.push_back("net.core.netdev_max_backlog = 250000  # bursts from many OSDs at once");

  t.limits.push_back("*  -  memlock  unlimited  # RDMA registration (NCCL over IB/RoCE)");
  t.limits.push_back("*  -  nofile   1048576    # shards, chunks, a socket per OSD");
  if (f.limits_known && f.limits.memlock.soft != kUnlimited) {
    t.notes.push_back("memlock is " + doctor::BytesText(f.limits.memlock.soft) + " now");
  }
  if (f.thp == "always") {
    t.sysctl.push_back(
        "# THP is 'always': echo madvise > /sys/kernel/mm/transparent_hugepage/enabled");
  }

  // One rank per GPU, each bound to the cores of its GPU's NUMA node.
  const uint32_t ranks = o.ranks ? o.ranks : std::max<uint32_t>(1, uint32_t(f.gpus.size()));
  std::map<int, int> gpus_per_node;
  for (const auto& g : f.gpus) ++gpus_per_node[g.numa_node];
  const bool even =
      !gpus_per_node.empty() && !gpus_per_node.count(-1) && int(gpus_per_node.size()) == numa &&
      std::all_of(gpus_per_node.begin(), gpus_per_node.end(),
                  [&](const auto& kv) { return kv.second == gpus_per_node.begin()->second; });
  if (even && numa > 1) {
    const int per = gpus_per_node.begin()->second;
    const int pe = std::max(1, cpus / numa / per);
    t.mpirun = "mpirun -np " + std::to_string(ranks) + " --map-by ppr:" + std::to_string(per) +
               ":numa:PE=" + std::to_string(pe) + " --bind-to core --report-bindings";
    t.notes.push_back(std::to_string(per) + " GPU(s) on each of " + std::to_string(numa) +
                      " NUMA nodes: " + std::to_string(pe) + " cores per rank");
  } else {
    const int pe = std::max(1, cpus / int(ranks));
    t.mpirun = "mpirun -np " + std::to_string(ranks) + " --map-by slot:PE=" + std::to_string(pe) +
               " --bind-to core --report-bindings";
    if (numa > 1) {
      t.notes.push_back(
          "GPUs not spread evenly over the NUMA nodes: cores bound in order; "
          "check with `stoker doctor --only gpu-numa`");
    }
  }
  t.mpirun += "  # rank r uses cuda:r";

  const std::string comm = o.comm_env_file;
  if (!comm.empty()) {
    STOKER_ASSIGN_OR_RETURN(t.nccl_env, ReadEnvFile(comm));
    t.nccl_env.insert(t.nccl_env.begin(), "# from " + comm + " (stoker tune comm)");
  } else {
    t.nccl_env.push_back("# no `stoker tune comm` file given (--comm-env FILE): NCCL's defaults");
    if (!f.nics.empty()) {
      t.nccl_env.push_back(
          "# " + std::to_string(f.nics.size()) +
          " NIC(s) found; `stoker tune comm` picks NCCL_IB_HCA/NCCL_SOCKET_IFNAME");
    }
  }

  if (f.gpus.empty()) {
    t.mps.push_back("# no GPU found on this node: nothing to share");
  }
  t.mps.push_back("export CUDA_MPS_PIPE_DIRECTORY=" + o.mps_pipe_dir);
  t.mps.push_back("export CUDA_MPS_LOG_DIRECTORY=" + o.mps_log_dir);
  t.mps.push_back("mkdir -p " + o.mps_pipe_dir + " " + o.mps_log_dir);
  for (size_t i = 0; i < f.gpus.size(); ++i) {
    t.mps.push_back("nvidia-smi -i " + f.gpus[i].address + " -c EXCLUSIVE_PROCESS");
  }
  if (f.gpus.empty()) t.mps.push_back("nvidia-smi -c EXCLUSIVE_PROCESS  # each GPU");
  t.mps.push_back("nvidia-cuda-mps-control -d");
  t.mps.push_back("# stop: echo quit | nvidia-cuda-mps-control; nvidia-smi -c DEFAULT");
  return t;
}

}  // namespace stoker
