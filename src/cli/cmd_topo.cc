// stoker topo: the node's NUMA nodes, cores, GPUs and NICs (hwloc), the
// binding to use for N ranks a node, and with --check (under a launcher)
// each rank's actual binding judged against its GPU's and NIC's NUMA node.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "stoker/rank.h"
#include "stoker/topo.h"

namespace stoker::cli {

namespace {

std::string NumaName(int n) { return n < 0 ? "?" : std::to_string(n); }

int Show(const Topology& t, int ranks, bool json) {
  const BindingAdvice a = AdviseBinding(t, ranks);
  if (json) {
    nlohmann::json j;
    j["topology"] = nlohmann::json::parse(TopologyJson(t));
    j["advice"] = {{"ranks_per_node", ranks},
                   {"mpirun", a.mpirun},
                   {"numactl", a.numactl},
                   {"reason", a.reason}};
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }
  std::printf("topology (%s): %d cores, %d CPUs, %zu NUMA node(s)\n", t.source.c_str(), t.cores,
              t.pus, t.numa.size());
  for (const auto& n : t.numa) {
    std::printf("  NUMA %d: CPUs %s (%d cores), %s\n", n.index, CpuListString(n.cpus).c_str(),
                n.cores, HumanBytes(double(n.memory_bytes)).c_str());
  }
  for (const auto* list : {&t.gpus, &t.nics}) {
    for (size_t i = 0; i < list->size(); ++i) {
      const TopoDevice& d = (*list)[i];
      std::printf("  %s %zu: %s %s, NUMA %s, CPUs %s\n", d.kind.c_str(), i, d.pci.c_str(),
                  d.name.c_str(), NumaName(d.numa).c_str(), CpuListString(d.cpus).c_str());
    }
  }
  if (t.gpus.empty()) std::printf("  no GPU\n");
  if (t.nics.empty()) std::printf("  no PCI network device\n");
  std::printf("for %d rank(s) per node: %s\n  %s\n", ranks, a.reason.c_str(), a.mpirun.c_str());
  for (size_t r = 0; r < a.numactl.size(); ++r) {
    std::printf("  local rank %zu: %s\n", r, a.numactl[r].c_str());
  }
  return 0;
}

int Check(double timeout, bool json) {
  auto checks = CheckJobBinding(timeout);
  if (!checks.ok()) return Fail(checks.status());
  auto me = DiscoverRank();
  if (!me.ok() || me->rank != 0) {
    // Rank 0 reports for all; the others' verdict is its exit code.
    for (const auto& c : *checks) {
      if (!c.problems.empty()) return kExitProblems;
    }
    return 0;
  }
  int off = 0;
  nlohmann::json j = nlohmann::json::array();
  for (const auto& c : *checks) {
    const RankBinding& b = c.binding;
    off += c.problems.empty() ? 0 : 1;
    j.push_back({{"rank", b.rank},
                 {"local_rank", b.local_rank},
                 {"host", b.host},
                 {"cpus", b.cpus},
                 {"numa", b.numa},
                 {"gpu", b.gpu},
                 {"nic", b.nic},
                 {"ok", c.problems.empty()},
                 {"problems", c.problems}});
    if (json) continue;
    std::printf("rank %d (local %d) on %s: CPUs %s, NUMA %s, GPU %s, NIC %s: %s\n", b.rank,
                b.local_rank, b.host.c_str(), b.cpus.c_str(), NumaName(b.numa).c_str(),
                b.gpu.empty() ? "-" : b.gpu.c_str(), b.nic.empty() ? "-" : b.nic.c_str(),
                c.problems.empty() ? "ok" : "OFF");
    for (const auto& p : c.problems) std::printf("  rank %d: %s\n", b.rank, p.c_str());
  }
  if (json) {
    std::printf("%s\n", nlohmann::json{{"ranks", j}, {"off", off}}.dump(1).c_str());
  } else if (off > 0) {
    std::string names;
    for (const auto& c : *checks) {
      if (!c.problems.empty())
        names += (names.empty() ? "" : ", ") + std::to_string(c.binding.rank);
    }
    std::printf(
        "%d of %zu ranks are off their GPU's/NIC's NUMA node: ranks %s (stoker topo shows "
        "the binding to use)\n",
        off, checks->size(), names.c_str());
  } else {
    std::printf("all %zu ranks sit on their GPU's and NIC's NUMA node\n", checks->size());
  }
  return off > 0 ? kExitProblems : 0;
}

}  // namespace

void RegisterTopo(CLI::App& app, Action* action) {
  auto* cmd = app.add_subcommand(
      "topo",
      "The node's NUMA nodes, cores, GPUs and NICs (hwloc) and the binding for N ranks a node; "
      "--check, run under mpirun, names every rank bound away from its GPU's/NIC's NUMA node");
  struct Args {
    int ranks = 0;
    bool check = false;
    bool json = false;
    double timeout = 60;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("--ranks", args->ranks,
                  "ranks per node to advise for (default: one per GPU, else one per NUMA node)");
  cmd->add_flag("--check", args->check,
                "judge each rank's actual binding (run under mpirun/srun/torchrun); exit 1 when "
                "any rank is off");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->add_option("--timeout", args->timeout, "seconds for the ranks to meet (--check)")
      ->capture_default_str();
  cmd->callback([args, action] {
    *action = [args]() -> int {
      if (args->check) return Check(args->timeout, args->json);
      auto t = LoadTopology();
      if (!t.ok()) return Fail(t.status());
      int ranks = args->ranks;
      if (ranks <= 0) {
        ranks = !t->gpus.empty() ? static_cast<int>(t->gpus.size())
                                 : std::max<int>(1, static_cast<int>(t->numa.size()));
      }
      return Show(*t, ranks, args->json);
    };
  });
}

}  // namespace stoker::cli
