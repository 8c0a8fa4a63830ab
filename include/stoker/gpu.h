// GPU delivery: CUDA devices, batches delivered in device memory, and the
// host<->device copy benchmark that checks a node's PCIe path.
//
// The loader delivers to a GPU when LoaderOptions::device is "cuda:N": batch
// buffers are pinned, each built batch is copied with cudaMemcpyAsync on the
// loader's own stream while the next batches are read and collated, and
// Batch::device() is the copy, with an event the consumer's stream waits on.
// Nothing here ever synchronises the whole device: waits are on one stream
// or one event.
//
// This header needs no CUDA headers: streams are passed as integers (a
// cudaStream_t cast to uintptr_t, or torch's Stream.cuda_stream). Without
// CUDA in the build (STOKER_WITH_CUDA=OFF) everything here compiles and
// returns Unsupported, naming the device.
//
// Thread safety: the free functions are reentrant. A DeviceBatch may be used
// from several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker {

// A CUDA stream as an integer: a cudaStream_t's value, or one of the two
// special handles below (the numbering DLPack's __dlpack__(stream=...) uses).
using CudaStreamHandle = std::uintptr_t;
inline constexpr CudaStreamHandle kLegacyDefaultStream = 1;     // cudaStreamLegacy
inline constexpr CudaStreamHandle kPerThreadDefaultStream = 2;  // cudaStreamPerThread

// True when this build has CUDA (STOKER_WITH_CUDA=ON).
bool BuiltWithCuda();

// "cuda:N" (or "cuda", meaning cuda:0) -> N; "" or "cpu" -> -1, host
// delivery. InvalidArgument naming the string otherwise. Needs no GPU.
Result<int> ParseDevice(std::string_view device);

// "cuda:N" for a device index, for messages.
std::string DeviceName(int device);

struct CudaDeviceInfo {
  int index = 0;
  std::string name;           // "NVIDIA H200"
  std::string pci_bus_id;     // "0000:19:00.0"
  uint64_t total_memory = 0;  // bytes
  int compute_major = 0, compute_minor = 0;
  int copy_engines = 0;                         // cudaDevAttrAsyncEngineCount
  int driver_version = 0, runtime_version = 0;  // 13000 = 13.0
};

// The device's properties. Unavailable "cuda:N: no CUDA device ..." when the
// machine has no GPU or driver; InvalidArgument when N is out of range (the
// message says how many devices there are); Unsupported without CUDA.
Result<CudaDeviceInfo> GetCudaDevice(int device);

// The copy of one batch in device memory (Batch::device()). Same bytes, same
// offsets as Batch::buffer(): a column's device address is
// Batch::device_pointer(host pointer).
//
// The copy is asynchronous: before using the memory on a stream, call
// WaitOn(stream) (the stream waits on the device; the host does not block),
// or Synchronize() to block the calling thread. The device buffer goes back
// to the loader's pool when the last reference to this batch is dropped; it
// is not reused until the work queued on every stream passed to WaitOn up to
// that moment has run (an event is recorded on each), so a consumer may drop
// a batch right after queueing the kernels that read it. Work on a stream
// not passed to WaitOn must have finished before the batch is released, and
// a stream passed to WaitOn must outlive the batch.
class DeviceBatch {
 public:
  virtual ~DeviceBatch() = default;
  virtual int device() const = 0;
  virtual const std::byte* data() const = 0;  // a device address
  virtual size_t size() const = 0;
  // Makes `stream` wait for the copy (cudaStreamWaitEvent) and remembers it
  // for the buffer's release, as above. Errors name the device and the call.
  virtual Status WaitOn(CudaStreamHandle stream) = 0;
  // Blocks until the copy has landed (cudaEventSynchronize on this batch's
  // event alone).
  virtual Status Synchronize() = 0;
  // Whether the copy has landed; never blocks.
  virtual Result<bool> Ready() const = 0;
};

}  // namespace stoker
