// JPEG decode and augmentation (stoker/decode.h), run by the collate workers.
//
// The decoder works through libjpeg-turbo's libjpeg API (jpeglib.h) rather
// than TurboJPEG's tjDecompress2, because only that API decodes part of an
// image: after the crop box is drawn from the header's size alone,
//   - DCT scaling (scale_num / 8, a power of two) picks the smallest factor
//     whose scaled box still covers the output size, so the IDCT itself
//     does most of the downscaling;
//   - jpeg_skip_scanlines skips the rows above the box and the decode stops
//     after its last row (rows below are never entropy-decoded for baseline
//     JPEGs; progressive ones are read whole by jpeg_start_decompress);
//   - jpeg_crop_scanline narrows each decoded row to the box's columns
//     (widened to iMCU boundaries), so colour conversion and upsampling run
//     on the box only.
// Then a bilinear pass over the decoded window (half-pixel centres, as
// torchvision and PIL) and one output pass (flip, normalize, dtype, layout).
#include "stoker/decode.h"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "loader/augment.h"
#include "loader/resize.h"
#include "stoker/gpu.h"
#include "stoker/loader.h"

#ifdef STOKER_HAVE_TURBOJPEG
// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>
#include <jpeglib.h>
#endif

namespace stoker {

void ResizeBilinear(const uint8_t* src, uint32_t sh, uint32_t sw, uint8_t* dst, uint32_t dh,
                    uint32_t dw) {
  if (sh == dh && sw == dw) {
    std::memcpy(dst, src, size_t(sh) * sw * 3);
    return;
  }
  thread_local Taps ty, tx;
  ComputeTaps(0, sh, dh, 0, int64_t(sh) - 1, 1.0, &ty);
  ComputeTaps(0, sw, dw, 0, int64_t(sw) - 1, 1.0, &tx);
  ResizeWithTaps(src, size_t(sw) * 3, 0, 0, ty, tx, dst);
}

size_t ImageDTypeSize(ImageDType t) {
  switch (t) {
    case ImageDType::kUInt8:
      return 1;
    case ImageDType::kFloat32:
      return 4;
    case ImageDType::kFloat16:
    case ImageDType::kBFloat16:
      return 2;
  }
  return 1;
}

namespace {

// Each enum's names, indexed by its value (decode.h lists them).
constexpr std::string_view kCropNames[] = {"resize", "center", "random-resized"};
constexpr std::string_view kDTypeNames[] = {"uint8", "float32", "float16", "bfloat16"};
constexpr std::string_view kLayoutNames[] = {"nhwc", "nchw"};
static_assert(std::size(kCropNames) == size_t(CropMode::kRandomResized) + 1);
static_assert(std::size(kDTypeNames) == size_t(ImageDType::kBFloat16) + 1);
static_assert(std::size(kLayoutNames) == size_t(ImageLayout::kNCHW) + 1);

// ASCII case folded, '_' read as '-'.
bool SameName(std::string_view given, std::string_view name) {
  if (given.size() != name.size()) return false;
  for (size_t i = 0; i < given.size(); ++i) {
    char c = given[i];
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    if (c == '_') c = '-';
    if (c != name[i]) return false;
  }
  return true;
}

template <typename E, size_t N>
Result<E> ParseName(const char* option, const std::string_view (&names)[N],
                    std::string_view given) {
  for (size_t i = 0; i < N; ++i) {
    if (SameName(given, names[i])) return E(i);
  }
  std::string accepted;
  for (size_t i = 0; i < N; ++i) {
    accepted += i == 0 ? "" : i + 1 == N ? " or " : ", ";
    accepted += names[i];
  }
  return InvalidArgument(std::string(option) + " must be " + accepted + ", not '" +
                         std::string(given) + "'");
}

template <typename E, size_t N>
std::string_view NameOf(const std::string_view (&names)[N], E value) {
  return size_t(value) < N ? names[size_t(value)] : "unknown";
}

}  // namespace

Result<CropMode> ParseCropMode(std::string_view name) {
  return ParseName<CropMode>("crop", kCropNames, name);
}
Result<ImageDType> ParseImageDType(std::string_view name) {
  return ParseName<ImageDType>("dtype", kDTypeNames, name);
}
Result<ImageLayout> ParseImageLayout(std::string_view name) {
  return ParseName<ImageLayout>("layout", kLayoutNames, name);
}
std::string_view CropModeName(CropMode m) { return NameOf(kCropNames, m); }
std::string_view ImageDTypeName(ImageDType t) { return NameOf(kDTypeNames, t); }
std::string_view ImageLayoutName(ImageLayout l) { return NameOf(kLayoutNames, l); }

size_t DecodedSampleBytes(const DecodeOptions& o) {
  return size_t(o.height) * o.width * 3 * ImageDTypeSize(o.dtype);
}

namespace {

constexpr uint32_t kMaxSide = kMaxDecodeSide;
constexpr uint32_t kMaxResizeShorter = 65536;

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string Range(float a, float b) { return "(" + Num(a) + ", " + Num(b) + ")"; }

}  // namespace

Status ValidateDecodeOptions(const DecodeOptions& o) {
  if (o.field.empty()) return Status::Ok();
  if (Status st = ParseDevice(o.device).status(); !st.ok()) {
    return InvalidArgument("decode device: " + st.message());
  }
  const std::string size = std::to_string(o.height) + "x" + std::to_string(o.width);
  if (o.height == 0 || o.width == 0 || o.height > kMaxSide || o.width > kMaxSide) {
    return InvalidArgument("decode size " + size + ": height and width must be between 1 and " +
                           std::to_string(kMaxSide));
  }
  if (uint8_t(o.crop) > uint8_t(CropMode::kRandomResized)) {
    return InvalidArgument("decode crop: unknown mode " + std::to_string(int(o.crop)));
  }
  if (uint8_t(o.dtype) > uint8_t(ImageDType::kBFloat16)) {
    return InvalidArgument("decode dtype: unknown type " + std::to_string(int(o.dtype)));
  }
  if (uint8_t(o.layout) > uint8_t(ImageLayout::kNCHW)) {
    return InvalidArgument("decode layout: unknown layout " + std::to_string(int(o.layout)));
  }
  if (uint8_t(o.extent) > uint8_t(DecodeExtent::kWholeFull)) {
    return InvalidArgument("decode extent: unknown extent " + std::to_string(int(o.extent)));
  }
  // The negations catch NaN too.
  if (!(o.scale_min > 0 && o.scale_min <= o.scale_max && o.scale_max <= 1)) {
    return InvalidArgument("decode scale " + Range(o.scale_min, o.scale_max) +
                           ": the crop's area fraction needs 0 < min <= max <= 1");
  }
  if (!(o.ratio_min > 0 && o.ratio_min <= o.ratio_max && std::isfinite(o.ratio_max))) {
    return InvalidArgument("decode ratio " + Range(o.ratio_min, o.ratio_max) +
                           ": the crop's aspect ratio (w / h) needs 0 < min <= max");
  }
  if (!(o.cpu_share >= 0 && o.cpu_share <= 1)) {
    return InvalidArgument("decode cpu_share " + Num(o.cpu_share) +
                           ": a fraction of the images, between 0 and 1");
  }
  if (o.worker_nice > 19) {
    return InvalidArgument("decode worker_nice " + std::to_string(o.worker_nice) +
                           ": a nice increment, between 0 and 19");
  }
  if (!(o.flip >= 0 && o.flip <= 1)) {
    return InvalidArgument("decode flip " + Num(o.flip) + ": a probability, between 0 and 1");
  }
  if (o.crop == CropMode::kCenter && o.resize_shorter != 0 &&
      (o.resize_shorter < std::max(o.height, o.width) || o.resize_shorter > kMaxResizeShorter)) {
    return InvalidArgument("decode resize_shorter " + std::to_string(o.resize_shorter) +
                           ": must be between the crop size " + size + " and " +
                           std::to_string(kMaxResizeShorter));
  }
  if (o.normalize) {
    if (o.dtype == ImageDType::kUInt8) {
      return InvalidArgument(
          "decode normalize needs dtype float32, float16 or bfloat16 (uint8 cannot hold "
          "normalized values)");
    }
    for (int c = 0; c < 3; ++c) {
      if (!std::isfinite(o.mean[c])) {
        return InvalidArgument("decode mean[" + std::to_string(c) + "] " + Num(o.mean[c]) +
                               " is not a finite number");
      }
      if (!std::isfinite(o.std[c]) || o.std[c] == 0) {
        return InvalidArgument("decode std[" + std::to_string(c) + "] " + Num(o.std[c]) +
                               ": normalize divides by it, it must be finite and not 0");
      }
    }
  }
  return Status::Ok();
}

#ifdef STOKER_HAVE_TURBOJPEG
namespace {

// Refuse images whose header claims more pixels than any real training
// image has (a corrupt header must not become a multi-GiB allocation).
constexpr uint64_t kMaxPixels = 1ull << 28;

// libjpeg reports errors through error_exit, which must not return: it
// longjmps back to the setjmp of the call in progress. The functions with a
// setjmp below hold only trivially destructible locals.
struct JpegError {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated = false;
};

void ErrorExit(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegError*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

void EmitMessage(j_common_ptr c, int level) {
  if (level >= 0) return;  // trace messages
  // Warnings: corrupt data that libjpeg decodes around. Only running out of
  // data (a truncated file: libjpeg pads it with grey) fails the sample.
  auto* e = reinterpret_cast<JpegError*>(c->err);
  if (c->err->msg_code == JWRN_JPEG_EOF) e->truncated = true;
  c->err->num_warnings++;
}

void OutputMessage(j_common_ptr) {}

}  // namespace

struct DecodeScratch::Impl {
  jpeg_decompress_struct cinfo{};
  JpegError err;
  bool ready = false;
  std::vector<uint8_t> pixels;   // the decoded window
  std::vector<uint8_t> resized;  // height x width x 3, before the output pass
  Taps ty, tx;
  OutputTable table;

  Impl() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = ErrorExit;
    err.pub.emit_message = EmitMessage;
    err.pub.output_message = OutputMessage;
    ready = Create();
  }
  ~Impl() {
    if (ready) jpeg_destroy_decompress(&cinfo);
  }

  bool Create() {
    if (setjmp(err.jump)) return false;
    jpeg_create_decompress(&cinfo);
    return true;
  }

  bool ReadHeader(const uint8_t* data, size_t size) {
    err.truncated = false;
    if (setjmp(err.jump)) {
      jpeg_abort_decompress(&cinfo);
      return false;
    }
    jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
    jpeg_read_header(&cinfo, TRUE);
    return true;
  }

  // Decodes rows [y0, y1] and at least columns [x0, x1] of the image scaled
  // by scale_num / 8 into `pixels`; `col0` and `cols` get the columns it
  // holds (jpeg_crop_scanline widens them to iMCU boundaries).
  bool DecodeWindow(int scale_num, bool cmyk, uint32_t y0, uint32_t y1, uint32_t x0, uint32_t x1,
                    uint32_t* col0, uint32_t* cols, uint32_t* components) {
    if (setjmp(err.jump)) {
      jpeg_abort_decompress(&cinfo);
      return false;
    }
    cinfo.scale_num = scale_num;
    cinfo.scale_denom = 8;
    cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
    cinfo.dct_method = JDCT_ISLOW;
    jpeg_start_decompress(&cinfo);
    JDIMENSION xoff = x0, width = x1 - x0 + 1;
    if (width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &width);
    const size_t stride = size_t(width) * cinfo.output_components;
    pixels.resize(stride * (y1 - y0 + 1));
    if (y0 > 0) jpeg_skip_scanlines(&cinfo, y0);
    JSAMPROW rows[16];
    while (cinfo.output_scanline <= y1) {
      JDIMENSION k = 0;
      for (; k < 16 && cinfo.output_scanline + k <= y1; ++k) {
        rows[k] = pixels.data() + (cinfo.output_scanline + k - y0) * stride;
      }
      jpeg_read_scanlines(&cinfo, rows, k);
    }
    *col0 = xoff;
    *cols = width;
    *components = cinfo.output_components;
    jpeg_abort_decompress(&cinfo);
    return true;
  }
};

namespace {

// CMYK -> RGB in place, as PIL converts (Pillow's cmyk2rgb, and it always
// reads CMYK JPEGs with Adobe's inverted polarity: 0 is full ink, which is
// what Photoshop and libjpeg's own CMYK writer store).
void CmykToRgb(uint8_t* p, size_t pixels) {
  auto muldiv255 = [](uint32_t a, uint32_t b) {
    const uint32_t t = a * b + 128;
    return ((t >> 8) + t) >> 8;
  };
  for (size_t i = 0; i < pixels; ++i) {
    const uint32_t nk = p[4 * i + 3];  // 255 - K with K = 255 - stored
    for (int c = 0; c < 3; ++c) {
      const uint32_t ink = 255 - p[4 * i + c];
      p[3 * i + c] = uint8_t(nk - std::min(nk, muldiv255(ink, nk)));
    }
  }
}

Status DecodeAndAugment(const DecodeOptions& o, std::span<const std::byte> jpeg,
                        const SampleKey& key, std::span<std::byte> out, DecodeScratch::Impl* d) {
  if (!d->ready) return Internal("JPEG decode: libjpeg could not start");
  if (jpeg.empty()) return Corruption("JPEG decode: empty data");
  if (!d->ReadHeader(reinterpret_cast<const uint8_t*>(jpeg.data()), jpeg.size())) {
    return Corruption(std::string("not a JPEG: ") + d->err.message);
  }
  const uint32_t W = d->cinfo.image_width, H = d->cinfo.image_height;
  if (W == 0 || H == 0 || uint64_t(W) * H > kMaxPixels) {
    jpeg_abort_decompress(&d->cinfo);
    return Corruption("JPEG claims an impossible size " + std::to_string(W) + "x" +
                      std::to_string(H));
  }
  const bool cmyk = d->cinfo.jpeg_color_space == JCS_CMYK || d->cinfo.jpeg_color_space == JCS_YCCK;

  bool flip = false;
  const CropBox box = DrawCrop(o, H, W, key, &flip);

  // The smallest DCT scaling m / 8 at which the box still covers the
  // output, m a power of two: libjpeg-turbo has SIMD IDCTs for 8/8, 4/8,
  // 2/8 and 1/8 only; the others (and the 10x10 .. 14x14 IDCTs libjpeg
  // picks for their subsampled chroma) are plain C, and 7/8 decodes slower
  // than 8/8 (measured in docs/benchmarks.md).
  int m = 8;
  while (o.extent != DecodeExtent::kWholeFull && m > 1 && box.width * (m / 2) / 8 >= o.width &&
         box.height * (m / 2) / 8 >= o.height) {
    m /= 2;
  }
  const double scale = m / 8.0;
  ComputeTaps(box.top, box.height, o.height, box.clamp_top, box.clamp_bottom, scale, &d->ty);
  ComputeTaps(box.left, box.width, o.width, box.clamp_left, box.clamp_right, scale, &d->tx);
  uint32_t y0 = d->ty.lowest(), y1 = d->ty.highest();
  uint32_t x0 = d->tx.lowest(), x1 = d->tx.highest();
  if (o.extent != DecodeExtent::kCropScaled) {
    // The scaled image's size, as libjpeg computes it (jdiv_round_up).
    y0 = x0 = 0;
    y1 = uint32_t((uint64_t(H) * m + 7) / 8) - 1;
    x1 = uint32_t((uint64_t(W) * m + 7) / 8) - 1;
  }
  uint32_t col0 = 0, cols = 0, components = 0;
  if (!d->DecodeWindow(m, cmyk, y0, y1, x0, x1, &col0, &cols, &components)) {
    return Corruption(std::string("JPEG decode failed: ") + d->err.message);
  }
  if (d->err.truncated) return Corruption("JPEG data ends early (truncated file)");
  size_t stride = size_t(cols) * components;
  if (components == 4) {
    // Row by row in place: each row's RGB ends before its CMYK does.
    for (uint32_t r = 0; r <= y1 - y0; ++r) {
      uint8_t* row = d->pixels.data() + r * stride;
      CmykToRgb(row, cols);
      if (r > 0) std::memmove(d->pixels.data() + r * size_t(cols) * 3, row, size_t(cols) * 3);
    }
    stride = size_t(cols) * 3;
  } else if (components != 3) {
    return Internal("JPEG decode: " + std::to_string(components) + " components after RGB output");
  }

  const bool direct = !flip && o.dtype == ImageDType::kUInt8 && o.layout == ImageLayout::kNHWC;
  uint8_t* rgb = reinterpret_cast<uint8_t*>(out.data());
  if (!direct) {
    d->resized.resize(size_t(o.height) * o.width * 3);
    rgb = d->resized.data();
  }
  ResizeWithTaps(d->pixels.data(), stride, int32_t(y0), int32_t(col0), d->ty, d->tx, rgb);
  if (!direct) {
    if (!d->table.Matches(o)) d->table.Build(o);
    WriteOutput(rgb, o.height, o.width, flip, o.layout, d->table, out.data());
  }
  return Status::Ok();
}

}  // namespace

#else
struct DecodeScratch::Impl {};
#endif

DecodeScratch::DecodeScratch() : impl_(std::make_unique<Impl>()) {}
DecodeScratch::~DecodeScratch() = default;

Status DecodeSample(const DecodeOptions& o, std::span<const std::byte> jpeg, const SampleKey& key,
                    std::span<std::byte> out, DecodeScratch* scratch) {
#ifndef STOKER_HAVE_TURBOJPEG
  (void)o, (void)jpeg, (void)key, (void)out, (void)scratch;
  return Unsupported("JPEG decode: stoker was built without libjpeg-turbo");
#else
  if (out.size() < DecodedSampleBytes(o)) {
    return InvalidArgument("decode: output of " + std::to_string(out.size()) + " bytes, needs " +
                           std::to_string(DecodedSampleBytes(o)));
  }
  Status st = DecodeAndAugment(o, jpeg, key, out, scratch->impl());
  // A sample that cannot be decoded leaves zeros, never stale pixels (the
  // loader may skip it with skip_corrupt).
  if (!st.ok()) std::memset(out.data(), 0, DecodedSampleBytes(o));
  return st;
#endif
}

Status DecodeJpegResized(std::span<const std::byte> jpeg, uint32_t out_h, uint32_t out_w,
                         std::span<uint8_t> out, std::vector<uint8_t>* /*scratch*/) {
  DecodeOptions o;
  o.field = "image";
  o.height = out_h;
  o.width = out_w;
  thread_local DecodeScratch scratch;
  return DecodeSample(o, jpeg, {}, {reinterpret_cast<std::byte*>(out.data()), out.size()},
                      &scratch);
}

}  // namespace stoker
