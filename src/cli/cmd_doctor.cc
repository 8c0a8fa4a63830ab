// stoker doctor: the node's production checklist (stoker/doctor.h), each
// check PASS / WARN / FAIL / SKIP with its evidence and fix. Exit status 0
// (all PASS or SKIP), 1 (a WARN), 2 (a FAIL).
#include <cstdio>
#include <cstdlib>

#include "cli/cli.h"
#include "stoker/doctor.h"

namespace stoker::cli {

void RegisterDoctor(CLI::App& app, Action* action) {
  struct Args {
    DoctorOptions o;
    bool json = false;
    bool verbose = false;
    bool list = false;
    double timeout_s = 5;
    double bandwidth_timeout_s = 20;
    double dir_read_mib = 64;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "doctor",
      "The node's production checklist: NUMA, PCIe, kernel, limits, GPUs, storage, "
      "Ceph, clock (exit 0 PASS, 1 WARN, 2 FAIL)");
  cmd->add_flag("--json", args->json, "Machine-readable report (schema stoker.doctor/1)");
  cmd->add_flag("-v,--verbose", args->verbose, "Show every check's evidence, not only problems'");
  cmd->add_flag("--list", args->list, "List the checks and exit");
  cmd->add_option("--only", args->o.only, "Run only these checks (names from --list)");
  cmd->add_option("--sysroot", args->o.sysroot,
                  "Read /sys, /proc and the rest under this folder (a fixture or a copy)")
      ->capture_default_str();
  cmd->add_option("--cache-dir", args->o.cache_dir, "Node cache folder to read-test");
  cmd->add_option("--ckpt-dir", args->o.ckpt_dir, "Checkpoint folder to read-test");
  cmd->add_option("--dir-read-mib", args->dir_read_mib, "MiB written then read per folder test")
      ->capture_default_str();
  cmd->add_option("--ceph", args->o.ceph_uri,
                  "Cluster to reach: rados://POOL[/PREFIX]?conf=CONF&id=CLIENT");
  cmd->add_option("--timeout", args->timeout_s, "Seconds each check may take")
      ->capture_default_str();
  cmd->add_option("--bandwidth-timeout", args->bandwidth_timeout_s,
                  "Seconds each bandwidth check may take (all its repeats)")
      ->capture_default_str();
  cmd->add_option("--h2d-repeats", args->o.h2d_repeats, "Timed host-to-device runs per GPU")
      ->capture_default_str();
  cmd->add_option("--min-h2d-gbps", args->o.min_h2d_gbps,
                  "Pinned host-to-device GB/s below which a GPU fails")
      ->capture_default_str();
  cmd->add_option("--min-vfs", args->o.min_vfs, "SR-IOV VFs each capable NIC must have")
      ->capture_default_str();
  cmd->callback([args, action] {
    *action = [args] {
      if (args->list) {
        for (const auto& c : DoctorChecks()) {
          std::printf("%-22s %s%s\n", c.name.c_str(), c.description.c_str(),
                      c.exclusive ? " [measures]" : "");
        }
        return 0;
      }
      if (args->timeout_s <= 0 || args->bandwidth_timeout_s <= 0 || args->dir_read_mib <= 0) {
        return Fail(
            InvalidArgument("--timeout, --bandwidth-timeout and --dir-read-mib must be > 0"));
      }
      DoctorOptions o = args->o;
      o.check_timeout = std::chrono::milliseconds(int64_t(args->timeout_s * 1000));
      o.bandwidth_timeout = std::chrono::milliseconds(int64_t(args->bandwidth_timeout_s * 1000));
      o.dir_read_bytes = uint64_t(args->dir_read_mib * (1 << 20));
      auto report = RunDoctor(o);
      if (!report.ok()) return Fail(report.status());
      const std::string text =
          args->json ? DoctorReportJson(*report) + "\n" : DoctorReportText(*report, args->verbose);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
      const int code = report->ExitCode();
      // A check abandoned at its limit still runs on its thread, perhaps
      // blocked in the kernel: leave without running destructors under it.
      for (const auto& c : report->checks) {
        if (c.timed_out) std::_Exit(code);
      }
      return code;
    };
  });
}

}  // namespace stoker::cli
