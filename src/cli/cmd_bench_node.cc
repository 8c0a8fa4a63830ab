// stoker bench node URI --ranks N [--cache DIR]: one node's worth of ranks.
// Starts N rank processes on this machine (this program again, as the hidden
// `bench node-rank`), which read the dataset with their own loaders, as
// DDP ranks do, sharing the node cache when there is one; --jobs J runs J
// such jobs at once on the same cache (their seeds differ). Each rank reports
// each epoch; the ranks of all jobs wait at the end of every epoch for each
// other (training ranks run in lock step). Prints per epoch the bytes read
// from the store (remote_bytes) next to the dataset's size, each rank's MB/s
// and the node's, and the totals. Without --cache, every rank reads from the
// store: the peer the cache is measured against. With --cache, the ranks
// log their shard reads (STOKER_CACHE_ACCESS_LOG) and each epoch also
// reports the offline optimum for that read sequence and cache size
// (Belady's MIN, src/cache/optimum.h): optimum_remote_bytes.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "cache/optimum.h"
#include "cli/cli.h"
#include "stoker/loader.h"

namespace stoker::cli {
namespace {

struct NodeArgs {
  std::string uri;
  uint32_t ranks = 8;
  uint32_t jobs = 1;
  uint32_t epochs = 3;
  std::string cache;
  double cache_gib = 0;
  std::string policy = "planned";
  uint32_t ranks_per_node = 0;
  uint32_t batch_size = 256;
  uint32_t window = 8;
  uint32_t threads = 1;
  uint64_t seed = 0;
  bool json = false;
  bool node_affinity = false;
  std::string read_unit = "auto";
  // The world, when it spans more than this node (two-nodes.sh): this node's
  // ranks are rank_offset .. rank_offset + ranks - 1 of `world`.
  uint32_t world = 0;
  uint32_t rank_offset = 0;
  // node-rank only
  uint32_t rank = 0;
};

// One rank: E epochs, a JSON line after each, then waits for a byte on stdin
// (the parent's barrier) before the next.
int RunRank(const NodeArgs& a) {
  LoaderOptions o;
  o.rank = a.rank_offset + a.rank;
  o.world_size = a.world;
  o.batch_size = a.batch_size;
  o.shuffle_window_shards = a.window;
  o.threads = a.threads;
  o.seed = a.seed;
  o.cache_dir = a.cache;
  o.cache_bytes = uint64_t(a.cache_gib * double(1ull << 30));
  o.cache_policy = a.policy;
  o.ranks_per_node = a.ranks_per_node;
  o.node_affinity = a.node_affinity;
  o.read_unit = a.read_unit;
  auto loader = Loader::Open(a.uri, o);
  if (!loader.ok()) return Fail(loader.status());
  LoaderStats before;
  for (uint32_t e = 0; e < a.epochs; ++e) {
    const auto start = Clock::now();
    if (e > 0) {
      if (Status st = (*loader)->StartEpoch(e); !st.ok()) return Fail(st);
    }
    uint64_t samples = 0;
    while (true) {
      auto b = (*loader)->Next();
      if (!b.ok()) {
        if (b.status().code() == Code::kOutOfRange) break;
        return Fail(b.status());
      }
      samples += b->size();
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const LoaderStats s = (*loader)->stats();
    nlohmann::json j = {{"epoch", e},
                        {"samples", samples},
                        {"seconds", seconds},
                        {"bytes_read", s.bytes_read - before.bytes_read},
                        {"remote_bytes", s.remote_bytes - before.remote_bytes},
                        {"cache_bytes", s.cache_bytes - before.cache_bytes},
                        {"hits", s.cache_hits - before.cache_hits},
                        {"misses", s.cache_misses - before.cache_misses},
                        {"fetch_waits", s.cache_fetch_waits - before.cache_fetch_waits},
                        {"evictions", s.cache_evictions - before.cache_evictions},
                        {"refetches", s.cache_refetches - before.cache_refetches}};
    before = s;
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
    char go;
    if (e + 1 < a.epochs && read(0, &go, 1) != 1) return 0;  // the parent is gone
  }
  return 0;
}

struct Child {
  pid_t pid = -1;
  int out = -1;  // its stdout
  int in = -1;   // its stdin (the barrier)
  std::string buffer;
  uint32_t job = 0, rank = 0;
};

Result<std::vector<uint64_t>> ShardBytes(const std::string& uri) {
  STOKER_ASSIGN_OR_RETURN(auto store, OpenStore(uri));
  STOKER_ASSIGN_OR_RETURN(format::Manifest m, ReadManifest(*store));
  std::vector<uint64_t> bytes;
  for (const auto& s : m.shards) bytes.push_back(s.bytes);
  return bytes;
}

// The optimum per epoch from the ranks' access log (removed after).
std::vector<uint64_t> Optimum(const std::string& log, std::span<const uint64_t> shard_bytes,
                              uint64_t capacity) {
  auto reads = cache_internal::ReadAccessLog(log);
  unlink(log.c_str());
  if (!reads.ok()) return {};
  return cache_internal::OptimalRemoteBytes(*reads, shard_bytes, capacity);
}

// Starts rank `r` of job `job` (this program again) with pipes for its
// reports (its stdout) and the barrier (its stdin).
Result<Child> StartRank(const NodeArgs& a, uint32_t job, uint32_t r) {
  std::vector<std::string> argv = {"stoker",           "bench",
                                   "node-rank",        a.uri,
                                   "--rank",           std::to_string(r),
                                   "--world-size",     std::to_string(a.world ? a.world : a.ranks),
                                   "--rank-offset",    std::to_string(a.rank_offset),
                                   "--epochs",         std::to_string(a.epochs),
                                   "--batch-size",     std::to_string(a.batch_size),
                                   "--window",         std::to_string(a.window),
                                   "--threads",        std::to_string(a.threads),
                                   "--seed",           std::to_string(a.seed + job),
                                   "--policy",         a.policy,
                                   "--cache-gib",      std::to_string(a.cache_gib),
                                   "--ranks-per-node", std::to_string(a.ranks_per_node)};
  if (a.node_affinity) argv.push_back("--node-affinity");
  argv.push_back("--read-unit");
  argv.push_back(a.read_unit);
  if (!a.cache.empty()) {
    argv.push_back("--cache");
    argv.push_back(a.cache);
  }
  STOKER_ASSIGN_OR_RETURN(SelfChild c, SpawnSelf(std::move(argv)));
  return Child{c.pid, c.out, c.in, "", job, r};
}

using Reports = std::map<uint32_t, std::vector<nlohmann::json>>;  // epoch -> the ranks'

// Reads the ranks' reports until every rank has closed its stdout, and
// releases the ranks at the end of each epoch once all live ranks reported
// it (the barrier).
Reports Collect(std::vector<Child>& kids, uint32_t epochs) {
  Reports reports;
  size_t open = kids.size();
  std::vector<bool> released(epochs, false);
  auto Release = [&](uint32_t e) {  // the barrier: every rank goes on
    released[e] = true;
    for (auto& k : kids) (void)!write(k.in, "g", 1);
  };
  while (open > 0) {
    std::vector<pollfd> fds;
    for (auto& k : kids) fds.push_back({k.out, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < kids.size(); ++i) {
      if (kids[i].out < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t n = read(kids[i].out, buf, sizeof buf);
      if (n <= 0) {
        close(kids[i].out);
        kids[i].out = -1;
        open--;
        // A rank that died does not hold the others at the barrier.
        for (uint32_t e = 0; e + 1 < epochs; ++e) {
          if (!released[e] && !reports[e].empty() && reports[e].size() >= open) Release(e);
        }
        continue;
      }
      kids[i].buffer.append(buf, size_t(n));
      size_t nl;
      while ((nl = kids[i].buffer.find('\n')) != std::string::npos) {
        auto j = nlohmann::json::parse(kids[i].buffer.substr(0, nl), nullptr, false);
        kids[i].buffer.erase(0, nl + 1);
        if (j.is_discarded()) continue;
        j["job"] = kids[i].job;
        j["rank"] = kids[i].rank;
        const uint32_t e = j["epoch"];
        reports[e].push_back(j);
        if (reports[e].size() >= open && e + 1 < epochs && !released[e]) Release(e);
      }
    }
  }
  return reports;
}

// Waits for the ranks; returns how many failed.
int Reap(std::vector<Child>& kids) {
  int failed = 0;
  for (auto& k : kids) {
    close(k.in);
    int status = 0;
    waitpid(k.pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
  }
  return failed;
}

// One epoch's reports summed over the node's ranks, next to the dataset and
// (when known) the optimum.
nlohmann::json SumEpoch(uint32_t e, const std::vector<nlohmann::json>& rs, uint64_t dataset,
                        const std::vector<uint64_t>& optimum) {
  uint64_t remote = 0, read = 0;
  double slowest = 0;
  std::vector<double> mbs;
  nlohmann::json j = {{"epoch", e}};
  for (const char* k : {"hits", "misses", "fetch_waits", "evictions", "refetches"}) {
    uint64_t sum = 0;
    for (const auto& r : rs) sum += r[k].get<uint64_t>();
    j[k] = sum;
  }
  for (const auto& r : rs) {
    remote += r["remote_bytes"].get<uint64_t>();
    read += r["bytes_read"].get<uint64_t>();
    const double s = r["seconds"].get<double>();
    slowest = std::max(slowest, s);
    mbs.push_back(s > 0 ? double(r["bytes_read"].get<uint64_t>()) / s / 1e6 : 0);
  }
  std::sort(mbs.begin(), mbs.end());
  j["remote_bytes"] = remote;
  j["dataset_bytes"] = dataset;
  j["remote_per_dataset"] = double(remote) / double(dataset);
  j["bytes_read"] = read;
  j["seconds"] = slowest;
  j["node_mb_per_s"] = slowest > 0 ? double(read) / slowest / 1e6 : 0;
  j["rank_mb_per_s_min"] = mbs.empty() ? 0 : mbs.front();
  j["rank_mb_per_s_mean"] =
      mbs.empty() ? 0 : std::accumulate(mbs.begin(), mbs.end(), 0.0) / double(mbs.size());
  j["rank_mb_per_s_max"] = mbs.empty() ? 0 : mbs.back();
  if (e < optimum.size()) {
    j["optimum_remote_bytes"] = optimum[e];
    j["remote_per_optimum"] =
        optimum[e] ? double(remote) / double(optimum[e]) : (remote ? 1e9 : 1.0);
  }
  return j;
}

void PrintTable(const NodeArgs& a, const nlohmann::json& out, uint64_t dataset) {
  std::printf("%s: %u job(s) x %u ranks, cache %s (%s), dataset %s\n", a.uri.c_str(), a.jobs,
              a.ranks, a.cache.empty() ? "none" : a.cache.c_str(),
              out["policy"].get<std::string>().c_str(), HumanBytes(double(dataset)).c_str());
  std::printf("%5s %14s %8s %8s %10s %9s %9s %9s %9s\n", "epoch", "remote_bytes", "x_data",
              "x_optimum", "node_MB/s", "rank_min", "rank_mean", "rank_max", "evictions");
  for (const auto& e : out["epochs"]) {
    std::printf("%5u %14lu %8.3f %8.3f %10.0f %9.0f %9.0f %9.0f %9lu\n", e["epoch"].get<uint32_t>(),
                (unsigned long)e["remote_bytes"].get<uint64_t>(),
                e["remote_per_dataset"].get<double>(), e.value("remote_per_optimum", 0.0),
                e["node_mb_per_s"].get<double>(), e["rank_mb_per_s_min"].get<double>(),
                e["rank_mb_per_s_mean"].get<double>(), e["rank_mb_per_s_max"].get<double>(),
                (unsigned long)e["evictions"].get<uint64_t>());
  }
  std::printf("total: %s from the store, %s read by the ranks, %.0f MB/s\n",
              HumanBytes(double(out["total"]["remote_bytes"].get<uint64_t>())).c_str(),
              HumanBytes(double(out["total"]["bytes_read"].get<uint64_t>())).c_str(),
              out["total"]["node_mb_per_s"].get<double>());
}

int RunNode(const NodeArgs& a) {
  auto shard_bytes = ShardBytes(a.uri);
  if (!shard_bytes.ok()) return Fail(shard_bytes.status());
  const uint64_t dataset = std::accumulate(shard_bytes->begin(), shard_bytes->end(), uint64_t{0});
  std::string access_log;
  if (!a.cache.empty()) {
    char path[] = "/tmp/stoker-node-access-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) return Fail(ErrnoToStatus(errno, "mkstemp"));
    close(fd);
    access_log = path;
    setenv("STOKER_CACHE_ACCESS_LOG", path, 1);  // the ranks inherit it
  }
  // A rank that died leaves a closed pipe: its write fails, nothing more.
  signal(SIGPIPE, SIG_IGN);
  std::vector<Child> kids;
  for (uint32_t job = 0; job < a.jobs; ++job) {
    for (uint32_t r = 0; r < a.ranks; ++r) {
      auto kid = StartRank(a, job, r);
      if (!kid.ok()) return Fail(kid.status());
      kids.push_back(std::move(kid).value());
    }
  }
  const Reports reports = Collect(kids, a.epochs);
  const int failed = Reap(kids);
  const uint64_t limit = uint64_t(a.cache_gib * double(1ull << 30));
  const std::vector<uint64_t> optimum =
      access_log.empty() ? std::vector<uint64_t>{} : Optimum(access_log, *shard_bytes, limit);
  nlohmann::json out = {{"uri", a.uri},
                        {"ranks", a.ranks},
                        {"jobs", a.jobs},
                        {"cache", a.cache},
                        {"policy", a.cache.empty() ? "none" : a.policy},
                        {"cache_bytes_limit", limit},
                        {"shards", shard_bytes->size()},
                        {"dataset_bytes", dataset}};
  nlohmann::json epochs = nlohmann::json::array();
  uint64_t total_remote = 0, total_read = 0;
  double total_seconds = 0;
  for (const auto& [e, rs] : reports) {
    epochs.push_back(SumEpoch(e, rs, dataset, optimum));
    total_remote += epochs.back()["remote_bytes"].get<uint64_t>();
    total_read += epochs.back()["bytes_read"].get<uint64_t>();
    total_seconds += epochs.back()["seconds"].get<double>();
  }
  out["epochs"] = epochs;
  out["total"] = {
      {"remote_bytes", total_remote},
      {"bytes_read", total_read},
      {"seconds", total_seconds},
      {"node_mb_per_s", total_seconds > 0 ? double(total_read) / total_seconds / 1e6 : 0}};
  out["failed_ranks"] = failed;
  if (a.json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    PrintTable(a, out, dataset);
  }
  if (failed) {
    std::fprintf(stderr, "stoker bench node: %d rank(s) failed\n", failed);
    return kExitProblems;
  }
  return 0;
}

void AddCommon(CLI::App* cmd, NodeArgs* a) {
  cmd->add_option("URI", a->uri, "Dataset URI")->required();
  cmd->add_option("--epochs", a->epochs, "Epochs")->capture_default_str();
  cmd->add_option("--cache", a->cache, "Node cache folder (none: every rank reads the store)");
  cmd->add_option("--cache-gib", a->cache_gib, "Cache limit (0 = the disk's free space less 5%)")
      ->capture_default_str();
  cmd->add_option("--policy", a->policy, "planned (Belady) or lru")->capture_default_str();
  cmd->add_option("--ranks-per-node", a->ranks_per_node, "Ranks of a node (0 = the world)")
      ->capture_default_str();
  cmd->add_option("--batch-size", a->batch_size, "Samples per batch")->capture_default_str();
  cmd->add_option("--window", a->window, "Shuffle window in shards")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Loader workers per rank")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Shuffle seed (job j uses seed + j)")->capture_default_str();
  cmd->add_option("--read-unit", a->read_unit,
                  "The loader's read unit: auto, shard, sample or map (under auto a local store "
                  "reads samples, so shard gives a remote store's whole-shard reads)")
      ->capture_default_str();
  cmd->add_flag("--node-affinity", a->node_affinity,
                "Each shard read by one node only (needs --ranks-per-node)");
  cmd->add_option("--world-size", a->world, "Ranks in the world (0 = --ranks: one node)")
      ->capture_default_str();
  cmd->add_option("--rank-offset", a->rank_offset, "The world rank of this node's first rank")
      ->capture_default_str();
}

}  // namespace

void RegisterBenchNode(CLI::App* bench, Action* action) {
  auto a = std::make_shared<NodeArgs>();
  auto* cmd = bench->add_subcommand(
      "node", "N rank processes on this machine sharing one node cache: remote bytes per epoch");
  AddCommon(cmd, a.get());
  cmd->add_option("--ranks", a->ranks, "Rank processes per job")->capture_default_str();
  cmd->add_option("--jobs", a->jobs, "Jobs at once on the same cache")->capture_default_str();
  cmd->add_flag("--json", a->json, "Machine-readable output");
  cmd->callback([a, action] { *action = [a] { return RunNode(*a); }; });

  auto r = std::make_shared<NodeArgs>();
  auto* rank = bench->add_subcommand("node-rank", "One rank of `bench node` (internal)");
  rank->group("");  // hidden
  AddCommon(rank, r.get());
  rank->add_option("--rank", r->rank, "This rank")->required();
  rank->callback([r, action] { *action = [r] { return RunRank(*r); }; });
}

}  // namespace stoker::cli
