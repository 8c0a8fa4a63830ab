// stoker demo: synthesize JPEGs, pack them, and run the same emulated
// training job twice, once on a per-file loader and once on stoker, with the
// same images, threads and decode. Prints and writes the comparison.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/cli.h"
#include "cli/loader_flags.h"
#include "bench/bench.h"
#include "stoker/pack.h"

namespace stoker::cli {
namespace {

namespace fs = std::filesystem;

// Drops the page cache so both runs read from the device, when allowed
// (root on a kernel that lets this container do it).
bool DropPageCache() {
  ::sync();
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, "3", 1) == 1;
  ::close(fd);
  return ok;
}

nlohmann::json RunJson(const TrainRun& r) {
  return {{"steps", r.steps},
          {"samples", r.samples},
          {"wall_seconds", r.wall_seconds},
          {"compute_seconds", r.compute_seconds},
          {"data_wait_seconds", r.wait_seconds},
          {"samples_per_s", r.samples_per_second()},
          {"data_wait_share", r.data_wait_share()},
          {"accelerator_utilisation", r.accelerator_utilisation()}};
}

}  // namespace

void RegisterDemo(CLI::App& app, Action* action) {
  struct Args {
    std::string dir = "stoker-demo";
    std::string uri;
    std::string json_path;
    uint32_t images = 3000;
    uint32_t classes = 10;
    double compute_ms = 25;
    bool raw = false;
    bool keep = false;
    LoaderFlags flags;
  };
  auto args = std::make_shared<Args>();
  args->flags.options.batch_size = 64;
  args->flags.decode = true;
  auto* cmd =
      app.add_subcommand("demo",
                         "Synthesize JPEGs, pack them, and compare an emulated training job on a "
                         "per-file loader and on stoker");
  cmd->add_option("--dir", args->dir, "Working folder (images and the packed dataset)")
      ->capture_default_str();
  cmd->add_option("--uri", args->uri, "Pack to this dataset URI instead (e.g. rados://POOL/NAME)");
  cmd->add_option("--images", args->images, "Images to synthesize")->capture_default_str();
  cmd->add_option("--classes", args->classes, "Classes (folders)")->capture_default_str();
  cmd->add_option("--compute-ms", args->compute_ms, "Emulated accelerator time per step")
      ->capture_default_str();
  cmd->add_flag("--raw", args->raw, "Deliver raw bytes (no JPEG decode)");
  cmd->add_flag("--keep", args->keep, "Keep the working folder afterwards");
  cmd->add_option("--json", args->json_path, "Write the results as JSON to this file");
  args->flags.Add(cmd);
  cmd->callback([args, action] {
    *action = [args]() -> int {
      if (args->raw) args->flags.decode = false;
      if (Status st = args->flags.Finish(); !st.ok()) return Fail(st);
      if (args->images == 0) return Fail(InvalidArgument("--images must be at least 1"));
      const LoaderOptions& lo = args->flags.options;
      const fs::path dir = fs::absolute(args->dir);
      const fs::path images = dir / "images";
      const std::string uri = args->uri.empty() ? (dir / "dataset").string() : args->uri;
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

      std::printf("1/4 synthesizing %u JPEG images in %s ...\n", args->images, images.c_str());
      std::fflush(stdout);
      SynthOptions so;
      so.images = args->images;
      so.classes = args->classes;
      auto t0 = std::chrono::steady_clock::now();
      auto bytes = SynthesizeImageFolder(images.string(), so);
      if (!bytes.ok()) return Fail(bytes.status());
      std::printf("    %s, mean %.0f KB per image, %.1f s\n", HumanBytes(double(*bytes)).c_str(),
                  *bytes / 1000.0 / args->images,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

      std::printf("2/4 packing into %s ...\n", uri.c_str());
      std::fflush(stdout);
      t0 = std::chrono::steady_clock::now();
      auto store = OpenStore(uri);
      if (!store.ok()) return Fail(store.status());
      auto sources = ScanImageFolder(images.string());
      if (!sources.ok()) return Fail(sources.status());
      auto manifest = Pack(*sources, **store, PackOptions{});
      if (!manifest.ok()) return Fail(manifest.status());
      std::printf("    %lu samples in %zu shards, %.1f s\n", (unsigned long)manifest->sample_count,
                  manifest->shards.size(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

      const auto compute = std::chrono::microseconds(int64_t(args->compute_ms * 1000));
      const std::string what = lo.decode.field.empty()
                                   ? "raw bytes"
                                   : "JPEG decode + resize to " + std::to_string(lo.decode.height) +
                                         "x" + std::to_string(lo.decode.width);
      const uint32_t threads = lo.threads ? lo.threads : std::thread::hardware_concurrency();
      std::printf(
          "3/4 emulated training, per-file loader (one open+read per image, as ImageFolder + "
          "DataLoader): batch %u, %u threads, %s, %.1f ms compute per step\n",
          lo.batch_size, threads, what.c_str(), args->compute_ms);
      std::fflush(stdout);
      const bool cold = DropPageCache();
      // Each loader is opened by the job's first step, so its start-up and
      // first reads count in its time.
      std::unique_ptr<PerFileLoader> per_file;
      auto base = EmulateTraining(
          [&]() -> Result<Batch> {
            if (!per_file) {
              STOKER_ASSIGN_OR_RETURN(per_file, PerFileLoader::Open(*sources, lo));
            }
            return per_file->Next();
          },
          compute, 0);
      if (!base.ok()) return Fail(base.status());
      per_file.reset();

      std::printf("4/4 emulated training, stoker loader: the same job\n");
      std::fflush(stdout);
      DropPageCache();
      std::unique_ptr<Loader> loader;
      auto ours = EmulateTraining(
          [&]() -> Result<Batch> {
            if (!loader) {
              STOKER_ASSIGN_OR_RETURN(loader, Loader::Open(*store, lo));
            }
            return loader->Next();
          },
          compute, 0);
      if (!ours.ok()) return Fail(ours.status());

      std::printf("\n%-22s %12s %12s %14s\n", "", "samples/s", "data wait", "accel. util.");
      std::printf("%-22s %12.0f %11.1f%% %13.1f%%\n", "per-file loader", base->samples_per_second(),
                  100 * base->data_wait_share(), 100 * base->accelerator_utilisation());
      std::printf("%-22s %12.0f %11.1f%% %13.1f%%\n", "stoker", ours->samples_per_second(),
                  100 * ours->data_wait_share(), 100 * ours->accelerator_utilisation());
      std::printf("\nstoker / per-file: %.2fx samples/s (page cache %s before each run; %s)\n",
                  base->samples_per_second() > 0
                      ? ours->samples_per_second() / base->samples_per_second()
                      : 0.0,
                  cold ? "dropped" : "NOT dropped (not allowed here): both runs read warm data",
                  what.c_str());

      nlohmann::json j;
      j["images"] = args->images;
      j["image_bytes"] = *bytes;
      j["shards"] = manifest->shards.size();
      j["batch_size"] = lo.batch_size;
      j["threads"] = threads;
      j["decode"] = what;
      j["compute_ms_per_step"] = args->compute_ms;
      j["page_cache_dropped"] = cold;
      j["per_file"] = RunJson(*base);
      j["stoker"] = RunJson(*ours);
      j["speedup"] = base->samples_per_second() > 0
                         ? ours->samples_per_second() / base->samples_per_second()
                         : 0.0;
      if (!args->json_path.empty()) {
        std::ofstream f(args->json_path);
        f << j.dump(2) << "\n";
        if (!f) return Fail(IoError("write " + args->json_path));
        std::printf("results written to %s\n", args->json_path.c_str());
      }
      loader.reset();
      if (!args->keep) fs::remove_all(dir, ec);
      return 0;
    };
  });
}

}  // namespace stoker::cli
