// stoker bench loader URI: reads an epoch (or N samples) as fast as it can
// and reports MB/s, samples/s, CPU seconds per GB and peak RSS.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "cli/cli.h"
#include "cli/loader_flags.h"

namespace stoker::cli {

namespace {

int Report(const std::string& what, const LoaderRun& run, const LoaderOptions& o, bool json,
           const nlohmann::json& extra) {
  nlohmann::json j = extra.is_null() ? nlohmann::json::object() : extra;
  j["uri"] = what;
  j["samples"] = run.samples;
  j["batches"] = run.batches;
  j["bytes_read"] = run.bytes_read;
  j["bytes_delivered"] = run.bytes;
  j["seconds"] = run.seconds;
  j["first_batch_seconds"] = run.first_batch_seconds;
  j["mb_per_s"] = run.mb_per_second();
  j["samples_per_s"] = run.samples_per_second();
  j["cpu_seconds"] = run.cpu_seconds;
  j["cpu_seconds_per_gb"] = run.cpu_seconds_per_gb();
  j["kernel_cpu_seconds"] = run.kernel_cpu_seconds;
  j["page_faults"] = run.page_faults;
  j["peak_rss_bytes"] = run.peak_rss_bytes;
  j["memory_budget_bytes"] = o.memory_budget;
  if (json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%s: %lu samples in %lu batches, %s read in %.2f s\n", what.c_str(),
              (unsigned long)run.samples, (unsigned long)run.batches,
              HumanBytes(double(run.bytes_read)).c_str(), run.seconds);
  std::printf("  %.0f MB/s, %.0f samples/s, first batch after %.3f s\n", run.mb_per_second(),
              run.samples_per_second(), run.first_batch_seconds);
  std::printf(
      "  %.3f CPU s per GB read (%.0f%% in the kernel, %lu page faults), peak RSS %s "
      "(budget %s)\n",
      run.cpu_seconds_per_gb(),
      run.cpu_seconds > 0 ? 100 * run.kernel_cpu_seconds / run.cpu_seconds : 0.0,
      (unsigned long)run.page_faults, HumanBytes(double(run.peak_rss_bytes)).c_str(),
      o.memory_budget ? HumanBytes(double(o.memory_budget)).c_str() : "automatic");
  if (j.contains("epoch_samples_per_s") && j["epoch_samples_per_s"].size() > 1) {
    std::printf("  per epoch:");
    for (const auto& v : j["epoch_samples_per_s"]) std::printf(" %.0f", v.get<double>());
    std::printf(" samples/s\n");
  }
  return 0;
}

// What bench loader and bench files share: how much to read, how to report
// it, and the loader's flags.
struct ReadArgs {
  uint64_t samples = 0;
  uint32_t epochs = 1;
  bool json = false;
  LoaderFlags flags;

  void Add(CLI::App* cmd) {
    cmd->add_option("--samples", samples, "Stop after this many samples (0 = whole epochs)")
        ->capture_default_str();
    cmd->add_option("--epochs", epochs, "Epochs to read")->capture_default_str();
    cmd->add_flag("--json", json, "Machine-readable output");
    flags.Add(cmd);
  }
};

void RegisterBenchFiles(CLI::App* bench, Action* action);

}  // namespace

void RegisterBench(CLI::App& app, Action* action) {
  auto* bench = app.add_subcommand("bench", "Measure the loader (and, later, storage)");
  bench->require_subcommand(1);

  struct Args : ReadArgs {
    std::string uri;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = bench->add_subcommand("loader", "Read a dataset as fast as possible");
  cmd->add_option("URI", args->uri, "Dataset URI")->required();
  args->Add(cmd);
  RegisterBenchFiles(bench, action);
  RegisterBenchStorage(bench, action);
  cmd->callback([args, action] {
    *action = [args] {
      if (Status st = args->flags.Finish(); !st.ok()) return Fail(st);
      ResetPeakRss();
      // Opened by the first next(), inside the measurement: Open starts the
      // reads, and the time to the first batch includes it.
      std::unique_ptr<Loader> l;
      std::shared_ptr<Store> store;
      uint64_t epoch = 0;
      // Per epoch: samples and seconds, to show whether epochs slow down.
      std::vector<double> epoch_rates;
      uint64_t epoch_samples = 0;
      Clock::time_point epoch_start;
      auto end_epoch = [&] {
        const double s = std::chrono::duration<double>(Clock::now() - epoch_start).count();
        epoch_rates.push_back(s > 0 ? epoch_samples / s : 0);
      };
      auto next = [&]() -> Result<Batch> {
        if (!l) {
          epoch_start = Clock::now();
          STOKER_ASSIGN_OR_RETURN(store, OpenStore(args->uri, args->flags.options.store));
          STOKER_ASSIGN_OR_RETURN(l, Loader::Open(store, args->flags.options));
        }
        while (true) {
          auto b = l->Next();
          if (b.ok()) epoch_samples += b->size();
          if (b.ok() || b.status().code() != Code::kOutOfRange || epoch + 1 >= args->epochs) {
            if (!b.ok() && b.status().code() == Code::kOutOfRange) end_epoch();
            return b;
          }
          end_epoch();
          epoch_samples = 0;
          epoch_start = Clock::now();
          STOKER_RETURN_IF_ERROR(l->StartEpoch(++epoch));
        }
      };
      auto run = MeasureLoader(next, args->samples,
                               [&] { return l ? l->stats().bytes_read : uint64_t{0}; });
      if (!run.ok()) return Fail(run.status());
      const LoaderStats st = l->stats();
      nlohmann::json extra;
      extra["peak_buffer_bytes"] = st.peak_buffer_bytes;
      extra["read_retries"] = st.read_retries;
      extra["decode_skipped"] = st.decode_skipped;
      extra["shared_batches"] = st.shared_batches;
      extra["epoch_samples_per_s"] = epoch_rates;
      extra["data_wait_seconds"] = std::chrono::duration<double>(st.wait_time).count();
      extra["engine"] = store->Describe().engine;
      extra["read_unit"] = std::string(l->read_unit());
      extra["remote_bytes"] = st.remote_bytes;
      if (!args->flags.options.cache_dir.empty()) {
        extra["cache"] = {{"bytes", st.cache_bytes},         {"hits", st.cache_hits},
                          {"misses", st.cache_misses},       {"fetch_waits", st.cache_fetch_waits},
                          {"evictions", st.cache_evictions}, {"refetches", st.cache_refetches}};
      }
      return Report(args->uri, *run, args->flags.options, args->json, extra);
    };
  });
}

namespace {
void RegisterBenchFiles(CLI::App* bench, Action* action) {
  struct Args : ReadArgs {
    std::string src;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = bench->add_subcommand(
      "files", "The per-file baseline: read an ImageFolder tree (or list) one file per sample");
  cmd->add_option("SRC", args->src, "ImageFolder root or 'PATH LABEL' list file")->required();
  args->Add(cmd);
  cmd->callback([args, action] {
    *action = [args] {
      if (Status st = args->flags.Finish(); !st.ok()) return Fail(st);
      ResetPeakRss();
      auto sources = ScanSources(args->src);
      if (!sources.ok()) return Fail(sources.status());
      std::unique_ptr<PerFileLoader> loader;  // opened inside the measurement
      uint64_t epoch = 0;
      auto next = [&]() -> Result<Batch> {
        if (!loader) {
          STOKER_ASSIGN_OR_RETURN(loader, PerFileLoader::Open(*sources, args->flags.options));
        }
        while (true) {
          auto b = loader->Next();
          if (b.ok() || b.status().code() != Code::kOutOfRange || epoch + 1 >= args->epochs) {
            return b;
          }
          STOKER_RETURN_IF_ERROR(loader->StartEpoch(++epoch));
        }
      };
      auto run = MeasureLoader(next, args->samples,
                               [&] { return loader ? loader->bytes_read() : uint64_t{0}; });
      if (!run.ok()) return Fail(run.status());
      return Report(args->src, *run, args->flags.options, args->json, {});
    };
  });
}
}  // namespace

}  // namespace stoker::cli
