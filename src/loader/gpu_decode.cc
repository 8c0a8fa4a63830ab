// The loader's GPU decode (loader/gpu_decode.h).
#include "loader/gpu_decode.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

#include "loader/augment.h"
#include "stoker/plan.h"

namespace stoker {

namespace {

// Whether an EOI marker closes the data (within the last 64 bytes: some
// writers pad after it). libjpeg reports a JPEG without one as truncated;
// nvJPEG may decode it without a word, so such a file goes to the CPU,
// which says what is wrong with it.
bool EndsWithEoi(std::span<const std::byte> jpeg) {
  const size_t n = jpeg.size();
  for (size_t k = n >= 64 ? n - 64 : 0; k + 1 < n; ++k) {
    if (jpeg[k] == std::byte{0xff} && jpeg[k + 1] == std::byte{0xd9}) return true;
  }
  return false;
}

}  // namespace

bool GpuDecodeList::Take(size_t i, std::span<const std::byte> jpeg, const SampleKey& key,
                         const std::function<std::string()>& where) {
  if (!EndsWithEoi(jpeg)) return false;
  auto h = ParseJpegHeader(jpeg);
  if (!h.ok()) return false;
  const DecodeBackend b = RouteJpeg(*h, caps_);
  if (b == DecodeBackend::kCpu) return false;
  if (cpu_share_ > 0) {
    // A stream of its own, apart from the crop's draws.
    constexpr uint64_t kShareStream = 0x4350555348415245ull;  // "CPUSHARE"
    Rng rng(MixSeed({key.seed, key.epoch, key.sample_id, kShareStream}));
    if (Uniform01(rng) < double(cpu_share_)) return false;
  }
  Entry& e = entries_[i];
  e.used = true;
  const auto* p = reinterpret_cast<const uint8_t*>(jpeg.data());
  e.jpeg.assign(p, p + jpeg.size());
  e.plan = PlanGpuCrop(*decode_, h->height, h->width, key);
  e.backend = b;
  e.key = key;
  e.where = where();
  taken_++;
  return true;
}

namespace {

// Once per process and reason: the loaders of one job open with the same
// options, and a line per epoch or per loader would drown the log.
void SayOnce(const std::string& line) {
  static std::mutex mu;
  static std::set<std::string> said;
  std::lock_guard lock(mu);
  if (said.insert(line).second) std::fprintf(stderr, "stoker: %s\n", line.c_str());
}

gpu::OutputSpec SpecOf(const DecodeOptions& o) {
  gpu::OutputSpec s;
  s.height = int32_t(o.height);
  s.width = int32_t(o.width);
  s.type = gpu::OutType(uint8_t(o.dtype));
  s.nchw = o.layout == ImageLayout::kNCHW;
  s.normalize = o.normalize;
  std::memcpy(s.mean, o.mean, sizeof s.mean);
  std::memcpy(s.std, o.std, sizeof s.std);
  return s;
}

}  // namespace

float CpuShareStep(float share, int ready) {
  constexpr float kStep = 0.01f, kMost = 0.95f;
  if (ready <= 0) return std::max(0.0f, share - kStep);
  if (ready >= 2) return std::min(kMost, share + kStep);
  return share;
}

int CpuShareObservation(uint64_t b, uint64_t num_batches, size_t lookahead, bool b_ready,
                        bool next_ready) {
  if (b == 0 || b + 1 + std::max<size_t>(lookahead, 1) >= num_batches) return -1;
  if (!b_ready) return 0;
  return lookahead > 1 && next_ready ? 2 : 1;
}

GpuDecode::GpuDecode(std::unique_ptr<gpu::JpegDecoder> d, const DecodeOptions& o, int device)
    : decoder_(std::move(d)), decode_(o), device_(device), spec_(SpecOf(o)), share_(o.cpu_share) {
  caps_.nvjpeg = true;
  caps_.hardware = decoder_->engines();
}

std::unique_ptr<GpuDecode> GpuDecode::Open(int device, const DecodeOptions& decode,
                                           uint64_t memory_budget, std::string* path) {
  gpu::JpegDecoderOptions o;
  o.device = device;
  o.memory_budget = memory_budget;
  auto d = gpu::JpegDecoder::Open(o);
  if (!d.ok()) {
    *path = CpuInsteadOf(device, d.status());
    return nullptr;
  }
  *path = DeviceName(device) + ": " + (*d)->description() + "; libjpeg-turbo for the rest";
  SayOnce("decode device " + *path);
  return std::unique_ptr<GpuDecode>(new GpuDecode(std::move(d).value(), decode, device));
}

Status GpuDecode::Run(const GpuDecodeList& list, std::byte* host_base, CudaStreamHandle stream,
                      std::byte* device_base, LoaderCounters* counters) {
  std::vector<gpu::JpegJob> jobs;
  std::vector<size_t> sample;  // jobs[k] is sample sample[k]
  jobs.reserve(list.taken());
  const auto& entries = list.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    const GpuDecodeList::Entry& e = entries[i];
    if (!e.used) continue;
    gpu::JpegJob j;
    j.data = e.jpeg.data();
    j.size = e.jpeg.size();
    j.hardware = e.backend == DecodeBackend::kHardware;
    j.image_h = e.plan.image_h;
    j.image_w = e.plan.image_w;
    j.roi_x = e.plan.roi_x;
    j.roi_y = e.plan.roi_y;
    j.roi_w = e.plan.roi_w;
    j.roi_h = e.plan.roi_h;
    j.y = e.plan.y;
    j.x = e.plan.x;
    j.flip = e.plan.flip;
    j.out_offset = i * list.image_bytes();
    jobs.push_back(j);
    sample.push_back(i);
  }
  if (jobs.empty()) return Status::Ok();
  gpu::JpegDecodeResult r;
  STOKER_RETURN_IF_ERROR(decoder_->DecodeBatch(jobs, spec_, device_base + list.column_offset(),
                                               stream, &r));
  LoaderCounters::Add(counters->decoded_hardware, r.hardware);
  LoaderCounters::Add(counters->decoded_cuda, r.cuda);
  LoaderCounters::Add(counters->gpu_decode_wait_ns, r.wait_ns);
  // What nvJPEG failed on: the CPU path, whose verdict stands.
  for (size_t k = 0; k < r.failed.size(); ++k) {
    const size_t i = sample[r.failed[k]];
    const GpuDecodeList::Entry& e = entries[i];
    std::byte* slot = host_base + list.column_offset() + i * list.image_bytes();
    Status st = DecodeSample(decode_,
                             {reinterpret_cast<const std::byte*>(e.jpeg.data()), e.jpeg.size()},
                             e.key, {slot, list.image_bytes()}, &scratch_);
    if (!st.ok()) {
      if (!(decode_.skip_corrupt && st.code() == Code::kCorruption)) {
        return st.WithContext(e.where);
      }
      std::memset(slot, 0, list.image_bytes());
      LoaderCounters::Add(counters->decode_skipped, 1);
    } else {
      LoaderCounters::Add(counters->decoded_cpu, 1);
    }
    STOKER_RETURN_IF_ERROR(decoder_->Upload(slot, device_base + (slot - host_base),
                                            list.image_bytes(), stream));
  }
  return Status::Ok();
}

Result<int> DeliveryDevice(const LoaderOptions& o, std::string* unavailable) {
  STOKER_ASSIGN_OR_RETURN(const int device, ParseDevice(o.device));
  if (o.decode.field.empty() || o.decode.device.empty()) return device;
  auto d = ParseDevice(o.decode.device);
  if (!d.ok()) return InvalidArgument("decode device: " + d.status().message());
  if (*d < 0) return device;
  if (device >= 0 && device != *d) {
    return InvalidArgument("decode device " + DeviceName(*d) + " is not the device batches go to (" +
                           DeviceName(device) +
                           "): the GPU decode writes into the delivered batches, so set both to "
                           "the same GPU (or leave device empty)");
  }
  if (device >= 0) return device;
  if (Status st = gpu::JpegDecoder::Probe(*d); !st.ok()) {
    *unavailable = CpuInsteadOf(*d, st);
    return -1;
  }
  return *d;
}

std::string CpuInsteadOf(int device, const Status& why) {
  SayOnce("decode device " + DeviceName(device) + ": " + why.message() +
          "; JPEGs are decoded on the CPU (libjpeg-turbo) instead");
  return "cpu (decode device " + DeviceName(device) + ": " + why.message() + ")";
}

}  // namespace stoker
