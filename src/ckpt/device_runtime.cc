// CudaDeviceRuntime: the CUDA runtime where this build has it
// (src/gpu/cuda_ckpt_runtime.cc), else a runtime whose every call says the
// build has none, naming the device.
#include "ckpt/device_runtime.h"

#include "stoker/gpu.h"

#ifdef STOKER_HAVE_CUDA
namespace stoker::gpu {
std::shared_ptr<ckpt::DeviceRuntime> NewCudaCkptRuntime();
}
#endif

namespace stoker::ckpt {
namespace {

class NoCudaRuntime final : public DeviceRuntime {
 public:
  Result<void*> HostAlloc(int, size_t) override { return NoCuda(0); }
  void HostFree(void*) override {}
  Result<Stream> NewStream(int device) override { return NoCuda(device); }
  void DestroyStream(int, Stream) override {}
  Result<Event> NewEvent(int device) override { return NoCuda(device); }
  void DestroyEvent(int, Event) override {}
  Status Record(int device, Event, Stream) override { return NoCuda(device); }
  Status StreamWait(int device, Stream, Event) override { return NoCuda(device); }
  Status CopyD2H(int device, void*, const void*, size_t, Stream) override { return NoCuda(device); }
  Status CopyH2D(int device, void*, const void*, size_t, Stream) override { return NoCuda(device); }
  Status Synchronize(int device, Event) override { return NoCuda(device); }

 private:
  static Status NoCuda(int device) {
    return Unsupported(DeviceName(device) +
                       ": a checkpoint of device tensors needs a stoker built with CUDA "
                       "(configure with -DSTOKER_WITH_CUDA=ON)");
  }
};

}  // namespace

std::shared_ptr<DeviceRuntime> CudaDeviceRuntime() {
#ifdef STOKER_HAVE_CUDA
  static const std::shared_ptr<DeviceRuntime> runtime = gpu::NewCudaCkptRuntime();
#else
  static const std::shared_ptr<DeviceRuntime> runtime = std::make_shared<NoCudaRuntime>();
#endif
  return runtime;
}

}  // namespace stoker::ckpt
