// stoker tune comm: NCCL's algorithms x protocols (or Open MPI's allreduce
// algorithms) measured by a fresh job each, the best per size against the
// default with its spread, and an environment file a job can source.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/cli.h"
#include "stoker/comm.h"

namespace stoker::cli {

namespace {

std::vector<std::string> Words(const std::string& s, char sep = ' ') {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string w;
  while (std::getline(in, w, sep)) {
    if (!w.empty()) out.push_back(w);
  }
  return out;
}

}  // namespace

void RegisterTuneComm(CLI::App& app, Action* action) {
  // `tune` may be registered by another file too (tune storage, ...).
  CLI::App* tune = nullptr;
  try {
    tune = app.get_subcommand("tune");
  } catch (const CLI::OptionNotFound&) {
    tune = app.add_subcommand("tune", "Find the settings that run fastest on this machine");
    tune->require_subcommand(1);
  }
  auto* cmd = tune->add_subcommand(
      "comm",
      "Sweep NCCL_ALGO x NCCL_PROTO (nccl), or stoker's ring and Open MPI's tuned allreduce "
      "algorithms (mpi), a job "
      "per setting, 3 runs each; print the best per size against the default and write an "
      "environment file");
  struct Args {
    std::string backend = "nccl";
    std::string launcher;
    std::string op = "allreduce";
    std::string dtype = "float32";
    double bucket_mib = 0;
    uint64_t min = 0, max = 0;
    double step = 4;
    int repeats = 3;
    int iters = 20;
    int warmup = 5;
    double timeout = 300;
    std::string only;
    std::string write;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("--backend", args->backend, "nccl or mpi")->capture_default_str();
  cmd->add_option("--launcher", args->launcher,
                  "how to start the job, e.g. 'mpirun -np 8' or 'torchrun --nproc-per-node 8 "
                  "--no-python'")
      ->required();
  cmd->add_option("--op", args->op, "the operation to tune")->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "its dtype")->capture_default_str();
  cmd->add_option("--bucket-mib", args->bucket_mib,
                  "one size: the gradient bucket (DDP's is 25 MiB); the default without "
                  "--min/--max");
  cmd->add_option("--min-bytes,--min", args->min, "a sweep instead: smallest size in bytes");
  cmd->add_option("--max-bytes,--max", args->max, "largest size in bytes");
  cmd->add_option("--step", args->step, "size factor of the sweep")->capture_default_str();
  cmd->add_option("--repeats", args->repeats, "runs of every setting")->capture_default_str();
  cmd->add_option("--iters", args->iters, "timed iterations per run")->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "untimed iterations per run")->capture_default_str();
  cmd->add_option("--timeout", args->timeout, "seconds a run may take")->capture_default_str();
  cmd->add_option("--only", args->only,
                  "comma-separated settings to try besides the default (e.g. Ring/LL128,Tree/"
                  "Simple, or 4:ring for mpi)");
  cmd->add_option("--write", args->write, "write the environment file here (e.g. nccl.env)");
  cmd->callback([args, action] {
    *action = [args]() -> int {
      CommTuneOptions o;
      o.backend = args->backend;
      o.launcher = Words(args->launcher);
      auto op = ParseCommOp(args->op);
      if (!op.ok()) return Fail(op.status());
      auto dtype = ParseCommDtype(args->dtype);
      if (!dtype.ok()) return Fail(dtype.status());
      o.op = *op;
      o.dtype = *dtype;
      if (args->min > 0 || args->max > 0) {
        o.min_bytes = args->min > 0 ? args->min : args->max;
        o.max_bytes = args->max > 0 ? args->max : args->min;
      } else {
        const double mib = args->bucket_mib > 0 ? args->bucket_mib : 25;
        o.min_bytes = o.max_bytes = static_cast<uint64_t>(mib * (1 << 20));
      }
      o.step_factor = args->step;
      o.repeats = args->repeats;
      o.iters = args->iters;
      o.warmup = args->warmup;
      o.timeout_s = args->timeout;
      o.only = Words(args->only, ',');
      auto r = TuneComm(o);
      if (!r.ok()) return Fail(r.status());
      std::printf("# tune comm: %s %s %s, %d ranks, %d runs per setting, %zu settings\n",
                  o.backend.c_str(), args->op.c_str(), args->dtype.c_str(), r->world_size,
                  o.repeats, r->settings.size());
      for (const auto& u : r->unavailable) std::printf("#   unavailable: %s\n", u.c_str());
      std::printf("%14s %16s %12s %12s %9s %9s %s\n", "size(B)", "best", r->metric.c_str(),
                  "default", "gain", "spread", "");
      for (const auto& s : r->sizes) {
        std::printf("%14llu %16s %12.3f %12.3f %+8.1f%% %8.1f%% %s\n",
                    static_cast<unsigned long long>(s.bytes), s.best.c_str(), s.best_busbw,
                    s.default_busbw, 100 * s.gain, 100 * std::max(s.best_spread, s.default_spread),
                    s.beats_default ? "" : "(within noise: no better than the default)");
      }
      if (r->recommended.env.empty()) {
        std::printf("nothing beats the default beyond the noise (%.1f%%): keep the default\n",
                    100 * r->noise);
      } else {
        std::printf("recommended: %s (%+.1f%% over the default, noise %.1f%%)\n",
                    r->recommended.name.c_str(), 100 * r->recommended_gain, 100 * r->noise);
      }
      if (!args->write.empty()) {
        std::ofstream f(args->write, std::ios::trunc);
        f << CommTuneEnvFile(o, *r);
        if (!f.flush()) return Fail(IoError("cannot write " + args->write));
        std::printf("wrote %s (source it in the job's environment)\n", args->write.c_str());
      }
      return 0;
    };
  });
}

}  // namespace stoker::cli
