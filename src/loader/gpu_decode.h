// The loader's GPU decode (internal; DecodeOptions::device).
//
// The workers do what they do on the CPU path up to the decode: for each
// image they read its header, route it (loader/jpeg_route.h) and, when it
// goes to the GPU, keep its bytes and crop plan in the batch's
// GpuDecodeList instead of decoding it; the others they decode as always.
// The device stage then copies the batch to the GPU and, on the same stream
// before the batch counts as landed, has nvJPEG decode the listed images
// and the fused kernel write them into the batch's image column
// (GpuDecode::Run). An image nvJPEG fails on is decoded on the CPU there and
// uploaded, so a batch never fails for the GPU's sake; a corrupt one fails
// the batch with the CPU path's own error, naming dataset, shard and sample
// (or is zero-filled and counted with skip_corrupt).
//
// Thread safety: GpuDecodeList::Take from any worker for distinct samples;
// GpuDecode::Run from the copier thread alone.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/jpeg_decoder.h"
#include "loader/counters.h"
#include "loader/jpeg_route.h"
#include "stoker/decode.h"
#include "stoker/loader.h"

namespace stoker {

// The images of one batch that go to the GPU.
class GpuDecodeList {
 public:
  struct Entry {
    bool used = false;
    std::vector<uint8_t> jpeg;  // a copy: the shard buffer may go before the copier runs
    GpuCropPlan plan;
    DecodeBackend backend = DecodeBackend::kCpu;
    SampleKey key;
    std::string where;  // "dataset ...: shard ...: sample ...: field 'image'", for errors
  };

  // `cpu_share`: the batch's share of GPU-routed images left to the CPU
  // (< 0: decode->cpu_share).
  GpuDecodeList(const DecodeOptions* decode, GpuDecodeCaps caps, size_t count,
                uint64_t column_offset, uint64_t image_bytes, float cpu_share = -1.0f)
      : decode_(decode),
        cpu_share_(cpu_share < 0 ? decode->cpu_share : cpu_share),
        caps_(caps),
        entries_(count),
        column_offset_(column_offset),
        image_bytes_(image_bytes) {}

  // Keeps sample i for the GPU when its header routes it there (true);
  // false leaves it to the worker's CPU decode (which also reports a header
  // that does not parse).
  bool Take(size_t i, std::span<const std::byte> jpeg, const SampleKey& key,
            const std::function<std::string()>& where);

  const std::vector<Entry>& entries() const { return entries_; }
  uint64_t column_offset() const { return column_offset_; }
  uint64_t image_bytes() const { return image_bytes_; }
  size_t taken() const { return taken_.load(); }

 private:
  const DecodeOptions* decode_;
  const float cpu_share_;
  const GpuDecodeCaps caps_;
  std::vector<Entry> entries_;
  const uint64_t column_offset_, image_bytes_;
  std::atomic<size_t> taken_{0};
};

// DecodeOptions::cpu_share_balance's rule: the share after the copier
// found `ready` built batches waiting for it as it went for the next one
// (0: it had to wait for the workers; 2 or more: the GPU stage is behind).
// Moves by 0.01 a batch, within [0, 0.95].
float CpuShareStep(float share, int ready);

// What the copier's look at the built queue before batch `b` (of
// `num_batches` in the epoch; the workers build up to `lookahead` batches
// ahead) tells the balance: the `ready` count CpuShareStep takes, or -1
// when it tells nothing. The epoch's first batch is the pipeline filling
// (the copier always waits for it), and its last batches are built with
// nothing left for the workers to build (they always wait for the copier):
// counting those moved the share by the epoch's length, not by the rates
// (0.32 to 0.43 over four 24-batch epochs on the H100).
int CpuShareObservation(uint64_t b, uint64_t num_batches, size_t lookahead, bool b_ready,
                        bool next_ready);

class GpuDecode {
 public:
  // Opens nvJPEG on `device` with `memory_budget` device bytes. Without it
  // (no nvJPEG, no GPU, a build without CUDA or nvcc) returns null, having
  // said once per process on stderr which path runs instead; `path` gets
  // the line LoaderStats::decode_path carries either way.
  static std::unique_ptr<GpuDecode> Open(int device, const DecodeOptions& decode,
                                         uint64_t memory_budget, std::string* path);

  const GpuDecodeCaps& caps() const { return caps_; }

  // Decodes `list` into the device copy of a batch (`device_base`, its
  // host block at `host_base`) on `stream`, as the stager's AfterCopy.
  Status Run(const GpuDecodeList& list, std::byte* host_base, CudaStreamHandle stream,
             std::byte* device_base, LoaderCounters* counters);

  // The CPU share the next batch gets (DecodeOptions::cpu_share, moved by
  // Balance when cpu_share_balance is on).
  float cpu_share() const { return share_.load(std::memory_order_relaxed); }
  bool balancing() const { return decode_.cpu_share_balance; }
  // The copier's observation, for the balance (CpuShareStep).
  void Balance(int ready) {
    share_.store(CpuShareStep(share_.load(std::memory_order_relaxed), ready),
                 std::memory_order_relaxed);
  }

  uint64_t device_bytes() const { return decoder_->device_bytes(); }
  uint64_t peak_device_bytes() const { return decoder_->peak_device_bytes(); }

 private:
  GpuDecode(std::unique_ptr<gpu::JpegDecoder> d, const DecodeOptions& o, int device);

  std::unique_ptr<gpu::JpegDecoder> decoder_;
  const DecodeOptions decode_;
  const int device_;
  GpuDecodeCaps caps_;
  gpu::OutputSpec spec_;
  DecodeScratch scratch_;  // the CPU fallback's, in the copier thread
  std::atomic<float> share_;  // written by the copier, read by the assembly
};

// The device batches go to: LoaderOptions::device, or the decode's device
// when that is empty and the GPU decode can run there (otherwise host
// delivery, with the reason in *unavailable, and the CPU decodes).
// InvalidArgument when both are set and differ.
Result<int> DeliveryDevice(const LoaderOptions& o, std::string* unavailable);

// The line LoaderStats::decode_path carries, and stderr once, when the
// decode device cannot decode: `why` is the reason.
std::string CpuInsteadOf(int device, const Status& why);

}  // namespace stoker
