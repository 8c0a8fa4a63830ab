// stoker bench loader URI: reads an epoch (or N samples) as fast as it can
// and reports MB/s, samples/s, CPU seconds per GB and peak RSS.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/loader_flags.h"
#include "stoker/bench.h"

namespace stoker::cli {

void RegisterBench(CLI::App& app, Action* action) {
  auto* bench = app.add_subcommand("bench", "Measure the loader (and, later, storage)");
  bench->require_subcommand(1);

  struct Args {
    std::string uri;
    uint64_t samples = 0;
    uint32_t epochs = 1;
    bool json = false;
    LoaderFlags flags;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = bench->add_subcommand("loader", "Read a dataset as fast as possible");
  cmd->add_option("URI", args->uri, "Dataset URI")->required();
  cmd->add_option("--samples", args->samples, "Stop after this many samples (0 = whole epochs)")
      ->capture_default_str();
  cmd->add_option("--epochs", args->epochs, "Epochs to read")->capture_default_str();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  args->flags.Add(cmd);
  cmd->callback([args, action] {
    *action = [args] {
      if (Status st = args->flags.Finish(); !st.ok()) return Fail(st);
      ResetPeakRss();
      const ProcessUsage base = GetProcessUsage();
      auto loader = Loader::Open(args->uri, args->flags.options);
      if (!loader.ok()) return Fail(loader.status());
      Loader& l = **loader;
      uint64_t epoch = 0;
      auto next = [&]() -> Result<Batch> {
        while (true) {
          auto b = l.Next();
          if (b.ok() || b.status().code() != Code::kOutOfRange || epoch + 1 >= args->epochs) {
            return b;
          }
          STOKER_RETURN_IF_ERROR(l.StartEpoch(++epoch));
        }
      };
      auto run = MeasureLoader(next, args->samples, [&] { return l.stats().bytes_read; });
      if (!run.ok()) return Fail(run.status());
      const LoaderStats st = l.stats();
      nlohmann::json j;
      j["uri"] = args->uri;
      j["samples"] = run->samples;
      j["batches"] = run->batches;
      j["bytes_read"] = run->bytes_read;
      j["bytes_delivered"] = run->bytes;
      j["seconds"] = run->seconds;
      j["first_batch_seconds"] = run->first_batch_seconds;
      j["mb_per_s"] = run->mb_per_second();
      j["samples_per_s"] = run->samples_per_second();
      j["cpu_seconds"] = run->cpu_seconds;
      j["cpu_seconds_per_gb"] = run->cpu_seconds_per_gb();
      j["peak_rss_bytes"] = run->peak_rss_bytes;
      j["baseline_rss_bytes"] = base.rss_bytes;
      j["memory_budget_bytes"] = args->flags.options.memory_budget;
      j["peak_buffer_bytes"] = st.peak_buffer_bytes;
      j["read_retries"] = st.read_retries;
      j["data_wait_seconds"] = std::chrono::duration<double>(st.wait_time).count();
      j["engine"] = PosixEngineName(*OpenStore(args->uri).value());
      if (args->json) {
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
      }
      std::printf("%s: %lu samples in %lu batches, %s read in %.2f s\n", args->uri.c_str(),
                  (unsigned long)run->samples, (unsigned long)run->batches,
                  HumanBytes(double(run->bytes_read)).c_str(), run->seconds);
      std::printf("  %.0f MB/s, %.0f samples/s, first batch after %.3f s\n", run->mb_per_second(),
                  run->samples_per_second(), run->first_batch_seconds);
      std::printf("  %.3f CPU s per GB read, peak RSS %s (budget %s)\n", run->cpu_seconds_per_gb(),
                  HumanBytes(double(run->peak_rss_bytes)).c_str(),
                  HumanBytes(double(args->flags.options.memory_budget)).c_str());
      return 0;
    };
  });
}

}  // namespace stoker::cli
