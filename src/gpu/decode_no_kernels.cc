// The fused kernel's entry points in builds without CUDA
// (gpu/decode_kernels.h): the CPU reference still works; a launch says why not.
#include "gpu/decode_kernels.h"

namespace stoker::gpu {

bool FusedKernelAvailable() { return false; }

Status LaunchFusedResize(int device, const ImageJob*, uint32_t, const OutputSpec&, void*,
                         CudaStreamHandle) {
  return Unsupported(DeviceName(device) +
                     ": this stoker was built without CUDA (configure with -DSTOKER_WITH_CUDA=ON)");
}

}  // namespace stoker::gpu
