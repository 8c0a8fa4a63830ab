// nvJPEG on one GPU (gpu/jpeg_decoder.h), CUDA builds.
//
// The order of one batch on the caller's stream: the engines' batched
// decode of the hardware images into their windows of the arena, then the
// CUDA decodes (whole images: nvjpegDecode has no ROI), then the jobs
// table copied from pinned memory, then the fused kernel. nvJPEG's own
// host phase (Huffman decode for the CUDA backend, parsing for the engines)
// runs in the calling thread before its device work is queued.
//
// The engines' state (and the decode params the batched call reads) is not
// touched again until the batched decode that used it has finished: nvJPEG
// does not say that a hardware state may be reused while its decode is in
// flight, and a decoder that did so stalled the engines on the H100 (the
// next batch's wait never returned). There are two, used in turn, so that
// the host's parse of one batch still overlaps the engines' decode of the
// one before; every wait on the GPU is bounded (WaitEvent), so a stall is
// an error naming the device, not a hang.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>

#include "gpu/cuda_util.h"
#include "gpu/decode_kernels.h"
#include "gpu/jpeg_decoder.h"
#include "gpu/nvjpeg_api.h"

namespace stoker::gpu {
namespace {

// How long a wait on the GPU's own work may take before it is a stall: a
// batch takes milliseconds (seconds under compute-sanitizer).
constexpr std::chrono::milliseconds kStallLimit{30000};

uint64_t NanosSince(std::chrono::steady_clock::time_point t) {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now() - t)
                      .count());
}

// The device allocator nvJPEG and the arena share, bounded by the budget.
struct Budget {
  int device = 0;
  uint64_t limit = 0;
  std::atomic<uint64_t> used{0}, peak{0};
  std::atomic<uint64_t> refused{0};  // the size of the last allocation refused

  bool Take(uint64_t n) {
    uint64_t u = used.load();
    do {
      if (u + n > limit) {
        refused = n;
        return false;
      }
    } while (!used.compare_exchange_weak(u, u + n));
    uint64_t p = peak.load();
    while (u + n > p && !peak.compare_exchange_weak(p, u + n)) {
    }
    return true;
  }
  void Give(uint64_t n) { used -= n; }
};

int DevMalloc(void* ctx, void** ptr, size_t size, void* stream) {
  auto* b = static_cast<Budget*>(ctx);
  if (!b->Take(size)) return 1;
  if (cudaMallocAsync(ptr, size, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
    (void)cudaGetLastError();
    b->Give(size);
    return 1;
  }
  return 0;
}

int DevFree(void* ctx, void* ptr, size_t size, void* stream) {
  auto* b = static_cast<Budget*>(ctx);
  if (ptr == nullptr) return 0;
  const cudaError_t e = cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream));
  b->Give(size);
  return e == cudaSuccess ? 0 : 1;
}

int PinnedMalloc(void*, void** ptr, size_t size, void*) {
  return cudaHostAlloc(ptr, size, cudaHostAllocDefault) == cudaSuccess ? 0 : 1;
}

int PinnedFree(void*, void* ptr, size_t, void*) {
  return cudaFreeHost(ptr) == cudaSuccess ? 0 : 1;
}

// One of the engines' two states, with the params its batched call reads
// (one per image) and the event after that call's work.
struct EngineSlot {
  nvj::JpegState state = nullptr;
  std::vector<nvj::DecodeParams> params;
  int initialized = -1;  // the batch size nvjpegDecodeBatchedInitialize was given
  cudaEvent_t decoded = nullptr;
  bool in_use = false;  // a decode was queued on it since the last wait
};

class CudaJpegDecoder final : public JpegDecoder {
 public:
  CudaJpegDecoder(const nvj::Api* api, const JpegDecoderOptions& o) : api_(api), device_(o.device) {
    budget_.device = o.device;
    budget_.limit = o.memory_budget;
    dev_ = {DevMalloc, DevFree, &budget_};
    pinned_ = {PinnedMalloc, PinnedFree, nullptr};
  }

  ~CudaJpegDecoder() override {
    DeviceGuard guard(device_);
    // The last batch's work must be done with the buffers below: one event,
    // never the whole device.
    if (done_ != nullptr) (void)WaitEvent(device_, "the GPU decode's last batch", done_, kStallLimit);
    for (EngineSlot& e : slots_) {
      for (nvj::DecodeParams p : e.params) api_->DecodeParamsDestroy(p);
      if (e.state != nullptr) api_->JpegStateDestroy(e.state);
      if (e.decoded != nullptr) (void)cudaEventDestroy(e.decoded);
    }
    if (stream_ != nullptr) api_->JpegStreamDestroy(stream_);
    if (cuda_state_ != nullptr) api_->JpegStateDestroy(cuda_state_);
    if (hw_ != nullptr) api_->Destroy(hw_);
    if (cuda_ != nullptr) api_->Destroy(cuda_);
    if (arena_ != nullptr) {
      (void)cudaFree(arena_);
      budget_.Give(arena_bytes_);
    }
    if (jobs_device_ != nullptr) (void)cudaFree(jobs_device_);
    if (jobs_host_ != nullptr) (void)cudaFreeHost(jobs_host_);
    if (jobs_copied_ != nullptr) (void)cudaEventDestroy(jobs_copied_);
    if (done_ != nullptr) (void)cudaEventDestroy(done_);
  }

  Status Init() {
    STOKER_RETURN_IF_ERROR(GetCudaDevice(device_).status());
    DeviceGuard guard(device_);
    STOKER_RETURN_IF_ERROR(CudaStatus(device_, "cudaSetDevice", guard.status()));
    STOKER_RETURN_IF_ERROR(nvj::NvjpegStatus(
        device_, "nvjpegCreateExV2(default backend)",
        api_->CreateExV2(nvj::kBackendDefault, &dev_, &pinned_, 0, &cuda_)));
    STOKER_RETURN_IF_ERROR(nvj::NvjpegStatus(device_, "nvjpegJpegStateCreate",
                                             api_->JpegStateCreate(cuda_, &cuda_state_)));
    // The engines: a GPU without them refuses the backend (or reports 0).
    unsigned engines = 0, cores = 0;
    if (api_->CreateExV2(nvj::kBackendHardware, &dev_, &pinned_, 0, &hw_) == nvj::kSuccess &&
        api_->GetHardwareDecoderInfo(hw_, &engines, &cores) == nvj::kSuccess && engines > 0 &&
        api_->JpegStateCreate(hw_, &slots_[0].state) == nvj::kSuccess &&
        api_->JpegStateCreate(hw_, &slots_[1].state) == nvj::kSuccess &&
        api_->JpegStreamCreate(hw_, &stream_) == nvj::kSuccess) {
      engines_ = true;
      for (EngineSlot& e : slots_) {
        STOKER_RETURN_IF_ERROR(
            CudaStatus(device_, "cudaEventCreateWithFlags",
                       cudaEventCreateWithFlags(&e.decoded, cudaEventDisableTiming)));
      }
    } else {
      for (EngineSlot& e : slots_) {
        if (e.state != nullptr) api_->JpegStateDestroy(e.state);
        e.state = nullptr;
      }
      if (hw_ != nullptr) api_->Destroy(hw_);
      hw_ = nullptr;
    }
    description_ = "nvJPEG " + std::to_string(api_->major) + "." + std::to_string(api_->minor) +
                   "." + std::to_string(api_->patch) + " (" + api_->path + "): ";
    description_ += engines_ ? "hardware backend, " + std::to_string(engines) + " engine" +
                                   (engines == 1 ? "" : "s") + " x " + std::to_string(cores) +
                                   " cores, and CUDA"
                             : std::string("CUDA only (no JPEG engines on this GPU)");
    if (!FusedKernelAvailable()) {
      return Unsupported(DeviceName(device_) +
                         ": this stoker was built without nvcc, so without the GPU decode's "
                         "kernel");
    }
    STOKER_RETURN_IF_ERROR(CudaStatus(
        device_, "cudaEventCreateWithFlags",
        cudaEventCreateWithFlags(&jobs_copied_, cudaEventDisableTiming)));
    return CudaStatus(device_, "cudaEventCreateWithFlags",
                      cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }

  const std::string& description() const override { return description_; }
  bool engines() const override { return engines_; }
  uint64_t device_bytes() const override { return budget_.used.load(); }
  uint64_t peak_device_bytes() const override { return budget_.peak.load(); }

  Status Upload(const void* host, void* device, size_t bytes, CudaStreamHandle stream) override {
    DeviceGuard guard(device_);
    return CudaStatus(device_, "cudaMemcpyAsync(" + std::to_string(bytes) + " bytes to device)",
                      cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice,
                                      reinterpret_cast<cudaStream_t>(stream)));
  }

  Status DecodeBatch(std::span<const JpegJob> jobs, const OutputSpec& spec, void* device_column,
                     CudaStreamHandle stream_handle, JpegDecodeResult* result) override {
    DeviceGuard guard(device_);
    STOKER_RETURN_IF_ERROR(CudaStatus(device_, "cudaSetDevice", guard.status()));
    // In chunks whose windows fit half the budget (nvJPEG's own buffers
    // take from the rest), one image at the least, each decoded and resized
    // before the next reuses the arena (stream order keeps them apart).
    const uint64_t cap = std::max<uint64_t>(budget_.limit / 2, 1);
    size_t begin = 0;
    while (begin < jobs.size()) {
      size_t end = begin;
      uint64_t bytes = 0;
      while (end < jobs.size()) {
        const uint64_t need = uint64_t(jobs[end].image_w) * 3 * jobs[end].image_h;  // at most
        if (end > begin && bytes + need > cap) break;
        bytes += need;
        ++end;
      }
      JpegDecodeResult part;
      STOKER_RETURN_IF_ERROR(
          DecodeChunk(jobs.subspan(begin, end - begin), spec, device_column, stream_handle, &part));
      result->hardware += part.hardware;
      result->cuda += part.cuda;
      result->wait_ns += part.wait_ns;
      for (size_t k = 0; k < part.failed.size(); ++k) {
        result->failed.push_back(part.failed[k] + uint32_t(begin));
        result->why.push_back(std::move(part.why[k]));
      }
      begin = end;
    }
    return Status::Ok();
  }

 private:
  Status DecodeChunk(std::span<const JpegJob> jobs, const OutputSpec& spec, void* device_column,
                     CudaStreamHandle stream_handle, JpegDecodeResult* result) {
    const auto s = reinterpret_cast<cudaStream_t>(stream_handle);
    const size_t n = jobs.size();
    // Where each job's window goes in the arena: hardware ones decode
    // their ROI, CUDA ones the whole image.
    std::vector<uint8_t> on_hw(n, 0);
    bool any_hw = false;
    for (size_t i = 0; i < n; ++i) {
      on_hw[i] = jobs[i].hardware && engines_;
      any_hw = any_hw || on_hw[i];
    }
    EngineSlot* slot = nullptr;
    if (any_hw) {
      // The state and params of the batch before last: its decode must be done.
      slot = &slots_[next_slot_];
      next_slot_ ^= 1;
      if (slot->in_use) {
        const auto t = std::chrono::steady_clock::now();
        STOKER_RETURN_IF_ERROR(WaitEvent(device_, "the JPEG engines' batch before last",
                                         slot->decoded, kStallLimit));
        result->wait_ns += NanosSince(t);
        slot->in_use = false;
      }
      STOKER_RETURN_IF_ERROR(CheckEngines(jobs, *slot, &on_hw));
    }
    std::vector<uint64_t> offset(n), pitch(n);
    uint64_t total = 0, whole = 0;
    for (size_t i = 0; i < n; ++i) {
      const JpegJob& j = jobs[i];
      pitch[i] = uint64_t(on_hw[i] ? j.roi_w : j.image_w) * 3;
      offset[i] = total;
      total += (pitch[i] * (on_hw[i] ? j.roi_h : j.image_h) + 255) / 256 * 256;
      whole += (uint64_t(j.image_w) * 3 * j.image_h + 255) / 256 * 256;
    }
    // The arena is sized for the whole images, which the windows never
    // exceed: its size then depends on the images, not on the epoch's random
    // crops, so it stops growing once each image size has been seen (sized by
    // the windows, it grew over 50 epochs as larger batches of crops came).
    if (Status st = Reserve(whole, s); !st.ok()) {
      if (st.code() != Code::kNoSpace) return st;
      // No room for the windows: these images go to the CPU, the batch goes on.
      for (size_t i = 0; i < n; ++i) {
        result->failed.push_back(uint32_t(i));
        result->why.push_back(st);
      }
      return Status::Ok();
    }
    std::vector<uint8_t> ok(n, 0);
    // The engines, in one batched call.
    std::vector<uint32_t> hw_index;
    for (size_t i = 0; i < n; ++i) {
      if (on_hw[i]) hw_index.push_back(uint32_t(i));
    }
    if (!hw_index.empty()) {
      if (DecodeOnEngines(jobs, hw_index, offset, pitch, s, slot).ok()) {
        for (uint32_t i : hw_index) ok[i] = 1;
        result->hardware += uint32_t(hw_index.size());
      } else {
        // The whole call failed: each image gets its own try on CUDA.
        for (uint32_t i : hw_index) on_hw[i] = 0;
        return DecodeBatchAgainOnCuda(jobs, spec, device_column, stream_handle, result);
      }
    }
    // CUDA, one image at a time.
    for (size_t i = 0; i < n; ++i) {
      if (on_hw[i]) continue;
      const JpegJob& j = jobs[i];
      nvj::Image img{};
      img.channel[0] = static_cast<unsigned char*>(arena_) + offset[i];
      img.pitch[0] = pitch[i];
      const int st = api_->Decode(cuda_, cuda_state_, j.data, j.size, nvj::kOutputRgbi, &img, s);
      if (st == nvj::kSuccess) {
        ok[i] = 1;
        result->cuda++;
      } else {
        result->failed.push_back(uint32_t(i));
        result->why.push_back(nvj::NvjpegStatus(device_, "nvjpegDecode", st));
      }
    }
    // The kernel's table, then the kernel.
    std::vector<ImageJob> table;
    table.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (!ok[i]) continue;
      const JpegJob& j = jobs[i];
      ImageJob k;
      k.src = static_cast<const uint8_t*>(arena_) + offset[i];
      k.pitch = pitch[i];
      k.y = j.y;
      k.x = j.x;
      if (!on_hw[i]) {
        // The whole image was decoded: shift from the window to the image.
        k.y.shift -= int32_t(j.roi_y);
        k.x.shift -= int32_t(j.roi_x);
        k.src_h = int32_t(j.image_h);
        k.src_w = int32_t(j.image_w);
      } else {
        k.src_h = int32_t(j.roi_h);
        k.src_w = int32_t(j.roi_w);
      }
      k.flip = j.flip;
      k.out_offset = j.out_offset;
      table.push_back(k);
    }
    if (!table.empty()) {
      STOKER_RETURN_IF_ERROR(UploadTable(table, s, &result->wait_ns));
      STOKER_RETURN_IF_ERROR(LaunchFusedResize(device_, jobs_device_, uint32_t(table.size()), spec,
                                               device_column, stream_handle));
    }
    return CudaStatus(device_, "cudaEventRecord", cudaEventRecord(done_, s));
  }

  // The engines' own say per image (nvjpegDecodeBatchedSupportedEx with its
  // ROI): 0 is "supported". Those refused go to CUDA.
  Status CheckEngines(std::span<const JpegJob> jobs, EngineSlot& slot, std::vector<uint8_t>* on_hw) {
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (!(*on_hw)[i]) continue;
      const JpegJob& j = jobs[i];
      STOKER_ASSIGN_OR_RETURN(nvj::DecodeParams p, Params(slot, i));
      int supported = 1;
      if (api_->JpegStreamParseHeader(hw_, j.data, j.size, stream_) != nvj::kSuccess ||
          api_->DecodeParamsSetOutputFormat(p, nvj::kOutputRgbi) != nvj::kSuccess ||
          api_->DecodeParamsSetROI(p, int(j.roi_x), int(j.roi_y), int(j.roi_w), int(j.roi_h)) !=
              nvj::kSuccess ||
          api_->DecodeBatchedSupportedEx(hw_, stream_, p, &supported) != nvj::kSuccess ||
          supported != 0) {
        (*on_hw)[i] = 0;
      }
    }
    return Status::Ok();
  }

  Result<nvj::DecodeParams> Params(EngineSlot& slot, size_t i) {
    while (slot.params.size() <= i) {
      nvj::DecodeParams p = nullptr;
      STOKER_RETURN_IF_ERROR(nvj::NvjpegStatus(device_, "nvjpegDecodeParamsCreate",
                                               api_->DecodeParamsCreate(hw_, &p)));
      slot.params.push_back(p);
    }
    return slot.params[i];
  }

  // The batched call on `slot`'s state, its end recorded in slot->decoded
  // (whether or not the call succeeded: what it queued may still run).
  Status DecodeOnEngines(std::span<const JpegJob> jobs, const std::vector<uint32_t>& index,
                         const std::vector<uint64_t>& offset, const std::vector<uint64_t>& pitch,
                         cudaStream_t s, EngineSlot* slot) {
    const size_t m = index.size();
    std::vector<const unsigned char*> data(m);
    std::vector<size_t> lengths(m);
    std::vector<nvj::Image> out(m);
    std::vector<nvj::DecodeParams> params(m);
    for (size_t k = 0; k < m; ++k) {
      const JpegJob& j = jobs[index[k]];
      data[k] = j.data;
      lengths[k] = j.size;
      out[k] = {};
      out[k].channel[0] = static_cast<unsigned char*>(arena_) + offset[index[k]];
      out[k].pitch[0] = pitch[index[k]];
      // Params(i) of the job's own index was set by CheckEngines; the
      // batched call wants them in its own order.
      STOKER_ASSIGN_OR_RETURN(params[k], Params(*slot, index[k]));
    }
    if (int(m) != slot->initialized) {
      STOKER_RETURN_IF_ERROR(nvj::NvjpegStatus(
          device_, "nvjpegDecodeBatchedInitialize",
          api_->DecodeBatchedInitialize(hw_, slot->state, int(m), 1, nvj::kOutputRgbi)));
      slot->initialized = int(m);
    }
    const Status st = nvj::NvjpegStatus(
        device_, "nvjpegDecodeBatchedEx(" + std::to_string(m) + " images)",
        api_->DecodeBatchedEx(hw_, slot->state, data.data(), lengths.data(), out.data(),
                              params.data(), s));
    STOKER_RETURN_IF_ERROR(
        CudaStatus(device_, "cudaEventRecord", cudaEventRecord(slot->decoded, s)));
    slot->in_use = true;
    return st;
  }

  // After a failed batched call: the same batch with the engines off.
  Status DecodeBatchAgainOnCuda(std::span<const JpegJob> jobs, const OutputSpec& spec,
                                void* device_column, CudaStreamHandle stream,
                                JpegDecodeResult* result) {
    std::vector<JpegJob> again(jobs.begin(), jobs.end());
    for (JpegJob& j : again) j.hardware = false;
    return DecodeChunk(again, spec, device_column, stream, result);
  }

  // An arena of at least `bytes`, in stream order: the old one is freed on
  // the stream after the work that used it.
  Status Reserve(uint64_t bytes, cudaStream_t s) {
    if (bytes <= arena_bytes_) return Status::Ok();
    if (arena_ != nullptr) {
      (void)cudaFreeAsync(arena_, s);
      budget_.Give(arena_bytes_);
      arena_ = nullptr;
      arena_bytes_ = 0;
    }
    // Batches vary: a quarter more where the budget has room for it.
    const uint64_t room = budget_.limit > budget_.used.load() ? budget_.limit - budget_.used.load() : 0;
    const uint64_t want = std::max(bytes, std::min(bytes + bytes / 4, room));
    if (!budget_.Take(want)) {
      return NoSpace(DeviceName(device_) + ": the GPU decode needs " + std::to_string(want) +
                     " bytes of device memory for a batch's decoded images, and its budget of " +
                     std::to_string(budget_.limit) + " bytes holds " +
                     std::to_string(budget_.used.load()) +
                     " already (raise device_memory_budget, or lower batch_size)");
    }
    const cudaError_t e = cudaMallocAsync(&arena_, want, s);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      budget_.Give(want);
      arena_ = nullptr;
      return CudaStatus(device_, "cudaMallocAsync(" + std::to_string(want) + " bytes)", e);
    }
    arena_bytes_ = want;
    return Status::Ok();
  }

  // The jobs table through pinned memory; the previous batch's copy must
  // have left it first.
  Status UploadTable(const std::vector<ImageJob>& table, cudaStream_t s, uint64_t* wait_ns) {
    const auto t = std::chrono::steady_clock::now();
    STOKER_RETURN_IF_ERROR(
        WaitEvent(device_, "the previous batch's jobs table copy", jobs_copied_, kStallLimit));
    *wait_ns += NanosSince(t);
    if (table.size() > jobs_capacity_) {
      if (jobs_device_ != nullptr) (void)cudaFreeAsync(jobs_device_, s);
      if (jobs_host_ != nullptr) (void)cudaFreeHost(jobs_host_);
      jobs_device_ = nullptr;
      jobs_host_ = nullptr;
      const size_t cap = std::max<size_t>(table.size(), 256);
      STOKER_RETURN_IF_ERROR(
          CudaStatus(device_, "cudaHostAlloc(jobs table)",
                     cudaHostAlloc(reinterpret_cast<void**>(&jobs_host_),
                                   cap * sizeof(ImageJob), cudaHostAllocDefault)));
      STOKER_RETURN_IF_ERROR(CudaStatus(
          device_, "cudaMallocAsync(jobs table)",
          cudaMallocAsync(reinterpret_cast<void**>(&jobs_device_), cap * sizeof(ImageJob), s)));
      jobs_capacity_ = cap;
    }
    std::copy(table.begin(), table.end(), jobs_host_);
    STOKER_RETURN_IF_ERROR(
        CudaStatus(device_, "cudaMemcpyAsync(jobs table)",
                   cudaMemcpyAsync(jobs_device_, jobs_host_, table.size() * sizeof(ImageJob),
                                   cudaMemcpyHostToDevice, s)));
    return CudaStatus(device_, "cudaEventRecord", cudaEventRecord(jobs_copied_, s));
  }

  const nvj::Api* api_;
  const int device_;
  Budget budget_;
  nvj::DevAllocatorV2 dev_{};
  nvj::PinnedAllocatorV2 pinned_{};
  nvj::Handle hw_ = nullptr, cuda_ = nullptr;
  nvj::JpegState cuda_state_ = nullptr;
  nvj::JpegStream stream_ = nullptr;
  EngineSlot slots_[2];
  int next_slot_ = 0;
  bool engines_ = false;
  std::string description_;
  void* arena_ = nullptr;
  uint64_t arena_bytes_ = 0;
  ImageJob* jobs_host_ = nullptr;
  ImageJob* jobs_device_ = nullptr;
  size_t jobs_capacity_ = 0;
  cudaEvent_t jobs_copied_ = nullptr;
  cudaEvent_t done_ = nullptr;  // after the latest batch's kernel
};

}  // namespace

Status JpegDecoder::Probe(int device) {
  STOKER_RETURN_IF_ERROR(nvj::LoadNvjpeg().status());
  STOKER_RETURN_IF_ERROR(GetCudaDevice(device).status());
  if (!FusedKernelAvailable()) {
    return Unsupported(DeviceName(device) +
                       ": this stoker was built without nvcc, so without the GPU decode's kernel");
  }
  return Status::Ok();
}

Result<std::unique_ptr<JpegDecoder>> JpegDecoder::Open(const JpegDecoderOptions& options) {
  STOKER_ASSIGN_OR_RETURN(const nvj::Api* api, nvj::LoadNvjpeg());
  auto d = std::make_unique<CudaJpegDecoder>(api, options);
  STOKER_RETURN_IF_ERROR(d->Init());
  return std::unique_ptr<JpegDecoder>(std::move(d));
}

}  // namespace stoker::gpu
