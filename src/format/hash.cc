// The format's checksum and hex helpers. docs/format.md, conventions.
#include <xxhash.h>

#include "format/coding.h"
#include "stoker/format.h"

namespace stoker::format {

namespace internal {
#if defined(__x86_64__)
uint64_t Hash64Avx2(const void* data, size_t size);
#endif
}  // namespace internal

uint64_t Hash64(std::span<const std::byte> data) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return internal::Hash64Avx2(data.data(), data.size());
#endif
  // XXH3_64bits accepts (nullptr, 0).
  return XXH3_64bits(data.data(), data.size());
}

namespace internal {

namespace {
constexpr char kHexDigits[] = "0123456789abcdef";
}  // namespace

std::string Hex16(uint64_t v) {
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i) {
    s[i] = kHexDigits[v & 0xf];
    v >>= 4;
  }
  return s;
}

std::string HexBytes(const uint8_t* p, size_t n) {
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kHexDigits[p[i] >> 4];
    s[2 * i + 1] = kHexDigits[p[i] & 0xf];
  }
  return s;
}

}  // namespace internal
}  // namespace stoker::format
