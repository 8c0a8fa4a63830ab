// The fused kernel (gpu/decode_kernels.h), compiled by nvcc with
// --fmad=false so that it computes exactly what the CPU reference does.
//
// One thread per output pixel, all three channels; blockIdx.y is the image.
// Taps are computed per pixel from the axis maps (a few float operations)
// rather than tabled: for ImageNet-sized crops the reads of the decoded
// window, which stay in L1/L2 between neighbouring threads, dominate.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>

#include "gpu/resize_math.h"

namespace stoker::gpu {
namespace {

__device__ __forceinline__ void Store(const OutputSpec& o, uint8_t* image, int32_t oy, int32_t ox,
                                      const uint8_t rgb[3]) {
  for (int c = 0; c < 3; ++c) {
    const uint64_t i = OutIndex(o, oy, ox, c);
    switch (o.type) {
      case OutType::kUInt8:
        image[i] = rgb[c];
        break;
      case OutType::kFloat32:
        reinterpret_cast<float*>(image)[i] = OutValue(o, c, rgb[c]);
        break;
      case OutType::kFloat16:
        reinterpret_cast<__half*>(image)[i] = __float2half_rn(OutValue(o, c, rgb[c]));
        break;
      case OutType::kBFloat16:
        reinterpret_cast<uint16_t*>(image)[i] =
            FloatBitsToBFloat16(__float_as_uint(OutValue(o, c, rgb[c])));
        break;
    }
  }
}

__global__ void FusedResizeKernel(const ImageJob* jobs, OutputSpec spec, uint8_t* column) {
  const ImageJob& job = jobs[blockIdx.y];
  const int32_t pixels = spec.height * spec.width;
  uint8_t* image = column + job.out_offset;
  for (int32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < pixels;
       i += gridDim.x * blockDim.x) {
    const int32_t oy = i / spec.width, ox = i - oy * spec.width;
    uint8_t rgb[3];
    ResamplePixel(job, oy, job.flip ? spec.width - 1 - ox : ox, rgb);
    Store(spec, image, oy, ox, rgb);
  }
}

}  // namespace

// Called by gpu/cuda_decode.cc (C++20, which nvcc's host compiler need not
// share); returns a cudaError_t.
int LaunchFusedResizeRaw(const ImageJob* device_jobs, uint32_t count, const OutputSpec& spec,
                         void* device_column, void* stream) {
  if (count == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int32_t pixels = spec.height * spec.width;
  // Enough blocks per image to fill the GPU with a batch of a few dozen,
  // and never more than the pixels need.
  const uint32_t blocks = uint32_t(std::min<int32_t>((pixels + kThreads - 1) / kThreads, 64));
  dim3 grid(blocks, count);
  FusedResizeKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      device_jobs, spec, static_cast<uint8_t*>(device_column));
  return cudaGetLastError();
}

}  // namespace stoker::gpu
