// stoker bench storage URI: the access patterns of a training job (whole-
// object writes, whole-object sequential reads, 4 KiB random reads) on any
// store, with throughput, IOPS and latency percentiles for each.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cli.h"
#include "bench/storage_bench.h"

namespace stoker::cli {

namespace {

nlohmann::json ToJson(const StorageBenchResult& r) {
  nlohmann::json j;
  j["uri"] = r.uri;
  j["run_prefix"] = r.run_prefix;
  j["object_bytes"] = r.options.object_bytes;
  j["objects"] = r.options.objects;
  j["depth"] = r.options.depth;
  j["seconds_per_pattern"] = r.options.seconds;
  j["random_read_bytes"] = r.options.random_read_bytes;
  j["patterns"] = nlohmann::json::object();
  for (const PatternResult& p : r.patterns) {
    nlohmann::json q;
    q["ops"] = p.ops;
    q["bytes"] = p.bytes;
    q["seconds"] = p.seconds;
    q["mb_per_s"] = p.mb_per_second();
    q["iops"] = p.iops();
    q["latency_ms"] = {{"p50", p.latency.p50 * 1e3},
                       {"p99", p.latency.p99 * 1e3},
                       {"p99.9", p.latency.p999 * 1e3},
                       {"max", p.latency.max * 1e3},
                       {"mean", p.latency.mean * 1e3}};
    j["patterns"][p.name] = q;
  }
  return j;
}

void PrintText(const StorageBenchResult& r) {
  const auto& o = r.options;
  std::printf("%s: %u objects of %s, %u in flight, %g s per pattern (objects under %s)\n",
              r.uri.c_str(), o.objects, HumanBytes(double(o.object_bytes)).c_str(), o.depth,
              o.seconds, r.run_prefix.c_str());
  std::printf("  %-14s %10s %10s %10s %10s %10s\n", "pattern", "MB/s", "IOPS", "p50 ms", "p99 ms",
              "p99.9 ms");
  for (const PatternResult& p : r.patterns) {
    std::string label = p.name;
    if (p.name == "write") label = "write " + HumanBytes(double(o.object_bytes));
    if (p.name == "seq") label = "seq read";
    if (p.name == "rand") label = "rand " + HumanBytes(double(o.random_read_bytes));
    std::printf("  %-14s %10.1f %10.1f %10.2f %10.2f %10.2f\n", label.c_str(), p.mb_per_second(),
                p.iops(), p.latency.p50 * 1e3, p.latency.p99 * 1e3, p.latency.p999 * 1e3);
  }
}

}  // namespace

void RegisterBenchStorage(CLI::App* bench, Action* action) {
  struct Args {
    std::string uri;
    StorageBenchOptions options;
    double object_mib = 4;
    double rand_kib = 4;
    std::string patterns = "write,seq,rand";
    bool no_cleanup = false;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = bench->add_subcommand(
      "storage",
      "Measure a store the way a training job uses it: whole-object writes, whole-object "
      "sequential reads, 4 KiB random reads");
  cmd->add_option("URI", args->uri, "Store URI (a folder, file:///path, rados://POOL/PREFIX)")
      ->required();
  cmd->add_option("--depth,--threads", args->options.depth, "Operations in flight")
      ->capture_default_str();
  cmd->add_option("--object-mib", args->object_mib, "Object size in MiB")->capture_default_str();
  cmd->add_option("--objects", args->options.objects, "Objects written and read")
      ->capture_default_str();
  cmd->add_option("--seconds", args->options.seconds, "Seconds per pattern")->capture_default_str();
  cmd->add_option("--rand-kib", args->rand_kib, "Random read size in KiB")->capture_default_str();
  cmd->add_option("--patterns", args->patterns, "Comma-separated: write, seq, rand")
      ->capture_default_str();
  cmd->add_option("--prefix", args->options.prefix, "Where the objects go inside the store")
      ->capture_default_str();
  cmd->add_flag("--no-cleanup", args->no_cleanup, "Leave the objects in the store");
  cmd->add_flag("--json", args->json, "Machine-readable output");
  cmd->callback([args, action] {
    *action = [args] {
      StorageBenchOptions o = args->options;
      if (!(args->object_mib > 0) || !(args->rand_kib > 0)) {
        return Fail(InvalidArgument("--object-mib and --rand-kib must be positive"));
      }
      o.object_bytes = static_cast<uint64_t>(args->object_mib * (1 << 20));
      o.random_read_bytes = static_cast<uint32_t>(args->rand_kib * 1024);
      o.cleanup = !args->no_cleanup;
      o.write = o.seq = o.rand = false;
      std::stringstream list(args->patterns);
      for (std::string p; std::getline(list, p, ',');) {
        if (p == "write") {
          o.write = true;
        } else if (p == "seq") {
          o.seq = true;
        } else if (p == "rand") {
          o.rand = true;
        } else if (!p.empty()) {
          return Fail(InvalidArgument("unknown pattern '" + p +
                                      "' in --patterns (known: write, seq, rand)"));
        }
      }
      auto store = OpenStore(args->uri);
      if (!store.ok()) return Fail(store.status());
      auto result = RunStorageBench(**store, o);
      if (!result.ok()) return Fail(result.status());
      if (args->json) {
        std::printf("%s\n", ToJson(*result).dump(2).c_str());
      } else {
        PrintText(*result);
      }
      return 0;
    };
  });
}

}  // namespace stoker::cli
