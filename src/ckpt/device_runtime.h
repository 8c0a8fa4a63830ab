// The CUDA runtime calls a checkpoint makes, behind one narrow interface
// (internal): pinned host memory, a copy stream per device, events, and
// asynchronous copies. The checkpointer's staging (device_staging.h) is
// written against it, so its ordering, reuse and error paths are tested
// without a GPU by a stand-in that keeps "device memory" in host memory and
// runs each stream's work in order on a thread of its own
// (tests/ckpt_device_standin.h); CudaDeviceRuntime() is the real one
// (src/gpu/cuda_ckpt_runtime.cc in CUDA builds).
//
// Every error names the device and the call, as gpu::CudaStatus does:
// "cuda:0: cudaMemcpyAsync(D2H, 67108864 bytes): an illegal memory access was
// encountered (cudaErrorIllegalAddress)"; out of (pinned) memory is NoSpace
// and names the size asked. Nothing here synchronises a whole device.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <memory>

#include "stoker/checkpoint.h"
#include "stoker/status.h"

namespace stoker::ckpt {

class DeviceRuntime {
 public:
  using Stream = void*;  // cudaStream_t
  using Event = void*;   // cudaEvent_t

  virtual ~DeviceRuntime() = default;

  // Page-locked host memory for DMA (portable), for copies to and from
  // `device`: on a host of several NUMA nodes, placed on the node closest
  // to that GPU (its pages bound there by preference, then registered with
  // cudaHostRegister), so the copies cross no socket link; elsewhere (or
  // `device` < 0) cudaHostAlloc's. NoSpace naming `bytes` when there is not
  // that much.
  virtual Result<void*> HostAlloc(int device, size_t bytes) = 0;
  virtual void HostFree(void* p) = 0;

  // A non-blocking stream of `device`, never the legacy default stream.
  virtual Result<Stream> NewStream(int device) = 0;
  virtual void DestroyStream(int device, Stream s) = 0;
  // An event without timing (cudaEventDisableTiming).
  virtual Result<Event> NewEvent(int device) = 0;
  virtual void DestroyEvent(int device, Event e) = 0;

  // cudaEventRecord: `e` fires once the work queued on `s` so far is done.
  // `s` may be null: the legacy default stream.
  virtual Status Record(int device, Event e, Stream s) = 0;
  // cudaStreamWaitEvent: work queued on `s` from now on waits for `e`.
  virtual Status StreamWait(int device, Stream s, Event e) = 0;
  // cudaMemcpyAsync, device to host and host to device, on `s`.
  virtual Status CopyD2H(int device, void* dst, const void* src, size_t n, Stream s) = 0;
  virtual Status CopyH2D(int device, void* dst, const void* src, size_t n, Stream s) = 0;
  // cudaEventSynchronize: waits for `e`; the error of the work before it.
  virtual Status Synchronize(int device, Event e) = 0;
};

// The CUDA runtime, or (a build without CUDA) one whose every call is
// Unsupported naming the device.
std::shared_ptr<DeviceRuntime> CudaDeviceRuntime();

// NewCheckpointer with another runtime (tests: the stand-in).
std::unique_ptr<Checkpointer> NewCheckpointerOn(std::shared_ptr<Store> store,
                                                const CheckpointerOptions& options,
                                                std::shared_ptr<DeviceRuntime> runtime);

}  // namespace stoker::ckpt
