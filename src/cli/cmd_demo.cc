// stoker demo: how many accelerators this node keeps busy from the storage
// the user has, as MLPerf Storage asks it. Synthesizes images, packs them,
// then runs an emulated training job (a named model's compute time per step,
// from MLPerf Storage's DLIO configs) on 1, 2, 4, ... emulated accelerators
// (ranks on this node, a thread and a loader each), with the per-file loader
// and with stoker, and finds the most each keeps at least 90% busy.
//
// Storage: by default each operation pays an emulated network round trip on
// both sides (each per-file open + read, each stoker store operation: the
// same RoundTrip, counted); `--storage local` reads the local disk as it is;
// `--storage rados://...` the real cluster (per-file: one object per image).

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/cli.h"
#include "bench/bench.h"
#include "cli/demo_torch.h"
#include "stoker/pack.h"

namespace stoker::cli {
namespace {

namespace fs = std::filesystem;

// The emulated accelerators: MLPerf Storage's DLIO workload configs
// (github.com/mlcommons/storage, storage-conf/workload/), train.computation_time
// per step of reader.batch_size samples. The demo keeps the per-sample time
// and scales it to its own batch size.
struct Model {
  const char* name;
  const char* accelerator;
  double step_seconds;
  uint32_t batch;
  const char* source;
};
constexpr Model kModels[] = {
    {"resnet50-h100", "H100", 0.224, 400,
     "MLPerf Storage resnet50_h100.yaml: computation_time 0.224 s per batch of 400"},
    {"resnet50-a100", "A100", 0.151, 64,
     "MLPerf Storage resnet50_a100.yaml: computation_time 0.151 s per batch of 64"},
};

// The default round trip: the per-file loader on a CephFS mount read a
// second time (docs/benchmarks.md, "Per-file through CephFS against stoker
// from RADOS", 4 KiB: 3,253 files/s with 2 threads, about 0.6 ms per file).
constexpr double kCephFsRoundTripMs = 0.6;
constexpr double kBusyThreshold = 0.9;  // MLPerf Storage's AU for ResNet-50

// A batch source that runs epoch after epoch (a trial may need more steps
// than one epoch has).
template <typename L>
BatchSource Endless(std::shared_ptr<L> loader) {
  auto epoch = std::make_shared<uint64_t>(0);
  return [loader, epoch]() -> Result<Batch> {
    auto b = loader->Next();
    if (!b.ok() && b.status().code() == Code::kOutOfRange) {
      STOKER_RETURN_IF_ERROR(loader->StartEpoch(++*epoch));
      return loader->Next();
    }
    return b;
  };
}

nlohmann::json TrialJson(const AcceleratorTrial& t) {
  return {{"accelerators", t.accelerators},
          {"utilisation", t.utilisation},
          {"min_rank_utilisation", t.min_utilisation},
          {"nominal_compute_share", t.compute_share},
          {"samples_per_s", t.samples_per_second},
          {"wall_seconds", t.wall_seconds},
          {"busy", t.utilisation >= kBusyThreshold}};
}

nlohmann::json SearchJson(const AcceleratorSearch& s, uint64_t ops) {
  nlohmann::json trials = nlohmann::json::array();
  for (const auto& t : s.trials) trials.push_back(TrialJson(t));
  return {{"accelerators_busy", s.supported}, {"trials", trials}, {"storage_operations", ops}};
}

}  // namespace

void RegisterDemo(CLI::App& app, Action* action) {
  struct Args {
    std::string dir = "stoker-demo";
    std::string storage = "network";
    double round_trip_ms = kCephFsRoundTripMs;
    std::string model = "resnet50-h100";
    std::string json_path;
    uint32_t images = 3000;
    uint32_t classes = 10;
    uint32_t batch_size = 64;
    uint32_t threads = 0;
    uint32_t steps = 60;
    uint32_t warmup_steps = 10;
    uint32_t max_accelerators = 64;
    bool decode = false;
    bool keep = false;
    bool no_torch = false;
  };
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "demo",
      "How many accelerators this node keeps >= 90% busy from your storage: per-file loader vs "
      "stoker, MLPerf Storage's question");
  cmd->add_option("--dir", args->dir, "Working folder (images and the packed dataset)")
      ->capture_default_str();
  cmd->add_option("--storage", args->storage,
                  "network (local disk + an emulated round trip per operation, both sides), "
                  "local (the disk as it is) or a rados://POOL/NAME URI (the real cluster)")
      ->capture_default_str();
  cmd->add_option("--round-trip-ms", args->round_trip_ms,
                  "Emulated round trip per operation with --storage network (default: CephFS, "
                  "per-file on a warm mount, docs/benchmarks.md)")
      ->capture_default_str();
  cmd->add_option("--model", args->model,
                  "Emulated accelerator: resnet50-h100 or resnet50-a100 (MLPerf Storage DLIO "
                  "compute time per sample)")
      ->capture_default_str();
  cmd->add_option("--images", args->images, "Images to synthesize")->capture_default_str();
  cmd->add_option("--classes", args->classes, "Classes (folders)")->capture_default_str();
  cmd->add_option("--batch-size", args->batch_size, "Samples per step")->capture_default_str();
  cmd->add_option("--threads", args->threads,
                  "Loader threads of the node, split across the ranks, the same on both sides "
                  "(0 = cores)")
      ->capture_default_str();
  cmd->add_option("--steps", args->steps, "Measured steps per rank and trial")
      ->capture_default_str();
  cmd->add_option("--warmup-steps", args->warmup_steps, "Steps per rank before measuring")
      ->capture_default_str();
  cmd->add_option("--max-accelerators", args->max_accelerators, "Stop the search here")
      ->capture_default_str();
  cmd->add_flag("--decode", args->decode,
                "Decode and resize the JPEGs on both sides (default: deliver bytes, as MLPerf "
                "Storage does)");
  cmd->add_flag("--no-torch", args->no_torch, "Do not run PyTorch's DataLoader");
  cmd->add_flag("--keep", args->keep, "Keep the working folder afterwards");
  cmd->add_option("--json", args->json_path, "Write every figure as JSON to this file");
  cmd->callback([args, action] {
    *action = [args]() -> int {
      const Model* model = nullptr;
      for (const auto& m : kModels) {
        if (args->model == m.name) model = &m;
      }
      if (!model) {
        return Fail(InvalidArgument("--model must be resnet50-h100 or resnet50-a100, not '" +
                                    args->model + "'"));
      }
      if (args->images == 0) return Fail(InvalidArgument("--images must be at least 1"));
      if (args->batch_size == 0) return Fail(InvalidArgument("--batch-size must be at least 1"));
      if (args->steps == 0) return Fail(InvalidArgument("--steps must be at least 1"));
      if (args->max_accelerators == 0) {
        return Fail(InvalidArgument("--max-accelerators must be at least 1"));
      }
      const bool rados = args->storage.rfind("rados://", 0) == 0;
      const bool emulate = args->storage == "network";
      if (!rados && !emulate && args->storage != "local") {
        return Fail(InvalidArgument("--storage must be network, local or rados://POOL/NAME, not '" +
                                    args->storage + "'"));
      }
      if (emulate && !(args->round_trip_ms >= 0)) {
        return Fail(InvalidArgument("--round-trip-ms must be 0 or more"));
      }
      const auto started = Clock::now();
      const double per_sample_s = model->step_seconds / model->batch;
      const auto compute =
          std::chrono::microseconds(int64_t(per_sample_s * args->batch_size * 1e6 + 0.5));
      const double demand = 1.0 / per_sample_s;  // samples/s one accelerator consumes
      const uint32_t node_threads =
          args->threads ? args->threads : std::max(1u, std::thread::hardware_concurrency());
      std::string storage_text =
          emulate ? "local disk + an emulated network round trip of " +
                        std::to_string(args->round_trip_ms).substr(0, 5) +
                        " ms per operation on both sides (each per-file open+read, each stoker "
                        "store read; default: CephFS, per-file on a warm mount, "
                        "docs/benchmarks.md)"
          : rados ? "the Ceph cluster at " + args->storage + " (per-file: one object per image)"
                  : "local disk as it is (no emulated latency)";

      const fs::path dir = fs::absolute(args->dir);
      const fs::path images = dir / "images";
      std::error_code ec;
      // The demo owns its folder: it reuses one it made before (marked) and
      // never empties a folder of someone else's.
      const fs::path marker = dir / ".stoker-demo";
      if (fs::exists(dir, ec) && !fs::is_empty(dir, ec) && !fs::exists(marker, ec)) {
        return Fail(AlreadyExists(dir.string() +
                                  " is not empty and not a stoker demo folder; pick another "
                                  "--dir"));
      }
      fs::remove_all(dir, ec);
      fs::create_directories(dir, ec);
      if (ec) return Fail(ErrnoToStatus(ec.value(), "mkdir " + dir.string()));
      std::ofstream(marker) << "made by stoker demo\n";

      std::printf(
          "question: how many %s accelerators (%s, %.2f ms of compute per sample: %s) "
          "does this node keep >= %.0f%% busy?\n",
          model->accelerator, model->name, per_sample_s * 1e3, model->source, 100 * kBusyThreshold);
      std::printf("storage:  %s\n", storage_text.c_str());
      std::printf("[1/5] synthesizing %u JPEG images in %s ...\n", args->images, images.c_str());
      std::fflush(stdout);
      SynthOptions so;
      so.images = args->images;
      so.classes = args->classes;
      auto t0 = Clock::now();
      auto bytes = SynthesizeImageFolder(images.string(), so);
      if (!bytes.ok()) return Fail(bytes.status());
      std::printf("      %s, mean %.0f KB per image, %.1f s\n", HumanBytes(double(*bytes)).c_str(),
                  *bytes / 1000.0 / args->images,
                  std::chrono::duration<double>(Clock::now() - t0).count());

      const std::string uri = rados ? args->storage : (dir / "dataset").string();
      std::printf("[2/5] packing into %s ...\n", uri.c_str());
      std::fflush(stdout);
      t0 = Clock::now();
      auto opened = OpenStore(uri);
      if (!opened.ok()) return Fail(opened.status());
      std::shared_ptr<Store> store = *opened;
      auto sources = ScanImageFolder(images.string());
      if (!sources.ok()) return Fail(sources.status());
      auto manifest = Pack(*sources, *store, PackOptions{});
      if (!manifest.ok()) return Fail(manifest.status());
      std::printf("      %lu samples in %zu shards, %.1f s\n",
                  (unsigned long)manifest->sample_count, manifest->shards.size(),
                  std::chrono::duration<double>(Clock::now() - t0).count());
      // On the cluster, the per-file side reads each image as its own object.
      PackSources per_file_sources = *sources;
      std::shared_ptr<Store> per_file_store;
      if (rados) {
        std::printf("      uploading the %zu images as objects for the per-file side ...\n",
                    sources->files.size());
        std::fflush(stdout);
        per_file_store = store;
        for (auto& f : per_file_sources.files) {
          std::ifstream in(f.path, std::ios::binary);
          std::string s((std::istreambuf_iterator<char>(in)), {});
          const std::string key = "per-file/" + fs::relative(f.path, images).string();
          if (Status st = store->Put(key, std::as_bytes(std::span(s.data(), s.size()))); !st.ok()) {
            return Fail(st);
          }
          f.path = key;
        }
      }

      auto round_trip = std::make_shared<RoundTrip>(
          std::chrono::microseconds(emulate ? int64_t(args->round_trip_ms * 1000 + 0.5) : 0));
      // Without the emulation the round trip is 0: it only counts operations.
      std::shared_ptr<Store> stoker_store = NewLatencyStore(store, round_trip);
      std::shared_ptr<RoundTrip> per_file_round_trip = round_trip;
      LoaderOptions base;
      base.batch_size = args->batch_size;
      if (args->decode) base.decode.field = "image";
      const auto rank_options = [&](uint32_t rank, uint32_t ranks) {
        LoaderOptions o = base;
        // Each rank reads the whole set in its own order: the load of ranks
        // sharing a set `ranks` times this size.
        o.seed = rank;
        o.threads = std::max(1u, node_threads / ranks);
        return o;
      };
      const auto trial_line = [&](const char* who, const AcceleratorTrial& t) {
        std::printf(
            "      %-9s %3u accelerators: %5.1f%% busy (least busy rank %5.1f%%), %8.0f "
            "samples/s, %.1f s\n",
            who, t.accelerators, 100 * t.utilisation, 100 * t.min_utilisation, t.samples_per_second,
            t.wall_seconds);
        std::fflush(stdout);
      };
      const auto search = [&](const char* who,
                              const std::function<Result<BatchSource>(uint32_t, uint32_t)>& open)
          -> Result<AcceleratorSearch> {
        return SearchAccelerators(
            [&](uint32_t n) -> Result<AcceleratorTrial> {
              auto t = RunAccelerators(
                  n, [&](uint32_t rank) { return open(rank, n); }, compute, args->warmup_steps,
                  args->steps);
              if (t.ok()) trial_line(who, *t);
              return t;
            },
            kBusyThreshold, args->max_accelerators);
      };

      std::printf(
          "[3/5] per-file loader (one open+read per image, as ImageFolder + DataLoader): "
          "1, 2, 4, ... ranks, %u loader threads split across them, batch %u, %.1f ms "
          "compute per step\n",
          node_threads, args->batch_size, compute.count() / 1e3);
      std::fflush(stdout);
      const uint64_t ops0 = round_trip->operations();
      auto per_file = search("per-file", [&](uint32_t rank, uint32_t n) -> Result<BatchSource> {
        STOKER_ASSIGN_OR_RETURN(auto l, PerFileLoader::Open(per_file_sources, rank_options(rank, n),
                                                            per_file_round_trip, per_file_store));
        return Endless(std::shared_ptr<PerFileLoader>(std::move(l)));
      });
      if (!per_file.ok()) return Fail(per_file.status());
      const uint64_t per_file_ops = round_trip->operations() - ops0;

      std::printf("[4/5] stoker loader: the same ranks, threads, batch and compute\n");
      std::fflush(stdout);
      const uint64_t ops1 = round_trip->operations();
      auto ours = search("stoker", [&](uint32_t rank, uint32_t n) -> Result<BatchSource> {
        STOKER_ASSIGN_OR_RETURN(auto l, Loader::Open(stoker_store, rank_options(rank, n)));
        return Endless(std::shared_ptr<Loader>(std::move(l)));
      });
      if (!ours.ok()) return Fail(ours.status());
      const uint64_t stoker_ops = round_trip->operations() - ops1;

      std::printf("[5/5] PyTorch DataLoader over the same image files ...\n");
      std::fflush(stdout);
      TorchPeer torch;
      if (args->no_torch) {
        torch.note = "not run (--no-torch)";
      } else if (rados) {
        torch.note = "not run: the images are objects on the cluster, not files";
      } else if (args->decode) {
        torch.note = "not run with --decode (it reads bytes, as MLPerf Storage does)";
      } else {
        torch = RunTorchPeer(dir, images.string(), emulate ? args->round_trip_ms : 0,
                             args->batch_size, args->steps, node_threads);
      }
      if (torch.ran) {
        for (const auto& w : torch.runs) {
          std::printf("      DataLoader num_workers=%-3u %8.0f samples/s\n", w.workers,
                      w.samples_per_second);
        }
      } else {
        std::printf("      %s\n", torch.note.c_str());
      }

      const double total_s = std::chrono::duration<double>(Clock::now() - started).count();
      std::printf("\n%-28s %14s %14s\n", "", "per-file", "stoker");
      std::printf("%-28s %14u %14u\n", "accelerators >= 90% busy", per_file->supported,
                  ours->supported);
      const auto best = [](const AcceleratorSearch& s) {
        double v = 0;
        for (const auto& t : s.trials) v = std::max(v, t.samples_per_second);
        return v;
      };
      std::printf("%-28s %14.0f %14.0f\n", "best samples/s (all ranks)", best(*per_file),
                  best(*ours));
      std::printf("%-28s %14lu %14lu\n", "storage operations", (unsigned long)per_file_ops,
                  (unsigned long)stoker_ops);
      if (torch.ran) {
        std::printf(
            "%-28s %14.0f samples/s at num_workers=%u: at most %u accelerator(s)' demand "
            "(one process, not run as ranks)\n",
            "torch DataLoader", torch.best_samples_per_second, torch.best_workers,
            uint32_t(torch.best_samples_per_second / demand));
      }
      std::printf(
          "\nthis node, this storage: per-file keeps %u %s busy, stoker keeps %u "
          "(%s; %u threads; %.0f s)\n",
          per_file->supported, model->accelerator, ours->supported,
          emulate ? "emulated network round trip"
          : rados ? "Ceph cluster"
                  : "local disk",
          node_threads, total_s);

      nlohmann::json j;
      j["question"] = "accelerators kept >= 90% busy";
      j["model"] = {{"name", model->name},
                    {"accelerator", model->accelerator},
                    {"source", model->source},
                    {"compute_seconds_per_sample", per_sample_s},
                    {"samples_per_s_per_accelerator", demand}};
      j["storage"] = {{"mode", emulate ? "network"
                               : rados ? "rados"
                                       : "local"},
                      {"description", storage_text},
                      {"round_trip_ms", emulate ? args->round_trip_ms : 0.0},
                      {"uri", uri}};
      j["images"] = args->images;
      j["image_bytes"] = *bytes;
      j["shards"] = manifest->shards.size();
      j["batch_size"] = args->batch_size;
      j["compute_ms_per_step"] = compute.count() / 1e3;
      j["node_threads"] = node_threads;
      j["decode"] = args->decode;
      j["steps"] = args->steps;
      j["warmup_steps"] = args->warmup_steps;
      j["busy_threshold"] = kBusyThreshold;
      j["per_file"] = SearchJson(*per_file, per_file_ops);
      j["stoker"] = SearchJson(*ours, stoker_ops);
      j["torch"] = TorchJson(torch);
      j["headline"] = {{"per_file_accelerators", per_file->supported},
                       {"stoker_accelerators", ours->supported}};
      j["total_seconds"] = total_s;
      if (!args->json_path.empty()) {
        std::ofstream f(args->json_path);
        f << j.dump(2) << "\n";
        if (!f) return Fail(IoError("write " + args->json_path));
        std::printf("every figure: %s\n", args->json_path.c_str());
      }
      if (!args->keep) fs::remove_all(dir, ec);
      return 0;
    };
  });
}

}  // namespace stoker::cli
