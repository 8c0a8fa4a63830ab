// Test helper: a C++ program (no Python) that publishes its metrics and
// saves two checkpoints through metrics::OpenCheckpointer, one synchronous
// and one asynchronous, so that tests/python/test_metrics_prometheus.py can
// find them in Prometheus with their bytes.
//
//   metrics_ckpt_child METRICS_DIR ROOT JOB
//
// Prints the bytes the two checkpoints hold (their manifests' sum), then
// stays alive, its series published, until its stdin closes.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "stoker/metrics.h"

namespace {

int Fail(const stoker::Status& s) {
  std::fprintf(stderr, "metrics_ckpt_child: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace stoker;
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s METRICS_DIR ROOT JOB\n", argv[0]);
    return 2;
  }
  metrics::Options o;
  o.dir = argv[1];
  o.job = argv[3];
  o.rank = 0;
  o.interval = std::chrono::milliseconds(200);
  if (Status s = metrics::Enable(o); !s.ok()) return Fail(s);
  auto c = metrics::OpenCheckpointer(argv[2]);
  if (!c.ok()) return Fail(c.status());
  std::vector<std::byte> a(3000, std::byte{1}), b(50000, std::byte{2});
  const std::vector<TensorRef> tensors = {{"a", DType::kUInt8, {3000}, a},
                                          {"b", DType::kFloat32, {12500}, b}};
  if (Status s = (*c)->Save("sync", tensors, {}); !s.ok()) return Fail(s);
  auto h = (*c)->SaveAsync("async", tensors, {});
  if (!h.ok()) return Fail(h.status());
  if (Status s = h->Wait(); !s.ok()) return Fail(s);
  uint64_t bytes = 0;
  for (const char* name : {"sync", "async"}) {
    auto m = (*c)->ReadManifest(name);
    if (!m.ok()) return Fail(m.status());
    bytes += m->bytes();
  }
  std::printf("%llu\n", static_cast<unsigned long long>(bytes));
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  metrics::Disable();
  return 0;
}
