// Synthetic JPEG data sets for the demo and the benchmarks.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "stoker/plan.h"

#ifdef STOKER_HAVE_TURBOJPEG
#include <turbojpeg.h>
#endif

namespace stoker {

Result<uint64_t> SynthesizeImageFolder(const std::string& root, const SynthOptions& o) {
#ifndef STOKER_HAVE_TURBOJPEG
  return Unsupported("synthesizing JPEGs needs libturbojpeg");
#else
  namespace fs = std::filesystem;
  if (o.images == 0 || o.classes == 0) return InvalidArgument("images and classes must be >= 1");
  std::error_code ec;
  for (uint32_t c = 0; c < o.classes; ++c) {
    char name[32];
    std::snprintf(name, sizeof name, "class_%02u", c);
    fs::create_directories(fs::path(root) / name, ec);
    if (ec) return ErrnoToStatus(ec.value(), "mkdir " + (fs::path(root) / name).string());
  }
  std::atomic<uint32_t> next{0};
  std::atomic<uint64_t> total{0};
  std::atomic<bool> failed{false};
  Status first_error;
  std::mutex mu;
  auto work = [&] {
    tjhandle tj = tjInitCompress();
    std::vector<uint8_t> rgb;
    while (!failed) {
      const uint32_t i = next++;
      if (i >= o.images) break;
      Rng rng(MixSeed({o.seed, i}));
      // Sizes vary as photos do; texture strength steers the JPEG size
      // towards the target mean.
      const int w = 250 + int(rng.Below(451)), h = 250 + int(rng.Below(451));
      rgb.resize(size_t(w) * h * 3);
      const double fx = 0.005 + rng.Below(1000) / 40000.0, fy = 0.005 + rng.Below(1000) / 40000.0;
      const int base[3] = {int(rng.Below(200)), int(rng.Below(200)), int(rng.Below(200))};
      const double area_scale = 475.0 * 475.0 / (double(w) * h);
      const int noise = std::max(2, int(o.mean_bytes / 2600.0 * area_scale)) + int(rng.Below(8));
      uint64_t x = rng.Next();
      for (int yy = 0; yy < h; ++yy) {
        for (int xx = 0; xx < w; ++xx) {
          x ^= x << 13;
          x ^= x >> 7;
          x ^= x << 17;
          const double wave = 60 * std::sin(xx * fx) * std::cos(yy * fy);
          for (int ch = 0; ch < 3; ++ch) {
            int v = base[ch] + int(wave) + int((x >> (ch * 8)) % noise) - noise / 2;
            rgb[(size_t(yy) * w + xx) * 3 + ch] = uint8_t(std::clamp(v, 0, 255));
          }
        }
      }
      unsigned char* jpeg = nullptr;
      unsigned long jpeg_size = 0;
      if (tjCompress2(tj, rgb.data(), w, 0, h, TJPF_RGB, &jpeg, &jpeg_size, TJSAMP_420, 90, 0) !=
          0) {
        std::lock_guard lock(mu);
        first_error = Internal(std::string("tjCompress2: ") + tjGetErrorStr2(tj));
        failed = true;
        break;
      }
      char name[64];
      std::snprintf(name, sizeof name, "class_%02u/img_%06u.jpg", i % o.classes, i);
      const fs::path path = fs::path(root) / name;
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(jpeg), std::streamsize(jpeg_size));
      f.close();
      tjFree(jpeg);
      if (!f) {
        std::lock_guard lock(mu);
        first_error = IoError("write " + path.string());
        failed = true;
        break;
      }
      total += jpeg_size;
    }
    tjDestroy(tj);
  };
  const uint32_t threads =
      o.threads ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (uint32_t t = 0; t < threads; ++t) pool.emplace_back(work);
  for (auto& t : pool) t.join();
  if (failed) return first_error;
  return total.load();
#endif
}

}  // namespace stoker
