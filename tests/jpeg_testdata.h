// Test pictures and JPEGs made with TurboJPEG's compressor, shared by the
// decode tests (decode_test.cc, gpu_decode_test.cc).
#pragma once

#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace stoker::testdata {

// A smooth picture with detail in every region: gradients plus a few
// sharp-edged squares, so that crops and flips are told apart. RGB, HWC.
inline std::vector<uint8_t> Picture(int h, int w) {
  std::vector<uint8_t> p(size_t(h) * w * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* q = &p[(size_t(y) * w + x) * 3];
      q[0] = uint8_t(x * 255 / std::max(1, w - 1));
      q[1] = uint8_t(y * 255 / std::max(1, h - 1));
      q[2] = uint8_t(128 + 100 * std::sin(x * 0.05) * std::cos(y * 0.07));
      if ((x / 40 + y / 30) % 5 == 0) q[2] = 20;
    }
  }
  return p;
}

// `pixels` (h x w of TurboJPEG pixel format `pf`) compressed with
// subsampling `samp`, `quality` and `flags` (TJFLAG_*).
inline std::vector<std::byte> Compress(const std::vector<uint8_t>& pixels, int h, int w, int pf,
                                       int samp, int quality, int flags) {
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, pixels.data(), w, 0, h, pf, &out, &size, samp, quality, flags), 0)
      << tjGetErrorStr2(tj);
  std::vector<std::byte> jpeg(reinterpret_cast<std::byte*>(out),
                              reinterpret_cast<std::byte*>(out) + size);
  tjFree(out);
  tjDestroy(tj);
  return jpeg;
}

}  // namespace stoker::testdata
