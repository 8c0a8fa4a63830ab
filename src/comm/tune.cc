// `stoker tune comm`: each setting measured by a fresh job of `stoker bench
// comm` (comm.h), 3 rounds, the best per size against the default with the
// runs' spread.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "stoker/comm.h"

extern char** environ;

namespace stoker {

namespace {

using Clock = std::chrono::steady_clock;

// Open MPI 4.1's coll/tuned allreduce algorithms (ompi_info --param coll
// tuned --level 9).
constexpr const char* kOmpiAllreduce[] = {"basic_linear", "nonoverlapping", "recursive_doubling",
                                          "ring",         "segmented_ring", "rabenseifner"};

// Variables a setting may set; the children's environment drops them all
// first, so that "default" is the library's own choice.
bool TunedVariable(const std::string& name) {
  return name == "NCCL_ALGO" || name == "NCCL_PROTO" ||
         name.rfind("OMPI_MCA_coll_tuned_", 0) == 0 || name.rfind("STOKER_COMM_MPI_", 0) == 0;
}

struct Child {
  int rc = -1;
  bool timed_out = false;
  std::string out, err;
};

// Runs argv with env; stdout and stderr captured; killed (its process
// group) after the timeout.
Result<Child> RunChild(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                       double timeout_s) {
  int out[2], err[2];
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  std::vector<char*> a, e;
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  for (const auto& s : env) e.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  e.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, a[0], &fa, &attr, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(out[0]);
    close(err[0]);
    return ErrnoToStatus(rc, "start " + argv[0]);
  }
  Child c;
  const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (Clock::now() > deadline && !c.timed_out) {
      c.timed_out = true;
      kill(-pid, SIGKILL);
    }
    if (poll(fds, 2, 200) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const ssize_t k = read(fds[i].fd, buf, sizeof buf);
      if (k > 0) {
        (i == 0 ? c.out : c.err).append(buf, static_cast<size_t>(k));
      } else if (k == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  waitpid(pid, &status, 0);
  c.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return c;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Spread(const std::vector<double>& v) {
  if (v.empty()) return 0;
  const double m = Median(v);
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return m > 0 ? (*hi - *lo) / m : 0;
}

std::string LastLines(const std::string& s, int n) {
  size_t pos = s.size();
  while (n-- > 0 && pos > 0) {
    pos = s.rfind('\n', pos - 2 < s.size() ? pos - 2 : 0);
    if (pos == std::string::npos) return s;
    ++pos;
  }
  return s.substr(pos);
}

}  // namespace

Result<std::vector<CommTuneSetting>> CommTuneSettings(const std::string& backend, CommOp op) {
  std::vector<CommTuneSetting> s = {{"default", {}}};
  if (backend == "nccl") {
    for (const char* algo : {"Ring", "Tree", "NVLS", "CollnetDirect", "CollnetChain"}) {
      for (const char* proto : {"Simple", "LL", "LL128"}) {
        s.push_back(
            {std::string(algo) + "/" + proto, {{"NCCL_ALGO", algo}, {"NCCL_PROTO", proto}}});
      }
    }
    return s;
  }
  if (backend == "mpi") {
    if (op != CommOp::kAllReduce) {
      return Unsupported(
          "tune comm --backend mpi sweeps allreduce algorithms only (stoker's ring and Open "
          "MPI's)");
    }
    // The default is the backend's own choice (comm.h: stoker's ring from
    // 1 MiB); then the ring's knobs, then MPI_Allreduce with Open MPI's own
    // choice and each of its algorithms.
    s.push_back({"ring/seg64K",
                 {{"STOKER_COMM_MPI_ALLREDUCE", "ring"},
                  {"STOKER_COMM_MPI_SEGMENT", std::to_string(64 << 10)}}});
    s.push_back({"ring/seg1M",
                 {{"STOKER_COMM_MPI_ALLREDUCE", "ring"},
                  {"STOKER_COMM_MPI_SEGMENT", std::to_string(1 << 20)}}});
    s.push_back(
        {"ring/spin", {{"STOKER_COMM_MPI_ALLREDUCE", "ring"}, {"STOKER_COMM_MPI_SLEEP_US", "0"}}});
    s.push_back({"MPI_Allreduce", {{"STOKER_COMM_MPI_ALLREDUCE", "mpi"}}});
    for (int i = 1; i <= 6; ++i) {
      s.push_back({std::to_string(i) + ":" + kOmpiAllreduce[i - 1],
                   {{"STOKER_COMM_MPI_ALLREDUCE", "mpi"},
                    {"OMPI_MCA_coll_tuned_use_dynamic_rules", "1"},
                    {"OMPI_MCA_coll_tuned_allreduce_algorithm", std::to_string(i)}}});
    }
    return s;
  }
  return InvalidArgument("--backend: '" + backend + "' is neither mpi nor nccl");
}

Result<CommTuneReport> TuneComm(const CommTuneOptions& o) {
  if (o.launcher.empty()) {
    return InvalidArgument(
        "tune comm starts a job per setting: give the launcher, e.g. "
        "--launcher 'mpirun -np 8' or --launcher 'torchrun --nproc-per-node 8 "
        "--no-python'");
  }
  if (o.repeats < 1) return InvalidArgument("--repeats must be at least 1");
  CommTuneReport report;
  STOKER_ASSIGN_OR_RETURN(auto all, CommTuneSettings(o.backend, o.op));
  for (const auto& s : all) {
    if (s.name == "default" || o.only.empty() ||
        std::find(o.only.begin(), o.only.end(), s.name) != o.only.end()) {
      report.settings.push_back(s);
    }
  }
  for (const auto& name : o.only) {
    if (std::none_of(all.begin(), all.end(), [&](const auto& s) { return s.name == name; })) {
      std::string names;
      for (const auto& s : all) names += (names.empty() ? "" : ", ") + s.name;
      return InvalidArgument("--only: no setting '" + name + "' (" + names + ")");
    }
  }
  // The children's environment: ours, less rank variables (a tune run from
  // inside a job must not pass its rank on) and the tuned variables.
  std::vector<std::string> base_env;
  const auto rank_vars = RankVariables();
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    if (TunedVariable(name)) continue;
    if (std::find(rank_vars.begin(), rank_vars.end(), name) != rank_vars.end()) continue;
    base_env.push_back(kv);
  }
  // The children run this binary by its real path (/proc/self/exe would be
  // the launcher's own in the child).
  std::string stoker = o.stoker;
  if (stoker == "/proc/self/exe") {
    char path[4096];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
    if (n <= 0) return ErrnoToStatus(errno, "readlink /proc/self/exe");
    stoker.assign(path, static_cast<size_t>(n));
  }
  const bool mpirun = o.launcher[0].find("mpirun") != std::string::npos ||
                      o.launcher[0].find("mpiexec") != std::string::npos;
  CommBenchOptions sweep;
  sweep.min_bytes = o.min_bytes;
  sweep.max_bytes = o.max_bytes;
  sweep.step_factor = o.step_factor;
  const std::vector<uint64_t> sizes = CommSizes(sweep);
  report.busbw.assign(report.settings.size(), std::vector<std::vector<double>>(sizes.size()));
  std::vector<bool> failed(report.settings.size(), false);
  std::vector<uint64_t> measured_bytes(sizes.size(), 0);
  for (int round = 0; round < o.repeats; ++round) {
    for (size_t si = 0; si < report.settings.size(); ++si) {
      if (failed[si]) continue;
      const CommTuneSetting& s = report.settings[si];
      std::vector<std::string> argv = o.launcher;
      std::vector<std::string> env = base_env;
      for (const auto& [k, v] : s.env) {
        env.push_back(k + "=" + v);
        if (mpirun) argv.insert(argv.begin() + 1, {"-x", k});
      }
      std::ostringstream step;
      step << o.step_factor;
      for (std::string a : {stoker,
                            std::string("bench"),
                            std::string("comm"),
                            std::string("--backend"),
                            o.backend,
                            std::string("--ops"),
                            std::string(CommOpName(o.op)),
                            std::string("--dtypes"),
                            std::string(CommDtypeName(o.dtype)),
                            std::string("--min-bytes"),
                            std::to_string(o.min_bytes),
                            std::string("--max-bytes"),
                            std::to_string(o.max_bytes),
                            std::string("--step"),
                            step.str(),
                            std::string("--warmup"),
                            std::to_string(o.warmup),
                            std::string("--iters"),
                            std::to_string(o.iters),
                            std::string("--json")}) {
        argv.push_back(a);
      }
      STOKER_ASSIGN_OR_RETURN(Child c, RunChild(argv, env, o.timeout_s));
      const auto brace = c.out.find('{');
      nlohmann::json j;
      std::string why;
      if (c.timed_out) {
        why = "timed out after " + std::to_string(int(o.timeout_s)) + " s";
      } else if (c.rc != 0 || brace == std::string::npos) {
        why = "exit " + std::to_string(c.rc) + ": " + LastLines(c.err + c.out, 3);
      } else {
        try {
          j = nlohmann::json::parse(c.out.substr(brace));
        } catch (const std::exception& e) {
          why = std::string("unreadable output: ") + e.what();
        }
      }
      if (!why.empty()) {
        if (s.name == "default") {
          return IoError("tune comm: the default run failed (" + why + "); command: " + [&] {
            std::string cmd;
            for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
            return cmd;
          }());
        }
        failed[si] = true;
        report.unavailable.push_back(s.name + ": " + why);
        continue;
      }
      report.world_size = j.value("world_size", 0);
      if (report.world_size == 1) report.metric = "algbw";
      const auto& results = j["results"];
      for (size_t k = 0; k < sizes.size() && k < results.size(); ++k) {
        report.busbw[si][k].push_back(results[k].value(report.metric + "_gbps", 0.0));
        measured_bytes[k] = results[k].value("bytes", uint64_t{0});
      }
    }
  }
  // Drop failed settings.
  for (size_t si = report.settings.size(); si-- > 0;) {
    if (failed[si]) {
      report.settings.erase(report.settings.begin() + si);
      report.busbw.erase(report.busbw.begin() + si);
    }
  }
  // Per size: the best median against the default's.
  std::vector<double> log_gain(report.settings.size(), 0);
  double noise_sum = 0;
  size_t n_sizes = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (report.busbw[0][k].empty()) continue;
    CommTuneSize t;
    t.bytes = measured_bytes[k];
    t.default_busbw = Median(report.busbw[0][k]);
    t.default_spread = Spread(report.busbw[0][k]);
    t.best = "default";
    t.best_busbw = t.default_busbw;
    t.best_spread = t.default_spread;
    for (size_t si = 0; si < report.settings.size(); ++si) {
      const double m = Median(report.busbw[si][k]);
      if (t.default_busbw > 0 && m > 0) log_gain[si] += std::log(m / t.default_busbw);
      if (m > t.best_busbw) {
        t.best = report.settings[si].name;
        t.best_busbw = m;
        t.best_spread = Spread(report.busbw[si][k]);
      }
    }
    t.gain = t.default_busbw > 0 ? t.best_busbw / t.default_busbw - 1 : 0;
    t.beats_default = t.best != "default" && t.gain > std::max(t.default_spread, t.best_spread);
    noise_sum += std::max(t.default_spread, t.best_spread);
    ++n_sizes;
    report.sizes.push_back(t);
  }
  report.noise = n_sizes ? noise_sum / n_sizes : 0;
  size_t best = 0;
  for (size_t si = 1; si < report.settings.size(); ++si) {
    if (log_gain[si] > log_gain[best]) best = si;
  }
  const double gain = n_sizes ? std::exp(log_gain[best] / n_sizes) - 1 : 0;
  if (best != 0 && gain > report.noise) {
    report.recommended = report.settings[best];
    report.recommended_gain = gain;
  } else {
    report.recommended = report.settings[0];
    report.recommended_gain = 0;
  }
  return report;
}

std::string CommTuneEnvFile(const CommTuneOptions& o, const CommTuneReport& r) {
  std::ostringstream f;
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  f << "# stoker tune comm: " << o.backend << " " << CommOpName(o.op) << " "
    << CommDtypeName(o.dtype) << ", " << r.world_size << " ranks, " << o.repeats
    << " runs per setting, " << date << "\n";
  for (const auto& s : r.sizes) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "#   %llu B: best %s %.3f GB/s %s, default %.3f (%+.1f%%, spread %.1f%% / "
                  "%.1f%%)%s\n",
                  static_cast<unsigned long long>(s.bytes), s.best.c_str(), s.best_busbw,
                  r.metric.c_str(), s.default_busbw, 100 * s.gain, 100 * s.best_spread,
                  100 * s.default_spread, s.beats_default ? "" : " (within noise)");
    f << line;
  }
  if (r.recommended.env.empty()) {
    f << "# nothing beat the default beyond the noise: keep the library's own choice\n";
    for (const auto& s : r.settings) {
      for (const auto& [k, v] : s.env) {
        (void)v;
        if (f.str().find("unset " + k + "\n") == std::string::npos) f << "unset " << k << "\n";
      }
    }
    return f.str();
  }
  char line[160];
  std::snprintf(line, sizeof line, "# recommended: %s, %+.1f%% over the default (noise %.1f%%)\n",
                r.recommended.name.c_str(), 100 * r.recommended_gain, 100 * r.noise);
  f << line;
  for (const auto& [k, v] : r.recommended.env) f << "export " << k << "=" << v << "\n";
  return f.str();
}

}  // namespace stoker
