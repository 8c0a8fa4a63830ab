// Test helper: saves checkpoints w-000000, w-000001, ... to URI in a loop
// (content from MakeCkptContent(seed = the number)), printing "committed
// NAME" after each, until killed or COUNT are done. ckpt_test kills it at
// random moments.
//
//   ckpt_writer URI START COUNT CHUNK_BYTES SCALE [async|auto]
//
// auto: names from Checkpointer::ClaimName (ckpt-NNNNNN), printed with the
// seed of their content ("committed ckpt-000003 7").
#include <cstdio>
#include <cstdlib>
#include <string>

#include "ckpt_testdata.h"

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s URI START COUNT CHUNK_BYTES SCALE [async]\n", argv[0]);
    return 2;
  }
  const std::string uri = argv[1];
  const uint64_t start = std::strtoull(argv[2], nullptr, 10);
  const uint64_t count = std::strtoull(argv[3], nullptr, 10);
  stoker::SaveOptions o;
  o.chunk_bytes = std::strtoull(argv[4], nullptr, 10);
  const size_t scale = std::strtoull(argv[5], nullptr, 10);
  const bool async = argc > 6 && std::string(argv[6]) == "async";
  const bool automatic = argc > 6 && std::string(argv[6]) == "auto";
  auto c = stoker::OpenCheckpointer(uri);
  if (!c.ok()) {
    std::fprintf(stderr, "ckpt_writer: %s\n", c.status().ToString().c_str());
    return 1;
  }
  for (uint64_t i = start; i < start + count; ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "w-%06llu", static_cast<unsigned long long>(i));
    std::string name = buf;
    if (automatic) {
      auto claimed = (*c)->ClaimName();
      if (!claimed.ok()) {
        std::fprintf(stderr, "ckpt_writer: %s\n", claimed.status().ToString().c_str());
        return 1;
      }
      name = *claimed;
    }
    auto content = stoker::testing::MakeCkptContent(i, scale);
    stoker::Status s;
    if (async) {
      auto h = (*c)->SaveAsync(name, content.refs, o);
      s = h.ok() ? h->Wait() : h.status();
    } else {
      s = (*c)->Save(name, content.refs, o);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "ckpt_writer: %s\n", s.ToString().c_str());
      return 1;
    }
    if (automatic) {
      std::printf("committed %s %llu\n", name.c_str(), static_cast<unsigned long long>(i));
    } else {
      std::printf("committed %s\n", name.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}
