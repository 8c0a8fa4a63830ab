// stoker tune ceph|node (stoker/tune.h): settings derived for the cluster and
// the node. `tune` is a parent that other files add children to (tune comm):
// each registers through TuneCommand(), which makes it once.
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "cli/cli.h"
#include "stoker/tune.h"

namespace stoker::cli {

CLI::App* TuneCommand(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands([](CLI::App* a) { return a->get_name() == "tune"; })) {
    return sub;
  }
  auto* tune = app.add_subcommand("tune", "Settings derived for this node and its Ceph cluster");
  tune->require_subcommand(1);
  return tune;
}

namespace {

Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
  f.close();
  if (!f) return IoError("write " + path + ": cannot write the file");
  return Status::Ok();
}

void RegisterTuneCeph(CLI::App* tune, Action* action) {
  struct Args {
    CephTuneOptions o;
    bool dry_run = false, apply = false;
    int timeout_s = 60;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = tune->add_subcommand(
      "ceph",
      "Pools, CRUSH rules, caps and config of the training layout, planned from the "
      "cluster (--dry-run) or applied and read back (--apply)");
  auto* dry = cmd->add_flag("--dry-run", args->dry_run, "Print the ceph commands, change nothing");
  auto* apply = cmd->add_flag("--apply", args->apply, "Run them, then read every value back");
  dry->excludes(apply);
  cmd->add_option("--conf,-c", args->o.conf, "ceph.conf (default: $CEPH_CONF, /etc/ceph)");
  cmd->add_option("--id", args->o.id, "The key that applies (client.ID)")->capture_default_str();
  cmd->add_option("--keyring", args->o.keyring, "Its keyring (default: the conf's)");
  cmd->add_option("--ceph-bin", args->o.ceph, "The ceph command")->capture_default_str();
  cmd->add_option("--timeout", args->timeout_s, "Seconds per ceph command")->capture_default_str();
  cmd->add_option("--data-pool", args->o.data_pool, "Training data pool")->capture_default_str();
  cmd->add_option("--ckpt-pool", args->o.ckpt_pool, "Checkpoint pool")->capture_default_str();
  cmd->add_option("--replicas", args->o.replicas, "Copies per object")->capture_default_str();
  cmd->add_option("--min-size", args->o.min_size, "Copies a write waits for (0: replicas - 1)")
      ->capture_default_str();
  cmd->add_option("--pgs-per-osd", args->o.pgs_per_osd, "PG target per OSD (each copy counts)")
      ->capture_default_str();
  cmd->add_option("--data-share", args->o.data_share, "The data pool's share of the PGs")
      ->capture_default_str();
  cmd->add_option("--gpus-per-node", args->o.gpus_per_node,
                  "GPUs of a client node (osd_op_num_shards = 2x)")
      ->capture_default_str();
  cmd->add_option("--osd-memory-target", args->o.osd_memory_target,
                  "Bytes (0: max(4 GiB, 1 GiB per GPU))")
      ->capture_default_str();
  cmd->add_option("--read-depth", args->o.read_depth, "A rank's reads in flight")
      ->capture_default_str();
  cmd->add_option("--op-timeout", args->o.op_timeout_s, "The job client's op timeouts, s")
      ->capture_default_str();
  cmd->add_option("--client", args->o.job_client, "The per-job client (without client.)")
      ->capture_default_str();
  cmd->add_option("--keyring-out", args->o.job_keyring_out,
                  "After --apply, write the job client's keyring here (0600)");
  cmd->add_option("--prefix", args->o.job_prefix,
                  "Object prefix the job may write in the checkpoint pool (default: the client)");
  cmd->callback([args, action] {
    *action = [args] {
      if (args->dry_run == args->apply) {
        return Fail(InvalidArgument("tune ceph: give --dry-run or --apply"));
      }
      if (args->timeout_s <= 0) return Fail(InvalidArgument("tune ceph: --timeout must be > 0"));
      CephTuneOptions o = args->o;
      o.command_timeout = std::chrono::seconds(args->timeout_s);
      if (args->dry_run) {
        auto plan = PlanCephLayout(o);
        if (!plan.ok()) return Fail(plan.status());
        std::printf("%s", plan->Text(o).c_str());
        return 0;
      }
      auto report = ApplyCephLayout(o);
      if (!report.ok()) return Fail(report.status());
      for (const auto& a : report->applied) std::printf("applied: %s\n", a.c_str());
      for (const auto& v : report->read_back) {
        std::printf("read back: %s = %s\n", v.what.c_str(), v.got.c_str());
      }
      std::printf("tune ceph: %zu change(s) applied; %zu value(s) read back, all as asked\n",
                  report->applied.size(), report->read_back.size());
      return 0;
    };
  });
}

void RegisterTuneNode(CLI::App* tune, Action* action) {
  struct Args {
    NodeTuneOptions o;
    std::string write;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = tune->add_subcommand(
      "node",
      "sysctl, limits, mpirun binding, NCCL env and MPS commands for this node "
      "(printed; nothing is changed)");
  cmd->add_option("--write", args->write, "Also write them to this file");
  cmd->add_option("--sysroot", args->o.sysroot, "Read the node under this folder")
      ->capture_default_str();
  cmd->add_option("--ranks", args->o.ranks, "Ranks on this node (0: one per GPU)")
      ->capture_default_str();
  cmd->add_option("--comm-env", args->o.comm_env_file,
                  "`stoker tune comm --write`'s environment file (default: ./nccl.env if it "
                  "exists)");
  cmd->add_option("--mps-pipe-dir", args->o.mps_pipe_dir, "MPS pipe folder")->capture_default_str();
  cmd->callback([args, action] {
    *action = [args] {
      // tune comm's file under the name its help suggests, when it is here.
      if (args->o.comm_env_file.empty() && ::access("nccl.env", R_OK) == 0) {
        args->o.comm_env_file = "nccl.env";
      }
      auto t = PlanNodeTuning(args->o);
      if (!t.ok()) return Fail(t.status());
      const std::string text = t->Text();
      std::printf("%s", text.c_str());
      if (!args->write.empty()) {
        if (Status s = WriteText(args->write, text); !s.ok()) return Fail(s);
        std::fprintf(stderr, "stoker: wrote %s\n", args->write.c_str());
      }
      return 0;
    };
  });
}

}  // namespace

void RegisterTune(CLI::App& app, Action* action) {
  CLI::App* tune = TuneCommand(app);
  RegisterTuneCeph(tune, action);
  RegisterTuneNode(tune, action);
}

}  // namespace stoker::cli
