// Devices and the one cudaError_t -> Status mapping (CUDA builds).
#include <string>

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
