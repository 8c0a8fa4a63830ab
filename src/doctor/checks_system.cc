// The kernel's and the process's side of the checklist: kernel version,
// huge pages, limits, CPU frequency, NUMA balancing, IOMMU, clock sync.
#include <algorithm>
#include <map>
#include <sstream>

#include "doctor/internal.h"

namespace stoker::doctor {
namespace {

constexpr CheckState kPass = CheckState::kPass;
constexpr CheckState kWarn = CheckState::kWarn;
constexpr CheckState kFail = CheckState::kFail;
constexpr CheckState kSkip = CheckState::kSkip;

// The production guides' rules: 5.15 LTS recommended; nothing before Ubuntu's
// 5.4.0-135, whose predecessors leak memory in the RDMA stack.
void KernelVersion(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  auto release = ReadTrimmed(env, "/proc/sys/kernel/osrelease", out);
  if (!release) return Verdict(out, kSkip, "cannot read the kernel release");
  out->evidence.push_back("/proc/sys/kernel/osrelease = " + *release);
  const auto k = ParseKernelRelease(*release);
  const std::string upgrade = "boot the 5.15 LTS kernel (or newer)";
  if (!k) return Verdict(out, kWarn, "cannot parse the release '" + *release + "'", upgrade);
  const int v = k->major * 1000 + k->minor;
  if (v < 5004) {
    return Verdict(out, kFail,
                   *release + ": older than 5.4, which leaks memory in RDMA before 5.4.0-135",
                   upgrade);
  }
  if (v == 5004) {
    if (k->abi >= 0 && k->abi < 135) {
      return Verdict(out, kFail, *release + ": before 5.4.0-135, whose RDMA stack leaks memory",
                     upgrade);
    }
    if (k->abi < 0) {
      return Verdict(out, kWarn,
                     *release + ": a 5.4 kernel whose RDMA fix (Ubuntu's 5.4.0-135) cannot be told",
                     upgrade);
    }
    return Verdict(out, kWarn, *release + ": has the RDMA fix; 5.15 LTS is recommended", upgrade);
  }
  if (v < 5015)
    return Verdict(out, kWarn, *release + ": older than the recommended 5.15 LTS", upgrade);
  Verdict(out, kPass, *release + ": 5.15 or newer");
}

// THP "always" makes khugepaged compact memory behind the data path's back
// (latency spikes in the loader's and the OSDs' allocations); "madvise" keeps
// huge pages for the programs that ask.
void TransparentHugePages(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  const char* kEnabled = "/sys/kernel/mm/transparent_hugepage/enabled";
  auto enabled = ReadTrimmed(env, kEnabled, out);
  if (!enabled) return Verdict(out, kSkip, "no transparent huge page setting to read");
  out->evidence.push_back(std::string(kEnabled) + " = " + *enabled);
  const std::string mode = SelectedChoice(*enabled);
  const std::string fix =
      "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (and "
      "transparent_hugepage=madvise on the kernel command line)";
  if (mode == "always") {
    return Verdict(out, kFail, "transparent huge pages: always (compaction stalls the data path)",
                   fix);
  }
  auto defrag = ReadTrimmed(env, "/sys/kernel/mm/transparent_hugepage/defrag", out);
  if (defrag) {
    out->evidence.push_back("/sys/kernel/mm/transparent_hugepage/defrag = " + *defrag);
    if (SelectedChoice(*defrag) == "always") {
      return Verdict(out, kWarn,
                     "THP " + mode + ", but defrag always: allocations stall to compact",
                     "echo defer+madvise > /sys/kernel/mm/transparent_hugepage/defrag");
    }
  }
  if (mode.empty()) return Verdict(out, kWarn, "no THP mode selected in '" + *enabled + "'", fix);
  Verdict(out, kPass, "transparent huge pages: " + mode);
}

// Huge pages reserved up front are memory nothing else may use: the pinned
// staging buffers and the page cache that feeds the loader lose it.
void HugePages(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  auto meminfo = env.ReadFile("/proc/meminfo");
  if (!meminfo.ok()) {
    out->evidence.push_back("cannot read /proc/meminfo: " + meminfo.status().ToString());
    return Verdict(out, kSkip, "cannot read /proc/meminfo");
  }
  const uint64_t total = MeminfoBytes(*meminfo, "MemTotal").value_or(0);
  uint64_t reserved = 0;
  if (auto sizes = env.ListDir("/sys/kernel/mm/hugepages"); sizes.ok()) {
    for (const std::string& s : *sizes) {
      // "hugepages-2048kB"
      const uint64_t kb = std::strtoull(s.c_str() + std::min<size_t>(s.size(), 10), nullptr, 10);
      auto n = ReadTrimmed(env, "/sys/kernel/mm/hugepages/" + s + "/nr_hugepages", out);
      if (!n) continue;
      const uint64_t count = std::strtoull(n->c_str(), nullptr, 10);
      out->evidence.push_back("/sys/kernel/mm/hugepages/" + s + "/nr_hugepages = " + *n);
      reserved += count * kb * 1024;
    }
  } else {
    // Older kernels: only the default size, in /proc/meminfo.
    const uint64_t n = MeminfoBytes(*meminfo, "HugePages_Total").value_or(0);
    const uint64_t size = MeminfoBytes(*meminfo, "Hugepagesize").value_or(0);
    out->evidence.push_back("/proc/meminfo: HugePages_Total " + std::to_string(n) +
                            ", Hugepagesize " + BytesText(size));
    reserved = n * size;
  }
  out->evidence.push_back("/proc/meminfo: MemTotal " + BytesText(total));
  const double share = total ? double(reserved) / double(total) : 0;
  out->metrics["reserved_bytes"] = double(reserved);
  const std::string what = BytesText(reserved) + " reserved in huge pages (" +
                           Fixed(share * 100, 1) + "% of " + BytesText(total) + ")";
  const std::string fix =
      "lower vm.nr_hugepages (and hugepages= on the kernel command line) to what the "
      "node's services use";
  if (share > 0.5) return Verdict(out, kFail, what + ": the rest is too little for staging", fix);
  if (share > 0.25) return Verdict(out, kWarn, what, fix);
  Verdict(out, kPass, what);
}

bool HasRdmaDevices(const NodeEnv& env, CheckResult* out) {
  auto ib = env.ListDir("/sys/class/infiniband");
  if (!ib.ok() || ib->empty()) return false;
  std::string names;
  for (const auto& n : *ib) names += (names.empty() ? "" : " ") + n;
  out->evidence.push_back("/sys/class/infiniband: " + names);
  return true;
}

// RDMA (NCCL over InfiniBand/RoCE, Ceph's RDMA messenger) registers memory
// under RLIMIT_MEMLOCK; a low limit makes registrations fail at run time.
void Memlock(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  auto limits = env.Limits();
  if (!limits.ok()) {
    out->evidence.push_back("cannot read the limits: " + limits.status().ToString());
    return Verdict(out, kSkip, "cannot read RLIMIT_MEMLOCK");
  }
  const ResourceLimit l = limits->memlock;
  out->evidence.push_back("RLIMIT_MEMLOCK soft " + BytesText(l.soft) + ", hard " +
                          BytesText(l.hard) +
                          (env.root() == "/" ? " (getrlimit)" : " (/proc/self/limits)"));
  const std::string fix =
      "memlock unlimited: '* - memlock unlimited' in /etc/security/limits.d/, "
      "LimitMEMLOCK=infinity for services, --ulimit memlock=-1 for containers";
  if (l.soft == kUnlimited) return Verdict(out, kPass, "memlock unlimited");
  const bool rdma = HasRdmaDevices(env, out);
  const std::string what = "memlock limited to " + BytesText(l.soft);
  if (l.soft < (64ull << 20)) {
    if (rdma) return Verdict(out, kFail, what + ": RDMA memory registration will fail", fix);
    return Verdict(out, kWarn, what + " (no RDMA device here; NCCL/Ceph over RDMA would fail)",
                   fix);
  }
  Verdict(out, kWarn, what + ": large RDMA registrations may fail", fix);
}

// Each shard, checkpoint chunk and OSD connection holds a descriptor; a
// client of a large Ceph cluster keeps a socket per OSD.
void OpenFiles(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  auto limits = env.Limits();
  if (!limits.ok()) {
    out->evidence.push_back("cannot read the limits: " + limits.status().ToString());
    return Verdict(out, kSkip, "cannot read RLIMIT_NOFILE");
  }
  const ResourceLimit l = limits->nofile;
  auto text = [](uint64_t v) {
    return v == kUnlimited ? std::string("unlimited") : std::to_string(v);
  };
  out->evidence.push_back("RLIMIT_NOFILE soft " + text(l.soft) + ", hard " + text(l.hard));
  out->metrics["soft"] = double(l.soft);
  const std::string fix =
      "nofile 1048576: '* - nofile 1048576' in /etc/security/limits.d/, LimitNOFILE= for "
      "services" +
      std::string(l.hard >= 65536 ? " (or ulimit -n " + text(l.hard) + " here)" : "");
  if (l.soft < 1024) return Verdict(out, kFail, "open files limited to " + text(l.soft), fix);
  if (l.soft < 65536) {
    return Verdict(out, kWarn, "open files limited to " + text(l.soft) + " (65536 or more advised)",
                   fix);
  }
  Verdict(out, kPass, "open files: " + text(l.soft));
}

void CpuGovernor(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  auto cpus = env.ListDir("/sys/devices/system/cpu");
  if (!cpus.ok()) {
    out->evidence.push_back("cannot list /sys/devices/system/cpu: " + cpus.status().ToString());
    return Verdict(out, kSkip, "cannot list the CPUs");
  }
  std::map<std::string, int> governors;
  int seen = 0;
  for (const std::string& c : *cpus) {
    if (c.size() < 4 || c.rfind("cpu", 0) != 0 || !std::isdigit(static_cast<unsigned char>(c[3]))) {
      continue;
    }
    auto g = env.ReadFile("/sys/devices/system/cpu/" + c + "/cpufreq/scaling_governor");
    if (!g.ok()) continue;
    ++governors[Trim(*g)];
    ++seen;
  }
  if (seen == 0) {
    out->evidence.push_back("no /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor");
    return Verdict(out, kSkip, "no CPU frequency scaling here (a VM, or no cpufreq driver)");
  }
  std::string list;
  for (const auto& [g, n] : governors)
    list += (list.empty() ? "" : ", ") + g + " x" + std::to_string(n);
  out->evidence.push_back("scaling_governor of " + std::to_string(seen) + " CPUs: " + list);
  if (governors.size() == 1 && governors.count("performance")) {
    return Verdict(out, kPass, "every CPU runs the performance governor");
  }
  Verdict(out, kWarn, "CPU governors: " + list + " (decode and collation slow down with the clock)",
          "cpupower frequency-set -g performance (and make it persist in the node's image)");
}

// Automatic NUMA balancing migrates the pages of ranks that are already
// bound to their GPU's node, and unmaps pages to sample them.
void NumaBalancing(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  auto v = ReadTrimmed(env, "/proc/sys/kernel/numa_balancing", out);
  if (!v) return Verdict(out, kSkip, "no kernel.numa_balancing (kernel without NUMA balancing)");
  out->evidence.push_back("/proc/sys/kernel/numa_balancing = " + *v);
  int nodes = 0;
  if (auto list = env.ListDir("/sys/devices/system/node"); list.ok()) {
    for (const auto& n : *list)
      nodes += n.rfind("node", 0) == 0 && n.size() > 4 && std::isdigit(n[4]);
  }
  out->evidence.push_back(std::to_string(nodes) + " NUMA node(s) in /sys/devices/system/node");
  if (*v != "0" && nodes > 1) {
    return Verdict(out, kWarn,
                   "automatic NUMA balancing is on with " + std::to_string(nodes) +
                       " nodes: it migrates the pages of bound ranks",
                   "sysctl -w kernel.numa_balancing=0 (ranks are bound with mpirun --bind-to)");
  }
  Verdict(out, kPass,
          *v == "0" ? "automatic NUMA balancing off" : "one NUMA node: balancing moves nothing");
}

// GPUDirect RDMA and peer-to-peer copies need DMA that the IOMMU does not
// translate (off, or passthrough); translation also costs every DMA a lookup.
void Iommu(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  auto cmdline = ReadTrimmed(env, "/proc/cmdline", out);
  std::vector<std::string> flags;
  if (cmdline) {
    std::istringstream in(*cmdline);
    for (std::string tok; in >> tok;) {
      if (tok == "--") break;
      if (tok.find("iommu") != std::string::npos) flags.push_back(tok);
    }
    std::string joined;
    for (const auto& f : flags) joined += " " + f;
    out->evidence.push_back("/proc/cmdline iommu flags:" + (joined.empty() ? " none" : joined));
  }
  auto units = env.ListDir("/sys/class/iommu");
  if (!units.ok() || units->empty()) {
    out->evidence.push_back(units.ok()
                                ? "/sys/class/iommu is empty"
                                : "cannot list /sys/class/iommu: " + units.status().ToString());
    return Verdict(out, kPass, "no IOMMU translates DMA");
  }
  std::string names;
  for (const auto& u : *units) names += " " + u;
  out->evidence.push_back("/sys/class/iommu:" + names);
  // The mode each GPU's and NIC's group is in: identity (passthrough), DMA or
  // DMA-FQ (translated).
  int translated = 0, gpus_translated = 0, known = 0;
  if (auto devices = env.ListDir("/sys/bus/pci/devices"); devices.ok()) {
    for (const std::string& a : *devices) {
      const PciDevice d = ReadPciDevice(env, a);
      if (d.kind == "other") continue;
      auto group = env.RealPath("/sys/bus/pci/devices/" + a + "/iommu_group");
      if (!group.ok()) continue;
      auto type = env.ReadFile(*group + "/type");
      if (!type.ok()) continue;
      const std::string t = Trim(*type);
      ++known;
      out->evidence.push_back(a + " (" + d.kind + "): " + *group + "/type = " + t);
      if (t != "identity") {
        ++translated;
        gpus_translated += d.kind == "gpu";
      }
    }
  }
  const std::string fix =
      "add iommu=pt (intel_iommu=on iommu=pt, or amd_iommu=on iommu=pt) to "
      "the kernel command line";
  const bool pt_flag = std::any_of(flags.begin(), flags.end(), [](const std::string& f) {
    return f == "iommu=pt" || f == "iommu.passthrough=1" || f == "iommu=off" ||
           f == "intel_iommu=off" || f == "amd_iommu=off";
  });
  if (known == 0) {
    if (pt_flag)
      return Verdict(out, kPass, "IOMMU present, passthrough or off on the command line");
    return Verdict(out, kWarn, "IOMMU present; its mode for GPUs and NICs cannot be read", fix);
  }
  if (gpus_translated > 0) {
    return Verdict(
        out, kFail,
        std::to_string(gpus_translated) +
            " GPU(s) behind a translating IOMMU: GPUDirect RDMA and P2P need passthrough",
        fix);
  }
  if (translated > 0) {
    return Verdict(out, kWarn, std::to_string(translated) + " NIC(s) behind a translating IOMMU",
                   fix);
  }
  Verdict(out, kPass, "IOMMU in passthrough for every GPU and NIC");
}

// Ceph monitors warn past 0.05 s of skew; traces of several nodes only line
// up with synchronised clocks.
void ClockSync(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  auto c = env.Clock();
  if (!c.ok()) {
    out->evidence.push_back("cannot read the clock state: " + c.status().ToString());
    return Verdict(out, kSkip, "cannot read the kernel's clock state");
  }
  out->evidence.push_back(
      std::string("adjtimex: STA_UNSYNC ") + (c->unsynchronized ? "set" : "clear") + ", maxerror " +
      std::to_string(c->max_error_us) + " us, esterror " + std::to_string(c->est_error_us) +
      " us, offset " + std::to_string(c->offset_us) + " us");
  out->metrics["max_error_us"] = double(c->max_error_us);
  const std::string fix =
      "run a time service (chronyd, or timedatectl set-ntp true) against the "
      "cluster's NTP servers";
  if (c->unsynchronized) {
    // A guest on a paravirtual clock reads the host's time, which a time
    // service on the host disciplines: no service here is a risk, not skew.
    const char* kSource = "/sys/devices/system/clocksource/clocksource0/current_clocksource";
    auto source = ReadTrimmed(env, kSource, out);
    if (source) out->evidence.push_back(std::string(kSource) + " = " + *source);
    if (source && (*source == "kvm-clock" || source->rfind("hyperv", 0) == 0 || *source == "xen")) {
      return Verdict(out, kWarn,
                     "no time service disciplines this guest's clock (STA_UNSYNC); it follows the "
                     "host's through " +
                         *source,
                     fix);
    }
    return Verdict(out, kFail, "the clock is not synchronised (STA_UNSYNC)", fix);
  }
  if (c->max_error_us > 100000) {
    return Verdict(out, kWarn,
                   "synchronised, but maxerror " + std::to_string(c->max_error_us / 1000) +
                       " ms (Ceph warns past 50 ms of skew)",
                   fix);
  }
  Verdict(out, kPass, "synchronised (maxerror " + std::to_string(c->max_error_us / 1000) + " ms)");
}

}  // namespace

std::vector<CheckSpec> SystemChecks() {
  return {
      {"kernel-version", "kernel release: 5.15 LTS recommended, none before 5.4.0-135", false,
       KernelVersion},
      {"transparent-hugepages", "THP not 'always' (compaction stalls)", false,
       TransparentHugePages},
      {"hugepages", "memory reserved in huge pages", false, HugePages},
      {"memlock-limit", "RLIMIT_MEMLOCK unlimited (RDMA registration)", false, Memlock},
      {"open-files-limit", "RLIMIT_NOFILE of at least 65536", false, OpenFiles},
      {"cpu-governor", "CPU frequency governor 'performance'", false, CpuGovernor},
      {"numa-balancing", "automatic NUMA balancing off on multi-node machines", false,
       NumaBalancing},
      {"iommu", "IOMMU off or passthrough for GPUs and NICs", false, Iommu},
      {"clock-sync", "the kernel clock is synchronised (adjtimex)", false, ClockSync},
  };
}

}  // namespace stoker::doctor
