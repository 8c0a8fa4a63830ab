// Topology: loading (hwloc or STOKER_TOPO_FILE), binding advice and the
// binding check (topo.h). Nothing here needs hwloc.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "comm/topo_internal.h"

namespace stoker {

namespace {

using nlohmann::json;

json DeviceJson(const TopoDevice& d) {
  return {{"pci", d.pci}, {"name", d.name}, {"numa", d.numa}, {"cpus", d.cpus}};
}

Result<Topology> FromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("STOKER_TOPO_FILE=" + path + ": cannot be read");
  try {
    json j = json::parse(in);
    if (j.contains("topology")) j = j["topology"];
    Topology t;
    t.source = path;
    t.cores = j.value("cores", 0);
    t.pus = j.value("pus", 0);
    for (const auto& n : j.at("numa")) {
      TopoNuma numa;
      numa.index = n.at("index").get<int>();
      numa.cpus = n.at("cpus").get<std::vector<int>>();
      numa.cores = n.value("cores", static_cast<int>(numa.cpus.size()));
      numa.memory_bytes = n.value("memory_bytes", uint64_t{0});
      t.numa.push_back(std::move(numa));
    }
    for (const char* kind : {"gpus", "nics"}) {
      for (const auto& d : j.value(kind, json::array())) {
        TopoDevice dev;
        dev.kind = std::string(kind) == "gpus" ? "gpu" : "nic";
        dev.pci = d.value("pci", "");
        dev.name = d.value("name", "");
        dev.numa = d.value("numa", -1);
        dev.cpus = d.value("cpus", std::vector<int>{});
        if (dev.cpus.empty()) {
          for (const auto& n : t.numa) {
            if (n.index == dev.numa) dev.cpus = n.cpus;
          }
        }
        (dev.kind == "gpu" ? t.gpus : t.nics).push_back(std::move(dev));
      }
    }
    if (t.pus == 0) {
      for (const auto& n : t.numa) t.pus += static_cast<int>(n.cpus.size());
    }
    if (t.cores == 0) t.cores = t.pus;
    return t;
  } catch (const std::exception& e) {
    return InvalidArgument("STOKER_TOPO_FILE=" + path + ": " + e.what());
  }
}

const TopoNuma* FindNuma(const Topology& t, int index) {
  for (const auto& n : t.numa) {
    if (n.index == index) return &n;
  }
  return nullptr;
}

// The NUMA nodes any of `cpus` belongs to.
std::vector<int> NumaOf(const Topology& t, const std::vector<int>& cpus) {
  std::vector<int> out;
  for (const auto& n : t.numa) {
    for (int c : cpus) {
      if (std::find(n.cpus.begin(), n.cpus.end(), c) != n.cpus.end()) {
        out.push_back(n.index);
        break;
      }
    }
  }
  return out;
}

bool Within(const std::vector<int>& cpus, const std::vector<int>& allowed) {
  for (int c : cpus) {
    if (std::find(allowed.begin(), allowed.end(), c) == allowed.end()) return false;
  }
  return true;
}

std::string Join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

const TopoDevice* GpuOf(const Topology& t, int local_rank) {
  if (t.gpus.empty()) return nullptr;
  return &t.gpus[static_cast<size_t>(local_rank) % t.gpus.size()];
}

// The NIC nearest to a GPU's NUMA node (or to `numa` without a GPU).
const TopoDevice* NicNear(const Topology& t, int numa) {
  if (t.nics.empty()) return nullptr;
  for (const auto& n : t.nics) {
    if (numa >= 0 && n.numa == numa) return &n;
  }
  return &t.nics.front();
}

}  // namespace

std::string CpuListString(const std::vector<int>& cpus) {
  std::vector<int> v = cpus;
  std::sort(v.begin(), v.end());
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(v[i]);
    if (j > i) s += "-" + std::to_string(v[j]);
    i = j + 1;
  }
  return s;
}

Result<Topology> LoadTopology() {
  const char* file = std::getenv("STOKER_TOPO_FILE");
  if (file != nullptr && *file != '\0') return FromFile(file);
  auto t = comm::LoadMachineTopology();
  if (t.ok()) {
    std::sort(t->gpus.begin(), t->gpus.end(),
              [](const TopoDevice& a, const TopoDevice& b) { return a.pci < b.pci; });
  }
  return t;
}

std::string TopologyJson(const Topology& t) {
  json j;
  j["source"] = t.source;
  j["cores"] = t.cores;
  j["pus"] = t.pus;
  j["numa"] = json::array();
  for (const auto& n : t.numa) {
    j["numa"].push_back({{"index", n.index},
                         {"cpus", n.cpus},
                         {"cores", n.cores},
                         {"memory_bytes", n.memory_bytes}});
  }
  j["gpus"] = json::array();
  for (const auto& d : t.gpus) j["gpus"].push_back(DeviceJson(d));
  j["nics"] = json::array();
  for (const auto& d : t.nics) j["nics"].push_back(DeviceJson(d));
  return j.dump();
}

BindingAdvice AdviseBinding(const Topology& t, int ranks) {
  BindingAdvice a;
  const int numa = std::max<int>(1, static_cast<int>(t.numa.size()));
  const int per_numa = (ranks + numa - 1) / numa;
  int cores_per_numa = t.numa.empty() ? t.cores : t.numa.front().cores;
  for (const auto& n : t.numa) cores_per_numa = std::min(cores_per_numa, n.cores);
  const int pe = per_numa > 0 ? cores_per_numa / per_numa : 0;
  std::ostringstream m;
  m << "mpirun -np " << ranks;
  std::ostringstream why;
  if (pe >= 1) {
    m << " --map-by ppr:" << per_numa << ":numa:PE=" << pe << " --bind-to core";
    why << per_numa << " rank(s) per NUMA node (" << numa << " node(s)), " << pe << " core(s) each";
  } else {
    m << " --map-by ppr:" << per_numa << ":numa --bind-to numa --oversubscribe";
    why << "more ranks than cores per NUMA node (" << cores_per_numa
        << "): each rank bound to its NUMA node, not to cores";
  }
  m << " --report-bindings";
  // Open MPI's ppr mapping fills NUMA node 0 first: right when the GPUs are
  // in NUMA order (local rank i -> GPU i), as on most servers.
  bool gpus_in_numa_order = true;
  for (int r = 0; r < ranks && !t.gpus.empty(); ++r) {
    const TopoDevice* g = GpuOf(t, r);
    const int numa_of_slot = t.numa.empty() ? 0 : t.numa[std::min(r / per_numa, numa - 1)].index;
    if (g->numa >= 0 && g->numa != numa_of_slot) gpus_in_numa_order = false;
  }
  if (!t.gpus.empty()) {
    why << (gpus_in_numa_order
                ? "; local rank i uses GPU i, which sits on the NUMA node mpirun maps it to"
                : "; the GPUs are not in NUMA order, so mpirun's mapping puts ranks on the wrong "
                  "node: use the numactl lines (one per local rank) instead");
  }
  for (int r = 0; r < ranks; ++r) {
    const TopoDevice* g = GpuOf(t, r);
    int node = g != nullptr ? g->numa : -1;
    if (node < 0 && !t.numa.empty()) node = t.numa[std::min(r / per_numa, numa - 1)].index;
    a.numactl.push_back(node >= 0 ? "numactl --cpunodebind=" + std::to_string(node) +
                                        " --membind=" + std::to_string(node)
                                  : "numactl --localalloc");
  }
  a.mpirun = m.str();
  a.reason = why.str();
  return a;
}

std::vector<int> AffinityCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
  return cpus;
}

RankBinding CurrentBinding(const Topology* t, const RankInfo& rank, const std::string& gpu) {
  RankBinding b;
  b.rank = rank.rank;
  b.local_rank = rank.local_rank;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  b.host = host;
  const std::vector<int> cpus = AffinityCpus();
  b.cpus = CpuListString(cpus);
  b.gpu = gpu;
  if (t != nullptr) {
    const auto nodes = NumaOf(*t, cpus);
    b.numa = nodes.size() == 1 ? nodes[0] : -1;
    const TopoDevice* g = GpuOf(*t, rank.local_rank);
    if (b.gpu.empty() && g != nullptr) b.gpu = g->pci;
    if (const TopoDevice* nic = NicNear(*t, g != nullptr ? g->numa : b.numa)) {
      b.nic = nic->name.empty() ? nic->pci : nic->name;
    }
  }
  return b;
}

std::vector<std::string> CheckBinding(const Topology& t, const RankBinding& b,
                                      const std::vector<int>& cpus) {
  std::vector<std::string> problems;
  const std::string where =
      "bound to CPUs " + CpuListString(cpus) + " (NUMA " + Join(NumaOf(t, cpus)) + ")";
  const TopoDevice* g = GpuOf(t, b.local_rank);
  int want = -1;
  if (g != nullptr && g->numa >= 0) {
    want = g->numa;
    const TopoNuma* n = FindNuma(t, g->numa);
    if (n != nullptr && !Within(cpus, n->cpus)) {
      problems.push_back(where + ", but its GPU " + g->pci + " (local rank " +
                         std::to_string(b.local_rank) + " -> GPU " +
                         std::to_string(b.local_rank % t.gpus.size()) + ") is on NUMA " +
                         std::to_string(g->numa) + " (CPUs " + CpuListString(n->cpus) + ")");
    }
  }
  const TopoDevice* nic = NicNear(t, want);
  if (nic != nullptr && nic->numa >= 0) {
    const TopoNuma* n = FindNuma(t, nic->numa);
    if (n != nullptr && !Within(cpus, n->cpus)) {
      problems.push_back(where + ", but its NIC " + nic->name + " (" + nic->pci + ") is on NUMA " +
                         std::to_string(nic->numa) + " (CPUs " + CpuListString(n->cpus) + ")");
    }
  }
  return problems;
}

}  // namespace stoker
