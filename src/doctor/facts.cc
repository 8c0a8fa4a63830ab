// GatherNodeFacts: NUMA nodes, GPUs and NICs with their PCIe links, limits,
// read from sysfs and procfs through a NodeEnv.
#include <algorithm>
#include <cstdlib>
#include <regex>

#include "doctor/internal.h"

namespace stoker {
namespace {

using doctor::Trim;

// "0000:19:00.0"
bool IsPciAddress(std::string_view s) {
  static const std::regex kAddress("[0-9a-fA-F]{4,}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7]");
  return std::regex_match(s.begin(), s.end(), kAddress);
}

std::optional<std::string> Read(const NodeEnv& env, const std::string& path) {
  auto t = env.ReadFile(path);
  if (!t.ok()) return std::nullopt;
  return Trim(*t);
}

long ReadLong(const NodeEnv& env, const std::string& path, long otherwise, int base = 10) {
  auto t = Read(env, path);
  if (!t || t->empty()) return otherwise;
  char* end = nullptr;
  const long v = std::strtol(t->c_str(), &end, base);
  return end == t->c_str() ? otherwise : v;
}

PciLink ReadLink(const NodeEnv& env, const std::string& dir, const char* which) {
  PciLink l;
  if (auto s = Read(env, dir + "/" + which + "_link_speed"))
    l.speed_gts = doctor::ParseLinkSpeed(*s);
  l.width = int(ReadLong(env, dir + "/" + which + "_link_width", 0));
  // 255 is what some devices report for "unknown width".
  if (l.width > 32) l.width = 0;
  return l;
}

}  // namespace

namespace doctor {

// Reads one PCI device's folder (exposed to the checks through the facts).
PciDevice ReadPciDevice(const NodeEnv& env, const std::string& address) {
  const std::string dir = "/sys/bus/pci/devices/" + address;
  PciDevice d;
  d.address = address;
  d.klass = uint32_t(ReadLong(env, dir + "/class", 0, 16));
  d.vendor = uint16_t(ReadLong(env, dir + "/vendor", 0, 16));
  d.device = uint16_t(ReadLong(env, dir + "/device", 0, 16));
  const uint32_t base_sub = d.klass >> 8;
  if (d.vendor == 0x10de && (base_sub == 0x0302 || base_sub == 0x0300)) {
    d.kind = "gpu";
  } else if (base_sub == 0x0200 || base_sub == 0x0207) {
    d.kind = "nic";
  } else {
    d.kind = "other";
  }
  d.numa_node = int(ReadLong(env, dir + "/numa_node", -1));
  d.current = ReadLink(env, dir, "current");
  d.max = ReadLink(env, dir, "max");
  d.sriov_total = int(ReadLong(env, dir + "/sriov_totalvfs", -1));
  d.sriov_num = int(ReadLong(env, dir + "/sriov_numvfs", -1));
  d.virtual_function = env.RealPath(dir + "/physfn").ok();
  d.aspm_l0s = int(ReadLong(env, dir + "/link/l0s_aspm", -1));
  d.aspm_l1 = int(ReadLong(env, dir + "/link/l1_aspm", -1));
  // The port above: the folder that holds this device's in /sys/devices.
  if (auto real = env.RealPath(dir); real.ok()) {
    const auto slash = real->rfind('/');
    if (slash != std::string::npos && slash > 0) {
      const std::string parent = real->substr(0, slash);
      const std::string name = parent.substr(parent.rfind('/') + 1);
      if (IsPciAddress(name)) d.upstream_max = ReadLink(env, parent, "max");
    }
  }
  return d;
}

}  // namespace doctor

NodeFacts GatherNodeFacts(const NodeEnv& env) {
  NodeFacts f;
  auto note = [&](const Status& s) { f.unreadable.push_back(s.ToString()); };

  if (auto nodes = env.ListDir("/sys/devices/system/node"); nodes.ok()) {
    for (const std::string& n : *nodes) {
      if (n.size() < 5 || n.rfind("node", 0) != 0 ||
          !std::all_of(n.begin() + 4, n.end(), ::isdigit)) {
        continue;
      }
      NumaNode node;
      node.id = std::atoi(n.c_str() + 4);
      const std::string dir = "/sys/devices/system/node/" + n;
      if (auto cl = env.ReadFile(dir + "/cpulist"); cl.ok()) {
        if (auto cpus = doctor::ParseCpuList(*cl); cpus.ok()) node.cpus = *cpus;
      } else {
        note(cl.status());
      }
      if (auto mi = env.ReadFile(dir + "/meminfo"); mi.ok()) {
        node.mem_total = doctor::MeminfoBytes(*mi, "MemTotal").value_or(0);
      } else {
        note(mi.status());
      }
      f.numa.push_back(std::move(node));
    }
    std::sort(f.numa.begin(), f.numa.end(),
              [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  } else {
    note(nodes.status());
  }

  if (auto online = env.ReadFile("/sys/devices/system/cpu/online"); online.ok()) {
    if (auto cpus = doctor::ParseCpuList(*online); cpus.ok()) f.online_cpus = int(cpus->size());
  } else {
    note(online.status());
  }
  if (auto mi = env.ReadFile("/proc/meminfo"); mi.ok()) {
    f.mem_total = doctor::MeminfoBytes(*mi, "MemTotal").value_or(0);
  } else {
    note(mi.status());
  }
  if (auto k = env.ReadFile("/proc/sys/kernel/osrelease"); k.ok()) {
    f.kernel = Trim(*k);
  } else {
    note(k.status());
  }
  if (auto t = env.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); t.ok()) {
    f.thp = doctor::SelectedChoice(*t);
  } else {
    note(t.status());
  }
  if (auto l = env.Limits(); l.ok()) {
    f.limits = *l;
    f.limits_known = true;
  } else {
    note(l.status());
  }

  if (auto devices = env.ListDir("/sys/bus/pci/devices"); devices.ok()) {
    for (const std::string& a : *devices) {
      PciDevice d = doctor::ReadPciDevice(env, a);
      if (d.kind == "gpu") {
        f.gpus.push_back(std::move(d));
      } else if (d.kind == "nic" && !d.virtual_function) {
        f.nics.push_back(std::move(d));
      }
    }
  } else {
    note(devices.status());
  }
  return f;
}

}  // namespace stoker
