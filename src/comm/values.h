// The benchmark's data: 16-bit float conversions and the inputs and
// expected outputs of each operation, all small integers so that every
// element has one exact value in every dtype (comm.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "stoker/comm.h"

namespace stoker::comm {

inline float Bf16ToFloat(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

inline float F16ToFloat(uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, 2);
  return static_cast<float>(x);
}

inline uint16_t FloatToF16(float f) {
  const _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &x, 2);
  return h;
}

// Inputs are 1..Range(): sums over `ranks` ranks stay exact integers (bfloat16
// holds every integer up to 256, float16 up to 2048).
inline int ValueRange(CommDtype dtype, int ranks) {
  int limit = 8;
  if (dtype == CommDtype::kBFloat16) limit = 256 / ranks;
  if (dtype == CommDtype::kFloat16) limit = 2048 / ranks;
  return limit < 1 ? 1 : (limit > 8 ? 8 : limit);
}

// Rank `rank`'s input element `i`.
inline int InputValue(int rank, uint64_t i, int range) {
  return 1 + static_cast<int>((uint64_t(rank) * 5 + i * 3 + i / 7) % uint64_t(range));
}

// Writes value `v` as element `i` of a `dtype` buffer, and reads it back.
inline void Store(CommDtype dtype, void* buf, uint64_t i, double v) {
  switch (dtype) {
    case CommDtype::kFloat32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case CommDtype::kInt32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case CommDtype::kBFloat16:
      static_cast<uint16_t*>(buf)[i] = FloatToBf16(static_cast<float>(v));
      break;
    case CommDtype::kFloat16:
      static_cast<uint16_t*>(buf)[i] = FloatToF16(static_cast<float>(v));
      break;
  }
}

inline double Load(CommDtype dtype, const void* buf, uint64_t i) {
  switch (dtype) {
    case CommDtype::kFloat32:
      return static_cast<const float*>(buf)[i];
    case CommDtype::kInt32:
      return static_cast<const int32_t*>(buf)[i];
    case CommDtype::kBFloat16:
      return Bf16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case CommDtype::kFloat16:
      return F16ToFloat(static_cast<const uint16_t*>(buf)[i]);
  }
  return 0;
}

}  // namespace stoker::comm
