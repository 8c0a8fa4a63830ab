// The GPU decode's fused kernel: resize (antialiased when downscaling), flip,
// normalize, cast and layout of a batch of decoded windows, in one launch,
// straight into the batch's image column in device memory (internal).
//
// The arithmetic is gpu/resize_math.h's, shared with the CPU reference
// below, which the GPU tests compare the kernel with element for element
// (the kernel is compiled without fused multiply-adds for that).
//
// Thread safety: the functions are reentrant; a launch is ordered on its
// stream like any other work there.
#pragma once

#include <cstdint>

#include "gpu/resize_math.h"
#include "stoker/gpu.h"
#include "stoker/status.h"

namespace stoker::gpu {

// Bytes of one element of `t`.
inline uint32_t OutTypeSize(OutType t) {
  return t == OutType::kUInt8 ? 1 : t == OutType::kFloat32 ? 4 : 2;
}

// The CPU reference: image `job` (its src in host memory) into `column`
// at job.out_offset, as the kernel writes it.
void FusedResizeReference(const ImageJob& job, const OutputSpec& spec, void* column);

// Whether this build has the kernel (CUDA on and nvcc found at configure).
bool FusedKernelAvailable();

// One launch over `count` images whose jobs are in device memory at
// `device_jobs` (their src device pointers), writing into `device_column`
// on `stream` of `device`. Returns once the launch is queued. Unsupported
// in builds without the kernel; launch errors name the device.
Status LaunchFusedResize(int device, const ImageJob* device_jobs, uint32_t count,
                         const OutputSpec& spec, void* device_column, CudaStreamHandle stream);

}  // namespace stoker::gpu
