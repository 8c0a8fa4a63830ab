// The demo's real peer: PyTorch's DataLoader over the same image files,
// run by /usr/bin/python3 (or $STOKER_DEMO_PYTHON) when it has torch and
// torchvision.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace stoker::cli {

struct TorchRun {
  uint32_t workers = 0;
  double samples_per_second = 0;
};

struct TorchPeer {
  bool ran = false;
  std::string note;  // why it did not run, or how it ran
  std::vector<TorchRun> runs;
  uint32_t best_workers = 0;
  double best_samples_per_second = 0;
};

// Runs torchvision's DatasetFolder (bytes, no decode) under a DataLoader at
// several worker counts (cores, 2x, 4x), each file read paying
// `round_trip_ms` first (a sleep in the worker, as the C++ side pays it),
// for `steps` batches after a warm-up; the best worker count is the peer's
// figure. Writes its script into `work_dir`.
TorchPeer RunTorchPeer(const std::filesystem::path& work_dir, const std::string& images,
                       double round_trip_ms, uint32_t batch_size, uint32_t steps,
                       uint32_t node_threads);

nlohmann::json TorchJson(const TorchPeer& peer);

}  // namespace stoker::cli
