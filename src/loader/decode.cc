// JPEG decode (libturbojpeg) and bilinear resize, run by the collate workers.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "loader/resize.h"
#include "stoker/loader.h"

#ifdef STOKER_HAVE_TURBOJPEG
#include <turbojpeg.h>
#endif

namespace stoker {

void ResizeBilinear(const uint8_t* src, uint32_t sh, uint32_t sw, uint8_t* dst, uint32_t dh,
                    uint32_t dw) {
  if (sh == dh && sw == dw) {
    std::memcpy(dst, src, size_t(sh) * sw * 3);
    return;
  }
  if (sh < 2 || sw < 2) {
    // One source row or column: doubled, so that both taps of every output
    // pixel exist; equal pixels blend to themselves.
    const uint32_t h2 = std::max(sh, 2u), w2 = std::max(sw, 2u);
    std::vector<uint8_t> wide(size_t(h2) * w2 * 3);
    for (uint32_t y = 0; y < h2; ++y) {
      for (uint32_t x = 0; x < w2; ++x) {
        const uint8_t* p = src + (size_t(std::min(y, sh - 1)) * sw + std::min(x, sw - 1)) * 3;
        std::memcpy(wide.data() + (size_t(y) * w2 + x) * 3, p, 3);
      }
    }
    ResizeBilinear(wide.data(), h2, w2, dst, dh, dw);
    return;
  }
  // Where output coordinate i samples, as (first source index, weight of
  // the next one in 1/256). Past the last source index: the one before it
  // with weight 256 on the last, so that both taps always exist.
  auto taps = [](uint32_t i, float scale, uint32_t n, uint32_t* first, uint32_t* w) {
    float f = (float(i) + 0.5f) * scale - 0.5f;
    if (f < 0) f = 0;
    const uint32_t i0 = std::min<uint32_t>(uint32_t(f), n - 1);
    if (i0 + 1 < n) {
      *first = i0;
      *w = uint32_t((f - float(i0)) * 256.0f + 0.5f);
    } else {
      *first = n - 2;
      *w = 256;
    }
  };
  const float sy = float(sh) / float(dh), sx = float(sw) / float(dw);
  const size_t row = size_t(dw) * 3;
  thread_local std::vector<uint32_t> xs, wxs;
  thread_local std::vector<uint16_t> rows;  // two horizontally resampled rows
  xs.resize(dw);
  wxs.resize(dw);
  rows.resize(2 * row);
  for (uint32_t x = 0; x < dw; ++x) {
    uint32_t x0, w;
    taps(x, sx, sw, &x0, &w);
    xs[x] = x0 * 3;
    wxs[x] = w;
  }
  auto resample = [&](uint32_t y, uint16_t* out) {
    const uint8_t* r = src + size_t(y) * sw * 3;
    for (uint32_t x = 0; x < dw; ++x) {
      const uint8_t* p = r + xs[x];
      const uint32_t w1 = wxs[x], w0 = 256 - w1;
      out[3 * x] = uint16_t(p[0] * w0 + p[3] * w1);
      out[3 * x + 1] = uint16_t(p[1] * w0 + p[4] * w1);
      out[3 * x + 2] = uint16_t(p[2] * w0 + p[5] * w1);
    }
  };
  // The source rows held in rows[0..row) and rows[row..2 row).
  int64_t held[2] = {-1, -1};
  auto get = [&](uint32_t y) -> const uint16_t* {
    for (int k = 0; k < 2; ++k) {
      if (held[k] == int64_t(y)) return rows.data() + k * row;
    }
    // Replace the row that is not the other one asked for: rows are asked
    // for in increasing order, so the older (smaller) one goes.
    const int k = held[0] < held[1] ? 0 : 1;
    resample(y, rows.data() + k * row);
    held[k] = y;
    return rows.data() + k * row;
  };
  for (uint32_t y = 0; y < dh; ++y) {
    uint32_t y0, wy;
    taps(y, sy, sh, &y0, &wy);
    uint8_t* out = dst + size_t(y) * row;
    const uint16_t* a = get(y0);
    const uint16_t* b = get(y0 + 1);  // replaces the older row, never y0's
    const uint32_t w1 = wy, w0 = 256 - wy;
    for (size_t i = 0; i < row; ++i) {
      out[i] = uint8_t((uint32_t(a[i]) * w0 + uint32_t(b[i]) * w1 + 32768u) >> 16);
    }
  }
}

namespace {

// Refuse images whose header claims more pixels than any real training
// image has (a corrupt header must not become a multi-GiB allocation).
constexpr uint64_t kMaxPixels = 1ull << 28;

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

// ---- DecodeSample (stoker/decode.h) ----------------------------------------
namespace stoker {

size_t ImageDTypeSize(ImageDType t) {
  switch (t) {
    case ImageDType::kUInt8:
      return 1;
    case ImageDType::kFloat32:
      return 4;
    case ImageDType::kFloat16:
      return 2;
  }
  return 1;
}

size_t DecodedSampleBytes(const DecodeOptions& o) {
  return size_t(o.height) * o.width * 3 * ImageDTypeSize(o.dtype);
}

Status ValidateDecodeOptions(const DecodeOptions& o) {
  if (o.field.empty()) return Status::Ok();
  if (o.height == 0 || o.width == 0 || o.height > kMaxDecodeSide || o.width > kMaxDecodeSide) {
    const std::string side = std::to_string(kMaxDecodeSide);
    return InvalidArgument("decode size must be between 1x1 and " + side + "x" + side);
  }
  return Status::Ok();
}

struct DecodeScratch::Impl {
  std::vector<uint8_t> pixels;
};
DecodeScratch::DecodeScratch() : impl_(std::make_unique<Impl>()) {}
DecodeScratch::~DecodeScratch() = default;

Status DecodeSample(const DecodeOptions& o, std::span<const std::byte> jpeg, const SampleKey& key,
                    std::span<std::byte> out, DecodeScratch* scratch) {
  if (o.crop != CropMode::kResize || o.flip != 0.0f || o.normalize ||
      o.dtype != ImageDType::kUInt8 || o.layout != ImageLayout::kNHWC) {
    return Unsupported("decode: crops, flips, normalization, float output and NCHW are not built");
  }
  return DecodeJpegResized(jpeg, o.height, o.width,
                           {reinterpret_cast<uint8_t*>(out.data()), out.size()},
                           &scratch->impl()->pixels);
}

}  // namespace stoker
