// nvJPEG, loaded at run time (internal).
//
// CUDA ships libnvjpeg (the toolkit, and pip's nvidia-nvjpeg wheels that
// torch pulls in); Debian main does not, and the build never needs it: the
// few types and functions stoker calls are declared here as nvJPEG's
// documentation (the nvJPEG Library Guide, CUDA 12 and 13) gives them, and
// resolved with dlopen/dlsym. CUDA streams are passed as void* (a
// cudaStream_t is a pointer), so no CUDA header is needed either.
//
// Where the library is looked for, in order (the first that opens wins):
//   1. $STOKER_NVJPEG_PATH: a libnvjpeg file, or a folder holding one;
//   2. libnvjpeg.so.13, then libnvjpeg.so.12, through the dynamic loader
//      (LD_LIBRARY_PATH, ldconfig's cache, and a copy already loaded in the
//      process, e.g. by torchvision);
//   3. the same names in $CUDA_HOME/lib64, /usr/local/cuda/lib64 and the
//      nvidia/*/lib folders of $VIRTUAL_ENV's site-packages (where torch's
//      pip wheels put it).
//
// Thread safety: LoadNvjpeg may be called from any thread; the library is
// loaded once per process and never unloaded.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "stoker/status.h"

namespace stoker::gpu::nvj {

// nvjpegStatus_t.
enum StatusCode : int {
  kSuccess = 0,
  kNotInitialized = 1,
  kInvalidParameter = 2,
  kBadJpeg = 3,
  kJpegNotSupported = 4,
  kAllocatorFailure = 5,
  kExecutionFailed = 6,
  kArchMismatch = 7,
  kInternalError = 8,
  kImplementationNotSupported = 9,
  kIncompleteBitstream = 10,
};
const char* StatusName(int status);

// nvjpegBackend_t.
enum Backend : int {
  kBackendDefault = 0,
  kBackendHybrid = 1,
  kBackendGpuHybrid = 2,
  kBackendHardware = 3,
};

// nvjpegOutputFormat_t: interleaved RGB into channel[0].
inline constexpr int kOutputRgbi = 5;
// nvjpegChromaSubsampling_t values are not used: the host parses headers.
inline constexpr int kMaxComponent = 4;  // NVJPEG_MAX_COMPONENT
// libraryPropertyType (library_types.h).
inline constexpr int kMajorVersion = 0, kMinorVersion = 1, kPatchLevel = 2;

struct Image {  // nvjpegImage_t
  unsigned char* channel[kMaxComponent];
  size_t pitch[kMaxComponent];
};

// nvjpegDevAllocatorV2_t / nvjpegPinnedAllocatorV2_t: stream-ordered, with a
// context pointer; they return 0 on success.
struct DevAllocatorV2 {
  int (*dev_malloc)(void* ctx, void** ptr, size_t size, void* stream);
  int (*dev_free)(void* ctx, void* ptr, size_t size, void* stream);
  void* dev_ctx;
};
struct PinnedAllocatorV2 {
  int (*pinned_malloc)(void* ctx, void** ptr, size_t size, void* stream);
  int (*pinned_free)(void* ctx, void* ptr, size_t size, void* stream);
  void* pinned_ctx;
};

// Opaque handles.
using Handle = struct nvjpegHandle*;
using JpegState = struct nvjpegJpegState*;
using JpegStream = struct nvjpegJpegStream*;
using DecodeParams = struct nvjpegDecodeParams*;

// The functions stoker calls, bound from the loaded library.
struct Api {
  std::string path;  // the file that was opened
  int major = 0, minor = 0, patch = 0;

  int (*GetProperty)(int type, int* value);
  int (*CreateExV2)(int backend, DevAllocatorV2* dev, PinnedAllocatorV2* pinned, unsigned flags,
                    Handle* handle);
  int (*Destroy)(Handle);
  int (*GetHardwareDecoderInfo)(Handle, unsigned* engines, unsigned* cores_per_engine);
  int (*JpegStateCreate)(Handle, JpegState*);
  int (*JpegStateDestroy)(JpegState);
  int (*Decode)(Handle, JpegState, const unsigned char* data, size_t length, int output_format,
                Image* destination, void* stream);
  int (*DecodeBatchedInitialize)(Handle, JpegState, int batch_size, int max_cpu_threads,
                                 int output_format);
  int (*DecodeBatchedEx)(Handle, JpegState, const unsigned char* const* data,
                         const size_t* lengths, Image* destinations, DecodeParams* params,
                         void* stream);
  int (*DecodeBatchedSupportedEx)(Handle, JpegStream, DecodeParams, int* is_supported);
  int (*JpegStreamCreate)(Handle, JpegStream*);
  int (*JpegStreamDestroy)(JpegStream);
  int (*JpegStreamParseHeader)(Handle, const unsigned char* data, size_t length, JpegStream);
  int (*DecodeParamsCreate)(Handle, DecodeParams*);
  int (*DecodeParamsDestroy)(DecodeParams);
  int (*DecodeParamsSetOutputFormat)(DecodeParams, int output_format);
  int (*DecodeParamsSetROI)(DecodeParams, int offset_x, int offset_y, int width, int height);
};

// The oldest major version taken: 12 (CUDA 12; batched ROI decode and the
// V2 allocators are there since 11.6, the hardware decoder info since 11.9).
inline constexpr int kMinMajor = 12;

// The library, loaded and bound once per process, or Unsupported starting
// "no nvJPEG (tried libnvjpeg.so.13, libnvjpeg.so.12, ...)" with each
// candidate's dlopen error and how to point stoker at one. A library that
// opens but lacks a function, or is older than kMinMajor, is Unsupported
// naming it. The result is the same on every call.
Result<const Api*> LoadNvjpeg();

// The candidate paths, in the order LoadNvjpeg tries them (for messages and
// tests).
std::vector<std::string> NvjpegCandidates();

// The one mapping of nvjpegStatus_t to Status: "cuda:0: nvjpegDecode(sample
// ...): NVJPEG_STATUS_BAD_JPEG". A bad or truncated JPEG is Corruption, an
// allocator failure NoSpace, a JPEG or feature nvJPEG does not take
// Unsupported, the rest IoError. (The decode stage hands any image nvJPEG
// fails on to the CPU path, whose error is the one reported.)
stoker::Status NvjpegStatus(int device, const std::string& call, int status);

}  // namespace stoker::gpu::nvj
