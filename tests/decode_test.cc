// DecodeSample (stoker/decode.h): crops, flips, normalization, output types
// and layouts, JPEG kinds, bad input. JPEGs are made here with TurboJPEG's
// compressor. The comparison with torchvision itself (crop distribution,
// pixels) is tests/python/test_augment.py.
#include "stoker/decode.h"

#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cli/loader_flags.h"
#include "gtest/gtest.h"
#include "jpeg_testdata.h"
#include "loader/augment.h"
#include "loader/fp16.h"

namespace stoker {
namespace {

using testdata::Picture;

enum class Kind { kRgb420, kRgb444, kGray, kCmyk, kProgressive };

std::vector<std::byte> Jpeg(const std::vector<uint8_t>& rgb, int h, int w, Kind kind) {
  std::vector<uint8_t> src = rgb;
  int pf = TJPF_RGB, samp = TJSAMP_420, flags = 0;
  if (kind == Kind::kRgb444) samp = TJSAMP_444;
  if (kind == Kind::kGray) {
    pf = TJPF_GRAY;
    samp = TJSAMP_GRAY;
    src.resize(size_t(h) * w);
    for (size_t i = 0; i < src.size(); ++i) src[i] = rgb[3 * i + 1];
  }
  if (kind == Kind::kCmyk) {
    // Stored as libjpeg and Photoshop store CMYK (inverted: 255 is no ink);
    // K = 0 ink here, so the picture's RGB is C, M, Y inverted back.
    pf = TJPF_CMYK;
    samp = TJSAMP_444;
    src.resize(size_t(h) * w * 4);
    for (size_t i = 0; i < size_t(h) * w; ++i) {
      for (int c = 0; c < 3; ++c) src[4 * i + c] = rgb[3 * i + c];
      src[4 * i + 3] = 255;
    }
  }
  if (kind == Kind::kProgressive) flags = TJFLAG_PROGRESSIVE;
  return testdata::Compress(src, h, w, pf, samp, 95, flags);
}

DecodeOptions Options(CropMode crop, uint32_t h = 64, uint32_t w = 80) {
  DecodeOptions o;
  o.field = "image";
  o.crop = crop;
  o.height = h;
  o.width = w;
  return o;
}

template <typename T = uint8_t>
std::vector<T> Decode(const DecodeOptions& o, const std::vector<std::byte>& jpeg,
                      const SampleKey& key, Status* st = nullptr) {
  std::vector<T> out(DecodedSampleBytes(o) / sizeof(T));
  thread_local DecodeScratch scratch;
  Status s = DecodeSample(
      o, jpeg, key, {reinterpret_cast<std::byte*>(out.data()), out.size() * sizeof(T)}, &scratch);
  if (st != nullptr) {
    *st = s;
  } else {
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return out;
}

// The image fully decoded by tjDecompress2 at the same DCT scale, then the
// same taps: what the partial decode (skipped rows, cropped columns) must
// reproduce.
std::vector<uint8_t> FullDecodeReference(const DecodeOptions& o, const std::vector<std::byte>& jpeg,
                                         const SampleKey& key) {
  tjhandle tj = tjInitDecompress();
  int w = 0, h = 0, ss = 0, cs = 0;
  auto* p = reinterpret_cast<const unsigned char*>(jpeg.data());
  EXPECT_EQ(tjDecompressHeader3(tj, p, jpeg.size(), &w, &h, &ss, &cs), 0);
  const SampleCrop c = SampleCropFor(o, h, w, key);
  int m = 8;  // as DecodeSample picks it
  while (m > 1 && c.width * (m / 2) / 8 >= o.width && c.height * (m / 2) / 8 >= o.height) m /= 2;
  const tjscalingfactor f{m, 8};
  const int sw = TJSCALED(w, f), sh = TJSCALED(h, f);
  std::vector<uint8_t> full(size_t(sw) * sh * 3);
  EXPECT_EQ(tjDecompress2(tj, p, jpeg.size(), full.data(), sw, 0, sh, TJPF_RGB, 0), 0);
  tjDestroy(tj);
  const bool crop = o.crop == CropMode::kRandomResized;
  Taps ty, tx;
  ComputeTaps(c.top, c.height, o.height, crop ? int64_t(c.top) : 0,
              crop ? int64_t(c.top + c.height) - 1 : h - 1, m / 8.0, &ty);
  ComputeTaps(c.left, c.width, o.width, crop ? int64_t(c.left) : 0,
              crop ? int64_t(c.left + c.width) - 1 : w - 1, m / 8.0, &tx);
  std::vector<uint8_t> out(size_t(o.height) * o.width * 3);
  ResizeWithTaps(full.data(), size_t(sw) * 3, 0, 0, ty, tx, out.data());
  if (c.flip) {
    for (uint32_t y = 0; y < o.height; ++y) {
      for (uint32_t x = 0; x < o.width / 2; ++x) {
        for (int k = 0; k < 3; ++k) {
          std::swap(out[(size_t(y) * o.width + x) * 3 + k],
                    out[(size_t(y) * o.width + o.width - 1 - x) * 3 + k]);
        }
      }
    }
  }
  return out;
}

TEST(DecodeOptionsTest, EachOutOfRangeParameterIsInvalidArgumentNamingIt) {
  struct Case {
    const char* name;
    void (*change)(DecodeOptions&);
  };
  const Case cases[] = {
      {"size", [](DecodeOptions& o) { o.height = 0; }},
      {"size", [](DecodeOptions& o) { o.width = 9000; }},
      {"scale", [](DecodeOptions& o) { o.scale_min = 0; }},
      {"scale", [](DecodeOptions& o) { o.scale_max = 1.5f; }},
      {"scale", [](DecodeOptions& o) { o.scale_min = 0.9f, o.scale_max = 0.5f; }},
      {"scale", [](DecodeOptions& o) { o.scale_min = std::nanf(""); }},
      {"ratio", [](DecodeOptions& o) { o.ratio_min = 0; }},
      {"ratio", [](DecodeOptions& o) { o.ratio_min = -1; }},
      {"ratio", [](DecodeOptions& o) { o.ratio_min = 2, o.ratio_max = 1; }},
      {"flip", [](DecodeOptions& o) { o.flip = 1.5f; }},
      {"flip", [](DecodeOptions& o) { o.flip = -0.1f; }},
      {"std[1]",
       [](DecodeOptions& o) { o.normalize = true, o.dtype = ImageDType::kFloat32, o.std[1] = 0; }},
      {"mean[2]",
       [](DecodeOptions& o) {
         o.normalize = true, o.dtype = ImageDType::kFloat16, o.mean[2] = INFINITY;
       }},
      {"normalize", [](DecodeOptions& o) { o.normalize = true; }},  // with uint8
      {"resize_shorter",
       [](DecodeOptions& o) { o.crop = CropMode::kCenter, o.resize_shorter = 200; }},
      {"crop", [](DecodeOptions& o) { o.crop = CropMode(7); }},
      {"dtype", [](DecodeOptions& o) { o.dtype = ImageDType(9); }},
      {"layout", [](DecodeOptions& o) { o.layout = ImageLayout(5); }},
  };
  DecodeOptions good = Options(CropMode::kRandomResized, 224, 224);
  ASSERT_TRUE(ValidateDecodeOptions(good).ok());
  good.crop = CropMode::kCenter;
  good.resize_shorter = 224;
  ASSERT_TRUE(ValidateDecodeOptions(good).ok());
  for (const Case& c : cases) {
    DecodeOptions o = Options(CropMode::kRandomResized, 224, 224);
    c.change(o);
    const Status st = ValidateDecodeOptions(o);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << c.name;
    EXPECT_NE(st.message().find(c.name), std::string::npos) << st.ToString();
  }
}

// The boxes stay within torchvision's ranges (area fraction in scale, aspect
// in ratio, inside the image) for every sample id; the flips are 50/50
// within a binomial bound. (test_augment.py compares the distribution with
// torchvision's own get_params.)
TEST(DecodeCropTest, BoxesFollowTheRangesAndFlipsAreFair) {
  DecodeOptions o = Options(CropMode::kRandomResized, 224, 224);
  o.flip = 0.5f;
  const uint32_t H = 375, W = 500;
  const int n = 20000;
  int flips = 0, fallbacks = 0;
  double area_sum = 0;
  for (int id = 0; id < n; ++id) {
    const SampleCrop c = SampleCropFor(o, H, W, {7, 3, uint64_t(id)});
    ASSERT_GE(c.top, 0);
    ASSERT_GE(c.left, 0);
    ASSERT_LE(c.top + c.height, H);
    ASSERT_LE(c.left + c.width, W);
    ASSERT_EQ(c.top, std::floor(c.top));
    const double frac = c.height * c.width / (double(H) * W);
    const double aspect = c.width / c.height;
    if (c.height == H && c.width == W) {
      ++fallbacks;  // the fallback (or a draw of the whole image)
    } else {
      // Rounding w and h to integers moves the area and aspect a little.
      EXPECT_GE(frac, 0.08 * 0.97);
      EXPECT_LE(frac, 1.0);
      EXPECT_GE(aspect, 0.75 * 0.985);
      EXPECT_LE(aspect, 4.0 / 3.0 * 1.015);
    }
    area_sum += frac;
    flips += c.flip;
  }
  // Binomial(20000, 0.5): sd 70.7; 5 sd.
  EXPECT_NEAR(flips, n / 2, 5 * 70.7);
  // The mean area fraction: torchvision's get_params gives 0.435 for this
  // image (20,000 draws; retries bias it below (0.08 + 1) / 2, as large
  // boxes of extreme aspect do not fit). The standard error is 0.002.
  EXPECT_NEAR(area_sum / n, 0.435, 0.01);
  EXPECT_LT(fallbacks, n / 50);
}

TEST(DecodeCropTest, TorchvisionFallbackClampsTheRatio) {
  // Scale near 1 with a ratio far from a 1:10 image's: every try fails, and
  // the central crop keeps the ratio closest to the image's.
  DecodeOptions o = Options(CropMode::kRandomResized);
  o.scale_min = 0.99f;
  o.ratio_min = 1.0f;
  o.ratio_max = 2.0f;
  const SampleCrop c = SampleCropFor(o, 1000, 100, {1, 0, 0});
  EXPECT_EQ(c.width, 100);
  EXPECT_EQ(c.height, 100);  // round(100 / 1.0)
  EXPECT_EQ(c.top, 450);
  EXPECT_EQ(c.left, 0);
}

TEST(DecodeCropTest, CenterCropIsResizeShorterThenCentre) {
  DecodeOptions o = Options(CropMode::kCenter, 224, 224);
  // 300 x 400: Resize(256) -> 256 x 341, CenterCrop(224): top 16, left
  // round(58.5) = 58 (half to even, as Python).
  const SampleCrop c = SampleCropFor(o, 300, 400, {});
  const double s = 300.0 / 256.0;
  EXPECT_DOUBLE_EQ(c.top, 16 * s);
  EXPECT_DOUBLE_EQ(c.height, 224 * s);
  EXPECT_DOUBLE_EQ(c.left, 58 * 400.0 / 341.0);
  EXPECT_DOUBLE_EQ(c.width, 224 * 400.0 / 341.0);
}

TEST(DecodeSampleTest, SameKeySameBytesOtherEpochOtherCrop) {
  const auto jpeg = Jpeg(Picture(300, 400), 300, 400, Kind::kRgb420);
  DecodeOptions o = Options(CropMode::kRandomResized);
  o.flip = 0.5f;
  const auto a = Decode(o, jpeg, {5, 1, 42});
  EXPECT_EQ(a, Decode(o, jpeg, {5, 1, 42}));
  int differ = 0;
  for (uint64_t e = 2; e < 6; ++e) differ += Decode(o, jpeg, {5, e, 42}) != a;
  EXPECT_EQ(differ, 4);
  EXPECT_NE(Decode(o, jpeg, {6, 1, 42}), a);  // other seed
  EXPECT_NE(Decode(o, jpeg, {5, 1, 43}), a);  // other sample
}

// The partial decode (DCT-scaled, rows skipped, columns cropped) against
// the whole image decoded at the same scale and resampled with the same
// taps, over many crops of several JPEG kinds.
TEST(DecodeSampleTest, PartialDecodeMatchesTheFullDecode) {
  for (Kind kind : {Kind::kRgb420, Kind::kRgb444, Kind::kProgressive}) {
    const auto jpeg = Jpeg(Picture(333, 517), 333, 517, kind);
    for (CropMode mode : {CropMode::kRandomResized, CropMode::kCenter, CropMode::kResize}) {
      DecodeOptions o = Options(mode, 48, 56);
      o.flip = 0.5f;
      int worst = 0;
      double sum = 0;
      size_t count = 0;
      for (uint64_t id = 0; id < (mode == CropMode::kRandomResized ? 60u : 1u); ++id) {
        const auto got = Decode(o, jpeg, {1, 0, id});
        const auto want = FullDecodeReference(o, jpeg, {1, 0, id});
        // The whole image at the same scale: tjDecompress2's pixels exactly.
        DecodeOptions whole = o;
        whole.extent = DecodeExtent::kWholeScaled;
        ASSERT_EQ(Decode(whole, jpeg, {1, 0, id}), want) << id;
        for (size_t i = 0; i < got.size(); ++i) {
          const int d = std::abs(int(got[i]) - int(want[i]));
          worst = std::max(worst, d);
          sum += d;
        }
        count += got.size();
      }
      // Cropped decodes upsample chroma at the window's edges from the
      // window alone: a level or two there, nothing elsewhere.
      EXPECT_LE(worst, 3) << int(kind) << " " << int(mode);
      EXPECT_LT(sum / count, 0.05) << int(kind) << " " << int(mode);
    }
  }
}

TEST(DecodeSampleTest, FlipMirrorsLayoutsTransposeFloatsNormalize) {
  const auto jpeg = Jpeg(Picture(240, 320), 240, 320, Kind::kRgb420);
  const uint32_t h = 40, w = 52;
  DecodeOptions o = Options(CropMode::kRandomResized, h, w);
  const SampleKey key{3, 9, 77};
  const auto base = Decode(o, jpeg, key);
  // flip = 1: the same crop (drawn before the flip), mirrored.
  o.flip = 1.0f;
  const auto flipped = Decode(o, jpeg, key);
  for (uint32_t y = 0; y < h; ++y) {
    for (uint32_t x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        ASSERT_EQ(flipped[(y * w + x) * 3 + c], base[(y * w + w - 1 - x) * 3 + c]);
      }
    }
  }
  // NCHW is NHWC transposed.
  o.layout = ImageLayout::kNCHW;
  const auto planar = Decode(o, jpeg, key);
  for (uint32_t y = 0; y < h; ++y) {
    for (uint32_t x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        ASSERT_EQ(planar[(c * h + y) * w + x], flipped[(y * w + x) * 3 + c]);
      }
    }
  }
  // float32: torchvision's (x / 255 - mean) / std of the uint8 pixels,
  // bit for bit; float16: the float32 values rounded.
  o.normalize = true;
  o.dtype = ImageDType::kFloat32;
  const auto f32 = Decode<float>(o, jpeg, key);
  o.dtype = ImageDType::kFloat16;
  const auto f16 = Decode<uint16_t>(o, jpeg, key);
  for (size_t i = 0; i < planar.size(); ++i) {
    const int c = int(i / (h * w));
    const float want = (float(planar[i]) / 255.0f - o.mean[c]) / o.std[c];
    ASSERT_EQ(f32[i], want) << i;
    ASSERT_EQ(f16[i], FloatToHalf(want)) << i;
  }
  // float without normalize: ToTensor's x / 255.
  o.normalize = false;
  o.dtype = ImageDType::kFloat32;
  const auto unit = Decode<float>(o, jpeg, key);
  for (size_t i = 0; i < planar.size(); ++i) ASSERT_EQ(unit[i], float(planar[i]) / 255.0f);
}

// Grayscale, CMYK and progressive JPEGs come out RGB, close to the picture.
TEST(DecodeSampleTest, GrayCmykProgressiveDecodeToRgb) {
  const int H = 96, W = 128;
  const auto picture = Picture(H, W);
  DecodeOptions o = Options(CropMode::kResize, H, W);  // no resampling
  for (Kind kind : {Kind::kGray, Kind::kCmyk, Kind::kProgressive, Kind::kRgb444}) {
    const auto got = Decode(o, Jpeg(picture, H, W, kind), {});
    double diff = 0;
    for (size_t i = 0; i < got.size(); i += 3) {
      for (int c = 0; c < 3; ++c) {
        const int want = kind == Kind::kGray ? picture[i + 1] : picture[i + c];
        diff += std::abs(int(got[i + c]) - want);
      }
      if (kind == Kind::kGray) {
        ASSERT_EQ(got[i], got[i + 1]);
        ASSERT_EQ(got[i + 1], got[i + 2]);
      }
    }
    // Quality 95, with sharp edges in the picture.
    EXPECT_LT(diff / double(got.size()), 3.0) << int(kind);
  }
}

TEST(DecodeSampleTest, CorruptAndTruncatedJpegsAreCorruption) {
  DecodeOptions o = Options(CropMode::kResize);
  const auto jpeg = Jpeg(Picture(200, 200), 200, 200, Kind::kRgb420);
  std::vector<std::vector<std::byte>> bad;
  bad.emplace_back();                                                     // empty
  bad.push_back(std::vector<std::byte>(jpeg.begin(), jpeg.begin() + 2));  // SOI only
  bad.push_back(std::vector<std::byte>(jpeg.begin(), jpeg.begin() + jpeg.size() / 2));
  std::vector<std::byte> garbage(1000, std::byte{0x5a});
  garbage[0] = std::byte{0xff};
  garbage[1] = std::byte{0xd8};
  bad.push_back(garbage);
  const auto progressive = Jpeg(Picture(200, 200), 200, 200, Kind::kProgressive);
  bad.push_back(
      std::vector<std::byte>(progressive.begin(), progressive.begin() + progressive.size() / 2));
  for (const auto& b : bad) {
    Status st;
    const auto out = Decode(o, b, {}, &st);
    EXPECT_EQ(st.code(), Code::kCorruption) << b.size() << " bytes: " << st.ToString();
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](uint8_t v) { return v == 0; }));
  }
  // The decoder is still good after errors.
  Status st;
  Decode(o, jpeg, {}, &st);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// The portable conversion against F16C (where the CPU has it) on a spread
// of floats, and exact on every half and every tie between two halves.
TEST(Fp16Test, RoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaN
    ASSERT_EQ(FloatToHalf(HalfToFloat(uint16_t(h))), h) << h;
  }
  // Ties: halfway between 1.0 (0x3c00) and its successor goes to 1.0; the
  // next tie goes up to the even 0x3c02.
  EXPECT_EQ(FloatToHalf(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(FloatToHalf(1.0f + 3 * 0x1p-11f), 0x3c02);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);  // tie with zero: even
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
#ifdef STOKER_FP16_X86
  if (!HaveF16C()) GTEST_SKIP() << "this CPU has no F16C to compare with";
  std::vector<float> in;
  for (uint64_t u = 0; u < (1ull << 32); u += 65537) {
    float f;
    const uint32_t v = uint32_t(u);
    std::memcpy(&f, &v, 4);
    if (!std::isnan(f)) in.push_back(f);
  }
  std::vector<uint16_t> hw(in.size()), sw(in.size());
  FloatsToHalvesF16C(in.data(), hw.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) sw[i] = FloatToHalf(in[i]);
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(sw[i], hw[i]) << in[i];
#endif
}

// `stoker bench loader`'s augmentation flags.
Status ParseFlags(std::vector<std::string> args, DecodeOptions* out) {
  CLI::App app;
  cli::LoaderFlags flags;
  flags.Add(&app);
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  app.parse(args);
  STOKER_RETURN_IF_ERROR(flags.Finish());
  *out = flags.options.decode;
  return Status::Ok();
}

TEST(LoaderFlagsTest, AugmentationFlagsFillDecodeOptions) {
  DecodeOptions d;
  ASSERT_TRUE(
      ParseFlags({"--crop", "random-resized", "--scale", "0.25,0.9", "--ratio", "0.5,2", "--flip",
                  "0.5", "--normalize", "0.5,0.4,0.3/0.2,0.25,0.5", "--dtype", "float16",
                  "--layout", "nchw", "--skip-corrupt", "--decode-size", "160x128"},
                 &d)
          .ok());
  EXPECT_EQ(d.field, "image");  // the flags imply --decode
  EXPECT_EQ(d.crop, CropMode::kRandomResized);
  EXPECT_EQ(d.height, 160u);
  EXPECT_EQ(d.width, 128u);
  EXPECT_FLOAT_EQ(d.scale_min, 0.25f);
  EXPECT_FLOAT_EQ(d.scale_max, 0.9f);
  EXPECT_FLOAT_EQ(d.ratio_min, 0.5f);
  EXPECT_FLOAT_EQ(d.ratio_max, 2.0f);
  EXPECT_FLOAT_EQ(d.flip, 0.5f);
  EXPECT_TRUE(d.normalize);
  EXPECT_FLOAT_EQ(d.mean[2], 0.3f);
  EXPECT_FLOAT_EQ(d.std[1], 0.25f);
  EXPECT_EQ(d.dtype, ImageDType::kFloat16);
  EXPECT_EQ(d.layout, ImageLayout::kNCHW);
  EXPECT_TRUE(d.skip_corrupt);

  ASSERT_TRUE(ParseFlags({"--crop", "center", "--normalize", "imagenet"}, &d).ok());
  EXPECT_EQ(d.crop, CropMode::kCenter);
  EXPECT_EQ(d.dtype, ImageDType::kFloat32);  // normalize's default
  EXPECT_FLOAT_EQ(d.mean[0], 0.485f);

  ASSERT_TRUE(ParseFlags({}, &d).ok());
  EXPECT_TRUE(d.field.empty());  // no decode without a flag asking for it

  const std::pair<std::vector<std::string>, std::string> bad[] = {
      {{"--crop", "random"}, "--crop"},
      {{"--scale", "0.5"}, "--scale"},
      {{"--scale", "0.9,0.1"}, "scale"},
      {{"--ratio", "1,2,3"}, "--ratio"},
      {{"--flip", "2"}, "flip"},
      {{"--normalize", "1,2,3"}, "--normalize"},
      {{"--normalize", "1,2,3/1,0,1"}, "std[1]"},
      {{"--normalize", "imagenet", "--dtype", "uint8"}, "normalize"},
      {{"--dtype", "int8"}, "--dtype"},
      {{"--layout", "hwc"}, "--layout"},
  };
  for (const auto& [args, name] : bad) {
    const Status st = ParseFlags(args, &d);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << args[0];
    EXPECT_NE(st.message().find(name), std::string::npos) << st.ToString();
  }
}

}  // namespace
}  // namespace stoker
