// stoker pack SRC DST: an ImageFolder tree or a list file into a dataset.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "cli/cli.h"
#include "stoker/pack.h"

namespace stoker::cli {

void RegisterPack(CLI::App& app, Action* action) {
  struct Args {
    std::string src, dst;
    double shard_mib = 4;
    uint32_t threads = 0;
    bool quiet = false;
    bool no_shuffle = false;
    uint64_t seed = 0;
  };
  auto args = std::make_shared<Args>();
  auto* cmd =
      app.add_subcommand("pack", "Pack an ImageFolder tree or a 'PATH LABEL' list into a dataset");
  cmd->add_option("SRC", args->src, "ImageFolder root (ROOT/CLASS/FILE) or list file")->required();
  cmd->add_option("DST", args->dst, "Dataset URI: a folder, file:///path or rados://POOL/PREFIX")
      ->required();
  cmd->add_option("--shard-mib", args->shard_mib, "Target shard size in MiB")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "Workers (0 = 2 x cores)")->capture_default_str();
  cmd->add_flag("--quiet", args->quiet, "No progress bar");
  cmd->add_flag("--no-shuffle", args->no_shuffle,
                "Keep the source order (default: a seeded shuffle, so shards mix classes)");
  cmd->add_option("--seed", args->seed, "Seed of the pack-time shuffle")->capture_default_str();
  cmd->callback([args, action] {
    *action = [args] {
      PackOptions o;
      o.shard_bytes = static_cast<uint64_t>(args->shard_mib * (1 << 20));
      o.threads = args->threads;
      o.shuffle = !args->no_shuffle;
      o.shuffle_seed = args->seed;
      const bool tty = isatty(STDOUT_FILENO) && !args->quiet;
      const auto start = std::chrono::steady_clock::now();
      if (tty) {
        o.progress = [start](const PackProgress& p) {
          const double frac = p.bytes_total ? double(p.bytes_done) / p.bytes_total : 1.0;
          const int width = 30, filled = int(frac * width);
          const double secs =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          std::printf("\r[%.*s%*s] %5.1f%%  %lu/%lu files  %lu shards  %.0f MB/s ", filled,
                      "##############################", width - filled, "", frac * 100,
                      (unsigned long)p.files_done, (unsigned long)p.files_total,
                      (unsigned long)p.shards_written, secs > 0 ? p.bytes_done / secs / 1e6 : 0.0);
          std::fflush(stdout);
        };
      }
      auto m = Pack(args->src, args->dst, o);
      if (tty) std::printf("\n");
      if (!m.ok()) return Fail(m.status());
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const uint64_t bytes = m->shards.total_bytes();
      std::printf("packed %lu samples (%lu classes) into %zu shards, %s, in %.1f s: %s\n",
                  (unsigned long)m->sample_count, (unsigned long)m->classes.size(),
                  m->shards.size(), HumanBytes(double(bytes)).c_str(), secs, args->dst.c_str());
      return 0;
    };
  });
}

}  // namespace stoker::cli
