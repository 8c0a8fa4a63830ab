// The fused kernel's launch (gpu/decode_kernels.h) in CUDA builds. The
// kernel itself is compiled only where nvcc was found at configure time
// (STOKER_HAVE_CUDA_KERNELS); the rest of the CUDA build does not need it.
#include <cuda_runtime_api.h>

#include "gpu/cuda_util.h"
#include "gpu/decode_kernels.h"

namespace stoker::gpu {

#ifdef STOKER_HAVE_CUDA_KERNELS
int LaunchFusedResizeRaw(const ImageJob* device_jobs, uint32_t count, const OutputSpec& spec,
                         void* device_column, void* stream);

bool FusedKernelAvailable() { return true; }

Status LaunchFusedResize(int device, const ImageJob* device_jobs, uint32_t count,
                         const OutputSpec& spec, void* device_column, CudaStreamHandle stream) {
  const int err = LaunchFusedResizeRaw(device_jobs, count, spec, device_column,
                                       reinterpret_cast<void*>(stream));
  return CudaStatus(device,
                    "fused resize kernel launch (" + std::to_string(count) + " images of " +
                        std::to_string(spec.height) + "x" + std::to_string(spec.width) + ")",
                    static_cast<cudaError_t>(err));
}
#else
bool FusedKernelAvailable() { return false; }

Status LaunchFusedResize(int device, const ImageJob*, uint32_t, const OutputSpec&, void*,
                         CudaStreamHandle) {
  return Unsupported(DeviceName(device) +
                     ": this stoker was built without nvcc, so without the GPU decode's kernel "
                     "(configure with CUDA's nvcc on the PATH or CMAKE_CUDA_COMPILER set)");
}
#endif

}  // namespace stoker::gpu
