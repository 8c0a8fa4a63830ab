// stoker bench h2d: host->device and device->host copy bandwidth, pinned and
// pageable, over a sweep of sizes (as nvbandwidth does), plus stoker's own
// staging path next to the best plain cudaMemcpyAsync of the same run. With
// --min-gbps it is a node check: exit 1 when pinned H2D is below it.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "gpu/h2d_bench.h"
#include "stoker/gpu.h"

namespace stoker::cli {

namespace {

// "64K", "4M", "1G", "65536" -> bytes.
Result<uint64_t> ParseSize(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  double scale = 1;
  const std::string unit = end ? std::string(end) : std::string();
  if (unit == "K" || unit == "KiB") scale = 1 << 10;
  if (unit == "M" || unit == "MiB") scale = 1 << 20;
  if (unit == "G" || unit == "GiB") scale = 1 << 30;
  if (end == s.c_str() || v <= 0 || (scale == 1 && !unit.empty())) {
    return InvalidArgument("--sizes: '" + s + "' is not a size like 64K, 4M or 1G");
  }
  return static_cast<uint64_t>(v * scale);
}

// The pinned H2D median at the size of a stoker-path measurement.
double PinnedAt(const H2dReport& r, uint64_t bytes) {
  for (const auto& m : r.results) {
    if (m.direction == "h2d" && m.memory == "pinned" && m.bytes == bytes) return m.gbps;
  }
  return 0;
}

nlohmann::json ToJson(const H2dReport& r) {
  nlohmann::json j;
  const CudaDeviceInfo& d = r.device;
  j["device"] = {{"index", d.index},
                 {"name", d.name},
                 {"pci_bus_id", d.pci_bus_id},
                 {"total_memory", d.total_memory},
                 {"compute_capability",
                  std::to_string(d.compute_major) + "." + std::to_string(d.compute_minor)},
                 {"copy_engines", d.copy_engines},
                 {"driver_version", d.driver_version},
                 {"runtime_version", d.runtime_version}};
  j["results"] = nlohmann::json::array();
  for (const auto& m : r.results) {
    nlohmann::json x = {{"direction", m.direction},
                        {"memory", m.memory},
                        {"bytes", m.bytes},
                        {"gbps", m.gbps},
                        {"best_gbps", m.best_gbps}};
    if (m.memory == "stoker" && PinnedAt(r, m.bytes) > 0) {
      x["vs_pinned"] = m.gbps / PinnedAt(r, m.bytes);
    }
    j["results"].push_back(x);
  }
  j["h2d_pinned_gbps"] = r.h2d_pinned_gbps;
  j["h2d_pageable_gbps"] = r.h2d_pageable_gbps;
  j["d2h_pinned_gbps"] = r.d2h_pinned_gbps;
  j["d2h_pageable_gbps"] = r.d2h_pageable_gbps;
  j["h2d_stoker_gbps"] = r.h2d_stoker_gbps;
  j["stoker_vs_best_pinned"] = r.h2d_pinned_gbps > 0 ? r.h2d_stoker_gbps / r.h2d_pinned_gbps : 0;
  return j;
}

void PrintText(const H2dReport& r) {
  const CudaDeviceInfo& d = r.device;
  std::printf("cuda:%d %s (%s, %s, compute %d.%d, %d copy engines, driver %d.%d)\n", d.index,
              d.name.c_str(), d.pci_bus_id.c_str(), HumanBytes(double(d.total_memory)).c_str(),
              d.compute_major, d.compute_minor, d.copy_engines, d.driver_version / 1000,
              d.driver_version % 1000 / 10);
  std::printf("  %-4s %-9s %10s %12s %10s %10s\n", "dir", "memory", "size", "GB/s (med)", "best",
              "vs pinned");
  for (const auto& m : r.results) {
    char ratio[16] = "";
    if (m.memory == "stoker" && PinnedAt(r, m.bytes) > 0) {
      std::snprintf(ratio, sizeof ratio, "%.3f", m.gbps / PinnedAt(r, m.bytes));
    }
    std::printf("  %-4s %-9s %10s %12.2f %10.2f %10s\n", m.direction.c_str(), m.memory.c_str(),
                HumanBytes(double(m.bytes)).c_str(), m.gbps, m.best_gbps, ratio);
  }
  std::printf("  best: h2d pinned %.2f GB/s, pageable %.2f; d2h pinned %.2f, pageable %.2f\n",
              r.h2d_pinned_gbps, r.h2d_pageable_gbps, r.d2h_pinned_gbps, r.d2h_pageable_gbps);
  if (r.h2d_stoker_gbps > 0) {
    std::printf("  stoker's staging path: %.2f GB/s, %.3f of the best pinned cudaMemcpyAsync\n",
                r.h2d_stoker_gbps, r.h2d_stoker_gbps / r.h2d_pinned_gbps);
  }
}

}  // namespace

void RegisterBenchH2d(CLI::App* bench, Action* action) {
  struct Args {
    std::string device = "cuda:0";
    std::vector<std::string> sizes;
    uint32_t repeats = 5;
    double run_mib = 1024;
    double min_gbps = 0;
    bool no_stoker = false;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = bench->add_subcommand(
      "h2d", "Host<->device copy bandwidth (pinned vs pageable, across sizes); a node check");
  cmd->add_option("--device", args->device, "CUDA device (cuda:N)")->capture_default_str();
  cmd->add_option("--sizes", args->sizes, "Copy sizes (e.g. 64K 1M 256M); default 64K..256M x4")
      ->delimiter(',');
  cmd->add_option("--repeats", args->repeats, "Timed runs per size (the median is reported)")
      ->capture_default_str();
  cmd->add_option("--run-mib", args->run_mib, "MiB copied per timed run")->capture_default_str();
  cmd->add_option("--min-gbps", args->min_gbps,
                  "Exit 1 when the best pinned host-to-device GB/s is below this (0: no check)")
      ->capture_default_str();
  cmd->add_flag("--no-stoker-path", args->no_stoker, "Skip the loader's staging path");
  cmd->add_flag("--json", args->json, "Machine-readable output");
  cmd->callback([args, action] {
    *action = [args] {
      H2dBenchOptions o;
      auto device = ParseDevice(args->device);
      if (!device.ok()) return Fail(device.status());
      if (*device < 0) return Fail(InvalidArgument("--device must be a CUDA device (cuda:N)"));
      o.device = *device;
      if (!args->sizes.empty()) {
        o.sizes.clear();
        for (const auto& s : args->sizes) {
          auto n = ParseSize(s);
          if (!n.ok()) return Fail(n.status());
          o.sizes.push_back(*n);
        }
      }
      o.repeats = args->repeats;
      o.bytes_per_run = static_cast<uint64_t>(args->run_mib * (1 << 20));
      o.stoker_path = !args->no_stoker;
      auto report = BenchH2d(o);
      if (!report.ok()) return Fail(report.status());
      const bool below = args->min_gbps > 0 && report->h2d_pinned_gbps < args->min_gbps;
      if (args->json) {
        nlohmann::json j = ToJson(*report);
        j["min_gbps"] = args->min_gbps;
        j["pass"] = !below;
        std::printf("%s\n", j.dump(2).c_str());
      } else {
        PrintText(*report);
      }
      if (below) {
        std::fprintf(stderr,
                     "stoker: %s: pinned host-to-device %.2f GB/s is below --min-gbps %.2f\n",
                     args->device.c_str(), report->h2d_pinned_gbps, args->min_gbps);
        return kExitProblems;
      }
      return 0;
    };
  });
}

}  // namespace stoker::cli
