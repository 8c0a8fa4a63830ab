// CUDA runtime helpers shared by the gpu module's CUDA files (internal).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <string_view>

#include "stoker/status.h"

namespace stoker::gpu {

// The one mapping of cudaError_t to Status. The message names the device and
// the call: "cuda:0: cudaMallocAsync(1073741824 bytes): out of memory
// (cudaErrorMemoryAllocation)". Out of memory is NoSpace; no GPU or driver is
// Unavailable (not retryable: it does not come back by itself); a bad device
// index, value or handle is InvalidArgument; the rest (a kernel fault that
// poisons the context, a lost device) is IoError.
Status CudaStatus(int device, std::string_view call, cudaError_t err);

// Waits for `event` to complete, as cudaEventSynchronize does, but gives up
// after `limit` with TimedOut naming the device and `what` rather than
// waiting for ever on work that never finishes (a stalled engine): polls
// cudaEventQuery, yielding, then sleeping in steps of up to 100 us.
Status WaitEvent(int device, std::string_view what, cudaEvent_t event,
                 std::chrono::milliseconds limit);

// Makes `device` current for the calling thread and puts the previous one
// back when it goes, so that a consumer's thread keeps its own device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) status_ = cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && status_ == cudaSuccess) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace stoker::gpu
