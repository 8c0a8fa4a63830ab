// Issue 36's benchmark of the token window index (docs/benchmarks.md,
// "Token window index"): TokenWindows::Build over N documents' token
// counts (shuffle off and on), the cost of a window's lookup, and, for a
// real dataset written here, TokenDataset::Open (the shards' indexes read
// and parsed) plus the build: what a rank pays at open. Run by
// bench/token_index.sh next to the NumPy version of the same algorithm
// (bench/token_index_numpy.py). Not installed.
//
//   token_index_bench build N...        one JSON line per N (synthetic counts)
//   token_index_bench open DIR DOCS     packs DOCS documents into DIR, then opens it
//   token_index_bench mix DIR N         N small sources, then a mixture of them
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/loader.h"
#include "stoker/mix.h"
#include "stoker/tokens.h"
#include "stoker/writer.h"

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Document lengths 1..2047 tokens (mean ~1024), from a fixed LCG.
std::vector<uint32_t> Lengths(uint64_t n, uint32_t max_len = 2047) {
  std::vector<uint32_t> v(n);
  uint64_t x = 12345;
  for (auto& l : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    l = 1 + uint32_t((x >> 33) % max_len);
  }
  return v;
}

int Build(int argc, char** argv) {
  for (int a = 2; a < argc; ++a) {
    const uint64_t n = std::strtoull(argv[a], nullptr, 10);
    const std::vector<uint32_t> lens = Lengths(n);
    for (bool shuffle : {false, true}) {
      auto t0 = Clock::now();
      const stoker::TokenWindows w = stoker::TokenWindows::Build(lens, 4096, 7, shuffle, 1, 0);
      const double build = Since(t0);
      std::vector<stoker::TokenPiece> pieces;
      const uint64_t lookups = 1000000;
      t0 = Clock::now();
      uint64_t total = 0;
      for (uint64_t p = 0; p < lookups; ++p) {
        pieces.clear();
        w.Pieces(w.WindowAt((p * 2654435761u) % w.size()), &pieces);
        total += pieces.size();
      }
      const double lookup = Since(t0);
      std::printf(
          "{\"what\": \"build\", \"documents\": %llu, \"shuffle\": %s, \"windows\": %llu, "
          "\"build_s\": %.3f, \"lookup_us\": %.3f, \"pieces_per_window\": %.2f, "
          "\"documents_per_block\": %u, \"index_bytes\": %llu}\n",
          (unsigned long long)n, shuffle ? "true" : "false", (unsigned long long)w.size(), build,
          lookup / lookups * 1e6, double(total) / lookups, w.documents_per_block(),
          (unsigned long long)((n + w.documents_per_block() - 1) / w.documents_per_block() + 1) *
              8);
      std::fflush(stdout);
    }
  }
  return 0;
}

int Open(const std::string& dir, uint64_t docs) {
  auto spec = stoker::format::ParseFieldSpec("tokens", "uint16[*]");
  auto t0 = Clock::now();
  {
    auto w = stoker::DatasetWriter::Create(dir, {*spec}, {});
    if (!w.ok()) return std::fprintf(stderr, "%s\n", w.status().ToString().c_str()), 1;
    const std::vector<uint32_t> lens = Lengths(docs, 255);
    std::vector<uint16_t> tokens(256);
    for (uint64_t d = 0; d < docs; ++d) {
      for (uint32_t t = 0; t < lens[d]; ++t) tokens[t] = uint16_t(d + t);
      stoker::format::FieldValue v;
      v.bytes = std::as_bytes(std::span(tokens.data(), lens[d]));
      if (auto st = (*w)->Write(std::span(&v, 1)); !st.ok()) {
        return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
      }
    }
    if (auto m = (*w)->Close(); !m.ok())
      return std::fprintf(stderr, "%s\n", m.status().ToString().c_str()), 1;
  }
  const double pack = Since(t0);
  t0 = Clock::now();
  auto store = stoker::OpenStore(dir).value();
  auto m = stoker::ReadManifest(*store);
  if (!m.ok()) return std::fprintf(stderr, "%s\n", m.status().ToString().c_str()), 1;
  const double manifest = Since(t0);
  const size_t shards = m->shards.size();
  const uint64_t bytes = m->shards.total_bytes();
  auto ds = stoker::TokenDataset::Open(store, std::move(*m), {});
  if (!ds.ok()) return std::fprintf(stderr, "%s\n", ds.status().ToString().c_str()), 1;
  const double indexes = Since(t0) - manifest;
  auto t1 = Clock::now();
  const stoker::TokenWindows w =
      stoker::TokenWindows::Build((*ds)->doc_tokens(), 2048, (*ds)->manifest().Id64(), true, 1, 0);
  const double build = Since(t1);
  std::printf(
      "{\"what\": \"open\", \"documents\": %llu, \"shards\": %zu, \"dataset_bytes\": %llu, "
      "\"pack_s\": %.2f, \"manifest_s\": %.3f, \"indexes_s\": %.3f, \"index_bytes\": %llu, "
      "\"build_s\": %.3f, \"windows\": %llu, \"open_total_s\": %.3f}\n",
      (unsigned long long)docs, shards, (unsigned long long)bytes, pack, manifest, indexes,
      (unsigned long long)(*ds)->index_bytes_read(), build, (unsigned long long)w.size(),
      manifest + indexes + build);
  // One shuffled epoch through the loader: tokens/s on one rank, and the
  // bytes read per dataset byte, with the records checked and without.
  for (bool verify : {true, false}) {
    stoker::LoaderOptions o;
    o.sequence_length = 2048;
    o.batch_size = 8;
    o.sequence_verify = verify;
    auto t2 = Clock::now();
    auto loader = stoker::Loader::Open(dir, o);
    if (!loader.ok()) return std::fprintf(stderr, "%s\n", loader.status().ToString().c_str()), 1;
    const double open = Since(t2);
    uint64_t tokens = 0;
    while (true) {
      auto b = (*loader)->Next();
      if (!b.ok()) break;
      tokens += b->size() * (o.sequence_length + 1);
    }
    const double secs = Since(t2) - open;
    const auto st = (*loader)->stats();
    std::printf(
        "{\"what\": \"epoch\", \"verify\": %s, \"open_s\": %.3f, \"epoch_s\": %.2f, "
        "\"tokens\": %llu, \"tokens_per_s\": %.0f, \"bytes_read\": %llu, "
        "\"read_over_dataset\": %.3f}\n",
        verify ? "true" : "false", open, secs, (unsigned long long)tokens, tokens / secs,
        (unsigned long long)st.bytes_read, double(st.bytes_read) / double(bytes));
  }
  return 0;
}

// N sources of 300 documents each (1..255 tokens) in DIR/000000.., then a
// mixture of them with equal weights: open time and the time per step.
int MixBench(const std::string& dir, uint32_t n) {
  auto spec = stoker::format::ParseFieldSpec("tokens", "uint16[*]");
  std::vector<stoker::MixSource> sources;
  auto t0 = Clock::now();
  const std::vector<uint32_t> lens = Lengths(300, 255);
  std::vector<uint16_t> tokens(256, 7);
  for (uint32_t i = 0; i < n; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "/%06u", i);
    auto w = stoker::DatasetWriter::Create(dir + name, {*spec}, {});
    if (!w.ok()) return std::fprintf(stderr, "%s\n", w.status().ToString().c_str()), 1;
    for (uint32_t l : lens) {
      stoker::format::FieldValue v;
      v.bytes = std::as_bytes(std::span(tokens.data(), l));
      if (auto st = (*w)->Write(std::span(&v, 1)); !st.ok()) return 1;
    }
    if (!(*w)->Close().ok()) return 1;
    sources.push_back({dir + name, 1.0 + i % 7, 0, ""});
  }
  const double pack = Since(t0);
  stoker::MixOptions o;
  o.batch_size = 512;
  o.sequence_length = 2048;
  t0 = Clock::now();
  auto mix = stoker::Mix::Open(sources, o);
  if (!mix.ok()) return std::fprintf(stderr, "%s\n", mix.status().ToString().c_str()), 1;
  const double open = Since(t0);
  const int steps = 20;
  t0 = Clock::now();
  for (int s = 0; s < steps; ++s) {
    if (!(*mix)->Next().ok()) return 1;
  }
  const double per_step = Since(t0) / steps;
  std::printf(
      "{\"what\": \"mix\", \"sources\": %u, \"pack_s\": %.2f, \"open_s\": %.3f, "
      "\"step_ms\": %.2f, \"batch\": 512, \"sequence_length\": 2048}\n",
      n, pack, open, per_step * 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "build" && argc > 2) return Build(argc, argv);
  if (what == "open" && argc == 4) return Open(argv[2], std::strtoull(argv[3], nullptr, 10));
  if (what == "mix" && argc == 4) return MixBench(argv[2], uint32_t(std::strtoul(argv[3], nullptr, 10)));
  std::fprintf(stderr, "usage: token_index_bench build N... | open DIR DOCS | mix DIR N\n");
  return 2;
}
