// Helpers shared by the fuzzers: they "reseal" mutated input (fix its
// checksums) so that libFuzzer reaches the checks behind the hashes, which
// random bytes would otherwise almost never pass.
#pragma once

#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/format.h"

namespace stoker::fuzz {

inline std::span<const std::byte> AsSpan(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// A manifest header line for `body` (docs/format.md §2.1) followed by it.
inline std::string SealManifest(std::string_view body) {
  char line[80];
  std::snprintf(line, sizeof line, "STOKER-DATASET 1 %zu %016" PRIx64 "\n", body.size(),
                format::Hash64(AsSpan(body)));
  return line + std::string(body);
}

template <typename T>
T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <typename T>
void Store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

// Fixes a shard's index hash (when the header's index lies inside it) and
// header hash (docs/format.md §3.1). Little-endian hosts only.
inline void SealShard(std::vector<std::byte>& b) {
  if (b.size() < format::kShardHeaderBytes) return;
  const uint64_t off = Load<uint64_t>(b.data() + 40);
  const uint64_t len = uint64_t{Load<uint32_t>(b.data() + 36)} * Load<uint16_t>(b.data() + 14);
  if (off <= b.size() && len <= b.size() - off) {
    Store<uint64_t>(b.data() + 48, format::Hash64(std::span(b).subspan(off, len)));
  }
  Store<uint64_t>(b.data() + 56, format::Hash64(std::span(b).first(56)));
}

// A property the parsers promise was broken: crash so that libFuzzer keeps
// the input.
[[noreturn]] inline void Violated(const char* what, const std::string& detail) {
  std::fprintf(stderr, "PROPERTY VIOLATED: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Errors from parsing untrusted bytes are Corruption or Unsupported, and
// name the object.
inline void CheckParseError(const Status& s, std::string_view where) {
  if (s.code() != Code::kCorruption && s.code() != Code::kUnsupported) {
    Violated("unexpected error code", s.ToString());
  }
  if (s.message().rfind(where, 0) != 0)
    Violated("message does not start with the name", s.ToString());
}

}  // namespace stoker::fuzz
