// The arithmetic of the GPU decode's fused kernel (internal), written once
// for the device (src/gpu/decode_kernels.cu) and the host (the reference in
// src/gpu/decode_reference.cc, which the GPU tests compare the kernel with).
//
// Resampling is torchvision's Resize(antialias=True) on the crop box, as
// PyTorch's _upsample_bilinear2d_aa computes it: output pixel i of an axis
// is centred at c = (i + offset + 0.5) * scale in the box's coordinates, the
// triangle filter is widened to `support` = max(scale, 1) source pixels on
// each side when downscaling (antialias; for upscaling it is plain bilinear
// with half-pixel centres), taps j in [max(floor(c - support + 0.5), 0),
// min(floor(c + support + 0.5), size)) weighted by the filter at
// (j - c + 0.5) / max(scale, 1), normalised to sum to one. `offset` is the
// centre crop's start in the resized image (kCenter resizes, then cuts), 0
// for a crop box. The result is rounded to uint8 (as PIL and the CPU path
// produce uint8 pixels), then flipped, normalised ((x / 255 - mean) / std in
// float32, as ToTensor + Normalize) and cast.
//
// Everything here is a pure function of its arguments: thread-safe.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define STOKER_HD __host__ __device__ __forceinline__
#else
#define STOKER_HD inline
#endif

namespace stoker::gpu {

// One axis of one image's resampling.
struct AxisMap {
  float scale = 1;     // source pixels per output pixel (box extent / output size)
  float offset = 0;    // output index shift (kCenter's crop start in the resized image)
  int32_t size = 0;    // source pixels the taps may use: the box's (or the image's for kCenter)
  int32_t shift = 0;   // index in the decoded window = box index - shift (the window's start)
};

// The taps of output index i: [*first, *end) in box coordinates, and the
// filter's centre and inverse width, for TapWeight.
STOKER_HD void AxisTaps(const AxisMap& m, int32_t i, int32_t* first, int32_t* end, float* centre,
                        float* inv_width) {
  const float c = (float(i) + m.offset + 0.5f) * m.scale;
  const float support = m.scale >= 1.0f ? m.scale : 1.0f;
  // PyTorch truncates toward zero; below zero the clamp to 0 decides.
  const float a = c - support + 0.5f, b = c + support + 0.5f;
  int32_t lo = a <= 0.0f ? 0 : int32_t(a);
  int32_t hi = int32_t(b);
  if (hi > m.size) hi = m.size;
  if (lo > hi - 1) lo = hi - 1;  // at least one tap (a centre at the far edge)
  *first = lo;
  *end = hi;
  *centre = c;
  *inv_width = m.scale >= 1.0f ? 1.0f / m.scale : 1.0f;
}

// The (unnormalised) triangle filter's weight of tap j.
STOKER_HD float TapWeight(int32_t j, float centre, float inv_width) {
  float x = (float(j) - centre + 0.5f) * inv_width;
  if (x < 0) x = -x;
  return x < 1.0f ? 1.0f - x : 0.0f;
}

// The decoded window's first source index on an axis (AxisMap::shift) and
// its length: the span of every tap of outputs 0 .. n - 1.
STOKER_HD void AxisWindow(const AxisMap& m, int32_t n, int32_t* first, int32_t* length) {
  int32_t a0, a1, b0, b1;
  float c, w;
  AxisTaps(m, 0, &a0, &a1, &c, &w);
  AxisTaps(m, n - 1, &b0, &b1, &c, &w);
  *first = a0;
  *length = b1 - a0;
}

// Rounds a resampled value to a pixel, as PIL and PyTorch's uint8 paths.
STOKER_HD uint8_t ToPixel(float v) {
  v += 0.5f;
  if (v <= 0.0f) return 0;
  if (v >= 255.0f) return 255;
  return uint8_t(v);
}

// Output element types, as stoker::ImageDType numbers them (kBFloat16 is the
// kernel's own: the CPU path has none).
enum class OutType : uint8_t { kUInt8 = 0, kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3 };

// float32 -> bfloat16 bits, round to nearest even, NaN kept quiet.
STOKER_HD uint16_t FloatBitsToBFloat16(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Everything the kernel needs of one image, in one plain struct that is
// copied to the device as it is.
struct ImageJob {
  const uint8_t* src = nullptr;  // decoded window, interleaved RGB (device memory in the kernel)
  uint64_t pitch = 0;            // bytes per row of src
  int32_t src_h = 0, src_w = 0;  // the window's rows and columns
  AxisMap y, x;
  uint8_t flip = 0;
  uint64_t out_offset = 0;  // bytes from the batch column's start
};

// Batch-wide output parameters.
struct OutputSpec {
  int32_t height = 0, width = 0;
  OutType type = OutType::kUInt8;
  uint8_t nchw = 0;
  uint8_t normalize = 0;
  float mean[3] = {0, 0, 0};  // with normalize: (x / 255 - mean) / std
  float std[3] = {1, 1, 1};
};

// The resampled RGB pixel at output (oy, ox) before the flip, as uint8.
STOKER_HD void ResamplePixel(const ImageJob& job, int32_t oy, int32_t ox, uint8_t rgb[3]) {
  int32_t y0, y1, x0, x1;
  float cy, wy, cx, wx;
  AxisTaps(job.y, oy, &y0, &y1, &cy, &wy);
  AxisTaps(job.x, ox, &x0, &x1, &cx, &wx);
  float acc[3] = {0, 0, 0};
  float ysum = 0;
  for (int32_t j = y0; j < y1; ++j) {
    const float wyj = TapWeight(j, cy, wy);
    if (wyj == 0.0f) continue;
    const uint8_t* row = job.src + uint64_t(j - job.y.shift) * job.pitch;
    float racc[3] = {0, 0, 0};
    float xsum = 0;
    for (int32_t k = x0; k < x1; ++k) {
      const float wxk = TapWeight(k, cx, wx);
      const uint8_t* p = row + uint64_t(k - job.x.shift) * 3;
      racc[0] += wxk * float(p[0]);
      racc[1] += wxk * float(p[1]);
      racc[2] += wxk * float(p[2]);
      xsum += wxk;
    }
    const float f = xsum > 0 ? wyj / xsum : 0.0f;
    acc[0] += f * racc[0];
    acc[1] += f * racc[1];
    acc[2] += f * racc[2];
    ysum += wyj;
  }
  const float inv = ysum > 0 ? 1.0f / ysum : 0.0f;
  for (int c = 0; c < 3; ++c) rgb[c] = ToPixel(acc[c] * inv);
}

// Where channel c of output pixel (oy, ox) goes, in elements from the
// image's first element.
STOKER_HD uint64_t OutIndex(const OutputSpec& o, int32_t oy, int32_t ox, int c) {
  return o.nchw ? (uint64_t(c) * o.height + oy) * o.width + ox
                : (uint64_t(oy) * o.width + ox) * 3 + c;
}

// The float value channel c of pixel value v becomes (before a float16 or
// bfloat16 cast).
STOKER_HD float OutValue(const OutputSpec& o, int c, uint8_t v) {
  // (v / 255 - mean) / std, as torchvision: the division first.
  const float x = float(v) / 255.0f;
  return o.normalize ? (x - o.mean[c]) / o.std[c] : x;
}

}  // namespace stoker::gpu
