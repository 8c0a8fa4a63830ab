// The checkpointer's DeviceRuntime on the CUDA runtime (CUDA builds; the
// interface is src/ckpt/device_runtime.h). Each call makes its device
// current for the calling thread and puts the previous one back.
#include <cuda_runtime_api.h>

#include <string>

#include "ckpt/device_runtime.h"
#include "gpu/cuda_util.h"

namespace stoker::gpu {

// Made from src/ckpt/device_runtime.cc when this build has CUDA.
std::shared_ptr<ckpt::DeviceRuntime> NewCudaCkptRuntime();

namespace {

class CudaCkptRuntime final : public ckpt::DeviceRuntime {
 public:
  Result<void*> HostAlloc(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      return CudaStatus(0, "cudaHostAlloc(" + std::to_string(bytes) + " bytes of pinned memory)",
                        err);
    }
    return p;
  }
  void HostFree(void* p) override { (void)cudaFreeHost(p); }

  Result<Stream> NewStream(int device) override {
    DeviceGuard g(device);
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaSetDevice", g.status()));
    cudaStream_t s = nullptr;
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaStreamCreateWithFlags(non-blocking)",
                                      cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
    return static_cast<Stream>(s);
  }
  void DestroyStream(int device, Stream s) override {
    DeviceGuard g(device);
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(s));
  }
  Result<Event> NewEvent(int device) override {
    DeviceGuard g(device);
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaSetDevice", g.status()));
    cudaEvent_t e = nullptr;
    STOKER_RETURN_IF_ERROR(CudaStatus(device, "cudaEventCreateWithFlags(disable timing)",
                                      cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
    return static_cast<Event>(e);
  }
  void DestroyEvent(int device, Event e) override {
    DeviceGuard g(device);
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  Status Record(int device, Event e, Stream s) override {
    DeviceGuard g(device);
    return CudaStatus(device, "cudaEventRecord",
                      cudaEventRecord(static_cast<cudaEvent_t>(e), static_cast<cudaStream_t>(s)));
  }
  Status StreamWait(int device, Stream s, Event e) override {
    DeviceGuard g(device);
    return CudaStatus(
        device, "cudaStreamWaitEvent",
        cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(e), 0));
  }
  Status CopyD2H(int device, void* dst, const void* src, size_t n, Stream s) override {
    DeviceGuard g(device);
    return CudaStatus(
        device, "cudaMemcpyAsync(device to host, " + std::to_string(n) + " bytes)",
        cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s)));
  }
  Status CopyH2D(int device, void* dst, const void* src, size_t n, Stream s) override {
    DeviceGuard g(device);
    return CudaStatus(
        device, "cudaMemcpyAsync(host to device, " + std::to_string(n) + " bytes)",
        cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(s)));
  }
  Status Synchronize(int device, Event e) override {
    return CudaStatus(device, "cudaEventSynchronize",
                      cudaEventSynchronize(static_cast<cudaEvent_t>(e)));
  }
};

}  // namespace

std::shared_ptr<ckpt::DeviceRuntime> NewCudaCkptRuntime() {
  return std::make_shared<CudaCkptRuntime>();
}

}  // namespace stoker::gpu
