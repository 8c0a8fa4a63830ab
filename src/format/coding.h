// Little-endian loads and stores and hex digits for the format's code.
// Internal to src/format. Loads go through memcpy: shard bytes are not
// aligned (records are packed), and an unaligned pointer cast is UB.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace stoker::format::internal {

template <typename T>
inline T LoadLE(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  if constexpr (std::endian::native == std::endian::big) {
    if constexpr (sizeof(T) == 8) v = static_cast<T>(__builtin_bswap64(static_cast<uint64_t>(v)));
    if constexpr (sizeof(T) == 4) v = static_cast<T>(__builtin_bswap32(static_cast<uint32_t>(v)));
    if constexpr (sizeof(T) == 2) v = static_cast<T>(__builtin_bswap16(static_cast<uint16_t>(v)));
  }
  return v;
}

template <typename T>
inline void StoreLE(std::byte* p, T v) {
  if constexpr (std::endian::native == std::endian::big) {
    if constexpr (sizeof(T) == 8) v = static_cast<T>(__builtin_bswap64(static_cast<uint64_t>(v)));
    if constexpr (sizeof(T) == 4) v = static_cast<T>(__builtin_bswap32(static_cast<uint32_t>(v)));
    if constexpr (sizeof(T) == 2) v = static_cast<T>(__builtin_bswap16(static_cast<uint16_t>(v)));
  }
  std::memcpy(p, &v, sizeof(T));
}

// "hex16" of docs/format.md: 16 lowercase digits, most significant first.
std::string Hex16(uint64_t v);
// Lowercase hex of `n` bytes, in order.
std::string HexBytes(const uint8_t* p, size_t n);

}  // namespace stoker::format::internal
