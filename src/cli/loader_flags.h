// Loader options as command-line flags, shared by `bench loader` and `demo`.
#pragma once

#include <string>

#include "cli/cli.h"
#include "stoker/loader.h"

namespace stoker::cli {

struct LoaderFlags {
  LoaderOptions options;
  double budget_mib = 512;
  std::string decode_size = "224x224";
  bool decode = false;
  bool no_shuffle = false;
  double cache_gib = 0;

  void Add(CLI::App* cmd) {
    cmd->add_option("--batch-size", options.batch_size, "Samples per batch")->capture_default_str();
    cmd->add_option("--threads", options.threads, "Collate/decode workers (0 = cores)")
        ->capture_default_str();
    cmd->add_option("--reads-in-flight", options.reads_in_flight, "Whole-shard reads in flight")
        ->capture_default_str();
    cmd->add_option("--budget-mib", budget_mib, "Memory budget for shard and batch buffers")
        ->capture_default_str();
    cmd->add_option("--window", options.shuffle_window_shards, "Shuffle window in shards")
        ->capture_default_str();
    cmd->add_option("--prefetch", options.prefetch_batches, "Batches built ahead")
        ->capture_default_str();
    cmd->add_option("--seed", options.seed, "Shuffle seed")->capture_default_str();
    cmd->add_flag("--no-shuffle", no_shuffle, "Read in packed order");
    cmd->add_flag("--direct", options.direct_io, "O_DIRECT reads (POSIX store)");
    cmd->add_option("--read-unit", options.read_unit,
                    "auto, shard (read shards whole) or sample (read each record into the batch)")
        ->capture_default_str();
    cmd->add_flag("--decode", decode, "Decode the 'image' field as JPEG and resize");
    cmd->add_option("--decode-size", decode_size, "HxW of decoded images")->capture_default_str();
    cmd->add_option("--cache", options.cache_dir,
                    "Node cache folder on local disk, shared by the node's ranks and jobs");
    cmd->add_option("--cache-gib", cache_gib,
                    "Node cache limit (0 = the disk's free space less 5%)")
        ->capture_default_str();
    cmd->add_option("--cache-policy", options.cache_policy, "planned (Belady) or lru")
        ->capture_default_str();
  }

  // Call after parsing.
  Status Finish() {
    options.memory_budget = static_cast<uint64_t>(budget_mib * (1 << 20));
    options.shuffle = !no_shuffle;
    options.cache_bytes = static_cast<uint64_t>(cache_gib * (1ull << 30));
    if (decode) {
      options.decode.field = "image";
      unsigned h = 0, w = 0;
      char x = 0;
      if (std::sscanf(decode_size.c_str(), "%u%c%u", &h, &x, &w) != 3 || x != 'x' || !h || !w) {
        return InvalidArgument("--decode-size must look like 224x224, not '" + decode_size + "'");
      }
      options.decode.height = h;
      options.decode.width = w;
    }
    return Status::Ok();
  }
};

}  // namespace stoker::cli
