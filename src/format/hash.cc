// The format's checksum and hex helpers. docs/format.md, conventions.
#include <xxhash.h>

#include <new>

#include "format/coding.h"
#include "stoker/format.h"

namespace stoker::format {

namespace internal {
#if defined(__x86_64__)
uint64_t Hash64Avx2(const void* data, size_t size);
void Hash64Avx2Update(void* state, const void* data, size_t size);
uint64_t Hash64Avx2Digest(const void* state);
#endif
}  // namespace internal

namespace {
bool UseAvx2() {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
#else
  return false;
#endif
}
}  // namespace

uint64_t Hash64(std::span<const std::byte> data) {
#if defined(__x86_64__)
  if (UseAvx2()) return internal::Hash64Avx2(data.data(), data.size());
#endif
  // XXH3_64bits accepts (nullptr, 0).
  return XXH3_64bits(data.data(), data.size());
}

// The state is the same struct whichever code updates it; only the
// accumulation differs.
Hash64Stream::Hash64Stream() : avx2_(UseAvx2()) {
  XXH3_state_t* s = XXH3_createState();
  if (s == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(s);
  state_ = s;
}

Hash64Stream::~Hash64Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Hash64Stream::Update(std::span<const std::byte> data) {
  if (data.empty()) return;
#if defined(__x86_64__)
  if (avx2_) {
    internal::Hash64Avx2Update(state_, data.data(), data.size());
    return;
  }
#endif
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data.data(), data.size());
}

uint64_t Hash64Stream::Digest() const {
#if defined(__x86_64__)
  if (avx2_) return internal::Hash64Avx2Digest(state_);
#endif
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
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
