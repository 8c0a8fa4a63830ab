// The geometry and arithmetic of DecodeSample (internal; decode.cc runs the
// JPEG decoder around these): the crop box, bilinear taps over a window of
// the decoded pixels, and the output pass (flip, normalize, dtype, layout).
#pragma once

#include <cstdint>
#include <vector>

#include "stoker/decode.h"
#include "stoker/plan.h"

namespace stoker {

// A crop box in source pixels: rows [top, top + height), columns [left,
// left + width), fractional where the crop follows a resize (kCenter).
// Output pixels sample the box with half-pixel centres; taps are clamped to
// rows [clamp_top, clamp_bottom] and columns [clamp_left, clamp_right]
// (the box's own pixels for a crop, as torchvision resizes the cut-out
// image; the whole image for kCenter, which resizes first and cuts after).
struct CropBox {
  double top = 0, left = 0, height = 0, width = 0;
  int64_t clamp_top = 0, clamp_bottom = 0, clamp_left = 0, clamp_right = 0;
};

// torchvision's RandomResizedCrop.get_params(img, scale, ratio) for an
// image_h x image_w image, with its random numbers from `rng`: 10 tries of area ~ U(scale) * area
// and log-aspect ~ U(log ratio), w = round(sqrt(area * aspect)), h = round(sqrt(area / aspect))
// (round half to even, as Python's round), kept when 0 < w <= W and 0 < h <= H, placed at i ~
// U{0..H-h}, j ~ U{0..W-w}; otherwise the central crop clamped to the ratio range. Returns (i, j,
// h, w) as a CropBox.
CropBox RandomResizedCropBox(uint32_t image_h, uint32_t image_w, const DecodeOptions& o, Rng& rng);

// Uniform in [0, 1) with 53 random bits.
double Uniform01(Rng& rng);

// The box of kCenter (Resize(resize_shorter) then CenterCrop(h, w)) and of
// kResize (the whole image), in source pixels.
uint32_t ResizeShorter(const DecodeOptions& o);  // kCenter's, its default applied
CropBox CenterCropBox(uint32_t image_h, uint32_t image_w, const DecodeOptions& o);
CropBox WholeImageBox(uint32_t image_h, uint32_t image_w);

// The generator seed of a sample's augmentation draws: the crop's first,
// then the flip's (Uniform01 < flip), whatever the crop mode.
uint64_t AugmentSeed(const SampleKey& key);

// The box and flip of a sample (what SampleCropFor reports).
CropBox DrawCrop(const DecodeOptions& o, uint32_t image_h, uint32_t image_w, const SampleKey& key,
                 bool* flip);

// Bilinear taps of one axis: output i blends source indices first[i] and
// second[i] (second = first + 1, or first at a clamped edge) with weight
// weight[i] / 256 on the second.
struct Taps {
  std::vector<int32_t> first, second;
  std::vector<uint16_t> weight;
  int32_t lowest() const;   // smallest index used
  int32_t highest() const;  // largest index used
};
// `n` outputs over [origin, origin + extent) of an axis whose indices are
// clamped to [lo, hi]; everything scaled by `scale` first (the decoder's DCT
// scaling: source pixel k of the scaled image covers [k/scale, (k+1)/scale)
// of the original).
void ComputeTaps(double origin, double extent, uint32_t n, int64_t lo, int64_t hi, double scale,
                 Taps* t);

// Resamples into dst (ty.size() x tx.size() x 3, packed RGB) from the
// packed RGB rows of `src` (row r of it holds source row row0 + r, column
// c holds source column col0 + c; `stride` bytes per row). Fixed point: one
// horizontal pass per source row used (16-bit), then two rows blended per
// output row; within one grey level of the filter in floating point.
void ResizeWithTaps(const uint8_t* src, size_t stride, int32_t row0, int32_t col0, const Taps& ty,
                    const Taps& tx, uint8_t* dst);

// The output pass over a resized h x w x 3 uint8 image: horizontal flip,
// per-channel lookup (identity for uint8; (x / 255 - mean) / std for float,
// computed as torchvision's ToTensor + Normalize do in float32, then
// rounded to float16 where asked), HWC or CHW.
struct OutputTable {
  bool Matches(const DecodeOptions& o) const;
  void Build(const DecodeOptions& o);

  bool built = false;
  ImageDType dtype = ImageDType::kUInt8;
  bool normalize = false;
  float mean[3] = {}, std[3] = {};
  uint8_t u8[3][256];
  float f32[3][256];
  uint16_t f16[3][256];
  uint16_t bf16[3][256];
};
void WriteOutput(const uint8_t* rgb, uint32_t h, uint32_t w, bool flip, ImageLayout layout,
                 const OutputTable& table, void* out);

}  // namespace stoker
