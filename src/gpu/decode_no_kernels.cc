// The fused kernel's entry points in builds without CUDA
// (gpu/decode_kernels.h, gpu/jpeg_decoder.h): the CPU reference still
// works; a launch or a decoder says why not.
#include "gpu/decode_kernels.h"
#include "gpu/jpeg_decoder.h"

namespace stoker::gpu {

bool FusedKernelAvailable() { return false; }

Status LaunchFusedResize(int device, const ImageJob*, uint32_t, const OutputSpec&, void*,
                         CudaStreamHandle) {
  return Unsupported(DeviceName(device) +
                     ": this stoker was built without CUDA (configure with -DSTOKER_WITH_CUDA=ON)");
}

Status JpegDecoder::Probe(int device) {
  return Unsupported(DeviceName(device) +
                     ": the GPU decode needs a CUDA build (configure with -DSTOKER_WITH_CUDA=ON)");
}

Result<std::unique_ptr<JpegDecoder>> JpegDecoder::Open(const JpegDecoderOptions& options) {
  return Probe(options.device);
}

}  // namespace stoker::gpu
