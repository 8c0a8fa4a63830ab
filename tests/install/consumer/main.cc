// A program that uses an installed stoker as a library: packs a small
// ImageFolder it writes itself into a dataset, then verifies every byte.
// Built by tests/install/install_test.sh through find_package(stoker) and
// through pkg-config.
#include <stoker/dataset.h>
#include <stoker/pack.h>
#include <stoker/store.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s WORK_DIR\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  const fs::path work = argv[1];
  for (int c = 0; c < 2; ++c) {
    const fs::path cls = work / "images" / ("class" + std::to_string(c));
    fs::create_directories(cls);
    for (int i = 0; i < 5; ++i) {
      std::ofstream(cls / ("s" + std::to_string(i) + ".bin"))
          << std::string(1000 + i, char('a' + c));
    }
  }
  auto manifest = stoker::Pack((work / "images").string(), (work / "dataset").string(), {});
  if (!manifest.ok()) {
    std::fprintf(stderr, "pack: %s\n", manifest.status().ToString().c_str());
    return 1;
  }
  auto store = stoker::OpenStore((work / "dataset").string());
  if (!store.ok()) {
    std::fprintf(stderr, "open: %s\n", store.status().ToString().c_str());
    return 1;
  }
  auto report = stoker::VerifyDataset(**store);
  if (!report.ok() || !report->ok()) {
    std::fprintf(stderr, "verify failed\n");
    return 1;
  }
  std::printf("consumer: %lu samples packed and verified\n",
              (unsigned long)report->samples_checked);
  return report->samples_checked == 10 ? 0 : 1;
}
