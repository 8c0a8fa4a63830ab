// Decode and augmentation of one image sample, as the loader's workers do it.
//
// The loader calls DecodeSample once per sample, in whichever worker builds
// that sample, into the sample's slot of the batch's image column
// (DecodedSampleBytes(options) bytes). Random choices (the crop box, the
// flip) are drawn from (seed, epoch, sample id) alone, so a resumed run and
// every worker count see the same pixels.
//
// Thread safety: DecodeSample is safe to call from any number of threads at
// once (each with its own DecodeScratch).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "stoker/status.h"

namespace stoker {

enum class ImageDType : uint8_t { kUInt8 = 0, kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3 };
enum class ImageLayout : uint8_t { kNHWC = 0, kNCHW = 1 };
enum class CropMode : uint8_t {
  // The whole image resized to height x width (aspect ratio not kept), as
  // torchvision's Resize((h, w)).
  kResize = 0,
  // Shorter side resized to `resize_shorter`, then the centre height x width
  // cut out: torchvision's Resize(256) + CenterCrop(224) for evaluation.
  kCenter = 1,
  // torchvision's RandomResizedCrop(size, scale, ratio): a box of random
  // area and aspect ratio, resized to height x width.
  kRandomResized = 2,
};

// The names of CropMode, ImageDType and ImageLayout, one set for every
// entry point (the CLI's --crop/--dtype/--layout, Python's decode={...}):
//   crop:   resize, center, random-resized
//   dtype:  uint8, float32, float16, bfloat16
//   layout: nhwc, nchw
// ASCII case is ignored and '_' is read as '-' ("random_resized",
// "NCHW" and "Float32" are accepted). Anything else is InvalidArgument
// naming the option and the accepted values, e.g. "crop must be resize,
// center or random-resized, not 'random'". The *Name functions give the
// spellings above (lower case, '-'); an out-of-range value gives "unknown".
Result<CropMode> ParseCropMode(std::string_view name);
Result<ImageDType> ParseImageDType(std::string_view name);
Result<ImageLayout> ParseImageLayout(std::string_view name);
std::string_view CropModeName(CropMode m);
std::string_view ImageDTypeName(ImageDType t);
std::string_view ImageLayoutName(ImageLayout l);

// How much of a JPEG DecodeSample decodes.
enum class DecodeExtent : uint8_t {
  // The crop's rows and columns only, at the smallest DCT scaling (1/8,
  // 2/8, 4/8 or 8/8) whose scaled crop still covers the output size.
  kCropScaled = 0,
  // The whole image at that DCT scaling.
  kWholeScaled = 1,
  // The whole image at full size (as PIL and torchvision decode).
  kWholeFull = 2,
};

// JPEG decode and augmentation, done by the loader's workers.
// The largest decode height and width.
inline constexpr uint32_t kMaxDecodeSide = 8192;

struct DecodeOptions {
  // The bytes field holding JPEG data. Empty: no decode. Default: none.
  std::string field;
  // Output size. Default: 224 x 224.
  uint32_t height = 224;
  uint32_t width = 224;
  // Default: kResize (what stoker did before crops existed).
  CropMode crop = CropMode::kResize;
  // kRandomResized: the box's area as a fraction of the image's (drawn
  // uniformly) and its aspect ratio w / h (drawn log-uniformly), as
  // torchvision does; 10 tries, then its central-crop fallback.
  // Default: torchvision's scale (0.08, 1.0) and ratio (3/4, 4/3).
  float scale_min = 0.08f, scale_max = 1.0f;
  float ratio_min = 3.0f / 4.0f, ratio_max = 4.0f / 3.0f;
  // kCenter: the shorter side before the centre crop. Default: 0 =
  // max(height, width) * 256 / 224 (torchvision's ImageNet evaluation: 256
  // for 224).
  uint32_t resize_shorter = 0;
  // Probability of a horizontal flip. Default: 0 (never).
  float flip = 0.0f;
  // (x / 255 - mean) / std per channel, into dtype. Default: off.
  bool normalize = false;
  float mean[3] = {0.485f, 0.456f, 0.406f};  // ImageNet's, as torchvision's docs use
  float std[3] = {0.229f, 0.224f, 0.225f};
  // Element type of the output. kUInt8 cannot be normalized; float32 and
  // float16 without normalize hold x / 255 (torchvision's ToTensor).
  // float16 and bfloat16 are float32's value rounded to nearest even
  // (bfloat16: for device delivery and C++; numpy has no bfloat16). Default:
  // kUInt8.
  ImageDType dtype = ImageDType::kUInt8;
  // Default: kNHWC (uint8 HWC as decoded).
  ImageLayout layout = ImageLayout::kNHWC;
  // A sample that is not a decodable JPEG: by default the batch fails with
  // Corruption naming the dataset, shard and sample; with this on, its
  // image is zero-filled, and the loader counts it (LoaderStats). Default: off.
  // (DecodeSample zero-fills the output of every sample it fails on.)
  bool skip_corrupt = false;
  // Default: kCropScaled, the fastest; the others are there to measure what
  // it gains (bench/augment_bench.py). kWholeFull's pixels differ from the
  // scaled ones by a few grey levels: the IDCT's downscaling is not the
  // bilinear filter's.
  DecodeExtent extent = DecodeExtent::kCropScaled;
  // Where JPEGs are decoded: "" or "cpu" in the loader's workers
  // (libjpeg-turbo); "cuda:N" on GPU N, with batches delivered there (the
  // loader's device defaults to it; another one is InvalidArgument). On the
  // GPU each image is routed by its header alone: nvJPEG's hardware engines
  // for baseline 4:4:4/4:2:2/4:2:0/4:4:0/grey JPEGs, nvJPEG on CUDA for the
  // others it takes (progressive, 4:1:1, or a GPU without engines), the
  // workers' libjpeg-turbo for the rest (CMYK, 12-bit, arithmetic) and for
  // any image nvJPEG fails on, so a batch never fails for the GPU's sake. The
  // crop and flip are drawn on the host as on the CPU path; the GPU resizes
  // with torchvision's antialias=True filter, so its pixels differ from the
  // CPU path's by about a grey level (docs/benchmarks.md). nvJPEG is loaded
  // at run time (libnvjpeg.so.13, then .12; STOKER_NVJPEG_PATH); without it,
  // or without a GPU, the loader says so once on stderr and decodes on the
  // CPU (LoaderStats::decode_path says which path ran). With the GPU
  // decode running, the image column is whole in device memory only (the
  // host buffer holds the CPU-decoded images). Default: "".
  std::string device;
  // With `device`: the fraction of the images the GPU would take that the
  // workers decode instead, so that CPU and GPU work together; each sample
  // is chosen from (seed, epoch, sample id), the same in every run. Pick it
  // from the images/s each path reaches alone, C (CPU) and G (GPU), and the
  // cores g the GPU path's host work keeps busy: at t = cores - round(g)
  // worker threads, C' = C * t / cores and cpu_share = C' / (C' + G)
  // (docs/architecture.md; bench/gpu_decode_bench.py does). Default: 0 (the
  // GPU takes all it can).
  float cpu_share = 0.0f;
  // Moves cpu_share at run time, starting from the value above: up while
  // the GPU stage falls behind (built batches wait for it), down while it
  // waits for the workers (CpuShareStep, loader/gpu_decode.h), so neither
  // path idles while the other has work. The split then depends on timing:
  // pixels may differ between runs by the few grey levels that separate the
  // two paths (crops and flips do not). LoaderStats::decode_cpu_share is the
  // share now. Default: off (the fixed cpu_share, deterministic).
  bool cpu_share_balance = false;
  // With `device`, while the GPU decode runs: the worker threads' nice is
  // raised by this much, so that the one copier thread that feeds the GPU
  // (its host work: nvJPEG's parsing and Huffman decode, the copies) gets a
  // core the moment it needs one, and the workers decode the CPU's share
  // on the cores it leaves. 0 leaves the workers at the process's nice.
  // Between 0 and 19. Default: 5.
  uint32_t worker_nice = 5;
};

// InvalidArgument naming the parameter when `o` is out of range (sizes,
// scale outside (0, 1] or min > max, ratio <= 0 or min > max, flip outside
// [0, 1], a std of 0 or a non-finite mean/std, normalize with uint8,
// resize_shorter below the crop size, unknown enum values).
Status ValidateDecodeOptions(const DecodeOptions& o);

// Bytes one decoded sample occupies: height * width * 3 * element size.
size_t DecodedSampleBytes(const DecodeOptions& o);
size_t ImageDTypeSize(ImageDType t);

// Where a sample's random draws come from.
struct SampleKey {
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint64_t sample_id = 0;  // global id in the dataset
};

// The crop box (source pixels: rows [top, top + height), columns [left,
// left + width); fractional for kCenter) and flip DecodeSample applies to a
// sample whose image is image_h x image_w. For tests and for looking at what
// a sample got.
struct SampleCrop {
  double top = 0, left = 0, height = 0, width = 0;
  bool flip = false;
};
SampleCrop SampleCropFor(const DecodeOptions& o, uint32_t image_h, uint32_t image_w,
                         const SampleKey& key);

// Per-thread reusable memory of DecodeSample (decoder handle, pixels).
class DecodeScratch {
 public:
  DecodeScratch();
  ~DecodeScratch();
  DecodeScratch(const DecodeScratch&) = delete;
  DecodeScratch& operator=(const DecodeScratch&) = delete;
  struct Impl;
  Impl* impl() { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

// Decodes `jpeg` and applies `o` into `out` (DecodedSampleBytes(o) bytes;
// layout HWC or CHW of one sample). Corruption when the data is not a
// decodable JPEG, a truncated one included (the caller adds which sample;
// a file cut short below the rows a crop needs decodes, as those rows are
// never read);
// Unsupported when built without libjpeg-turbo. Grayscale, CMYK (read with
// Adobe's inverted polarity, as PIL does) and progressive JPEGs give RGB.
Status DecodeSample(const DecodeOptions& o, std::span<const std::byte> jpeg, const SampleKey& key,
                    std::span<std::byte> out, DecodeScratch* scratch);

}  // namespace stoker
