#include "cli/demo_torch.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace stoker::cli {
namespace {

// Debian's interpreter, as for the binding; STOKER_DEMO_PYTHON overrides it
// (a GPU machine whose torch lives elsewhere).
std::string Python() {
  const char* p = std::getenv("STOKER_DEMO_PYTHON");
  return p && *p ? p : "/usr/bin/python3";
}

// argv: images round_trip_ms batch steps workers,... ; prints one JSON line.
constexpr const char* kScript = R"PY(
import json, sys, time
import torch, torchvision
from torch.utils.data import DataLoader

root, rtt, batch, steps = sys.argv[1], float(sys.argv[2]) / 1000, int(sys.argv[3]), int(sys.argv[4])
workers = [int(w) for w in sys.argv[5].split(",")]

def read(path):  # the file's open + read pays the round trip, as on the C++ side
    if rtt:
        time.sleep(rtt)
    with open(path, "rb") as f:
        return f.read()

def collate(items):
    return [x for x, _ in items], torch.tensor([y for _, y in items])

ds = torchvision.datasets.DatasetFolder(root, loader=read, extensions=(".jpg",))
runs = []
for w in workers:
    dl = DataLoader(ds, batch_size=batch, shuffle=True, num_workers=w, collate_fn=collate,
                    prefetch_factor=4, persistent_workers=True)
    it = iter(dl)
    def step():
        global it
        try:
            return next(it)
        except StopIteration:
            it = iter(dl)
            return next(it)
    for _ in range(4):
        step()
    t0, n = time.perf_counter(), 0
    for _ in range(steps):
        n += len(step()[1])
    runs.append({"workers": w, "samples_per_s": n / (time.perf_counter() - t0)})
    del it, dl
print(json.dumps(runs))
)PY";

}  // namespace

TorchPeer RunTorchPeer(const std::filesystem::path& work_dir, const std::string& images,
                       double round_trip_ms, uint32_t batch_size, uint32_t steps,
                       uint32_t node_threads) {
  TorchPeer peer;
  const std::string how =
      "to see it: apt-get install python3-torch python3-torchvision (Debian 12)";
  const std::string python = Python();
  if (std::system((python + " -c 'import torch, torchvision' >/dev/null 2>&1").c_str()) != 0) {
    peer.note = "not run: " + python + " has no torch/torchvision; " + how;
    return peer;
  }
  const auto script = work_dir / "torch_peer.py";
  std::ofstream(script) << kScript;
  std::string workers;
  for (uint32_t w : {node_threads, 2 * node_threads, 4 * node_threads}) {
    workers += (workers.empty() ? "" : ",") + std::to_string(std::min(w, 64u));
  }
  char rtt[32];
  std::snprintf(rtt, sizeof rtt, "%.4f", round_trip_ms);
  const std::string cmd = python + " " + script.string() + " '" + images + "' " + rtt + " " +
                          std::to_string(batch_size) + " " + std::to_string(steps) + " " + workers +
                          " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) {
    peer.note = "not run: could not start " + python;
    return peer;
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  const auto line = out.rfind('[');
  if (rc != 0 || line == std::string::npos) {
    peer.note = "failed: " + out.substr(out.size() > 400 ? out.size() - 400 : 0);
    return peer;
  }
  try {
    for (const auto& r : nlohmann::json::parse(out.substr(line))) {
      TorchRun run{r.at("workers").get<uint32_t>(), r.at("samples_per_s").get<double>()};
      peer.runs.push_back(run);
      if (run.samples_per_second > peer.best_samples_per_second) {
        peer.best_samples_per_second = run.samples_per_second;
        peer.best_workers = run.workers;
      }
    }
  } catch (const std::exception& e) {
    peer.note = std::string("failed: unreadable output (") + e.what() + ")";
    return peer;
  }
  peer.ran = true;
  peer.note =
      "torchvision DatasetFolder (bytes) + DataLoader, one process, best of num_workers " + workers;
  return peer;
}

nlohmann::json TorchJson(const TorchPeer& peer) {
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : peer.runs) {
    runs.push_back({{"num_workers", r.workers}, {"samples_per_s", r.samples_per_second}});
  }
  return {{"ran", peer.ran},
          {"note", peer.note},
          {"runs", runs},
          {"best_num_workers", peer.best_workers},
          {"best_samples_per_s", peer.best_samples_per_second}};
}

}  // namespace stoker::cli
