// The GPU decode (issue 34): JPEG headers read on the host, the backend each
// image goes to, crop windows drawn as the CPU path draws them, the fused
// kernel's arithmetic (its CPU reference, against torchvision's
// antialiased resize), nvJPEG's loading and its absence, and the loader
// falling back to the CPU path with identical output. The tests that need a
// GPU (the kernel against its reference, the nvJPEG stage) skip, saying
// why, where there is none.
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "gpu/decode_kernels.h"
#include "gpu/jpeg_decoder.h"
#include "gpu/nvjpeg_api.h"
#include "gtest/gtest.h"
#include "jpeg_testdata.h"
#include "loader/fp16.h"
#include "loader/gpu_decode.h"
#include "loader/jpeg_route.h"
#include "stoker/decode.h"
#include "stoker/loader.h"
#include "stoker/pack.h"
#include "testutil.h"

#ifdef STOKER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace stoker {
namespace {

using testdata::Picture;

enum class Kind { k420, k422, k444, k440, k411, kGrey, kProgressive, kCmyk };

std::vector<std::byte> Jpeg(int h, int w, Kind kind) {
  const std::vector<uint8_t> rgb = Picture(h, w);
  std::vector<uint8_t> src = rgb;
  int pf = TJPF_RGB, samp = TJSAMP_420, flags = 0;
  switch (kind) {
    case Kind::k420:
      break;
    case Kind::k422:
      samp = TJSAMP_422;
      break;
    case Kind::k444:
      samp = TJSAMP_444;
      break;
    case Kind::k440:
      samp = TJSAMP_440;
      break;
    case Kind::k411:
      samp = TJSAMP_411;
      break;
    case Kind::kGrey:
      pf = TJPF_GRAY;
      samp = TJSAMP_GRAY;
      src.resize(size_t(h) * w);
      for (size_t i = 0; i < src.size(); ++i) src[i] = rgb[3 * i + 1];
      break;
    case Kind::kProgressive:
      flags = TJFLAG_PROGRESSIVE;
      break;
    case Kind::kCmyk:
      pf = TJPF_CMYK;
      samp = TJSAMP_444;
      src.resize(size_t(h) * w * 4);
      for (size_t i = 0; i < size_t(h) * w; ++i) {
        for (int c = 0; c < 3; ++c) src[4 * i + c] = rgb[3 * i + c];
        src[4 * i + 3] = 255;
      }
      break;
  }
  return testdata::Compress(src, h, w, pf, samp, 90, flags);
}

// ---- headers -------------------------------------------------------------

TEST(JpegHeader, ReadsSizeSubsamplingColourAndCoding) {
  struct Case {
    Kind kind;
    JpegSubsampling sub;
    JpegColor color;
    bool progressive;
  } cases[] = {
      {Kind::k420, JpegSubsampling::k420, JpegColor::kYCbCr, false},
      {Kind::k422, JpegSubsampling::k422, JpegColor::kYCbCr, false},
      {Kind::k444, JpegSubsampling::k444, JpegColor::kYCbCr, false},
      {Kind::k440, JpegSubsampling::k440, JpegColor::kYCbCr, false},
      {Kind::k411, JpegSubsampling::k411, JpegColor::kYCbCr, false},
      {Kind::kGrey, JpegSubsampling::kGrey, JpegColor::kGrey, false},
      {Kind::kProgressive, JpegSubsampling::k420, JpegColor::kYCbCr, true},
      // TurboJPEG writes CMYK with an Adobe marker, transform 2 (YCCK).
      {Kind::kCmyk, JpegSubsampling::kOther, JpegColor::kYcck, false},
  };
  for (const Case& c : cases) {
    const auto jpeg = Jpeg(375, 500, c.kind);
    auto h = ParseJpegHeader(jpeg);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->width, 500u);
    EXPECT_EQ(h->height, 375u);
    EXPECT_EQ(h->precision, 8);
    EXPECT_EQ(h->subsampling, c.sub) << JpegSubsamplingName(h->subsampling);
    EXPECT_EQ(h->color, c.color) << JpegColorName(h->color);
    EXPECT_EQ(h->progressive, c.progressive);
    EXPECT_EQ(h->sof, c.progressive ? 2 : 0);
    EXPECT_FALSE(h->arithmetic);
  }
}

TEST(JpegHeader, BadInputIsCorruptionSayingWhat) {
  const auto good = Jpeg(64, 80, Kind::k420);
  auto expect = [](std::vector<std::byte> bytes, const std::string& what) {
    auto h = ParseJpegHeader(bytes);
    ASSERT_FALSE(h.ok()) << what;
    EXPECT_EQ(h.status().code(), Code::kCorruption);
    EXPECT_NE(h.status().message().find(what), std::string::npos) << h.status().ToString();
  };
  expect({}, "no SOI");
  expect({std::byte{'G'}, std::byte{'I'}, std::byte{'F'}}, "no SOI");
  // Cut inside the markers before the frame header.
  expect(std::vector<std::byte>(good.begin(), good.begin() + 30), "ends early");
  // A frame header claiming 0 rows.
  auto zero = good;
  for (size_t i = 2; i + 8 < zero.size(); ++i) {
    if (zero[i] == std::byte{0xff} && zero[i + 1] == std::byte{0xc0}) {
      zero[i + 5] = zero[i + 6] = std::byte{0};
      break;
    }
  }
  expect(zero, "impossible size 80x0");
  // A scan before any frame header.
  expect({std::byte{0xff}, std::byte{0xd8}, std::byte{0xff}, std::byte{0xda}, std::byte{0},
          std::byte{2}},
         "scan before the frame header");
}

// ---- routing --------------------------------------------------------------

TEST(JpegRoute, ByImagePropertiesAndWhatTheMachineHas) {
  const GpuDecodeCaps none{}, hybrid{true, false}, engines{true, true};
  struct Case {
    Kind kind;
    DecodeBackend with_engines, without_engines;
  } cases[] = {
      {Kind::k420, DecodeBackend::kHardware, DecodeBackend::kCuda},
      {Kind::k422, DecodeBackend::kHardware, DecodeBackend::kCuda},
      {Kind::k444, DecodeBackend::kHardware, DecodeBackend::kCuda},
      {Kind::k440, DecodeBackend::kHardware, DecodeBackend::kCuda},
      {Kind::kGrey, DecodeBackend::kHardware, DecodeBackend::kCuda},
      {Kind::k411, DecodeBackend::kCuda, DecodeBackend::kCuda},
      {Kind::kProgressive, DecodeBackend::kCuda, DecodeBackend::kCuda},
      {Kind::kCmyk, DecodeBackend::kCpu, DecodeBackend::kCpu},
  };
  for (const Case& c : cases) {
    auto h = ParseJpegHeader(Jpeg(120, 160, c.kind));
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(RouteJpeg(*h, engines), c.with_engines) << int(c.kind);
    EXPECT_EQ(RouteJpeg(*h, hybrid), c.without_engines) << int(c.kind);
    EXPECT_EQ(RouteJpeg(*h, none), DecodeBackend::kCpu) << int(c.kind);
  }
  // What nvJPEG does not decode goes to the CPU: 12-bit, arithmetic-coded,
  // lossless, RGB-coded.
  auto h = ParseJpegHeader(Jpeg(16, 16, Kind::k420));
  ASSERT_TRUE(h.ok());
  JpegHeader odd = *h;
  odd.precision = 12;
  EXPECT_EQ(RouteJpeg(odd, engines), DecodeBackend::kCpu);
  odd = *h;
  odd.arithmetic = true;
  odd.sof = 9;
  EXPECT_EQ(RouteJpeg(odd, engines), DecodeBackend::kCpu);
  odd = *h;
  odd.color = JpegColor::kRgb;
  EXPECT_EQ(RouteJpeg(odd, engines), DecodeBackend::kCpu);
  // Extended sequential (SOF1): CUDA, not the engines.
  odd = *h;
  odd.sof = 1;
  EXPECT_EQ(RouteJpeg(odd, engines), DecodeBackend::kCuda);
}

// ---- crop windows ---------------------------------------------------------

DecodeOptions Augment(CropMode crop) {
  DecodeOptions o;
  o.field = "image";
  o.crop = crop;
  o.height = o.width = 224;
  o.flip = 0.5f;
  return o;
}

// The box and flip come from DrawCrop, as the CPU path's; the window holds
// every tap and the maps put the box where SampleCropFor says it is.
TEST(GpuCrop, SameBoxAndFlipAsTheCpuPathAndAWindowThatHoldsEveryTap) {
  for (CropMode crop : {CropMode::kRandomResized, CropMode::kCenter, CropMode::kResize}) {
    const DecodeOptions o = Augment(crop);
    int flips = 0;
    for (uint64_t id = 0; id < 200; ++id) {
      const SampleKey key{7, 3, id};
      const GpuCropPlan p = PlanGpuCrop(o, 375, 500, key);
      const SampleCrop c = SampleCropFor(o, 375, 500, key);
      EXPECT_EQ(p.flip, c.flip);
      flips += p.flip;
      EXPECT_EQ(p.image_h, 375u);
      EXPECT_NEAR(p.y.scale * 224, c.height, 1e-3);
      EXPECT_NEAR(p.x.scale * 224, c.width, 1e-3);
      ASSERT_LE(p.roi_y + p.roi_h, 375u);
      ASSERT_LE(p.roi_x + p.roi_w, 500u);
      if (crop == CropMode::kRandomResized) {
        // The window is the box, widened by nothing (taps stay inside it).
        EXPECT_GE(double(p.roi_y), c.top);
        EXPECT_LE(double(p.roi_y + p.roi_h), c.top + c.height);
        EXPECT_EQ(p.y.size, int32_t(c.height));
        EXPECT_EQ(p.x.size, int32_t(c.width));
        EXPECT_EQ(p.y.offset, 0.f);
      } else if (crop == CropMode::kCenter) {
        EXPECT_EQ(p.y.size, 375);
        EXPECT_NEAR(p.x.offset * p.x.scale, c.left, 1e-3);
        EXPECT_EQ(p.x.offset, std::round(p.x.offset));  // the crop starts on a resized pixel
      }
      // Every output's taps fall inside the window.
      for (const auto* m : {&p.y, &p.x}) {
        const int32_t len = m == &p.y ? int32_t(p.roi_h) : int32_t(p.roi_w);
        for (int32_t i = 0; i < 224; ++i) {
          int32_t a, b;
          float cc, w;
          gpu::AxisTaps(*m, i, &a, &b, &cc, &w);
          ASSERT_GE(a - m->shift, 0);
          ASSERT_LE(b - m->shift, len);
          ASSERT_LT(a, b);
        }
      }
    }
    EXPECT_GT(flips, 60);
    EXPECT_LT(flips, 140);
  }
}

TEST(GpuCrop, SameSampleSamePlanOtherEpochOtherPlan) {
  const DecodeOptions o = Augment(CropMode::kRandomResized);
  const GpuCropPlan a = PlanGpuCrop(o, 375, 500, {1, 0, 42});
  const GpuCropPlan b = PlanGpuCrop(o, 375, 500, {1, 0, 42});
  const GpuCropPlan c = PlanGpuCrop(o, 375, 500, {1, 1, 42});
  EXPECT_EQ(std::memcmp(&a.y, &b.y, sizeof a.y), 0);
  EXPECT_EQ(a.roi_x, b.roi_x);
  EXPECT_TRUE(a.roi_x != c.roi_x || a.roi_y != c.roi_y || a.roi_w != c.roi_w);
}

// ---- the kernel's arithmetic (CPU reference) -------------------------------

// The test images of the torchvision comparison below (channel-wise
// patterns, HWC).
std::vector<uint8_t> Pattern(int h, int w) {
  std::vector<uint8_t> p(size_t(h) * w * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* q = &p[(size_t(y) * w + x) * 3];
      q[0] = uint8_t((x * 37 + y * 11) % 256);
      q[1] = uint8_t((x * 5 + y * 53) % 256);
      q[2] = uint8_t((x * x * 3 + y * 7) % 256);
    }
  }
  return p;
}

gpu::ImageJob WholeImageJob(const std::vector<uint8_t>& src, int h, int w, int oh, int ow) {
  gpu::ImageJob j;
  j.src = src.data();
  j.pitch = uint64_t(w) * 3;
  j.src_h = h;
  j.src_w = w;
  j.y = {float(h) / float(oh), 0, h, 0};
  j.x = {float(w) / float(ow), 0, w, 0};
  return j;
}

std::vector<uint8_t> RunReference(const gpu::ImageJob& j, const gpu::OutputSpec& o) {
  std::vector<uint8_t> out(size_t(o.height) * o.width * 3 * gpu::OutTypeSize(o.type));
  gpu::FusedResizeReference(j, o, out.data());
  return out;
}

// Expected values: torch.nn.functional.interpolate(x, size, mode="bilinear",
// antialias=True, align_corners=False) in float32 (torch 1.13), rounded
// half up, HWC; the images are Pattern(h, w).
TEST(FusedResizeReference, MatchesTorchvisionAntialiasedBilinear) {
  struct Case {
    int h, w, oh, ow;
    std::vector<int> want;
  } cases[] = {
      {7, 9, 3, 4, {40,  50,  10,  115, 60, 33,  181, 71,  88,  70,  81, 162,
                    64,  148, 25,  139, 158, 48, 184, 170, 103, 78,  180, 177,
                    87,  76,  40,  162, 86,  63, 160, 97,  118, 66,  107, 192}},
      {10, 6, 4, 5, {19,  54,  8,   61,  60,  13,  104, 66,  27,  146, 71,  48,  188, 77,  76,
                     44,  142, 23,  86,  148, 29,  128, 154, 42,  170, 159, 63,  213, 165, 92,
                     71,  81,  41,  114, 87,  47,  156, 92,  60,  198, 98,  81,  192, 104, 110,
                     96,  169, 57,  138, 175, 62,  180, 180, 75,  223, 186, 96,  73,  192, 125}},
  };
  for (const Case& c : cases) {
    const auto src = Pattern(c.h, c.w);
    gpu::OutputSpec o;
    o.height = c.oh;
    o.width = c.ow;
    const auto out = RunReference(WholeImageJob(src, c.h, c.w, c.oh, c.ow), o);
    ASSERT_EQ(out.size(), c.want.size());
    int worst = 0;
    for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(out[i] - c.want[i]));
    // torch keeps float32 and rounds once, as the reference; sums in
    // another order may still land a tie on the other side.
    EXPECT_LE(worst, 1) << c.h << "x" << c.w << " -> " << c.oh << "x" << c.ow;
  }
}

TEST(FusedResizeReference, SameSizeIsACopyAndUpscalingIsBilinear) {
  const auto src = Pattern(6, 8);
  gpu::OutputSpec o;
  o.height = 6;
  o.width = 8;
  EXPECT_EQ(RunReference(WholeImageJob(src, 6, 8, 6, 8), o), src);
  // 2x upscaling, half-pixel centres: output 1 of a row sits at 0.75 of
  // source 0 and 0.25 of source 1 (away from the clamped edges).
  std::vector<uint8_t> two = {0, 0, 0, 200, 100, 40};  // 1 x 2 pixels
  o.height = 1;
  o.width = 4;
  const auto up = RunReference(WholeImageJob(two, 1, 2, 1, 4), o);
  EXPECT_EQ(up[0], 0);
  EXPECT_EQ(up[3], 50);  // 0.75 * 0 + 0.25 * 200
  EXPECT_EQ(up[6], 150);
  EXPECT_EQ(up[9], 200);
}

TEST(FusedResizeReference, FlipNormalizeTypesAndLayouts) {
  const auto src = Pattern(5, 7);
  gpu::OutputSpec o;
  o.height = 5;
  o.width = 7;
  auto j = WholeImageJob(src, 5, 7, 5, 7);
  j.flip = 1;
  const auto flipped = RunReference(j, o);
  for (int y = 0; y < 5; ++y) {
    for (int x = 0; x < 7; ++x) {
      for (int c = 0; c < 3; ++c) {
        ASSERT_EQ(flipped[(y * 7 + x) * 3 + c], src[(y * 7 + (6 - x)) * 3 + c]);
      }
    }
  }
  j.flip = 0;
  o.normalize = 1;
  const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
  std::memcpy(o.mean, mean, sizeof mean);
  std::memcpy(o.std, sd, sizeof sd);
  for (auto type : {gpu::OutType::kFloat32, gpu::OutType::kFloat16, gpu::OutType::kBFloat16}) {
    for (uint8_t nchw : {0, 1}) {
      o.type = type;
      o.nchw = nchw;
      const auto out = RunReference(j, o);
      for (int y = 0; y < 5; ++y) {
        for (int x = 0; x < 7; ++x) {
          for (int c = 0; c < 3; ++c) {
            const float want = (float(src[(y * 7 + x) * 3 + c]) / 255.0f - mean[c]) / sd[c];
            const size_t i = nchw ? (size_t(c) * 5 + y) * 7 + x : (size_t(y) * 7 + x) * 3 + c;
            float got;
            if (type == gpu::OutType::kFloat32) {
              std::memcpy(&got, out.data() + 4 * i, 4);
              ASSERT_EQ(got, want);
            } else if (type == gpu::OutType::kFloat16) {
              uint16_t h;
              std::memcpy(&h, out.data() + 2 * i, 2);
              ASSERT_EQ(h, FloatToHalf(want));
            } else {
              uint16_t b;
              std::memcpy(&b, out.data() + 2 * i, 2);
              const uint32_t bits = uint32_t(b) << 16;
              std::memcpy(&got, &bits, 4);
              ASSERT_NEAR(got, want, std::abs(want) / 128 + 1e-6);
            }
          }
        }
      }
    }
  }
  // bfloat16 rounds to nearest even: 1 + 2^-8 (a tie) goes to 1, 1 + 3 *
  // 2^-8 up to 1 + 2^-6.
  EXPECT_EQ(gpu::FloatBitsToBFloat16(0x3f808000u), 0x3f80);
  EXPECT_EQ(gpu::FloatBitsToBFloat16(0x3f818000u), 0x3f82);
}

// How close the GPU path's pixels are to the CPU path's, on the same crop:
// the reference resampling a full-size decode of the window vs DecodeSample
// (DCT-scaled decode, then bilinear without antialias). Recorded for the
// docs; asserted loosely.
TEST(FusedResizeReference, CloseToTheCpuPathOnTheSameCrop) {
  const auto jpeg = Jpeg(375, 500, Kind::k420);
  DecodeOptions o = Augment(CropMode::kRandomResized);
  tjhandle tj = tjInitDecompress();
  std::vector<uint8_t> full(size_t(375) * 500 * 3);
  ASSERT_EQ(tjDecompress2(tj, reinterpret_cast<const unsigned char*>(jpeg.data()), jpeg.size(),
                          full.data(), 500, 0, 375, TJPF_RGB, TJFLAG_ACCURATEDCT),
            0);
  tjDestroy(tj);
  double total = 0;
  int worst_mean = 0;
  DecodeScratch scratch;
  for (uint64_t id = 0; id < 20; ++id) {
    const SampleKey key{5, 0, id};
    const GpuCropPlan p = PlanGpuCrop(o, 375, 500, key);
    gpu::ImageJob j;
    j.src = full.data() + (size_t(p.roi_y) * 500 + p.roi_x) * 3;
    j.pitch = 500 * 3;
    j.src_h = int32_t(p.roi_h);
    j.src_w = int32_t(p.roi_w);
    j.y = p.y;
    j.x = p.x;
    j.flip = p.flip;
    gpu::OutputSpec spec;
    spec.height = spec.width = 224;
    const auto gpu_pixels = RunReference(j, spec);
    std::vector<std::byte> cpu(DecodedSampleBytes(o));
    ASSERT_TRUE(DecodeSample(o, jpeg, key, cpu, &scratch).ok());
    double diff = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      diff += std::abs(int(gpu_pixels[i]) - int(uint8_t(cpu[i])));
    }
    diff /= double(cpu.size());
    total += diff;
    worst_mean = std::max(worst_mean, int(std::ceil(diff)));
  }
  std::printf("GPU reference vs CPU path, 20 RandomResizedCrops of a 500x375 4:2:0 JPEG: "
              "mean |diff| %.2f grey levels (worst image %d)\n",
              total / 20, worst_mean);
  EXPECT_LT(total / 20, 3.0);
}

// The same on the loader tests' synthetic photos (noise on colour waves,
// SynthesizeImageFolder) at 64x64: the figure GpuDecodeLoader.OnTheGpu's
// bound allows for, before nvJPEG's own IDCT differences.
TEST(FusedResizeReference, CloseToTheCpuPathOnSyntheticPhotos) {
  testing::TempDir d;
  SynthOptions so;
  so.images = 16;
  so.classes = 1;
  so.mean_bytes = 30000;
  ASSERT_TRUE(SynthesizeImageFolder((d.path() / "img").string(), so).ok());
  DecodeOptions o = Augment(CropMode::kRandomResized);
  o.height = o.width = 64;
  DecodeScratch scratch;
  double total = 0;
  size_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(d.path() / "img")) {
    if (!e.is_regular_file()) continue;
    const auto jpeg = testing::ReadFile(e.path());
    auto h = ParseJpegHeader(jpeg);
    ASSERT_TRUE(h.ok());
    std::vector<uint8_t> full(size_t(h->height) * h->width * 3);
    tjhandle tj = tjInitDecompress();
    ASSERT_EQ(tjDecompress2(tj, reinterpret_cast<const unsigned char*>(jpeg.data()), jpeg.size(),
                            full.data(), int(h->width), 0, int(h->height), TJPF_RGB,
                            TJFLAG_ACCURATEDCT),
              0);
    tjDestroy(tj);
    const SampleKey key{9, 0, n};
    const GpuCropPlan p = PlanGpuCrop(o, h->height, h->width, key);
    gpu::ImageJob j;
    j.src = full.data() + (size_t(p.roi_y) * h->width + p.roi_x) * 3;
    j.pitch = uint64_t(h->width) * 3;
    j.y = p.y;
    j.x = p.x;
    j.flip = p.flip;
    gpu::OutputSpec spec;
    spec.height = spec.width = 64;
    const auto gpu_pixels = RunReference(j, spec);
    std::vector<std::byte> cpu(DecodedSampleBytes(o));
    ASSERT_TRUE(DecodeSample(o, jpeg, key, cpu, &scratch).ok());
    double diff = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      diff += std::abs(int(gpu_pixels[i]) - int(uint8_t(cpu[i])));
    }
    total += diff / double(cpu.size());
    ++n;
  }
  std::printf("GPU reference vs CPU path, %zu synthetic photos, RandomResizedCrop to 64x64: "
              "mean |diff| %.2f grey levels\n",
              n, total / double(n));
  EXPECT_LT(total / double(n), 4.0);
}

// bfloat16 on the CPU path (the fallback of a GPU decode delivering
// bfloat16): float32's value rounded as the kernel rounds it.
TEST(DecodeBFloat16, CpuPathRoundsFloat32AsTheKernel) {
  const auto jpeg = Jpeg(120, 160, Kind::k420);
  DecodeOptions o = Augment(CropMode::kRandomResized);
  o.height = o.width = 32;
  o.normalize = true;
  o.layout = ImageLayout::kNCHW;
  o.dtype = ImageDType::kFloat32;
  ASSERT_TRUE(ValidateDecodeOptions(o).ok());
  DecodeScratch scratch;
  std::vector<std::byte> f32(DecodedSampleBytes(o));
  ASSERT_TRUE(DecodeSample(o, jpeg, {2, 0, 5}, f32, &scratch).ok());
  o.dtype = ImageDType::kBFloat16;
  ASSERT_TRUE(ValidateDecodeOptions(o).ok());
  EXPECT_EQ(DecodedSampleBytes(o), size_t(32) * 32 * 3 * 2);
  std::vector<std::byte> bf(DecodedSampleBytes(o));
  ASSERT_TRUE(DecodeSample(o, jpeg, {2, 0, 5}, bf, &scratch).ok());
  for (size_t i = 0; i < size_t(32) * 32 * 3; ++i) {
    uint32_t bits;
    std::memcpy(&bits, f32.data() + 4 * i, 4);
    uint16_t got;
    std::memcpy(&got, bf.data() + 2 * i, 2);
    ASSERT_EQ(got, gpu::FloatBitsToBFloat16(bits)) << i;
  }
  o.dtype = ImageDType(4);
  EXPECT_EQ(ValidateDecodeOptions(o).code(), Code::kInvalidArgument);
}

// ---- nvJPEG ---------------------------------------------------------------

TEST(Nvjpeg, CandidatesStartWithTheEnvironmentThenTheSonames) {
  setenv("STOKER_NVJPEG_PATH", "/nowhere/libnvjpeg.so.13", 1);
  auto c = gpu::nvj::NvjpegCandidates();
  unsetenv("STOKER_NVJPEG_PATH");
  ASSERT_GE(c.size(), 3u);
  EXPECT_EQ(c[0], "/nowhere/libnvjpeg.so.13");
  EXPECT_EQ(c[1], "libnvjpeg.so.13");
  EXPECT_EQ(c[2], "libnvjpeg.so.12");
  setenv("STOKER_NVJPEG_PATH", "/tmp", 1);  // a folder: the sonames in it
  c = gpu::nvj::NvjpegCandidates();
  unsetenv("STOKER_NVJPEG_PATH");
  EXPECT_EQ(c[0], "/tmp/libnvjpeg.so.13");
  EXPECT_EQ(c[1], "/tmp/libnvjpeg.so.12");
}

TEST(Nvjpeg, AbsentSaysWhatItTriedOrLoadsAndBinds) {
  auto api = gpu::nvj::LoadNvjpeg();
  if (api.ok()) {
    std::printf("nvJPEG %d.%d.%d at %s\n", (*api)->major, (*api)->minor, (*api)->patch,
                (*api)->path.c_str());
    EXPECT_GE((*api)->major, gpu::nvj::kMinMajor);
    EXPECT_NE((*api)->DecodeBatchedEx, nullptr);
    return;
  }
  EXPECT_EQ(api.status().code(), Code::kUnsupported);
  EXPECT_EQ(api.status().message().rfind("no nvJPEG (tried libnvjpeg.so.13, libnvjpeg.so.12", 0),
            0u)
      << api.status().ToString();
  EXPECT_NE(api.status().message().find("STOKER_NVJPEG_PATH"), std::string::npos);
  // The same answer every time (loaded once).
  EXPECT_EQ(gpu::nvj::LoadNvjpeg().status().message(), api.status().message());
}

TEST(Nvjpeg, StatusMapping) {
  using namespace gpu::nvj;
  EXPECT_EQ(NvjpegStatus(0, "x", kSuccess).code(), Code::kOk);
  EXPECT_EQ(NvjpegStatus(0, "x", kBadJpeg).code(), Code::kCorruption);
  EXPECT_EQ(NvjpegStatus(0, "x", kAllocatorFailure).code(), Code::kNoSpace);
  EXPECT_EQ(NvjpegStatus(0, "x", kJpegNotSupported).code(), Code::kUnsupported);
  const auto st = NvjpegStatus(1, "nvjpegDecode(sample 3)", kExecutionFailed);
  EXPECT_EQ(st.code(), Code::kIoError);
  EXPECT_EQ(st.message(), "cuda:1: nvjpegDecode(sample 3): NVJPEG_STATUS_EXECUTION_FAILED");
}

// ---- on a GPU ---------------------------------------------------------------

#ifdef STOKER_HAVE_CUDA
Status GpuPresent() { return GetCudaDevice(0).status(); }
#else
Status GpuPresent() { return Unsupported("built without CUDA"); }
#endif

// The kernel writes exactly what its reference computes, for every output
// type and layout, crops with flips, up- and downscaling, in one launch.
TEST(FusedResizeKernel, EqualsItsReferenceOnTheGpu) {
  if (Status st = GpuPresent(); !st.ok()) {
    GTEST_SKIP() << "needs a CUDA GPU, and this machine has none usable: " << st.ToString();
  }
  if (!gpu::FusedKernelAvailable()) GTEST_SKIP() << "this build has no kernel (no nvcc)";
#ifdef STOKER_HAVE_CUDA
  const DecodeOptions o = Augment(CropMode::kRandomResized);
  const auto full = Picture(375, 500);
  uint8_t* d_src = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_src), full.size()), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_src, full.data(), full.size(), cudaMemcpyHostToDevice), cudaSuccess);
  constexpr int kImages = 24;
  for (auto type : {gpu::OutType::kUInt8, gpu::OutType::kFloat32, gpu::OutType::kFloat16,
                    gpu::OutType::kBFloat16}) {
    for (uint8_t nchw : {0, 1}) {
      gpu::OutputSpec spec;
      spec.height = 224;
      spec.width = 224;
      spec.type = type;
      spec.nchw = nchw;
      spec.normalize = type != gpu::OutType::kUInt8;
      const size_t image_bytes = size_t(224) * 224 * 3 * gpu::OutTypeSize(type);
      std::vector<gpu::ImageJob> host_jobs(kImages), dev_jobs(kImages);
      for (int i = 0; i < kImages; ++i) {
        // Half the images come out of a small window (upscaling).
        const GpuCropPlan p = PlanGpuCrop(o, i % 2 ? 375 : 60, i % 2 ? 500 : 80, {3, 0, uint64_t(i)});
        gpu::ImageJob j;
        j.pitch = 500 * 3;
        j.src_h = int32_t(p.roi_h);
        j.src_w = int32_t(p.roi_w);
        j.y = p.y;
        j.x = p.x;
        j.flip = p.flip;
        j.out_offset = uint64_t(i) * image_bytes;
        host_jobs[i] = j;
        host_jobs[i].src = full.data() + (size_t(p.roi_y) * 500 + p.roi_x) * 3;
        dev_jobs[i] = j;
        dev_jobs[i].src = d_src + (size_t(p.roi_y) * 500 + p.roi_x) * 3;
      }
      gpu::ImageJob* d_jobs = nullptr;
      void* d_out = nullptr;
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_jobs), sizeof(gpu::ImageJob) * kImages),
                cudaSuccess);
      ASSERT_EQ(cudaMalloc(&d_out, image_bytes * kImages), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d_jobs, dev_jobs.data(), sizeof(gpu::ImageJob) * kImages,
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      Status st = gpu::LaunchFusedResize(0, d_jobs, kImages, spec, d_out, kLegacyDefaultStream);
      ASSERT_TRUE(st.ok()) << st.ToString();
      std::vector<uint8_t> got(image_bytes * kImages), want(image_bytes * kImages);
      ASSERT_EQ(cudaMemcpy(got.data(), d_out, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      for (int i = 0; i < kImages; ++i) gpu::FusedResizeReference(host_jobs[i], spec, want.data());
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
      EXPECT_EQ(differ, 0u) << "type " << int(type) << " nchw " << int(nchw);
      cudaFree(d_jobs);
      cudaFree(d_out);
    }
  }
  cudaFree(d_src);
#endif
}


// cpu_share: that fraction of the GPU's images stays with the workers,
// chosen per sample, the same every time.
TEST(GpuDecodeList, CpuShareKeepsAFractionOnTheCpuChosenPerSample) {
  DecodeOptions o = Augment(CropMode::kRandomResized);
  o.cpu_share = 0.3f;
  ASSERT_TRUE(ValidateDecodeOptions(o).ok());
  const auto good = Jpeg(120, 160, Kind::k420);
  auto where = [] { return std::string("sample"); };
  constexpr size_t kSamples = 2000;
  GpuDecodeList a(&o, GpuDecodeCaps{true, true}, kSamples, 0, DecodedSampleBytes(o));
  GpuDecodeList b(&o, GpuDecodeCaps{true, true}, kSamples, 0, DecodedSampleBytes(o));
  size_t kept = 0;
  for (size_t i = 0; i < kSamples; ++i) {
    const bool x = a.Take(i, good, {4, 2, i}, where);
    EXPECT_EQ(x, b.Take(i, good, {4, 2, i}, where));
    kept += !x;
  }
  EXPECT_NEAR(double(kept) / kSamples, 0.3, 0.04);
  o.cpu_share = 1.5f;
  EXPECT_EQ(ValidateDecodeOptions(o).code(), Code::kInvalidArgument);
  o.cpu_share = 0.3f;
  o.worker_nice = 19;
  EXPECT_TRUE(ValidateDecodeOptions(o).ok());
  o.worker_nice = 20;
  const Status nice = ValidateDecodeOptions(o);
  EXPECT_EQ(nice.code(), Code::kInvalidArgument);
  EXPECT_NE(nice.message().find("worker_nice 20"), std::string::npos) << nice.ToString();
}

// A batch's list takes the share it was given (the balance's current one),
// not the options' fixed cpu_share.
TEST(GpuDecodeList, ABatchKeepsTheShareItWasGiven) {
  DecodeOptions o = Augment(CropMode::kRandomResized);
  o.cpu_share = 0.0f;
  const auto good = Jpeg(120, 160, Kind::k420);
  auto where = [] { return std::string("sample"); };
  constexpr size_t kSamples = 2000;
  GpuDecodeList all(&o, GpuDecodeCaps{true, true}, kSamples, 0, DecodedSampleBytes(o));
  GpuDecodeList half(&o, GpuDecodeCaps{true, true}, kSamples, 0, DecodedSampleBytes(o), 0.5f);
  size_t left_all = 0, left_half = 0;
  for (size_t i = 0; i < kSamples; ++i) {
    left_all += !all.Take(i, good, {4, 2, i}, where);
    left_half += !half.Take(i, good, {4, 2, i}, where);
  }
  EXPECT_EQ(left_all, 0u);
  EXPECT_NEAR(double(left_half) / kSamples, 0.5, 0.04);
}

// cpu_share_balance's rule: down while the copier waits for the workers,
// up while built batches wait for the GPU, held in between, within
// [0, 0.95]; and it settles where the two rates meet. A model: the workers
// build a batch in w(s) = 1 + 3 s (the CPU decodes share s of it), the GPU
// stage takes g(s) = 2.5 (1 - s); the copier finds batches waiting when
// the workers are faster.
TEST(CpuShareBalance, MovesTowardsWhereNeitherPathWaits) {
  EXPECT_FLOAT_EQ(CpuShareStep(0.30f, 0), 0.29f);
  EXPECT_FLOAT_EQ(CpuShareStep(0.30f, 1), 0.30f);
  EXPECT_FLOAT_EQ(CpuShareStep(0.30f, 2), 0.31f);
  EXPECT_FLOAT_EQ(CpuShareStep(0.0f, 0), 0.0f);
  EXPECT_FLOAT_EQ(CpuShareStep(0.95f, 5), 0.95f);
  for (const float start : {0.0f, 0.9f}) {
    float s = start;
    double backlog = 0;  // built batches waiting for the GPU stage
    double sum = 0, lo = 1, hi = 0;
    for (int b = 0; b < 2000; ++b) {
      const double workers = 1 + 3 * s, gpu = 2.5 * (1 - s);  // seconds a batch
      backlog = std::clamp(backlog + gpu / workers - 1, 0.0, 4.0);
      s = CpuShareStep(s, backlog < 0.5 ? 0 : backlog < 1.5 ? 1 : 2);
      if (b >= 1000) sum += s, lo = std::min<double>(lo, s), hi = std::max<double>(hi, s);
    }
    // w(s) = g(s) at s = 1.5 / 5.5 = 0.273: the share cycles around it (the
    // backlog lags the share), by about +-0.06 in this model.
    EXPECT_NEAR(sum / 1000, 0.273, 0.02) << "from " << start;
    EXPECT_GT(lo, 0.273 - 0.08) << "from " << start;
    EXPECT_LT(hi, 0.273 + 0.08) << "from " << start;
  }
}

// The epoch's first batch and its last `lookahead` + 1 tell the balance
// nothing; in between, the built queue's state is the observation.
TEST(CpuShareBalance, TheEpochsEdgesDoNotMoveTheShare) {
  constexpr uint64_t kBatches = 24;
  constexpr size_t kAhead = 6;
  EXPECT_EQ(CpuShareObservation(0, kBatches, kAhead, false, false), -1);
  EXPECT_EQ(CpuShareObservation(1, kBatches, kAhead, false, false), 0);
  EXPECT_EQ(CpuShareObservation(1, kBatches, kAhead, true, false), 1);
  EXPECT_EQ(CpuShareObservation(1, kBatches, kAhead, true, true), 2);
  EXPECT_EQ(CpuShareObservation(16, kBatches, kAhead, true, true), 2);
  for (uint64_t b = 17; b < kBatches; ++b) {
    EXPECT_EQ(CpuShareObservation(b, kBatches, kAhead, true, true), -1) << b;
  }
  // A queue of one cannot show two built batches.
  EXPECT_EQ(CpuShareObservation(5, kBatches, 1, true, true), 1);
  // Too short an epoch to observe at all.
  for (uint64_t b = 0; b < 4; ++b) EXPECT_EQ(CpuShareObservation(b, 4, kAhead, true, true), -1);
  // Balanced rates (the copier finds a backlog, then waits, in turn) with
  // the tail's backlog and the first batch's wait of every epoch: the share
  // stays where it was (counting the tail, it went up by 0.07 an epoch).
  float s = 0.3f;
  for (int epoch = 0; epoch < 20; ++epoch) {
    for (uint64_t b = 0; b < kBatches; ++b) {
      const bool tail = b + kAhead >= kBatches, backlog = b > 0 && (tail || b % 2 == 0);
      const int r = CpuShareObservation(b, kBatches, kAhead, backlog, backlog);
      if (r >= 0) s = CpuShareStep(s, r);
    }
  }
  EXPECT_NEAR(s, 0.3f, 0.001f);
}

// ---- the loader -------------------------------------------------------------

// The workers' side: what a batch leaves for the GPU, and what stays on
// the CPU (not for nvJPEG, no EOI, not a JPEG).
TEST(GpuDecodeList, TakesWhatTheGpuDecodesAndLeavesTheRest) {
  const DecodeOptions o = Augment(CropMode::kRandomResized);
  GpuDecodeList list(&o, GpuDecodeCaps{true, true}, 5, 4096, DecodedSampleBytes(o));
  auto where = [] { return std::string("dataset d: shard 0: sample 1: field 'image'"); };
  const auto good = Jpeg(375, 500, Kind::k420), prog = Jpeg(375, 500, Kind::kProgressive);
  auto cut = good;
  cut.resize(cut.size() / 2);
  EXPECT_TRUE(list.Take(0, good, {1, 0, 10}, where));
  EXPECT_TRUE(list.Take(1, prog, {1, 0, 11}, where));
  EXPECT_FALSE(list.Take(2, Jpeg(375, 500, Kind::kCmyk), {1, 0, 12}, where));
  EXPECT_FALSE(list.Take(3, cut, {1, 0, 13}, where));
  const std::vector<std::byte> junk(100, std::byte{7});
  EXPECT_FALSE(list.Take(4, junk, {1, 0, 14}, where));
  EXPECT_EQ(list.taken(), 2u);
  const auto& e = list.entries();
  EXPECT_EQ(e[0].backend, DecodeBackend::kHardware);
  EXPECT_EQ(e[1].backend, DecodeBackend::kCuda);
  EXPECT_FALSE(e[2].used);
  EXPECT_EQ(e[0].jpeg.size(), good.size());
  EXPECT_EQ(e[0].where, where());
  const GpuCropPlan p = PlanGpuCrop(o, 375, 500, {1, 0, 10});
  EXPECT_EQ(e[0].plan.roi_x, p.roi_x);
  EXPECT_EQ(e[0].plan.flip, p.flip);
  EXPECT_EQ(list.column_offset(), 4096u);
}

// An image folder of `n` JPEGs packed into a dataset under `dir`.
std::string PackedImages(const std::filesystem::path& dir, uint32_t n) {
  SynthOptions so;
  so.images = n;
  so.classes = 3;
  so.mean_bytes = 30000;
  EXPECT_TRUE(SynthesizeImageFolder((dir / "img").string(), so).ok());
  const std::string uri = (dir / "ds").string();
  EXPECT_TRUE(Pack((dir / "img").string(), uri, PackOptions{}).ok());
  return uri;
}

LoaderOptions DecodingLoader(const std::string& device) {
  LoaderOptions o;
  o.batch_size = 8;
  o.seed = 11;
  o.threads = 2;
  o.decode = Augment(CropMode::kRandomResized);
  o.decode.height = o.decode.width = 64;
  o.decode.device = device;
  return o;
}

// One epoch's image bytes, in plan order (host memory).
std::vector<uint8_t> EpochImages(Loader& l) {
  std::vector<uint8_t> all;
  while (true) {
    auto b = l.Next();
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
      break;
    }
    const auto* img = b->image("image");
    const auto* p = reinterpret_cast<const uint8_t*>(img->data.data());
    all.insert(all.end(), p, p + img->data.size());
  }
  return all;
}

TEST(GpuDecodeLoader, DecodeDeviceMustBeTheDeliveryDevice) {
  testing::TempDir d;
  const std::string uri = PackedImages(d.path(), 8);
  LoaderOptions o = DecodingLoader("cuda:1");
  o.device = "cuda:0";
  auto l = Loader::Open(uri, o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kInvalidArgument);
  EXPECT_NE(l.status().message().find("decode device cuda:1 is not the device batches go to"),
            std::string::npos)
      << l.status().ToString();
  o = DecodingLoader("gpu0");
  l = Loader::Open(uri, o);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("decode device"), std::string::npos)
      << l.status().ToString();
}

// Without nvJPEG (or a GPU) the loader says why, decodes on the CPU and
// delivers where it would have without the decode device: the same bytes
// as a loader that never asked for the GPU.
TEST(GpuDecodeLoader, WithoutNvjpegTheCpuPathRunsWithIdenticalOutput) {
  if (gpu::JpegDecoder::Probe(0).ok()) {
    GTEST_SKIP() << "this machine can decode on cuda:0 (GpuDecodeLoader.OnTheGpu covers it)";
  }
  testing::TempDir d;
  const std::string uri = PackedImages(d.path(), 40);
  auto cpu = Loader::Open(uri, DecodingLoader(""));
  auto gpu = Loader::Open(uri, DecodingLoader("cuda:0"));
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  const auto a = EpochImages(**cpu), b = EpochImages(**gpu);
  ASSERT_EQ(a.size(), size_t(40) * 64 * 64 * 3);
  EXPECT_TRUE(a == b);
  const LoaderStats s = (*gpu)->stats();
  EXPECT_EQ(s.decode_path.rfind("cpu (decode device cuda:0: ", 0), 0u) << s.decode_path;
  EXPECT_NE(s.decode_path.find(gpu::nvj::LoadNvjpeg().ok() ? "" : "no nvJPEG (tried"),
            std::string::npos)
      << s.decode_path;
  EXPECT_EQ(s.decoded_cpu, 40u);
  EXPECT_EQ(s.decoded_hardware + s.decoded_cuda, 0u);
  EXPECT_EQ((*cpu)->stats().decode_path, "cpu");
  EXPECT_EQ((*cpu)->stats().decoded_cpu, 40u);
}

// A truncated JPEG fails the batch with the CPU path's own error (dataset,
// shard, sample, field), whichever path runs; with skip_corrupt it is
// zero-filled and counted.
TEST(GpuDecodeLoader, ACorruptJpegIsTheCpuPathsError) {
  testing::TempDir d;
  SynthOptions so;
  so.images = 12;
  so.classes = 1;
  so.mean_bytes = 30000;
  ASSERT_TRUE(SynthesizeImageFolder((d.path() / "img").string(), so).ok());
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(d.path() / "img")) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty());
  auto bytes = testing::ReadFile(files[3]);
  bytes.resize(bytes.size() * 2 / 5);  // the header stays whole
  testing::WriteFile(files[3], bytes);
  const std::string uri = (d.path() / "ds").string();
  ASSERT_TRUE(Pack((d.path() / "img").string(), uri, PackOptions{}).ok());
  const bool gpu = gpu::JpegDecoder::Probe(0).ok();
  auto first_error = [&](const std::string& decode_device, bool skip, uint64_t* skipped) {
    LoaderOptions o = DecodingLoader(decode_device);
    o.decode.crop = CropMode::kResize;  // every row is needed: the cut always shows
    o.decode.skip_corrupt = skip;
    if (!decode_device.empty() && gpu) o.device = decode_device;
    auto l = Loader::Open(uri, o);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (!l.ok()) return l.status();
    while (true) {
      auto b = (*l)->Next();
      if (!b.ok()) {
        *skipped = (*l)->stats().decode_skipped;
        return b.status();
      }
    }
  };
  uint64_t skipped = 0;
  const Status cpu = first_error("", false, &skipped);
  const Status other = first_error("cuda:0", false, &skipped);
  ASSERT_EQ(cpu.code(), Code::kCorruption) << cpu.ToString();
  EXPECT_NE(cpu.message().find("sample"), std::string::npos) << cpu.ToString();
  EXPECT_NE(cpu.message().find("field 'image'"), std::string::npos) << cpu.ToString();
  EXPECT_EQ(other.ToString(), cpu.ToString());
  const Status skipping = first_error("cuda:0", true, &skipped);
  EXPECT_EQ(skipping.code(), Code::kOutOfRange) << skipping.ToString();
  EXPECT_EQ(skipped, 1u);
}

#ifdef STOKER_HAVE_CUDA
// Thread id -> nice, of this process's threads (/proc/self/task/*/stat,
// field 19).
std::map<int, int> ThreadNices() {
  std::map<int, int> out;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream in(t.path() / "stat");
    std::string line;
    std::getline(in, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(line.substr(paren + 2));
    std::string field;
    // After the name: state is field 3, nice field 19.
    for (int k = 3; k < 19 && rest >> field; ++k) {
    }
    int n = 0;
    if (rest >> n) out[std::stoi(t.path().filename().string())] = n;
  }
  return out;
}

// On a GPU with nvJPEG: every image decoded on the GPU (the synthetic set
// is baseline 4:2:0), within a few grey levels of the CPU path on the same
// crops, device memory flat over epochs.
TEST(GpuDecodeLoader, OnTheGpu) {
  if (Status st = gpu::JpegDecoder::Probe(0); !st.ok()) {
    GTEST_SKIP() << "the GPU decode cannot run here: " << st.ToString();
  }
  testing::TempDir d;
  const std::string uri = PackedImages(d.path(), 64);
  auto cpu = Loader::Open(uri, DecodingLoader(""));
  auto gpu = Loader::Open(uri, DecodingLoader("cuda:0"));
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  std::printf("decode path: %s\n", (*gpu)->stats().decode_path.c_str());
  {
    // The workers run behind the copier (DecodeOptions::worker_nice), the
    // process's other threads where they were. Open started them; each
    // lowers itself first thing.
    const int base = ThreadNices().at(int(gettid()));
    int lowered = 0;
    size_t threads = 0;
    for (int k = 0; k < 2000 && lowered < 2; ++k) {
      const std::map<int, int> nice = ThreadNices();
      threads = nice.size();
      lowered = int(std::count_if(nice.begin(), nice.end(), [&](const auto& t) {
        return t.second == base + int(DecodeOptions{}.worker_nice);
      }));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(lowered, 2) << "workers (threads = 2) at nice " << base << " + 5, of " << threads
                          << " threads";
  }
  const auto want = EpochImages(**cpu);
  std::vector<uint8_t> got;
  while (true) {
    auto b = (*gpu)->Next();
    if (!b.ok()) {
      ASSERT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
      break;
    }
    ASSERT_NE(b->device(), nullptr);
    ASSERT_TRUE(b->device()->Synchronize().ok());
    const auto* img = b->image("image");
    std::vector<uint8_t> host(img->data.size());
    ASSERT_EQ(cudaMemcpy(host.data(), b->device_pointer(img->data.data()), host.size(),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    got.insert(got.end(), host.begin(), host.end());
  }
  ASSERT_EQ(got.size(), want.size());
  double diff = 0;
  for (size_t i = 0; i < got.size(); ++i) diff += std::abs(int(got[i]) - int(want[i]));
  diff /= double(got.size());
  const LoaderStats s = (*gpu)->stats();
  std::printf("GPU vs CPU path: mean |diff| %.2f grey levels; hardware %llu, cuda %llu, cpu %llu\n",
              diff, (unsigned long long)s.decoded_hardware, (unsigned long long)s.decoded_cuda,
              (unsigned long long)s.decoded_cpu);
  EXPECT_LT(diff, 3.0);
  EXPECT_EQ(s.decoded_hardware + s.decoded_cuda, 64u);

  // Device memory stays within the budget over 50 epochs (batches, nvJPEG
  // and the decoded windows together), and does not grow. On images of
  // many sizes it rises in steps as batches of larger images (and, in
  // nvJPEG's own buffers, larger bitstreams) come, up to a bound: +29% by
  // epoch 29 in 4 of 10 runs on the H200 (10.2 MB, budget 128 MiB). A
  // leak shows without that noise on 64 copies of one JPEG, where each
  // batch needs the same memory whatever the shuffle and the crops.
  const std::filesystem::path same = d.path() / "same";
  const auto one = Jpeg(375, 500, Kind::k420);
  for (int i = 0; i < 64; ++i) {
    testing::WriteFile(same / "img" / ("c" + std::to_string(i % 2)) / (std::to_string(i) + ".jpg"),
                       one);
  }
  ASSERT_TRUE(Pack((same / "img").string(), (same / "ds").string(), PackOptions{}).ok());
  LoaderOptions bounded = DecodingLoader("cuda:0");
  bounded.device_memory_budget = 128ull << 20;
  auto l = Loader::Open((same / "ds").string(), bounded);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  uint64_t after_two = 0, held_after_two = 0;
  // 50 epochs of 64 images take well under a second of decode; each epoch's
  // time is printed so a slow one is seen, and the loop gives up (failing)
  // after a minute rather than running into the step's limit.
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t epoch = 0; epoch < 50; ++epoch) {
    const auto epoch_start = std::chrono::steady_clock::now();
    ASSERT_TRUE((*l)->StartEpoch(epoch, 0).ok());
    while (true) {
      auto b = (*l)->Next();
      if (!b.ok()) {
        ASSERT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
        break;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    const double took = std::chrono::duration<double>(now - epoch_start).count();
    if (epoch < 3 || epoch % 10 == 9 || took > 1.0) {
      std::printf("epoch %llu: %.3f s, peak device %llu bytes\n", (unsigned long long)epoch, took,
                  (unsigned long long)(*l)->stats().peak_device_bytes);
      std::fflush(stdout);
    }
    ASSERT_LT(std::chrono::duration<double>(now - start).count(), 60.0)
        << "50 epochs of 64 images did not finish in a minute (at epoch " << epoch << ")";
    if (epoch == 1) {
      after_two = (*l)->stats().peak_device_bytes;
      held_after_two = (*l)->stats().device_bytes;
    }
  }
  const LoaderStats end = (*l)->stats();
  std::printf("device memory: peak %llu bytes after 2 epochs, %llu after 50 (budget %llu); "
              "held %llu after 2, %llu after 50\n",
              (unsigned long long)after_two, (unsigned long long)end.peak_device_bytes,
              (unsigned long long)bounded.device_memory_budget,
              (unsigned long long)held_after_two, (unsigned long long)end.device_bytes);
  EXPECT_LE(end.peak_device_bytes, bounded.device_memory_budget);
  // No growth: what the decode holds after 50 epochs, and its high-water
  // mark, are within a tenth of what they were after two. The windows'
  // arena is sized by the whole images, not by the epoch's crops; the pool
  // may add a block when copies overlap (+2.1% on the H100). A leak of a
  // batch an epoch would add 48 batches' worth (~4.7 MB).
  EXPECT_LE(end.device_bytes, held_after_two + held_after_two / 10);
  EXPECT_LE(end.peak_device_bytes, after_two + after_two / 10);
  EXPECT_EQ(end.decoded_hardware + end.decoded_cuda, 50u * 64);
  // The copier's time: some in the GPU decode, part of that waiting for
  // the GPU, and CPU time of its own.
  EXPECT_GT(end.gpu_decode_time.count(), 0);
  EXPECT_LE(end.gpu_decode_wait_time, end.gpu_decode_time);
  EXPECT_GT(end.copier_cpu_time.count(), 0);
  EXPECT_GT(end.copier_wait_time.count(), 0);  // at least each epoch's first batch
}
#endif

}  // namespace
}  // namespace stoker
