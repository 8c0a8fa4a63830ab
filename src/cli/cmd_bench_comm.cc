// stoker bench comm: collectives over MPI (host memory) or NCCL (device
// memory), run under mpirun/srun/torchrun, every result checked (comm.h).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli.h"
#include "stoker/comm.h"

namespace stoker::cli {

namespace {

// "8", "64K", "4M", "1G" (powers of 1024) -> bytes.
Result<uint64_t> ParseBytes(const std::string& flag, const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (unit.size() == 3 && unit[1] == 'i') unit = unit.substr(0, 1);  // KiB -> K
  double scale = 0;
  if (unit.empty()) scale = 1;
  if (unit == "K") scale = 1 << 10;
  if (unit == "M") scale = 1 << 20;
  if (unit == "G") scale = 1 << 30;
  if (end == s.c_str() || !(v > 0) || scale == 0) {
    return InvalidArgument(flag + ": '" + s + "' is not a size like 8, 64K, 4M or 1G");
  }
  return static_cast<uint64_t>(std::llround(v * scale));
}

template <typename T, typename F>
Result<std::vector<T>> ParseList(const std::string& text, const std::vector<T>& all, F parse) {
  if (text == "all") return all;
  std::vector<T> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    STOKER_ASSIGN_OR_RETURN(T v, parse(item));
    out.push_back(v);
  }
  return out;
}

std::string Name(std::string_view v) { return std::string(v); }

}  // namespace

nlohmann::json CommReportJson(const CommReport& r) {
  nlohmann::json j;
  j["world_size"] = r.bindings.size();
  j["backend"] = r.environment.backend;
  j["environment"] = {{"library_version", r.environment.library_version},
                      {"bootstrap", r.environment.bootstrap},
                      {"launcher", r.rank.launcher},
                      {"variables", r.environment.variables}};
  j["bindings"] = nlohmann::json::array();
  for (const auto& b : r.bindings) {
    j["bindings"].push_back({{"rank", b.rank},
                             {"local_rank", b.local_rank},
                             {"host", b.host},
                             {"cpus", b.cpus},
                             {"numa", b.numa},
                             {"gpu", b.gpu},
                             {"nic", b.nic}});
  }
  j["results"] = nlohmann::json::array();
  for (const auto& x : r.results) {
    j["results"].push_back({{"op", Name(CommOpName(x.op))},
                            {"dtype", Name(CommDtypeName(x.dtype))},
                            {"bytes", x.bytes},
                            {"count", x.count},
                            {"time_us", x.time_us},
                            {"max_time_us", x.max_time_us},
                            {"algbw_gbps", x.algbw_gbps},
                            {"busbw_gbps", x.busbw_gbps},
                            {"algorithm", x.algorithm},
                            {"wrong", 0}});
  }
  return j;
}

void RegisterBenchComm(CLI::App* bench, Action* action, CommBenchRunner run) {
  auto* cmd = bench->add_subcommand(
      "comm",
      "Collectives (allreduce, allgather, reducescatter, broadcast, alltoall, sendrecv) over MPI "
      "or NCCL, every result checked; run it under mpirun, srun or torchrun --no-python");
  struct Args {
    std::string backend = "mpi";
    std::string ops = "all";
    std::string dtypes = "float32";
    std::string min = "8";
    std::string max = "1G";
    double step = 2;
    int warmup = 5;
    int iters = 20;
    double timeout = 120;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("--backend", args->backend, "mpi (host memory) or nccl (device memory)")
      ->capture_default_str();
  cmd->add_option("--ops", args->ops, "comma-separated operations, or all")->capture_default_str();
  cmd->add_option("--dtypes", args->dtypes,
                  "float32, bfloat16, float16, int32 (comma list), or all")
      ->capture_default_str();
  cmd->add_option("--min-bytes,--min", args->min, "smallest size (nccl-tests' -b)")
      ->capture_default_str();
  cmd->add_option("--max-bytes,--max", args->max, "largest size (nccl-tests' -e)")
      ->capture_default_str();
  cmd->add_option("--step", args->step, "size factor between steps (nccl-tests' -f)")
      ->capture_default_str();
  cmd->add_option("--warmup", args->warmup, "untimed runs per size")->capture_default_str();
  cmd->add_option("--iters", args->iters, "timed runs per size")->capture_default_str();
  cmd->add_option("--timeout", args->timeout,
                  "seconds without progress before a rank gives up (a peer died or hangs)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "print the whole table, environment and bindings as JSON");
  cmd->callback([args, action, run] {
    *action = [args, run]() -> int {
      CommBenchOptions o;
      o.backend = args->backend;
      auto ops = ParseList(args->ops, AllCommOps(), ParseCommOp);
      if (!ops.ok()) return Fail(ops.status());
      auto dtypes = ParseList(args->dtypes, AllCommDtypes(), ParseCommDtype);
      if (!dtypes.ok()) return Fail(dtypes.status());
      auto min = ParseBytes("--min", args->min);
      auto max = ParseBytes("--max", args->max);
      if (!min.ok()) return Fail(min.status());
      if (!max.ok()) return Fail(max.status());
      o.ops = *ops;
      o.dtypes = *dtypes;
      o.min_bytes = *min;
      o.max_bytes = *max;
      o.step_factor = args->step;
      o.warmup = args->warmup;
      o.iters = args->iters;
      o.timeout_s = args->timeout;
      // A rank stuck in a collective cannot be woken: the command ends the
      // process, without running destructors under the blocked thread.
      o.on_stall = [](const Status& st) {
        const int code = Fail(st);
        std::fflush(stderr);
        std::_Exit(code);
      };
      auto report = run(o);
      if (!report.ok()) return Fail(report.status());
      const CommReport& r = *report;
      if (r.rank.rank != 0) return 0;
      if (args->json) {
        std::printf("%s\n", CommReportJson(r).dump(1).c_str());
        return 0;
      }
      std::printf("# stoker bench comm: %s, %zu ranks, %s (bootstrap: %s)\n", o.backend.c_str(),
                  r.bindings.size(), r.environment.library_version.c_str(),
                  r.environment.bootstrap.c_str());
      for (const auto& [k, v] : r.environment.variables) {
        std::printf("#   %s=%s\n", k.c_str(), v.c_str());
      }
      for (const auto& b : r.bindings) {
        std::printf("#   rank %d (local %d) on %s: cpus %s, numa %d%s%s%s%s\n", b.rank,
                    b.local_rank, b.host.c_str(), b.cpus.c_str(), b.numa,
                    b.gpu.empty() ? "" : ", gpu ", b.gpu.c_str(), b.nic.empty() ? "" : ", nic ",
                    b.nic.c_str());
      }
      std::printf("%14s %9s %13s %12s %12s %12s %12s %12s  %s\n", "op", "dtype", "size(B)", "count",
                  "time(us)", "algbw(GB/s)", "busbw(GB/s)", "max(us)", "algorithm");
      for (const auto& x : r.results) {
        std::printf("%14s %9s %13llu %12llu %12.2f %12.3f %12.3f %12.2f  %s\n",
                    Name(CommOpName(x.op)).c_str(), Name(CommDtypeName(x.dtype)).c_str(),
                    static_cast<unsigned long long>(x.bytes),
                    static_cast<unsigned long long>(x.count), x.time_us, x.algbw_gbps, x.busbw_gbps,
                    x.max_time_us, x.algorithm.c_str());
      }
      std::printf("# every result checked: %zu sizes, 0 wrong\n", r.results.size());
      return 0;
    };
  });
}

}  // namespace stoker::cli
