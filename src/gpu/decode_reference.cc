// The fused kernel's CPU reference (gpu/decode_kernels.h): the same
// functions of gpu/resize_math.h, one pixel at a time.
#include <cstring>

#include "gpu/decode_kernels.h"
#include "loader/fp16.h"

namespace stoker::gpu {

void FusedResizeReference(const ImageJob& job, const OutputSpec& o, void* column) {
  auto* image = static_cast<uint8_t*>(column) + job.out_offset;
  for (int32_t oy = 0; oy < o.height; ++oy) {
    for (int32_t ox = 0; ox < o.width; ++ox) {
      uint8_t rgb[3];
      ResamplePixel(job, oy, job.flip ? o.width - 1 - ox : ox, rgb);
      for (int c = 0; c < 3; ++c) {
        const uint64_t i = OutIndex(o, oy, ox, c);
        const float v = OutValue(o, c, rgb[c]);
        switch (o.type) {
          case OutType::kUInt8:
            image[i] = rgb[c];
            break;
          case OutType::kFloat32:
            std::memcpy(image + 4 * i, &v, 4);
            break;
          case OutType::kFloat16: {
            const uint16_t h = FloatToHalf(v);
            std::memcpy(image + 2 * i, &h, 2);
            break;
          }
          case OutType::kBFloat16: {
            uint32_t u;
            std::memcpy(&u, &v, 4);
            const uint16_t b = FloatBitsToBFloat16(u);
            std::memcpy(image + 2 * i, &b, 2);
            break;
          }
        }
      }
    }
  }
}

}  // namespace stoker::gpu
