#include "loader/augment.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu/resize_math.h"
#include "loader/fp16.h"

namespace stoker {
namespace {

// Stream label of the augmentation draws, apart from the plan's streams.
constexpr uint64_t kAugmentStream = 0x4155474d454e54ull;  // "AUGMENT"

// Python's round(): half to even (the default floating-point rounding mode).
int64_t RoundHalfEven(double x) { return int64_t(std::nearbyint(x)); }

}  // namespace

uint64_t AugmentSeed(const SampleKey& key) {
  return MixSeed({key.seed, key.epoch, key.sample_id, kAugmentStream});
}

double Uniform01(Rng& rng) { return double(rng.Next() >> 11) * 0x1p-53; }

CropBox WholeImageBox(uint32_t image_h, uint32_t image_w) {
  CropBox b;
  b.height = image_h;
  b.width = image_w;
  b.clamp_bottom = int64_t(image_h) - 1;
  b.clamp_right = int64_t(image_w) - 1;
  return b;
}

CropBox RandomResizedCropBox(uint32_t image_h, uint32_t image_w, const DecodeOptions& o, Rng& rng) {
  const int64_t H = image_h, W = image_w;
  const double area = double(H) * double(W);
  const double log_r0 = std::log(double(o.ratio_min)), log_r1 = std::log(double(o.ratio_max));
  auto uniform = [&](double a, double b) { return a + (b - a) * Uniform01(rng); };
  int64_t i = -1, j = 0, h = 0, w = 0;
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * uniform(o.scale_min, o.scale_max);
    const double aspect = std::exp(uniform(log_r0, log_r1));
    const int64_t cw = RoundHalfEven(std::sqrt(target * aspect));
    const int64_t ch = RoundHalfEven(std::sqrt(target / aspect));
    if (cw > 0 && cw <= W && ch > 0 && ch <= H) {
      h = ch;
      w = cw;
      i = int64_t(rng.Below(uint64_t(H - h + 1)));
      j = int64_t(rng.Below(uint64_t(W - w + 1)));
      break;
    }
  }
  if (i < 0) {
    // torchvision's fallback: the central crop, its aspect clamped to the
    // ratio range.
    const double in_ratio = double(W) / double(H);
    if (in_ratio < o.ratio_min) {
      w = W;
      h = std::clamp<int64_t>(RoundHalfEven(double(w) / o.ratio_min), 1, H);
    } else if (in_ratio > o.ratio_max) {
      h = H;
      w = std::clamp<int64_t>(RoundHalfEven(double(h) * o.ratio_max), 1, W);
    } else {
      w = W;
      h = H;
    }
    i = (H - h) / 2;
    j = (W - w) / 2;
  }
  CropBox b;
  b.top = double(i);
  b.left = double(j);
  b.height = double(h);
  b.width = double(w);
  b.clamp_top = i;
  b.clamp_bottom = i + h - 1;
  b.clamp_left = j;
  b.clamp_right = j + w - 1;
  return b;
}

uint32_t ResizeShorter(const DecodeOptions& o) {
  return o.resize_shorter ? o.resize_shorter : std::max(o.height, o.width) * 256 / 224;
}

CropBox CenterCropBox(uint32_t image_h, uint32_t image_w, const DecodeOptions& o) {
  // torchvision's Resize(int): the shorter side to S, the longer to
  // int(S * long / short); then CenterCrop: top = int(round((rh - h) / 2)).
  const uint32_t s = ResizeShorter(o);
  double rh, rw;
  if (image_w <= image_h) {
    rw = s;
    rh = std::floor(double(s) * double(image_h) / double(image_w));
  } else {
    rh = s;
    rw = std::floor(double(s) * double(image_w) / double(image_h));
  }
  const double top = double(RoundHalfEven((rh - o.height) / 2.0));
  const double left = double(RoundHalfEven((rw - o.width) / 2.0));
  const double sy = double(image_h) / rh, sx = double(image_w) / rw;
  CropBox b = WholeImageBox(image_h, image_w);
  b.top = top * sy;
  b.left = left * sx;
  b.height = o.height * sy;
  b.width = o.width * sx;
  return b;
}

CropBox DrawCrop(const DecodeOptions& o, uint32_t image_h, uint32_t image_w, const SampleKey& key,
                 bool* flip) {
  Rng rng(AugmentSeed(key));
  CropBox box;
  switch (o.crop) {
    case CropMode::kResize:
      box = WholeImageBox(image_h, image_w);
      break;
    case CropMode::kCenter:
      box = CenterCropBox(image_h, image_w, o);
      break;
    case CropMode::kRandomResized:
      box = RandomResizedCropBox(image_h, image_w, o, rng);
      break;
  }
  *flip = Uniform01(rng) < double(o.flip);
  return box;
}

SampleCrop SampleCropFor(const DecodeOptions& o, uint32_t image_h, uint32_t image_w,
                         const SampleKey& key) {
  SampleCrop c;
  const CropBox b = DrawCrop(o, image_h, image_w, key, &c.flip);
  c.top = b.top;
  c.left = b.left;
  c.height = b.height;
  c.width = b.width;
  return c;
}

int32_t Taps::lowest() const {
  return first.empty() ? 0 : *std::min_element(first.begin(), first.end());
}
int32_t Taps::highest() const {
  return second.empty() ? 0 : *std::max_element(second.begin(), second.end());
}

void ComputeTaps(double origin, double extent, uint32_t n, int64_t lo, int64_t hi, double scale,
                 Taps* t) {
  // The clamp range in the scaled image: the scaled pixels that overlap
  // [lo, hi + 1) of the original.
  const double o = origin * scale, e = extent * scale;
  const int64_t lo_s = int64_t(std::floor(double(lo) * scale));
  const int64_t hi_s = std::max(lo_s, int64_t(std::ceil(double(hi + 1) * scale)) - 1);
  t->first.resize(n);
  t->second.resize(n);
  t->weight.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    const double f =
        std::clamp((double(i) + 0.5) * e / double(n) + o - 0.5, double(lo_s), double(hi_s));
    const int64_t i0 = std::min<int64_t>(int64_t(f), hi_s);
    const int64_t i1 = std::min<int64_t>(i0 + 1, hi_s);
    t->first[i] = int32_t(i0);
    t->second[i] = int32_t(i1);
    t->weight[i] = i1 == i0 ? 0 : uint16_t(std::lround((f - double(i0)) * 256.0));
  }
}

void ResizeWithTaps(const uint8_t* src, size_t stride, int32_t row0, int32_t col0, const Taps& ty,
                    const Taps& tx, uint8_t* dst) {
  const size_t dh = ty.first.size(), dw = tx.first.size();
  const size_t row = dw * 3;
  thread_local std::vector<uint32_t> x0, x1;
  thread_local std::vector<uint16_t> rows;  // two horizontally resampled rows
  x0.resize(dw);
  x1.resize(dw);
  rows.resize(2 * row);
  for (size_t x = 0; x < dw; ++x) {
    x0[x] = uint32_t(tx.first[x] - col0) * 3;
    x1[x] = uint32_t(tx.second[x] - col0) * 3;
  }
  const uint16_t* wx = tx.weight.data();
  auto resample = [&](int32_t y, uint16_t* out) {
    const uint8_t* r = src + size_t(y - row0) * stride;
    for (size_t x = 0; x < dw; ++x) {
      const uint8_t* p = r + x0[x];
      const uint8_t* q = r + x1[x];
      const uint32_t w1 = wx[x], w0 = 256 - w1;
      out[3 * x] = uint16_t(p[0] * w0 + q[0] * w1);
      out[3 * x + 1] = uint16_t(p[1] * w0 + q[1] * w1);
      out[3 * x + 2] = uint16_t(p[2] * w0 + q[2] * w1);
    }
  };
  // The source rows held in rows[0..row) and rows[row..2 row).
  int64_t held[2] = {-1, -1};
  auto get = [&](int32_t y) -> const uint16_t* {
    for (int k = 0; k < 2; ++k) {
      if (held[k] == y) return rows.data() + k * row;
    }
    // Rows are asked for in increasing order: the older (smaller) one goes,
    // never the one just asked for.
    const int k = held[0] < held[1] ? 0 : 1;
    resample(y, rows.data() + k * row);
    held[k] = y;
    return rows.data() + k * row;
  };
  for (size_t y = 0; y < dh; ++y) {
    const uint16_t* a = get(ty.first[y]);
    const uint16_t* b = get(ty.second[y]);
    const uint32_t w1 = ty.weight[y], w0 = 256 - w1;
    uint8_t* out = dst + y * row;
    for (size_t i = 0; i < row; ++i) {
      out[i] = uint8_t((uint32_t(a[i]) * w0 + uint32_t(b[i]) * w1 + 32768u) >> 16);
    }
  }
}

bool OutputTable::Matches(const DecodeOptions& o) const {
  if (!built || o.dtype != dtype || o.normalize != normalize) return false;
  if (!normalize) return true;
  return std::memcmp(mean, o.mean, sizeof mean) == 0 && std::memcmp(std, o.std, sizeof std) == 0;
}

void OutputTable::Build(const DecodeOptions& o) {
  dtype = o.dtype;
  normalize = o.normalize;
  std::memcpy(mean, o.mean, sizeof mean);
  std::memcpy(std, o.std, sizeof std);
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      u8[c][v] = uint8_t(v);
      // torchvision's arithmetic, in float32 as it does it: ToTensor's
      // x.float().div(255), then Normalize's sub_(mean).div_(std).
      const float x = float(v) / 255.0f;
      f32[c][v] = normalize ? (x - mean[c]) / std[c] : x;
    }
    FloatsToHalves(f32[c], f16[c], 256);
    for (int v = 0; v < 256; ++v) {
      uint32_t bits;
      std::memcpy(&bits, &f32[c][v], 4);
      bf16[c][v] = gpu::FloatBitsToBFloat16(bits);  // the GPU kernel's rounding
    }
  }
  built = true;
}

namespace {

template <typename T>
void Write(const uint8_t* rgb, uint32_t h, uint32_t w, bool flip, ImageLayout layout,
           const T (*table)[256], T* out) {
  for (uint32_t y = 0; y < h; ++y) {
    const uint8_t* row = rgb + size_t(y) * w * 3;
    if (layout == ImageLayout::kNHWC) {
      T* o = out + size_t(y) * w * 3;
      for (uint32_t x = 0; x < w; ++x) {
        const uint8_t* p = row + size_t(flip ? w - 1 - x : x) * 3;
        o[3 * x] = table[0][p[0]];
        o[3 * x + 1] = table[1][p[1]];
        o[3 * x + 2] = table[2][p[2]];
      }
    } else {
      for (int c = 0; c < 3; ++c) {
        T* o = out + (size_t(c) * h + y) * w;
        const T* t = table[c];
        if (flip) {
          for (uint32_t x = 0; x < w; ++x) o[x] = t[row[size_t(w - 1 - x) * 3 + c]];
        } else {
          for (uint32_t x = 0; x < w; ++x) o[x] = t[row[size_t(x) * 3 + c]];
        }
      }
    }
  }
}

}  // namespace

void WriteOutput(const uint8_t* rgb, uint32_t h, uint32_t w, bool flip, ImageLayout layout,
                 const OutputTable& table, void* out) {
  switch (table.dtype) {
    case ImageDType::kUInt8:
      Write(rgb, h, w, flip, layout, table.u8, static_cast<uint8_t*>(out));
      return;
    case ImageDType::kFloat32:
      Write(rgb, h, w, flip, layout, table.f32, static_cast<float*>(out));
      return;
    case ImageDType::kFloat16:
      Write(rgb, h, w, flip, layout, table.f16, static_cast<uint16_t*>(out));
      return;
    case ImageDType::kBFloat16:
      Write(rgb, h, w, flip, layout, table.bf16, static_cast<uint16_t*>(out));
      return;
  }
}

}  // namespace stoker
