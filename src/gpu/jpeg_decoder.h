// nvJPEG on one GPU, for the loader's GPU decode (internal).
//
// Per device: a handle on the hardware backend (NVJPEG_BACKEND_HARDWARE:
// the JPEG engines of A100/H100-class GPUs, batched, with each image's ROI
// through nvjpegDecodeBatchedEx) where the GPU has engines, and one on the
// default backend (CUDA, Huffman on the host) for the images the engines
// refuse or where there are none. Both allocate through stoker's own
// stream-ordered device allocator, bounded by `memory_budget` (an
// allocation past it fails, which nvJPEG reports as an allocator failure:
// NoSpace naming the device and the size), and pinned memory through
// cudaHostAlloc. The decoded windows land in one grow-only arena of the same
// budget, then one launch of the fused kernel (gpu/decode_kernels.h) writes
// every image into the batch's device memory.
//
// Thread safety: DecodeBatch and Upload from one thread at a time (the
// loader's copier thread); the rest from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/resize_math.h"
#include "stoker/gpu.h"
#include "stoker/status.h"

namespace stoker::gpu {

// One image for the GPU.
struct JpegJob {
  const uint8_t* data = nullptr;  // the JPEG, in host memory until DecodeBatch returns
  size_t size = 0;
  bool hardware = false;  // routed to the engines; otherwise to CUDA
  uint32_t image_h = 0, image_w = 0;
  uint32_t roi_x = 0, roi_y = 0, roi_w = 0, roi_h = 0;  // the window the taps read
  AxisMap y, x;                                          // shift relative to the window
  bool flip = false;
  uint64_t out_offset = 0;  // bytes from the image column's start
};

struct JpegDecodeResult {
  // Jobs (indexes into the span) nvJPEG refused or failed on, with why: the
  // caller decodes them on the CPU.
  std::vector<uint32_t> failed;
  std::vector<Status> why;
  uint32_t hardware = 0, cuda = 0;  // images each backend decoded
  uint64_t wait_ns = 0;  // time the call spent waiting for the GPU's earlier work
};

struct JpegDecoderOptions {
  int device = 0;
  // Device bytes nvJPEG's buffers and the decoded windows may hold.
  // Default: 256 MiB.
  uint64_t memory_budget = 256ull << 20;
};

class JpegDecoder {
 public:
  // Loads nvJPEG (gpu/nvjpeg_api.h) and opens the handles on `device`.
  // Unsupported "no nvJPEG (tried ...)" without the library, or "built
  // without CUDA"; the device's own errors otherwise.
  static Result<std::unique_ptr<JpegDecoder>> Open(const JpegDecoderOptions& options);
  // Whether Open could work on `device` (nvJPEG loads, the GPU is there,
  // the build has the kernel), without opening anything: Open's error
  // otherwise.
  static Status Probe(int device);
  virtual ~JpegDecoder() = default;

  // "nvJPEG 13.0.1 (libnvjpeg.so.13): hardware backend, 1 engine x 5 cores,
  // and CUDA" or "...: CUDA only (no JPEG engines on this GPU)".
  virtual const std::string& description() const = 0;
  virtual bool engines() const = 0;

  // Decodes `jobs` on `stream`, then writes every decoded image into
  // `device_column` (as `spec` says) with one kernel launch, all ordered on
  // the stream. An image the engines refuse goes to CUDA; one CUDA fails on
  // is listed in result->failed and its slot left alone. Returns once the
  // work is queued (nvJPEG's host phase is done by then); a CUDA error, or
  // NoSpace when the budget cannot hold the batch's windows, is the status.
  virtual Status DecodeBatch(std::span<const JpegJob> jobs, const OutputSpec& spec,
                             void* device_column, CudaStreamHandle stream,
                             JpegDecodeResult* result) = 0;

  // Queues a host -> device copy on `stream` (the CPU-decoded images of a
  // batch). `host` must stay unchanged until the stream has run it.
  virtual Status Upload(const void* host, void* device, size_t bytes, CudaStreamHandle stream) = 0;

  virtual uint64_t device_bytes() const = 0;       // held now
  virtual uint64_t peak_device_bytes() const = 0;  // the most held
};

}  // namespace stoker::gpu
