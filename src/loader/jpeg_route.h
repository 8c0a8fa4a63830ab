// Per-image routing and crop windows of the GPU decode (internal).
//
// Before any pixel is decoded, the host reads each JPEG's header (the
// markers up to its frame header: no entropy data is touched), decides which
// backend takes it, and draws its crop box and flip exactly as the CPU path
// does (DrawCrop of loader/augment.h: one source of truth for every path),
// so that a resumed run and a run that switches path see the same crops.
// From the box it derives the window of source pixels the resampling
// filter reads (what nvJPEG is asked to decode as its ROI) and the
// per-axis maps the fused kernel resamples with (gpu/resize_math.h).
//
// Routing depends on the image's properties and on what the machine has
// (nvJPEG at all, hardware engines), never on timing: the same dataset on
// the same kind of GPU sends the same images to the same backend.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "gpu/resize_math.h"
#include "stoker/decode.h"
#include "stoker/status.h"

namespace stoker {

enum class JpegColor : uint8_t { kGrey, kYCbCr, kRgb, kCmyk, kYcck, kOther };
enum class JpegSubsampling : uint8_t { k444, k422, k420, k440, k411, k410, kGrey, kOther };

// What the frame header (SOFn) and the markers before it say.
struct JpegHeader {
  uint32_t width = 0, height = 0;
  uint8_t components = 0;
  uint8_t precision = 0;   // bits per sample: 8, or 12 (extended), 2..16 (lossless)
  uint8_t sof = 0;         // n of the SOFn marker: 0 baseline, 1 extended, 2 progressive, ...
  bool progressive = false;
  bool arithmetic = false;  // SOF9 .. SOF15: arithmetic coding
  bool lossless = false;    // SOF3, SOF7, SOF11, SOF15
  bool hierarchical = false;  // SOF5 .. SOF7, SOF13 .. SOF15 (differential)
  bool adobe = false;       // an APP14 "Adobe" marker was seen
  uint8_t adobe_transform = 0;
  bool jfif = false;
  uint8_t h[4] = {}, v[4] = {};  // sampling factors, by component
  JpegColor color = JpegColor::kOther;
  JpegSubsampling subsampling = JpegSubsampling::kOther;
};

// Parses `jpeg` up to its frame header. Corruption saying what is wrong
// ("not a JPEG: no SOI marker", "JPEG header ends early", "JPEG frame header
// claims 0x375 pixels", ...) for what libjpeg would refuse as well.
Result<JpegHeader> ParseJpegHeader(std::span<const std::byte> jpeg);

const char* JpegColorName(JpegColor c);
const char* JpegSubsamplingName(JpegSubsampling s);

// Which decoder takes an image.
enum class DecodeBackend : uint8_t {
  kHardware = 0,  // nvJPEG's hardware engines (NVJPEG_BACKEND_HARDWARE, batched)
  kCuda = 1,      // nvJPEG on CUDA cores (NVJPEG_BACKEND_GPU_HYBRID / HYBRID)
  kCpu = 2,       // libjpeg-turbo in the loader's workers (DecodeSample)
};
inline constexpr int kDecodeBackends = 3;
const char* DecodeBackendName(DecodeBackend b);

// What the machine offers the GPU decode.
struct GpuDecodeCaps {
  bool nvjpeg = false;    // libnvjpeg loaded and a handle made on the device
  bool hardware = false;  // the device has JPEG engines and the hardware backend opened
};

// The backend for an image with header `h` (by its properties only):
// hardware for baseline (or extended sequential) 8-bit Huffman JPEGs in
// grey or YCbCr/RGB at 4:4:4, 4:2:2, 4:2:0 or 4:4:0 (the subsamplings the
// engines take; nvJPEG's header: "410 and 411 sub-samplings are not
// supported"); CUDA for the other 8-bit Huffman grey/YCbCr/RGB ones
// (progressive, 4:1:1, 4:1:0, unusual factors) and for all of those where
// there are no engines; the CPU for the rest (CMYK and YCCK, 12-bit,
// arithmetic-coded, lossless) and for everything without nvJPEG. The GPU
// stage may still send an image the engines refuse at run time
// (nvjpegDecodeBatchedSupported) to CUDA, and one CUDA fails on to the CPU.
DecodeBackend RouteJpeg(const JpegHeader& h, const GpuDecodeCaps& caps);

// One image's plan for the GPU: its crop (as the CPU path draws it), the
// window of source pixels to decode, and the maps the kernel resamples with.
struct GpuCropPlan {
  uint32_t image_h = 0, image_w = 0;
  // The decoded window (nvJPEG's ROI), in source pixels.
  uint32_t roi_x = 0, roi_y = 0, roi_w = 0, roi_h = 0;
  gpu::AxisMap y, x;  // shift relative to the window
  bool flip = false;
};

// The plan of an image_h x image_w image for options `o` (validated) and
// sample `key`. Its crop box and flip are DrawCrop's.
GpuCropPlan PlanGpuCrop(const DecodeOptions& o, uint32_t image_h, uint32_t image_w,
                        const SampleKey& key);

}  // namespace stoker
