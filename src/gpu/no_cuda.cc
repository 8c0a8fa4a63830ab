// The gpu module in a build without CUDA (STOKER_WITH_CUDA=OFF): every entry
// point says so, naming the device, so `device = "cuda:0"` fails at Open
// with a message that tells how to get a CUDA build.
#include "gpu/stager.h"
#include "gpu/h2d_bench.h"
#include "stoker/gpu.h"

namespace stoker {
namespace {
Status NoCuda(int device) {
  return Unsupported(DeviceName(device) +
                     ": this stoker was built without CUDA (configure with -DSTOKER_WITH_CUDA=ON)");
}
}  // namespace

bool BuiltWithCuda() { return false; }
Result<CudaDeviceInfo> GetCudaDevice(int device) { return NoCuda(device); }
Result<H2dReport> BenchH2d(const H2dBenchOptions& options) { return NoCuda(options.device); }

namespace gpu {
Result<std::unique_ptr<Stager>> Stager::Open(const StagerOptions& options) {
  return NoCuda(options.device);
}
void InjectCopyFailure(uint64_t, int) {}
}  // namespace gpu

}  // namespace stoker
