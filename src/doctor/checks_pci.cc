// The node's shape: NUMA nodes, where each GPU and NIC sits, their PCIe
// links against what they can do, ASPM, SR-IOV.
#include <algorithm>
#include <map>
#include <set>

#include "doctor/internal.h"

namespace stoker::doctor {
namespace {

constexpr CheckState kPass = CheckState::kPass;
constexpr CheckState kWarn = CheckState::kWarn;
constexpr CheckState kFail = CheckState::kFail;
constexpr CheckState kSkip = CheckState::kSkip;

std::string CpuCountText(const NumaNode& n) { return std::to_string(n.cpus.size()) + " CPUs"; }

void NumaLayout(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  const NodeFacts f = GatherNodeFacts(env);
  if (f.numa.empty()) {
    out->evidence.push_back("no node* folders in /sys/devices/system/node");
    return Verdict(out, kSkip, "the kernel reports no NUMA nodes");
  }
  size_t min_cpus = SIZE_MAX, max_cpus = 0;
  uint64_t min_mem = UINT64_MAX, max_mem = 0;
  std::vector<int> cpuless, memless;
  for (const NumaNode& n : f.numa) {
    out->evidence.push_back("node " + std::to_string(n.id) + ": " + CpuCountText(n) + ", " +
                            BytesText(n.mem_total) + " (/sys/devices/system/node/node" +
                            std::to_string(n.id) + ")");
    if (n.cpus.empty()) cpuless.push_back(n.id);
    if (n.mem_total == 0) memless.push_back(n.id);
    if (!n.cpus.empty()) {
      min_cpus = std::min(min_cpus, n.cpus.size());
      max_cpus = std::max(max_cpus, n.cpus.size());
    }
    if (n.mem_total) {
      min_mem = std::min(min_mem, n.mem_total);
      max_mem = std::max(max_mem, n.mem_total);
    }
  }
  out->metrics["nodes"] = double(f.numa.size());
  const std::string what = std::to_string(f.numa.size()) + " NUMA node(s)";
  if (f.numa.size() == 1) return Verdict(out, kPass, what + ": nothing to balance");
  const std::string fix =
      "populate every socket's memory channels alike and check the BIOS's NUMA settings "
      "(sub-NUMA clustering, NPS); numactl --hardware shows the result";
  if (!memless.empty()) {
    return Verdict(out, kWarn,
                   what + ": node " + std::to_string(memless[0]) +
                       " has no memory: its CPUs allocate remotely",
                   fix);
  }
  const bool cpus_even = cpuless.empty() && max_cpus == min_cpus;
  const bool mem_even = max_mem <= min_mem + min_mem / 10;  // within 10%
  if (!cpus_even || !mem_even) {
    return Verdict(out, kWarn,
                   what + " unbalanced: CPUs " + std::to_string(min_cpus) + "-" +
                       std::to_string(max_cpus) + ", memory " + BytesText(min_mem) + "-" +
                       BytesText(max_mem) + " per node",
                   fix);
  }
  Verdict(out, kPass,
          what + ", balanced: " + std::to_string(max_cpus) + " CPUs and " + BytesText(max_mem) +
              " each");
}

std::string DeviceLine(const PciDevice& d) {
  char ids[32];
  std::snprintf(ids, sizeof ids, "%04x:%04x class 0x%06x", d.vendor, d.device, d.klass);
  return d.address + " (" + ids + ")";
}

// Where the GPUs (or NICs) sit: each must have a NUMA node the platform
// reports, and on a machine of several nodes they should be spread over
// them; each GPU's node should hold a NIC (RDMA traffic stays on its socket).
void Placement(const NodeEnv& env, const std::string& kind, CheckResult* out) {
  const NodeFacts f = GatherNodeFacts(env);
  const auto& devices = kind == "gpu" ? f.gpus : f.nics;
  const std::string plural = kind == "gpu" ? "GPUs" : "NICs";
  if (devices.empty()) {
    out->evidence.push_back(kind == "gpu"
                                ? "no NVIDIA device of class 0x0300/0x0302 in /sys/bus/pci/devices"
                                : "no device of class 0x0200/0x0207 in /sys/bus/pci/devices");
    return Verdict(out, kSkip, "no " + plural + " on this node");
  }
  std::map<int, int> per_node;
  for (const PciDevice& d : devices) {
    out->evidence.push_back(DeviceLine(d) + " numa_node = " + std::to_string(d.numa_node));
    ++per_node[d.numa_node];
  }
  const size_t nodes = std::max<size_t>(1, f.numa.size());
  if (nodes == 1) {
    return Verdict(
        out, kPass,
        std::to_string(devices.size()) + " " + plural + " on a machine of one NUMA node");
  }
  if (per_node.count(-1)) {
    return Verdict(out, kWarn,
                   std::to_string(per_node[-1]) + " " + plural +
                       " without a NUMA node (numa_node -1): ranks cannot be bound near them",
                   "enable NUMA/SRAT reporting in the BIOS (and ACPI in the kernel)");
  }
  if (kind == "nic") {
    std::set<int> gpu_nodes, nic_nodes;
    for (const auto& g : f.gpus) gpu_nodes.insert(g.numa_node);
    for (const auto& n : f.nics) nic_nodes.insert(n.numa_node);
    for (int g : gpu_nodes) {
      if (g >= 0 && !nic_nodes.count(g)) {
        return Verdict(out, kWarn,
                       "GPUs on NUMA node " + std::to_string(g) +
                           " have no NIC on their node: their network traffic crosses sockets",
                       "put a NIC in a slot of each GPU socket (or set NCCL_IB_HCA per rank)");
      }
    }
  }
  if (per_node.size() == 1 && devices.size() > 1) {
    return Verdict(out, kWarn,
                   "all " + std::to_string(devices.size()) + " " + plural + " on NUMA node " +
                       std::to_string(per_node.begin()->first) + " of " + std::to_string(nodes),
                   "spread the cards over the sockets' slots, or bind every rank to node " +
                       std::to_string(per_node.begin()->first));
  }
  std::string spread;
  for (const auto& [node, n] : per_node) {
    spread += (spread.empty() ? "" : ", ") + std::to_string(n) + " on node " + std::to_string(node);
  }
  Verdict(out, kPass, plural + ": " + spread);
}

void GpuNuma(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  Placement(env, "gpu", out);
}
void NicNuma(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  Placement(env, "nic", out);
}

// Each link against the device's capability and the port above it. A narrow
// link always fails; a slow one fails for NICs but only warns for GPUs, which
// drop their link speed when idle.
void Links(const NodeEnv& env, const std::string& kind, CheckResult* out) {
  const NodeFacts f = GatherNodeFacts(env);
  const auto& devices = kind == "gpu" ? f.gpus : f.nics;
  const std::string plural = kind == "gpu" ? "GPUs" : "NICs";
  if (devices.empty()) return Verdict(out, kSkip, "no " + plural + " on this node");
  int narrow = 0, slow = 0, unknown = 0;
  std::string first_bad;
  for (const PciDevice& d : devices) {
    if (d.current.width == 0 || d.max.width == 0) {
      ++unknown;
      out->evidence.push_back(d.address + ": no current/max_link_* (a virtual or non-PCIe device)");
      continue;
    }
    PciLink expect = d.max;
    if (d.upstream_max.width > 0) expect.width = std::min(expect.width, d.upstream_max.width);
    if (d.upstream_max.speed_gts > 0) {
      expect.speed_gts = std::min(expect.speed_gts, d.upstream_max.speed_gts);
    }
    out->evidence.push_back(d.address + ": current " + LinkText(d.current) + ", device max " +
                            LinkText(d.max) +
                            (d.upstream_max.width ? ", port max " + LinkText(d.upstream_max) : "") +
                            " (current_link_*, max_link_*)");
    if (d.current.width < expect.width) {
      ++narrow;
      if (first_bad.empty()) {
        first_bad = d.address + " runs x" + std::to_string(d.current.width) + " of x" +
                    std::to_string(expect.width);
      }
    } else if (d.current.speed_gts + 0.01 < expect.speed_gts) {
      ++slow;
      if (first_bad.empty()) {
        first_bad = d.address + " runs at " + Fixed(d.current.speed_gts, 1) + " of " +
                    Fixed(expect.speed_gts, 1) + " GT/s";
      }
    }
  }
  const int measured = int(devices.size()) - unknown;
  if (measured == 0) return Verdict(out, kSkip, "no " + plural + " report a PCIe link");
  const std::string fix =
      "reseat the card or move it to a full-width slot; check the riser and the BIOS's "
      "PCIe generation setting";
  if (narrow > 0) {
    return Verdict(out, kFail, std::to_string(narrow) + " narrow link(s): " + first_bad, fix);
  }
  if (slow > 0 && kind == "gpu") {
    return Verdict(out, kWarn,
                   std::to_string(slow) + " link(s) below their speed: " + first_bad +
                       " (GPUs slow the link when idle; h2d-bandwidth measures it under load)",
                   fix);
  }
  if (slow > 0)
    return Verdict(out, kFail, std::to_string(slow) + " slow link(s): " + first_bad, fix);
  Verdict(out, kPass, std::to_string(measured) + " " + plural + " at full link width and speed");
}

void GpuLinks(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  Links(env, "gpu", out);
}
void NicLinks(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  Links(env, "nic", out);
}

// ASPM puts idle links in low-power states; waking costs microseconds on each
// burst of DMA, which is what a loader's copies are.
void AspmPolicy(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  const std::string fix =
      "pcie_aspm=off (or pcie_aspm.policy=performance) on the kernel command line";
  std::optional<std::string> cmdline;
  if (auto c = env.ReadFile("/proc/cmdline"); c.ok()) cmdline = Trim(*c);
  const bool off_on_cmdline = cmdline && (cmdline->find("pcie_aspm=off") != std::string::npos);
  if (off_on_cmdline) out->evidence.push_back("/proc/cmdline has pcie_aspm=off");
  auto policy = ReadTrimmed(env, "/sys/module/pcie_aspm/parameters/policy", out);
  if (!policy) {
    if (off_on_cmdline) return Verdict(out, kPass, "ASPM off (kernel command line)");
    return Verdict(out, kSkip, "no ASPM policy to read (kernel built without CONFIG_PCIEASPM)");
  }
  out->evidence.push_back("/sys/module/pcie_aspm/parameters/policy = " + *policy);
  const std::string mode = SelectedChoice(*policy);
  if (off_on_cmdline || mode == "performance") {
    return Verdict(out, kPass,
                   "ASPM policy " + mode + (off_on_cmdline ? ", off on the command line" : ""));
  }
  if (mode == "powersave" || mode == "powersupersave") {
    return Verdict(out, kFail, "ASPM policy " + mode + ": links sleep between DMA bursts", fix);
  }
  Verdict(out, kWarn,
          "ASPM policy " + mode + ": the firmware's setting stays (see pcie-aspm-devices)", fix);
}

// ASPM control bits of a device's Link Control register, read from its
// config space the way lspci does: the PCI Express capability (id 0x10) in
// the capability list at 0x34, Link Control at +0x10, bit 0 L0s, bit 1 L1.
// -1 when the capability is not in what could be read (unprivileged reads
// of the config file stop at 64 bytes).
int AspmFromConfig(const std::string& config) {
  if (config.size() < 0x40) return -1;
  auto u8 = [&](size_t at) { return at < config.size() ? uint8_t(config[at]) : uint8_t(0); };
  if (!(u8(0x06) & 0x10)) return -1;  // status: no capability list
  size_t at = u8(0x34) & ~3u;
  for (int hops = 0; at >= 0x40 && at + 0x12 <= config.size() && hops < 48; ++hops) {
    if (u8(at) == 0x10) return u8(at + 0x10) & 0x3;
    at = u8(at + 1) & ~3u;
  }
  return -1;
}

void AspmDevices(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  const NodeFacts f = GatherNodeFacts(env);
  std::vector<PciDevice> devices = f.gpus;
  devices.insert(devices.end(), f.nics.begin(), f.nics.end());
  if (devices.empty()) return Verdict(out, kSkip, "no GPUs or NICs on this node");
  int on = 0, known = 0, short_config = 0;
  std::string first_on;
  for (const PciDevice& d : devices) {
    int l0s = d.aspm_l0s, l1 = d.aspm_l1;
    std::string source = "link/l0s_aspm, link/l1_aspm";
    if (l0s < 0 && l1 < 0) {
      auto config = env.ReadFile("/sys/bus/pci/devices/" + d.address + "/config");
      if (config.ok()) {
        const int bits = AspmFromConfig(*config);
        if (bits >= 0) {
          l0s = bits & 1;
          l1 = (bits >> 1) & 1;
          source = "config space, Link Control";
        } else if (config->size() <= 0x40) {
          ++short_config;
        }
      }
    }
    if (l0s < 0 && l1 < 0) {
      out->evidence.push_back(d.address + " (" + d.kind + "): ASPM state not readable");
      continue;
    }
    ++known;
    const bool enabled = l0s > 0 || l1 > 0;
    out->evidence.push_back(d.address + " (" + d.kind + "): L0s " + (l0s > 0 ? "on" : "off") +
                            ", L1 " + (l1 > 0 ? "on" : "off") + " (" + source + ")");
    if (enabled) {
      ++on;
      if (first_on.empty()) first_on = d.address + " (" + d.kind + ")";
    }
  }
  if (known == 0) {
    return Verdict(out, kSkip,
                   short_config ? "ASPM state needs root (the config space beyond 64 bytes)"
                                : "no device exposes its ASPM state");
  }
  if (on > 0) {
    return Verdict(
        out, kFail, "ASPM on for " + std::to_string(on) + " device(s), first " + first_on,
        "echo 0 > /sys/bus/pci/devices/ADDR/link/l1_aspm (and l0s_aspm), or pcie_aspm=off "
        "on the kernel command line");
  }
  Verdict(out, kPass, "ASPM off on " + std::to_string(known) + " GPU/NIC link(s)");
}

void Sriov(const NodeEnv& env, const DoctorOptions& o, CheckResult* out) {
  const NodeFacts f = GatherNodeFacts(env);
  int capable = 0, short_of = 0;
  std::string first;
  for (const PciDevice& d : f.nics) {
    if (d.sriov_total <= 0) continue;
    ++capable;
    out->evidence.push_back(d.address + ": sriov_numvfs " + std::to_string(d.sriov_num) +
                            " of sriov_totalvfs " + std::to_string(d.sriov_total));
    if (uint32_t(std::max(0, d.sriov_num)) < o.min_vfs) {
      ++short_of;
      if (first.empty()) first = d.address;
    }
  }
  if (capable == 0) return Verdict(out, kSkip, "no SR-IOV capable NIC");
  if (short_of > 0) {
    return Verdict(out, kFail,
                   std::to_string(short_of) + " NIC(s) with fewer than " +
                       std::to_string(o.min_vfs) + " VFs, first " + first,
                   "echo " + std::to_string(o.min_vfs) + " > /sys/bus/pci/devices/" + first +
                       "/sriov_numvfs (and persist it in the node's boot config)");
  }
  Verdict(out, kPass, std::to_string(capable) + " SR-IOV capable NIC(s), VFs as listed");
}

}  // namespace

std::vector<CheckSpec> PciChecks() {
  return {
      {"numa-layout", "NUMA nodes present and balanced (CPUs, memory)", false, NumaLayout},
      {"gpu-numa", "each GPU's NUMA node; GPUs spread over the nodes", false, GpuNuma},
      {"nic-numa", "each NIC's NUMA node; a NIC on each GPU's node", false, NicNuma},
      {"gpu-pcie-link", "each GPU's PCIe link width and speed against its capability", false,
       GpuLinks},
      {"nic-pcie-link", "each NIC's PCIe link width and speed against its capability", false,
       NicLinks},
      {"pcie-aspm-policy", "the kernel's PCIe ASPM policy", false, AspmPolicy},
      {"pcie-aspm-devices", "ASPM off on each GPU's and NIC's link", false, AspmDevices},
      {"sriov", "SR-IOV VFs of capable NICs (--min-vfs)", false, Sriov},
  };
}

}  // namespace stoker::doctor
