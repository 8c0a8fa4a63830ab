// Devices and the one cudaError_t -> Status mapping (CUDA builds).
#include <algorithm>
#include <string>
#include <thread>

#include "gpu/cuda_util.h"
#include "stoker/gpu.h"

namespace stoker {

bool BuiltWithCuda() { return true; }

namespace gpu {

Status CudaStatus(int device, std::string_view call, cudaError_t err) {
  if (err == cudaSuccess) return Status::Ok();
  std::string msg = DeviceName(device) + ": " + std::string(call) + ": " + cudaGetErrorString(err) +
                    " (" + cudaGetErrorName(err) + ")";
  switch (err) {
    case cudaErrorMemoryAllocation:
      return NoSpace(std::move(msg));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemNotReady:
      return Status(Code::kUnavailable, std::move(msg) + "; no usable GPU on this machine",
                    /*retryable=*/false);
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidValue:
    case cudaErrorInvalidResourceHandle:
      return InvalidArgument(std::move(msg));
    case cudaErrorNotSupported:
      return Unsupported(std::move(msg));
    default:
      return IoError(std::move(msg));
  }
}

Status WaitEvent(int device, std::string_view what, cudaEvent_t event,
                 std::chrono::milliseconds limit) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto nap = std::chrono::microseconds(0);
  for (uint32_t k = 0;; ++k) {
    const cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) return Status::Ok();
    if (q != cudaErrorNotReady) return CudaStatus(device, std::string(what), q);
    if (Clock::now() - start > limit) {
      return Status(Code::kTimedOut,
                    DeviceName(device) + ": " + std::string(what) + " did not finish in " +
                        std::to_string(limit.count()) + " ms: the GPU's work stalled (a hung JPEG engine or kernel); this "
                        "device's decode cannot go on",
                    /*retryable=*/false);
    }
    // The common wait is short (the previous batch's last kernel): yield
    // first, then sleep in growing steps.
    if (k < 64) {
      std::this_thread::yield();
    } else {
      nap = std::min<std::chrono::microseconds>(nap + std::chrono::microseconds(10),
                                                std::chrono::microseconds(100));
      std::this_thread::sleep_for(nap);
    }
  }
}

}  // namespace gpu

Result<CudaDeviceInfo> GetCudaDevice(int device) {
  int count = 0;
  STOKER_RETURN_IF_ERROR(gpu::CudaStatus(device, "cudaGetDeviceCount", cudaGetDeviceCount(&count)));
  if (device < 0 || device >= count) {
    return InvalidArgument(
        DeviceName(device) + ": device index out of range: this machine has " +
        std::to_string(count) + " CUDA device" + (count == 1 ? "" : "s") +
        (count > 0 ? " (cuda:0 to cuda:" + std::to_string(count - 1) + ")" : std::string()));
  }
  cudaDeviceProp p{};
  STOKER_RETURN_IF_ERROR(
      gpu::CudaStatus(device, "cudaGetDeviceProperties", cudaGetDeviceProperties(&p, device)));
  CudaDeviceInfo info;
  info.index = device;
  info.name = p.name;
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) == cudaSuccess) info.pci_bus_id = bus;
  info.total_memory = p.totalGlobalMem;
  info.compute_major = p.major;
  info.compute_minor = p.minor;
  info.copy_engines = p.asyncEngineCount;
  (void)cudaDriverGetVersion(&info.driver_version);
  (void)cudaRuntimeGetVersion(&info.runtime_version);
  return info;
}

}  // namespace stoker
