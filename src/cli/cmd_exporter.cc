// stoker exporter: the node's Prometheus scrape target (stoker processes,
// GPUs, storage). Listens on loopback unless --listen says otherwise.
#include <csignal>
#include <cstdio>

#include "cli/cli.h"
#include "stoker/exporter.h"

namespace stoker::cli {
namespace {

metrics::Exporter* g_exporter = nullptr;

void OnSignal(int) {
  if (g_exporter) g_exporter->Stop();
}

}  // namespace

void RegisterExporter(CLI::App& app, Action* action) {
  auto o = std::make_shared<metrics::ExporterOptions>();
  auto no_gpu = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "exporter", "Serve this node's stoker processes, GPUs and storage to Prometheus");
  cmd->add_option("--listen", o->listen,
                  "HOST:PORT to listen on; an address other than 127.0.0.1 exposes the metrics "
                  "to the network (0.0.0.0: every interface)")
      ->capture_default_str();
  cmd->add_option("--dir", o->dir,
                  "Folder the processes publish in (default: $STOKER_METRICS_DIR or "
                  "/dev/shm/stoker-metrics)");
  cmd->add_option("--watch", o->watch_paths,
                  "A folder whose block device's throughput to serve (the cache and checkpoint "
                  "folders); repeatable");
  cmd->add_flag("--no-gpu", *no_gpu, "Do not load NVML");
  cmd->add_option("--nvml", o->nvml_library, "NVML library to load")->capture_default_str();
  cmd->callback([o, no_gpu, action] {
    *action = [o, no_gpu] {
      o->gpu = !*no_gpu;
      auto e = metrics::Exporter::Start(*o);
      if (!e.ok()) return Fail(e.status());
      for (const auto& w : (*e)->warnings())
        std::fprintf(stderr, "stoker exporter: %s\n", w.c_str());
      if (!o->listen.starts_with("127.") && !o->listen.starts_with("localhost:")) {
        std::fprintf(stderr,
                     "stoker exporter: %s is reachable from other hosts: firewall it to the "
                     "Prometheus server (docs/architecture.md, Metrics)\n",
                     o->listen.c_str());
      }
      g_exporter = e->get();
      std::signal(SIGINT, OnSignal);
      std::signal(SIGTERM, OnSignal);
      std::printf("stoker exporter: serving http://%s:%d/metrics\n",
                  o->listen.substr(0, o->listen.rfind(':')).c_str(), (*e)->port());
      std::fflush(stdout);
      Status s = (*e)->Serve();
      g_exporter = nullptr;
      return s.ok() ? 0 : Fail(s);
    };
  });
}

}  // namespace stoker::cli
