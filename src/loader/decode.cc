// JPEG decode (libturbojpeg) and bilinear resize, run by the collate workers.
#include <cstring>
#include <string>

#include "stoker/loader.h"

#ifdef STOKER_HAVE_TURBOJPEG
#include <turbojpeg.h>
#endif

namespace stoker {
namespace {

// Refuse images whose header claims more pixels than any real training
// image has (a corrupt header must not become a multi-GiB allocation).
constexpr uint64_t kMaxPixels = 1ull << 28;

// Bilinear resize with half-pixel centres (align_corners=False), the
// convention of torchvision and PIL for upscaling.
void ResizeBilinear(const uint8_t* src, uint32_t sh, uint32_t sw, uint8_t* dst, uint32_t dh,
                    uint32_t dw) {
  if (sh == dh && sw == dw) {
    std::memcpy(dst, src, size_t(sh) * sw * 3);
    return;
  }
  const float sy = float(sh) / float(dh), sx = float(sw) / float(dw);
  thread_local std::vector<uint32_t> x0s, x1s;
  thread_local std::vector<float> fxs;
  x0s.resize(dw);
  x1s.resize(dw);
  fxs.resize(dw);
  for (uint32_t x = 0; x < dw; ++x) {
    float fx = (float(x) + 0.5f) * sx - 0.5f;
    if (fx < 0) fx = 0;
    uint32_t x0 = std::min<uint32_t>(uint32_t(fx), sw - 1);
    x0s[x] = x0 * 3;
    x1s[x] = std::min<uint32_t>(x0 + 1, sw - 1) * 3;
    fxs[x] = fx - float(x0);
  }
  for (uint32_t y = 0; y < dh; ++y) {
    float fy = (float(y) + 0.5f) * sy - 0.5f;
    if (fy < 0) fy = 0;
    uint32_t y0 = std::min<uint32_t>(uint32_t(fy), sh - 1);
    uint32_t y1 = std::min<uint32_t>(y0 + 1, sh - 1);
    float wy = fy - float(y0);
    const uint8_t* r0 = src + size_t(y0) * sw * 3;
    const uint8_t* r1 = src + size_t(y1) * sw * 3;
    uint8_t* out = dst + size_t(y) * dw * 3;
    for (uint32_t x = 0; x < dw; ++x) {
      const float wx = fxs[x];
      for (int ch = 0; ch < 3; ++ch) {
        float top = r0[x0s[x] + ch] + (r0[x1s[x] + ch] - r0[x0s[x] + ch]) * wx;
        float bot = r1[x0s[x] + ch] + (r1[x1s[x] + ch] - r1[x0s[x] + ch]) * wx;
        out[x * 3 + ch] = uint8_t(top + (bot - top) * wy + 0.5f);
      }
    }
  }
}

#ifdef STOKER_HAVE_TURBOJPEG
struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h) tjDestroy(h);
  }
};
#endif

}  // namespace

Status DecodeJpegResized(std::span<const std::byte> jpeg, uint32_t out_h, uint32_t out_w,
                         std::span<uint8_t> out, std::vector<uint8_t>* scratch) {
#ifndef STOKER_HAVE_TURBOJPEG
  return Unsupported("JPEG decode: stoker was built without libturbojpeg");
#else
  if (out.size() < size_t(out_h) * out_w * 3)
    return InvalidArgument("JPEG decode: output too small");
  thread_local TjHandle tj;
  if (tj.h == nullptr) return Internal("tjInitDecompress failed");
  if (jpeg.empty()) return Corruption("JPEG decode: empty data");
  auto* src = reinterpret_cast<const unsigned char*>(jpeg.data());
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(tj.h, src, jpeg.size(), &w, &h, &subsamp, &colorspace) != 0) {
    return Corruption(std::string("not a JPEG: ") + tjGetErrorStr2(tj.h));
  }
  if (w <= 0 || h <= 0 || uint64_t(w) * uint64_t(h) > kMaxPixels) {
    return Corruption("JPEG claims an impossible size " + std::to_string(w) + "x" +
                      std::to_string(h));
  }
  // Let the decoder do most of the downscaling (DCT scaling is nearly free):
  // the smallest scale whose output still covers the target.
  int n_factors = 0;
  tjscalingfactor* factors = tjGetScalingFactors(&n_factors);
  int sw = w, sh = h;
  for (int i = 0; i < n_factors; ++i) {
    int cw = TJSCALED(w, factors[i]), ch = TJSCALED(h, factors[i]);
    if (cw >= int(out_w) && ch >= int(out_h) && uint64_t(cw) * ch < uint64_t(sw) * sh) {
      sw = cw;
      sh = ch;
    }
  }
  scratch->resize(size_t(sw) * sh * 3);
  if (tjDecompress2(tj.h, src, jpeg.size(), scratch->data(), sw, 0, sh, TJPF_RGB, TJFLAG_FASTDCT) !=
      0) {
    // Warnings (e.g. a truncated final scan) still decode an image; only a
    // fatal error is corruption.
    if (tjGetErrorCode(tj.h) == TJERR_FATAL) {
      return Corruption(std::string("JPEG decode failed: ") + tjGetErrorStr2(tj.h));
    }
  }
  ResizeBilinear(scratch->data(), uint32_t(sh), uint32_t(sw), out.data(), out_h, out_w);
  return Status::Ok();
#endif
}

}  // namespace stoker
