// stoker bench gpu-loader URI: the loader delivering into GPU memory against
// the same loader delivering to host memory, same data, same options, runs
// interleaved: GB/s into HBM, samples/s, data wait in both modes, and how
// much of the H2D copy time is hidden behind reads and collation.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/cli.h"
#include "cli/loader_flags.h"
#include "bench/bench.h"
#include "stoker/gpu.h"

namespace stoker::cli {

namespace {

struct ModeRun {
  double seconds = 0;
  uint64_t samples = 0;
  uint64_t bytes_read = 0;
  double wait_seconds = 0;  // the consumer's data wait (Next() blocked)
  uint64_t h2d_bytes = 0;
  double h2d_seconds = 0;  // copy-engine busy time
  uint64_t peak_device_bytes = 0;
  uint64_t pinned_bytes = 0;
  std::string read_unit;  // "shard", "sample" or "map" (Loader::read_unit)
  // Where the consumer's time goes, on its own thread: all of Next() (the
  // data wait above plus taking the loader's lock), WaitOn, and releasing
  // the previous batch.
  double next_seconds = 0, wait_on_seconds = 0, release_seconds = 0;
};

// One run: the loader is opened and reads one warm-up epoch before the
// clock starts (CUDA context, pinning and the device pool's growth are
// one-time costs of a job, not of its steady state), then `epochs` epochs
// are timed. Device mode: each batch is waited on by the consumer's stream
// (the per-thread default stream) and dropped, and the run ends when the
// last copy has landed.
Result<ModeRun> RunOnce(const std::string& uri, const LoaderOptions& o, uint32_t epochs,
                        std::chrono::microseconds compute) {
  STOKER_ASSIGN_OR_RETURN(std::unique_ptr<Loader> l, Loader::Open(uri, o));
  uint64_t epoch = 0;
  const uint64_t last_epoch = epochs;  // epoch 0 is the warm-up
  std::shared_ptr<DeviceBatch> last;
  std::optional<Batch> held;  // the previous batch, released (timed) by the next call
  double next_s = 0, wait_on_s = 0, release_s = 0;
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  auto next = [&]() -> Result<Batch> {
    auto t = Clock::now();
    held.reset();
    release_s += since(t);
    while (true) {
      t = Clock::now();
      auto b = l->Next();
      next_s += since(t);
      if (b.ok()) {
        if (b->device()) {
          t = Clock::now();
          STOKER_RETURN_IF_ERROR(b->device()->WaitOn(kPerThreadDefaultStream));
          wait_on_s += since(t);
          last = b->device();
        }
        held = *b;
        return b;
      }
      if (b.status().code() != Code::kOutOfRange) return b;
      if (epoch >= last_epoch || epoch == 0) {
        // Copies land in order on the loader's stream: the last one landed
        // means all have.
        if (last) STOKER_RETURN_IF_ERROR(last->Synchronize());
        if (epoch == 0) STOKER_RETURN_IF_ERROR(l->StartEpoch(++epoch));
        return b;
      }
      STOKER_RETURN_IF_ERROR(l->StartEpoch(++epoch));
    }
  };
  while (true) {  // the warm-up epoch
    auto b = next();
    if (!b.ok()) {
      if (b.status().code() != Code::kOutOfRange) return b.status();
      break;
    }
  }
  const LoaderStats before = l->stats();
  next_s = wait_on_s = release_s = 0;
  ModeRun m;
  if (compute.count() > 0) {
    STOKER_ASSIGN_OR_RETURN(TrainRun t, EmulateTraining(next, compute, 0));
    m.seconds = t.wall_seconds;
    m.samples = t.samples;
  } else {
    STOKER_ASSIGN_OR_RETURN(LoaderRun r,
                            MeasureLoader(next, 0, [&] { return l->stats().bytes_read; }));
    m.seconds = r.seconds;
    m.samples = r.samples;
  }
  last.reset();
  held.reset();
  m.read_unit = std::string(l->read_unit());
  m.next_seconds = next_s;
  m.wait_on_seconds = wait_on_s;
  m.release_seconds = release_s;
  const LoaderStats s = l->stats();
  m.bytes_read = s.bytes_read - before.bytes_read;
  m.wait_seconds = std::chrono::duration<double>(s.wait_time - before.wait_time).count();
  m.h2d_bytes = s.h2d_bytes - before.h2d_bytes;
  m.h2d_seconds = std::chrono::duration<double>(s.h2d_time - before.h2d_time).count();
  m.peak_device_bytes = s.peak_device_bytes;
  m.pinned_bytes = s.pinned_bytes;
  return m;
}

double MedianOf(std::vector<ModeRun> runs, double ModeRun::*field) {
  std::vector<double> v;
  for (const auto& r : runs) v.push_back(r.*field);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The run whose time is the median, for the other figures.
ModeRun MedianRun(std::vector<ModeRun> runs) {
  std::sort(runs.begin(), runs.end(),
            [](const ModeRun& a, const ModeRun& b) { return a.seconds < b.seconds; });
  return runs[runs.size() / 2];
}

nlohmann::json ModeJson(const ModeRun& m) {
  return {{"seconds", m.seconds},
          {"samples", m.samples},
          {"bytes_read", m.bytes_read},
          {"gb_per_s", m.seconds > 0 ? m.bytes_read / m.seconds / 1e9 : 0},
          {"samples_per_s", m.seconds > 0 ? m.samples / m.seconds : 0},
          {"data_wait_seconds", m.wait_seconds},
          {"h2d_bytes", m.h2d_bytes},
          {"h2d_seconds", m.h2d_seconds},
          {"h2d_gb_per_s", m.seconds > 0 ? m.h2d_bytes / m.seconds / 1e9 : 0},
          {"peak_device_bytes", m.peak_device_bytes},
          {"pinned_bytes", m.pinned_bytes},
          {"consumer_next_seconds", m.next_seconds},
          {"consumer_wait_on_seconds", m.wait_on_seconds},
          {"consumer_release_seconds", m.release_seconds}};
}

}  // namespace

void RegisterBenchGpuLoader(CLI::App* bench, Action* action) {
  struct Args {
    std::string uri;
    std::string device = "cuda:0";
    uint32_t epochs = 3;  // timed, after one warm-up epoch
    uint32_t repeats = 3;
    uint64_t compute_us = 0;
    double device_budget_mib = 0;
    bool json = false;
    LoaderFlags flags;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = bench->add_subcommand(
      "gpu-loader",
      "The loader delivering into GPU memory vs to host memory: GB/s, samples/s, hidden H2D");
  cmd->add_option("URI", args->uri, "Dataset URI")->required();
  cmd->add_option("--device", args->device, "CUDA device (cuda:N)")->capture_default_str();
  cmd->add_option("--epochs", args->epochs, "Timed epochs per run (after one warm-up epoch)")
      ->capture_default_str();
  cmd->add_option("--repeats", args->repeats, "Runs of each mode, interleaved (median reported)")
      ->capture_default_str();
  cmd->add_option("--compute-us", args->compute_us,
                  "Emulated step time per batch (0: read as fast as possible)")
      ->capture_default_str();
  cmd->add_option("--device-budget-mib", args->device_budget_mib,
                  "Device memory for batches (0: the loader's default)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Machine-readable output");
  args->flags.Add(cmd);
  cmd->callback([args, action] {
    *action = [args] {
      if (Status st = args->flags.Finish(); !st.ok()) return Fail(st);
      auto device = ParseDevice(args->device);
      if (!device.ok()) return Fail(device.status());
      if (*device < 0) return Fail(InvalidArgument("--device must be a CUDA device (cuda:N)"));
      auto info = GetCudaDevice(*device);
      if (!info.ok()) return Fail(info.status());
      LoaderOptions host = args->flags.options;
      host.device.clear();
      LoaderOptions dev = host;
      dev.device = args->device;
      dev.device_memory_budget = static_cast<uint64_t>(args->device_budget_mib * (1 << 20));
      const std::chrono::microseconds compute(args->compute_us);
      std::vector<ModeRun> host_runs, dev_runs;
      for (uint32_t i = 0; i < std::max(1u, args->repeats); ++i) {
        auto h = RunOnce(args->uri, host, args->epochs, compute);
        if (!h.ok()) return Fail(h.status());
        host_runs.push_back(*h);
        auto d = RunOnce(args->uri, dev, args->epochs, compute);
        if (!d.ok()) return Fail(d.status());
        dev_runs.push_back(*d);
      }
      const ModeRun h = MedianRun(host_runs), d = MedianRun(dev_runs);
      const double host_s = MedianOf(host_runs, &ModeRun::seconds);
      const double dev_s = MedianOf(dev_runs, &ModeRun::seconds);
      const double host_wait = MedianOf(host_runs, &ModeRun::wait_seconds);
      const double dev_wait = MedianOf(dev_runs, &ModeRun::wait_seconds);
      // H2D that shows in the wall time is what device delivery added over
      // host delivery; the rest of the copy-engine time was hidden.
      const double exposed = std::max(0.0, dev_s - host_s);
      const double hidden =
          d.h2d_seconds > 0 ? std::clamp(1 - exposed / d.h2d_seconds, 0.0, 1.0) : 0;
      nlohmann::json j;
      j["uri"] = args->uri;
      j["device"] = {{"name", info->name}, {"index", info->index}, {"pci", info->pci_bus_id}};
      j["epochs"] = args->epochs;
      j["repeats"] = args->repeats;
      j["compute_us"] = args->compute_us;
      j["batch_size"] = host.batch_size;
      j["threads"] = host.threads;
      j["read_unit"] = h.read_unit;
      j["host"] = ModeJson(h);
      j["cuda"] = ModeJson(d);
      j["host_median_seconds"] = host_s;
      j["cuda_median_seconds"] = dev_s;
      j["cuda_vs_host_time"] = host_s > 0 ? dev_s / host_s : 0;
      j["host_median_wait_seconds"] = host_wait;
      j["cuda_median_wait_seconds"] = dev_wait;
      j["h2d_hidden_share"] = hidden;
      if (args->json) {
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
      }
      std::printf("%s -> %s (%s), %u epochs x %u runs per mode, batch %u, %u threads\n",
                  args->uri.c_str(), args->device.c_str(), info->name.c_str(), args->epochs,
                  args->repeats, host.batch_size, host.threads);
      for (const auto& [name, m] : {std::pair{"host", h}, std::pair{"cuda", d}}) {
        std::printf(
            "  %-5s %6.2f s  %7.2f GB/s read  %10.0f samples/s  wait %6.3f s  h2d %6.2f GB/s "
            "(engine busy %.3f s)\n",
            name, m.seconds, m.bytes_read / m.seconds / 1e9, m.samples / m.seconds, m.wait_seconds,
            m.h2d_bytes / m.seconds / 1e9, m.h2d_seconds);
      }
      std::printf("  cuda/host time %.3f, data wait cuda/host %.3f, H2D hidden %.1f%%\n",
                  host_s > 0 ? dev_s / host_s : 0, host_wait > 0 ? dev_wait / host_wait : 0,
                  hidden * 100);
      return 0;
    };
  });
}

}  // namespace stoker::cli
