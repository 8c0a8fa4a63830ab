// The GPUs: persistence, ECC, MPS (NVML, loaded at run time, and the MPS
// pipe folder), and pinned host-to-device bandwidth per GPU.
#include <algorithm>
#include <cstdlib>

#include "doctor/internal.h"

namespace stoker::doctor {
namespace {

constexpr CheckState kPass = CheckState::kPass;
constexpr CheckState kWarn = CheckState::kWarn;
constexpr CheckState kFail = CheckState::kFail;
constexpr CheckState kSkip = CheckState::kSkip;

std::string GpuName(const NvmlGpu& g) {
  return "GPU " + std::to_string(g.index) + " (" + g.pci_bus_id + (g.name.empty() ? "" : ", ") +
         g.name + ")";
}

// NVML's view, or a SKIP saying why there is none.
std::optional<NvmlReport> GetNvml(const NodeEnv& env, CheckResult* out) {
  auto r = env.Nvml();
  if (!r.ok()) {
    out->evidence.push_back(r.status().ToString());
    Verdict(out, kSkip, r.status().message());
    return std::nullopt;
  }
  out->evidence.push_back("NVML: driver " + r->driver_version + ", " +
                          std::to_string(r->gpus.size()) + " GPU(s)");
  if (r->gpus.empty()) {
    Verdict(out, kSkip, "NVML reports no GPU");
    return std::nullopt;
  }
  return *r;
}

// Without persistence mode the driver tears a GPU down when its last client
// exits: each job's first CUDA call pays the initialisation again.
void Persistence(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  auto nvml = GetNvml(env, out);
  if (!nvml) return;
  int off = 0, unknown = 0;
  for (const NvmlGpu& g : nvml->gpus) {
    out->evidence.push_back(GpuName(g) + ": persistence mode " +
                            (g.persistence_mode < 0 ? "unknown"
                             : g.persistence_mode   ? "on"
                                                    : "off"));
    off += g.persistence_mode == 0;
    unknown += g.persistence_mode < 0;
  }
  if (off > 0) {
    return Verdict(out, kWarn,
                   std::to_string(off) +
                       " GPU(s) without persistence mode: each job pays the "
                       "driver's start",
                   "run nvidia-persistenced (or nvidia-smi -pm 1) at boot");
  }
  if (unknown == int(nvml->gpus.size()))
    return Verdict(out, kSkip, "NVML cannot tell the persistence mode");
  Verdict(out, kPass, "persistence mode on for every GPU");
}

void Ecc(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  auto nvml = GetNvml(env, out);
  if (!nvml) return;
  int bad = 0, pending = 0, disabled = 0, history = 0;
  std::string first;
  for (const NvmlGpu& g : nvml->gpus) {
    out->evidence.push_back(GpuName(g) + ": ECC " +
                            (g.ecc_enabled < 0 ? "unknown"
                             : g.ecc_enabled   ? "on"
                                               : "off") +
                            ", uncorrected volatile " + std::to_string(g.ecc_uncorrected_volatile) +
                            ", aggregate " + std::to_string(g.ecc_uncorrected_aggregate) +
                            ", corrected volatile " + std::to_string(g.ecc_corrected_volatile) +
                            ", repair pending " + std::to_string(g.pending_memory_repair));
    if (g.ecc_uncorrected_volatile > 0 || g.pending_memory_repair > 0) {
      bad += g.ecc_uncorrected_volatile > 0;
      pending += g.pending_memory_repair > 0;
      if (first.empty()) first = GpuName(g);
    }
    disabled += g.ecc_enabled == 0;
    history += g.ecc_uncorrected_aggregate > 0;
  }
  if (bad > 0 || pending > 0) {
    return Verdict(out, kFail,
                   std::to_string(bad) + " GPU(s) with uncorrected ECC errors, " +
                       std::to_string(pending) + " with a memory repair pending; first " + first,
                   "drain the node and reset the GPU (nvidia-smi -r -i N); replace it if errors "
                   "recur");
  }
  if (disabled > 0) {
    return Verdict(out, kWarn, std::to_string(disabled) + " GPU(s) with ECC off",
                   "nvidia-smi -e 1 -i N, then reset the GPU");
  }
  if (history > 0) {
    return Verdict(out, kWarn,
                   std::to_string(history) +
                       " GPU(s) had uncorrected ECC errors in the past "
                       "(aggregate counter)",
                   "watch the GPU (nvidia-smi -q -d ECC,ROW_REMAPPER); replace it if they recur");
  }
  Verdict(out, kPass, "ECC on, no uncorrected error, no repair pending");
}

// MPS lets several ranks share a GPU through one daemon. A pipe folder with a
// control pipe but no daemon makes CUDA clients fail to connect.
void Mps(const NodeEnv& env, const DoctorOptions&, CheckResult* out) {
  const char* from_env = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string pipe_dir = from_env && *from_env ? from_env : "/tmp/nvidia-mps";
  out->evidence.push_back("MPS pipe folder " + pipe_dir +
                          (from_env && *from_env ? " (CUDA_MPS_PIPE_DIRECTORY)" : " (default)"));
  const NodeFacts facts = GatherNodeFacts(env);
  auto nvml = env.Nvml();
  const bool gpus = !facts.gpus.empty() || (nvml.ok() && !nvml->gpus.empty());
  if (!gpus) return Verdict(out, kSkip, "no GPU on this node");
  bool control = false;
  if (auto entries = env.ListDir(pipe_dir); entries.ok()) {
    control = std::find(entries->begin(), entries->end(), "control") != entries->end();
    out->evidence.push_back(pipe_dir +
                            (control ? " holds a control pipe" : " has no control pipe"));
  } else {
    out->evidence.push_back(pipe_dir + ": " + entries.status().message());
  }
  int daemons = 0, servers = 0;
  if (auto procs = env.ListDir("/proc"); procs.ok()) {
    for (const std::string& p : *procs) {
      if (p.empty() || !std::isdigit(static_cast<unsigned char>(p[0]))) continue;
      auto comm = env.ReadFile("/proc/" + p + "/comm");
      if (!comm.ok()) continue;
      // comm is cut at 15 characters: both daemons read "nvidia-cuda-mps";
      // argv[0] tells them apart.
      if (Trim(*comm) != "nvidia-cuda-mps") continue;
      auto cmdline = env.ReadFile("/proc/" + p + "/cmdline");
      if (!cmdline.ok()) continue;
      const std::string argv0 = cmdline->substr(0, cmdline->find('\0'));
      const std::string base = argv0.substr(argv0.rfind('/') + 1);
      daemons += base == "nvidia-cuda-mps-control";
      servers += base == "nvidia-cuda-mps-server";
    }
    out->evidence.push_back("/proc: " + std::to_string(daemons) + " nvidia-cuda-mps-control, " +
                            std::to_string(servers) + " nvidia-cuda-mps-server");
  }
  if (control && daemons == 0) {
    return Verdict(
        out, kFail,
        "a control pipe in " + pipe_dir + " but no MPS daemon: CUDA clients fail to connect",
        "start it (nvidia-cuda-mps-control -d) or remove the stale folder " + pipe_dir);
  }
  if (daemons == 0) {
    return Verdict(out, kPass, "MPS not running: each rank has the GPU to itself");
  }
  if (nvml.ok()) {
    for (const NvmlGpu& g : nvml->gpus) {
      out->evidence.push_back(GpuName(g) + ": compute mode " + g.compute_mode);
      if (g.compute_mode == "DEFAULT") {
        return Verdict(
            out, kWarn,
            "MPS runs, but " + GpuName(g) + " is in compute mode DEFAULT: processes may bypass it",
            "nvidia-smi -i " + std::to_string(g.index) +
                " -c EXCLUSIVE_PROCESS (as root, before starting MPS)");
      }
    }
  }
  Verdict(out, kPass, "MPS daemon running (" + pipe_dir + ")");
}

// The host-to-device copy the loader's staging path makes, per GPU, repeated:
// the median against the guides' floor and against the link, the spread
// against a flapping measurement.
void H2dBandwidth(const NodeEnv& env, const DoctorOptions& o, CheckResult* out) {
  auto gpus = env.CudaGpus();
  if (!gpus.ok()) {
    out->evidence.push_back(gpus.status().ToString());
    return Verdict(out, kSkip, "no CUDA GPU: " + gpus.status().message());
  }
  if (gpus->empty()) return Verdict(out, kSkip, "CUDA reports no GPU");
  const NodeFacts facts = GatherNodeFacts(env);
  int below_floor = 0, below_link = 0, flapping = 0, failed = 0;
  std::string first;
  for (const CudaGpu& g : *gpus) {
    const std::string name = "cuda:" + std::to_string(g.index) + " (" + g.pci_bus_id + ")";
    auto runs = env.MeasureH2d(g.index, o.h2d_bytes, std::max(1u, o.h2d_repeats));
    if (!runs.ok() || runs->empty()) {
      ++failed;
      out->evidence.push_back(name + ": " + (runs.ok() ? "no run" : runs.status().ToString()));
      if (first.empty()) first = name;
      continue;
    }
    const Spread s = SpreadOf(*runs);
    std::string line = name + ": " + std::to_string(runs->size()) + " runs of " +
                       BytesText(o.h2d_bytes) + ", " + SpreadText(s, "GB/s");
    double link_gbps = 0;
    for (const PciDevice& d : facts.gpus) {
      if (d.address != g.pci_bus_id || d.max.width == 0) continue;
      PciLink expect = d.max;
      if (d.upstream_max.width) expect.width = std::min(expect.width, d.upstream_max.width);
      if (d.upstream_max.speed_gts > 0) {
        expect.speed_gts = std::min(expect.speed_gts, d.upstream_max.speed_gts);
      }
      link_gbps = LinkGBps(expect);
      line += "; link " + LinkText(expect) + " = " + Fixed(link_gbps, 1) + " GB/s, " +
              Fixed(s.median / link_gbps, 2) + " of it";
    }
    out->evidence.push_back(line);
    const std::string key = "gpu" + std::to_string(g.index);
    out->metrics[key + "_median_gbps"] = s.median;
    out->metrics[key + "_spread"] = s.spread;
    // Below 60% of the link: PCIe 4/5 x16 copies reach 80-90% of it.
    const bool floor = s.median < o.min_h2d_gbps;
    const bool link = link_gbps > 0 && s.median < 0.6 * link_gbps;
    const bool flap = s.spread > 0.15;
    below_floor += floor;
    below_link += !floor && link;
    flapping += flap;
    if ((floor || link || flap) && first.empty()) first = name;
  }
  const std::string fix =
      "check the GPU's link (gpu-pcie-link), its NUMA placement and the IOMMU; then "
      "stoker bench h2d --device cuda:N for the full sweep";
  if (failed > 0) {
    return Verdict(out, kFail,
                   std::to_string(failed) + " GPU(s) could not be measured, first " + first, fix);
  }
  if (below_floor > 0) {
    return Verdict(out, kFail,
                   std::to_string(below_floor) + " GPU(s) below " + Fixed(o.min_h2d_gbps, 1) +
                       " GB/s pinned host-to-device, first " + first,
                   fix);
  }
  if (below_link > 0) {
    return Verdict(
        out, kWarn,
        std::to_string(below_link) + " GPU(s) below 60% of their link's bandwidth, first " + first,
        fix);
  }
  if (flapping > 0) {
    return Verdict(out, kWarn,
                   std::to_string(flapping) + " GPU(s) whose runs spread over 15%, first " + first +
                       ": something else copies or throttles",
                   "rerun when the node is idle; look for other processes on the GPU (nvidia-smi)");
  }
  Verdict(out, kPass,
          std::to_string(gpus->size()) + " GPU(s) at or above " + Fixed(o.min_h2d_gbps, 1) +
              " GB/s, steady across runs");
}

}  // namespace

std::vector<CheckSpec> GpuChecks() {
  return {
      {"gpu-persistence", "persistence mode on each GPU (NVML)", false, Persistence},
      {"gpu-ecc", "ECC on, no uncorrected errors, no memory repair pending (NVML)", false, Ecc},
      {"gpu-mps", "MPS daemon state against its pipe folder and compute modes", false, Mps},
      {"h2d-bandwidth", "pinned host-to-device GB/s per GPU, repeated (median, spread)", true,
       H2dBandwidth},
  };
}

}  // namespace stoker::doctor
