// float32 -> float16 (IEEE binary16) with round-to-nearest-even (internal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STOKER_FP16_X86 1
#endif

namespace stoker {

// Portable conversion, exact for every input: round-to-nearest-even, values
// from 65520 up to infinity, NaN to a quiet NaN, subnormal halves kept
// (F. Giesen's float_to_half_fast3_rtne).
inline uint16_t FloatToHalf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t h;
  if (u >= (127u + 16u) << 23) {  // 2^16 and up, infinity, NaN
    h = u > 0x7f800000u ? 0x7e00 : 0x7c00;
  } else if (u < 113u << 23) {  // below 2^-14: a subnormal half or zero
    // Adding 0.5 lines the half's last mantissa bit up with the float's, so
    // the float addition does the rounding.
    float v;
    std::memcpy(&v, &u, 4);
    v += 0.5f;
    uint32_t w;
    std::memcpy(&w, &v, 4);
    h = uint16_t(w - 0x3f000000u);
  } else {
    const uint32_t odd = (u >> 13) & 1;  // ties go to the even mantissa
    u += (uint32_t(15 - 127) << 23) + 0xfff + odd;
    h = uint16_t(u >> 13);
  }
  return uint16_t(h | (sign >> 16));
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float.
    float v = float(mant) * (1.0f / 16777216.0f);
    std::memcpy(&u, &v, 4);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#ifdef STOKER_FP16_X86
// The same with the F16C instruction (8 at a time), for CPUs that have it.
__attribute__((target("avx,f16c"))) inline void FloatsToHalvesF16C(const float* in, uint16_t* out,
                                                                   size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}
#endif

inline bool HaveF16C() {
#ifdef STOKER_FP16_X86
  static const bool have = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return have;
#else
  return false;
#endif
}

// Converts n floats, with F16C where the CPU has it (the results are the
// same bit for bit; NaN payloads aside).
inline void FloatsToHalves(const float* in, uint16_t* out, size_t n) {
#ifdef STOKER_FP16_X86
  if (HaveF16C()) {
    FloatsToHalvesF16C(in, out, n);
    return;
  }
#endif
  for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

}  // namespace stoker
