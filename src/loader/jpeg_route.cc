// JPEG headers read on the host, the backend each image goes to, and the
// GPU's crop windows (loader/jpeg_route.h).
//
// The marker walk follows ITU-T T.81 (B.1.1.2 markers, B.2.2 the frame
// header) and the colour-space inference libjpeg applies after it
// (jdapimin.c's default_decompress_parms): a JFIF marker means YCbCr, an
// Adobe APP14 marker's transform flag says RGB/YCbCr or CMYK/YCCK, and
// otherwise the component ids do.
#include "loader/jpeg_route.h"

#include <algorithm>
#include <cmath>

#include "loader/augment.h"

namespace stoker {
namespace {

// A header claiming more pixels than this is corrupt, as the CPU path says.
constexpr uint64_t kMaxPixels = 1ull << 28;

uint32_t Be16(const uint8_t* p) { return uint32_t(p[0]) << 8 | p[1]; }

bool IsSof(uint8_t m) {
  // C0..CF except DHT (C4), JPG (C8) and DAC (CC).
  return m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc;
}

JpegColor InferColor(const JpegHeader& h, const uint8_t ids[4]) {
  switch (h.components) {
    case 1:
      return JpegColor::kGrey;
    case 3:
      if (h.jfif) return JpegColor::kYCbCr;
      if (h.adobe) return h.adobe_transform == 0 ? JpegColor::kRgb : JpegColor::kYCbCr;
      if (ids[0] == 'R' && ids[1] == 'G' && ids[2] == 'B') return JpegColor::kRgb;
      return JpegColor::kYCbCr;
    case 4:
      if (h.adobe && h.adobe_transform == 2) return JpegColor::kYcck;
      return JpegColor::kCmyk;
    default:
      return JpegColor::kOther;
  }
}

JpegSubsampling InferSubsampling(const JpegHeader& h) {
  if (h.components == 1) return JpegSubsampling::kGrey;
  if (h.components != 3) return JpegSubsampling::kOther;
  if (h.h[1] != 1 || h.v[1] != 1 || h.h[2] != 1 || h.v[2] != 1) return JpegSubsampling::kOther;
  const int key = h.h[0] * 10 + h.v[0];
  switch (key) {
    case 11:
      return JpegSubsampling::k444;
    case 21:
      return JpegSubsampling::k422;
    case 22:
      return JpegSubsampling::k420;
    case 12:
      return JpegSubsampling::k440;
    case 41:
      return JpegSubsampling::k411;
    case 42:
      return JpegSubsampling::k410;
    default:
      return JpegSubsampling::kOther;
  }
}

}  // namespace

Result<JpegHeader> ParseJpegHeader(std::span<const std::byte> jpeg) {
  const auto* p = reinterpret_cast<const uint8_t*>(jpeg.data());
  const size_t n = jpeg.size();
  if (n < 2 || p[0] != 0xff || p[1] != 0xd8) return Corruption("not a JPEG: no SOI marker");
  JpegHeader h;
  size_t at = 2;
  while (true) {
    // A marker: 0xFF, any number of 0xFF fill bytes, the code.
    if (at >= n) return Corruption("JPEG header ends early (no frame header)");
    if (p[at] != 0xff) {
      return Corruption("JPEG header: byte " + std::to_string(at) + " is not a marker");
    }
    while (at < n && p[at] == 0xff) ++at;
    if (at >= n) return Corruption("JPEG header ends early (no frame header)");
    const uint8_t m = p[at++];
    if (m == 0x01 || (m >= 0xd0 && m <= 0xd7)) continue;  // TEM, RSTn: no length
    if (m == 0xd8) return Corruption("JPEG header: a second SOI marker");
    if (m == 0xd9) return Corruption("JPEG header: EOI before the frame header");
    if (m == 0xda) return Corruption("JPEG header: a scan before the frame header");
    if (at + 2 > n) return Corruption("JPEG header ends early (in a marker's length)");
    const uint32_t len = Be16(p + at);
    if (len < 2) return Corruption("JPEG header: marker length " + std::to_string(len));
    if (at + len > n) return Corruption("JPEG header ends early (in a marker segment)");
    const uint8_t* seg = p + at + 2;
    const uint32_t seg_len = len - 2;
    if (m == 0xe0 && seg_len >= 5 && std::equal(seg, seg + 5, "JFIF")) h.jfif = true;
    if (m == 0xee && seg_len >= 12 && std::equal(seg, seg + 5, "Adobe")) {
      h.adobe = true;
      h.adobe_transform = seg[11];
    }
    if (IsSof(m)) {
      if (seg_len < 6) return Corruption("JPEG frame header too short");
      h.sof = uint8_t(m - 0xc0);
      h.precision = seg[0];
      h.height = Be16(seg + 1);
      h.width = Be16(seg + 3);
      h.components = seg[5];
      if (seg_len < 6 + 3u * h.components) return Corruption("JPEG frame header too short");
      if (h.width == 0 || h.height == 0 || uint64_t(h.width) * h.height > kMaxPixels) {
        return Corruption("JPEG claims an impossible size " + std::to_string(h.width) + "x" +
                          std::to_string(h.height));
      }
      if (h.components == 0) return Corruption("JPEG frame header: no components");
      uint8_t ids[4] = {};
      for (uint32_t c = 0; c < h.components && c < 4; ++c) {
        ids[c] = seg[6 + 3 * c];
        h.h[c] = seg[7 + 3 * c] >> 4;
        h.v[c] = seg[7 + 3 * c] & 15;
        if (h.h[c] < 1 || h.h[c] > 4 || h.v[c] < 1 || h.v[c] > 4) {
          return Corruption("JPEG frame header: component " + std::to_string(c) +
                            " has sampling factors " + std::to_string(h.h[c]) + "x" +
                            std::to_string(h.v[c]) + " (each must be 1 to 4)");
        }
      }
      const uint8_t k = h.sof;
      h.progressive = k == 2 || k == 6 || k == 10 || k == 14;
      h.lossless = k == 3 || k == 7 || k == 11 || k == 15;
      h.arithmetic = k >= 9;
      h.hierarchical = (k >= 5 && k <= 7) || k >= 13;
      h.color = InferColor(h, ids);
      h.subsampling = InferSubsampling(h);
      return h;
    }
    at += len;
  }
}

const char* JpegColorName(JpegColor c) {
  switch (c) {
    case JpegColor::kGrey:
      return "grey";
    case JpegColor::kYCbCr:
      return "YCbCr";
    case JpegColor::kRgb:
      return "RGB";
    case JpegColor::kCmyk:
      return "CMYK";
    case JpegColor::kYcck:
      return "YCCK";
    case JpegColor::kOther:
      break;
  }
  return "other";
}

const char* JpegSubsamplingName(JpegSubsampling s) {
  switch (s) {
    case JpegSubsampling::k444:
      return "4:4:4";
    case JpegSubsampling::k422:
      return "4:2:2";
    case JpegSubsampling::k420:
      return "4:2:0";
    case JpegSubsampling::k440:
      return "4:4:0";
    case JpegSubsampling::k411:
      return "4:1:1";
    case JpegSubsampling::k410:
      return "4:1:0";
    case JpegSubsampling::kGrey:
      return "grey";
    case JpegSubsampling::kOther:
      break;
  }
  return "other";
}

const char* DecodeBackendName(DecodeBackend b) {
  switch (b) {
    case DecodeBackend::kHardware:
      return "hardware";
    case DecodeBackend::kCuda:
      return "cuda";
    case DecodeBackend::kCpu:
      return "cpu";
  }
  return "?";
}

DecodeBackend RouteJpeg(const JpegHeader& h, const GpuDecodeCaps& caps) {
  if (!caps.nvjpeg) return DecodeBackend::kCpu;
  // nvJPEG decodes 8-bit Huffman-coded grey and YCbCr; RGB-coded (Adobe
  // transform 0) and four-component images go to libjpeg-turbo, which
  // converts them as PIL does.
  const bool colour = (h.components == 1 && h.color == JpegColor::kGrey) ||
                      (h.components == 3 && h.color == JpegColor::kYCbCr);
  if (!colour || h.precision != 8 || h.arithmetic || h.lossless || h.hierarchical) {
    return DecodeBackend::kCpu;
  }
  const bool engine_subsampling =
      h.subsampling == JpegSubsampling::k444 || h.subsampling == JpegSubsampling::k422 ||
      h.subsampling == JpegSubsampling::k420 || h.subsampling == JpegSubsampling::k440 ||
      h.subsampling == JpegSubsampling::kGrey;
  if (caps.hardware && h.sof == 0 && engine_subsampling) return DecodeBackend::kHardware;
  return DecodeBackend::kCuda;
}

namespace {

// One axis: the box [origin, origin + extent) of a source axis clamped to
// [lo, hi], resampled to n outputs.
void PlanAxis(double origin, double extent, uint32_t n, int64_t lo, int64_t hi, gpu::AxisMap* m,
              uint32_t* window_start, uint32_t* window_length) {
  const double scale = extent / double(n);
  m->scale = float(scale);
  // kCenter's box starts at the crop's first row/column of the resized
  // image (an integer there); a crop box starts at its clamp (0).
  m->offset = float(std::nearbyint((origin - double(lo)) / scale * 1e4) / 1e4);
  m->size = int32_t(hi - lo + 1);
  m->shift = 0;
  int32_t first = 0, length = 0;
  gpu::AxisWindow(*m, int32_t(n), &first, &length);
  m->shift = first;
  *window_start = uint32_t(lo + first);
  *window_length = uint32_t(std::max(length, 1));
}

}  // namespace

GpuCropPlan PlanGpuCrop(const DecodeOptions& o, uint32_t image_h, uint32_t image_w,
                        const SampleKey& key) {
  GpuCropPlan p;
  p.image_h = image_h;
  p.image_w = image_w;
  const CropBox b = DrawCrop(o, image_h, image_w, key, &p.flip);
  PlanAxis(b.top, b.height, o.height, b.clamp_top, b.clamp_bottom, &p.y, &p.roi_y, &p.roi_h);
  PlanAxis(b.left, b.width, o.width, b.clamp_left, b.clamp_right, &p.x, &p.roi_x, &p.roi_w);
  return p;
}

}  // namespace stoker
