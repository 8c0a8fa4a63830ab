// The node exporter: one Prometheus scrape target per node, serving every
// stoker process of the node (the files they publish, see metrics.h), the
// GPUs (NVML, loaded at run time), and the node's view of storage.
//
// Thread safety: an Exporter is driven by one thread (Serve); Stop() may be
// called from any thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "stoker/status.h"

namespace stoker::metrics {

struct ExporterOptions {
  // Address to listen on, HOST:PORT. Default: 127.0.0.1:9478, loopback only:
  // another address (0.0.0.0 for every interface) exposes the node's metrics
  // to whoever can reach it, and must be asked for.
  std::string listen = "127.0.0.1:9478";
  // The processes' files. Default: "" = as Options::dir in metrics.h.
  std::string dir;
  // Folders whose backing block devices' throughput is served (the cache and
  // checkpoint folders). Default: none.
  std::vector<std::string> watch_paths;
  // Load NVML for GPU metrics. Default: on (absent NVML: one warning, no GPU
  // series).
  bool gpu = true;
  // Where the NVML library is loaded from. Default: libnvidia-ml.so.1.
  std::string nvml_library = "libnvidia-ml.so.1";
};

class Exporter {
 public:
  // Binds the address; "address in use" and the like are errors naming it.
  static Result<std::unique_ptr<Exporter>> Start(const ExporterOptions& options);
  virtual ~Exporter() = default;
  // Serves requests until Stop(): GET /metrics is the merged exposition,
  // GET / a short page, anything else 404.
  virtual Status Serve() = 0;
  virtual void Stop() = 0;
  // The port bound (for port 0, the one the kernel picked).
  virtual int port() const = 0;
  // The exposition a scrape would get now.
  virtual std::string Scrape() = 0;
  // Warnings met while starting (NVML absent, a path on no block device).
  virtual const std::vector<std::string>& warnings() const = 0;
};

// Merges expositions (Prometheus text format) into one: each family's HELP
// and TYPE once, its samples from every input together. InvalidArgument on a
// sample line outside any family.
Result<std::string> MergeExpositions(const std::vector<std::string>& texts);

}  // namespace stoker::metrics
