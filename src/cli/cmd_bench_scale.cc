// stoker bench scale --samples N [--shards S] [--ranks R] [--cache DIR]: what
// a dataset's size costs before the first batch. Writes a synthetic dataset
// of N tiny samples over S shards (its manifest and shard table as the
// writer writes them; the shards made on read, ShardBuilder's bytes, so 10^9
// samples need no disk), then starts R rank processes (this program again,
// as the hidden `bench scale-rank`), each of which opens a loader on it (and
// the node cache under DIR), takes the first batch, starts the next epoch
// and takes its first batch, and reports those times and its peak RSS. Per
// repetition the slowest rank and the largest RSS count; the figures are the
// medians over --repeat repetitions (a fresh cache folder each).
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/bench.h"
#include "cli/cli.h"
#include "stoker/format.h"
#include "stoker/loader.h"

namespace stoker::cli {
namespace {

struct ScaleArgs {
  uint64_t samples = 0;
  uint64_t shards = 0;  // 0: samples / 100, at most 10^6
  uint32_t ranks = 1;
  std::string cache;
  std::string dir;
  uint32_t repeat = 3;
  uint32_t batch_size = 256;
  uint32_t window = 8;
  uint32_t threads = 1;
  uint32_t sample_bytes = 8;
  bool json = false;
  // scale-rank only
  uint32_t rank = 0;
};

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double Mib(uint64_t bytes) { return double(bytes) / double(1 << 20); }

// One rank: open, first batch, next epoch's first batch; one JSON line.
int RunScaleRank(const ScaleArgs& a) {
  const double base_rss = Mib(GetProcessUsage().rss_bytes);
  const auto t0 = Clock::now();
  auto dir = OpenStore(a.dir);
  if (!dir.ok()) return Fail(dir.status());
  auto store = NewSyntheticShardStore(*dir);
  if (!store.ok()) return Fail(store.status());
  LoaderOptions o;
  o.batch_size = a.batch_size;
  o.shuffle_window_shards = a.window;
  o.threads = a.threads;
  o.rank = a.rank;
  o.world_size = a.ranks;
  o.cache_dir = a.cache;
  auto loader = Loader::Open(*store, o);
  if (!loader.ok()) return Fail(loader.status());
  const double open_seconds = Since(t0);
  auto first = (*loader)->Next();
  if (!first.ok()) return Fail(first.status());
  const double first_batch_seconds = Since(t0);
  const auto t1 = Clock::now();
  if (Status st = (*loader)->StartEpoch(1); !st.ok()) return Fail(st);
  auto next = (*loader)->Next();
  if (!next.ok()) return Fail(next.status());
  const double next_epoch_seconds = Since(t1);
  const ProcessUsage u = GetProcessUsage();
  const nlohmann::json j = {{"rank", a.rank},
                            {"open_seconds", open_seconds},
                            {"first_batch_seconds", first_batch_seconds},
                            {"next_epoch_seconds", next_epoch_seconds},
                            {"peak_rss_mib", Mib(u.peak_rss_bytes)},
                            {"start_rss_mib", base_rss},
                            {"batches", (*loader)->num_batches()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

// One repetition: every rank at once; the slowest time and largest RSS.
Result<nlohmann::json> RunOnce(const ScaleArgs& a, const std::string& cache) {
  std::vector<SelfChild> kids;
  for (uint32_t r = 0; r < a.ranks; ++r) {
    std::vector<std::string> argv = {"stoker",       "bench",
                                     "scale-rank",   "--dir",
                                     a.dir,          "--rank",
                                     std::to_string(r), "--ranks",
                                     std::to_string(a.ranks), "--batch-size",
                                     std::to_string(a.batch_size), "--window",
                                     std::to_string(a.window), "--threads",
                                     std::to_string(a.threads)};
    if (!cache.empty()) {
      argv.push_back("--cache");
      argv.push_back(cache);
    }
    auto c = SpawnSelf(std::move(argv));
    if (!c.ok()) {
      for (auto& k : kids) {  // the ranks started: end them, reap them
        kill(k.pid, SIGTERM);
        close(k.out);
        waitpid(k.pid, nullptr, 0);
      }
      return c.status();
    }
    close(c->in);
    kids.push_back(*c);
  }
  // Each rank writes one short line (far below a pipe's buffer) and exits:
  // reading them one after another cannot hold any of them up.
  std::vector<std::string> outs(kids.size());
  for (size_t i = 0; i < kids.size(); ++i) {
    char buf[4096];
    ssize_t n;
    while ((n = read(kids[i].out, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR)) {
      if (n > 0) outs[i].append(buf, size_t(n));
    }
    close(kids[i].out);
  }
  nlohmann::json worst = {{"open_seconds", 0.0},
                          {"first_batch_seconds", 0.0},
                          {"next_epoch_seconds", 0.0},
                          {"peak_rss_mib", 0.0},
                          {"start_rss_mib", 0.0}};
  int failed = 0;
  for (size_t i = 0; i < kids.size(); ++i) {
    int status = 0;
    waitpid(kids[i].pid, &status, 0);
    auto j = nlohmann::json::parse(outs[i], nullptr, false);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || j.is_discarded()) {
      failed++;
      continue;
    }
    for (auto& [k, v] : worst.items()) v = std::max(v.get<double>(), j[k].get<double>());
    worst["batches"] = j["batches"];
  }
  if (failed) return Internal(std::to_string(failed) + " of the rank processes failed");
  return worst;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int RunScale(ScaleArgs a) {
  if (a.samples == 0) return Fail(InvalidArgument("--samples must be >= 1"));
  if (a.shards == 0) a.shards = std::clamp<uint64_t>(a.samples / 100, 1, 1000000);
  if (a.ranks == 0 || a.repeat == 0) return Fail(InvalidArgument("--ranks and --repeat >= 1"));
  namespace fs = std::filesystem;
  bool made_dir = false;
  if (a.dir.empty()) {
    char tmpl[] = "/tmp/stoker-scale-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return Fail(ErrnoToStatus(errno, "mkdtemp /tmp"));
    a.dir = tmpl;
    made_dir = true;
  }
  auto cleanup = [&] {
    std::error_code ec;
    if (made_dir) fs::remove_all(a.dir, ec);
  };
  auto dst = OpenStore(a.dir);
  if (!dst.ok()) return Fail(dst.status());
  const auto tw = Clock::now();
  auto m = WriteScaleDataset(**dst, {a.samples, a.shards, a.sample_bytes});
  if (!m.ok()) {
    cleanup();
    return Fail(m.status());
  }
  const double write_seconds = Since(tw);
  nlohmann::json runs = nlohmann::json::array();
  for (uint32_t rep = 0; rep < a.repeat; ++rep) {
    std::string cache;
    if (!a.cache.empty()) {
      cache = (fs::path(a.cache) / ("scale-" + std::to_string(getpid()) + "-" +
                                    std::to_string(rep)))
                  .string();
    }
    auto run = RunOnce(a, cache);
    if (!cache.empty()) {
      std::error_code ec;
      fs::remove_all(cache, ec);
    }
    if (!run.ok()) {
      cleanup();
      return Fail(run.status());
    }
    runs.push_back(*run);
  }
  nlohmann::json out = {{"samples", a.samples},
                        {"shards", a.shards},
                        {"ranks", a.ranks},
                        {"cache", !a.cache.empty()},
                        {"batch_size", a.batch_size},
                        {"window", a.window},
                        {"repeat", a.repeat},
                        {"write_seconds", write_seconds},
                        {"table_bytes", m->table.bytes},
                        {"batches_per_rank", runs[0]["batches"]},
                        {"runs", runs}};
  for (const char* k :
       {"open_seconds", "first_batch_seconds", "next_epoch_seconds", "peak_rss_mib",
        "start_rss_mib"}) {
    std::vector<double> v;
    for (const auto& r : runs) v.push_back(r[k].get<double>());
    out[k] = Median(v);
  }
  cleanup();
  if (a.json) {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf(
      "%lu samples, %lu shards (table %s), %u rank(s)%s, medians of %u:\n"
      "  open %.3f s, first batch %.3f s after the start, next epoch's first batch %.3f s,\n"
      "  peak RSS %.1f MiB per rank (%.1f MiB at the process start)\n",
      (unsigned long)a.samples, (unsigned long)a.shards,
      HumanBytes(double(m->table.bytes)).c_str(), a.ranks, a.cache.empty() ? "" : ", node cache",
      a.repeat, out["open_seconds"].get<double>(), out["first_batch_seconds"].get<double>(),
      out["next_epoch_seconds"].get<double>(), out["peak_rss_mib"].get<double>(),
      out["start_rss_mib"].get<double>());
  return 0;
}

void AddCommon(CLI::App* cmd, ScaleArgs* a) {
  cmd->add_option("--ranks", a->ranks, "Rank processes (the world size)")->capture_default_str();
  cmd->add_option("--cache", a->cache, "Node cache parent folder (none: no cache)");
  cmd->add_option("--batch-size", a->batch_size, "Samples per batch")->capture_default_str();
  cmd->add_option("--window", a->window, "Shuffle window in shards")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Loader workers per rank")->capture_default_str();
}

}  // namespace

void RegisterBenchScale(CLI::App* bench, Action* action) {
  auto a = std::make_shared<ScaleArgs>();
  auto* cmd = bench->add_subcommand(
      "scale", "Open, first batch and next epoch against the dataset's size (synthetic shards)");
  AddCommon(cmd, a.get());
  cmd->add_option("--samples", a->samples, "Samples in the dataset")->required();
  cmd->add_option("--shards", a->shards, "Shards (0: samples / 100, at most 10^6)")
      ->capture_default_str();
  cmd->add_option("--sample-bytes", a->sample_bytes, "Bytes per sample")->capture_default_str();
  cmd->add_option("--repeat", a->repeat, "Repetitions (the median is reported)")
      ->capture_default_str();
  cmd->add_option("--dir", a->dir, "Where the manifest and table go (default: a temp folder)");
  cmd->add_flag("--json", a->json, "Machine-readable output");
  cmd->callback([a, action] { *action = [a] { return RunScale(*a); }; });

  auto r = std::make_shared<ScaleArgs>();
  auto* rank = bench->add_subcommand("scale-rank", "One rank of `bench scale` (internal)");
  rank->group("");  // hidden
  AddCommon(rank, r.get());
  rank->add_option("--dir", r->dir, "The dataset's folder")->required();
  rank->add_option("--rank", r->rank, "This rank")->required();
  rank->callback([r, action] { *action = [r] { return RunScaleRank(*r); }; });
}

}  // namespace stoker::cli
