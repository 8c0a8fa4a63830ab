#include "loader/device_stage.h"

#include <time.h>

#include "core/thread_boundary.h"
#include "loader/batch_builder.h"
#include "stoker/gpu.h"

namespace stoker {

void DeviceStage::Stop() {
  stop_ = true;
  copied_.Stop();
  if (copier_.joinable()) copier_.join();
}

namespace {

uint64_t ThreadCpuNanos() {
  timespec t{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t) != 0) return 0;
  return uint64_t(t.tv_sec) * 1000000000u + uint64_t(t.tv_nsec);
}

}  // namespace

void DeviceStage::CopierLoop() {
  uint64_t cpu = ThreadCpuNanos();
  for (uint64_t b = 0; b < num_batches_ && !stop_; ++b) {
    if (gpu_decode_ != nullptr && gpu_decode_->balancing()) {
      // How far the workers are ahead of the GPU stage: the balance's input.
      const bool now = built_.Ready(b);
      const int ready = CpuShareObservation(b, num_batches_, built_.capacity(), now,
                                            now && b + 1 < num_batches_ && built_.Ready(b + 1));
      if (ready >= 0) gpu_decode_->Balance(ready);
    }
    const auto asked = Clock::now();
    std::optional<Result<Batch>> r = built_.Take(b);
    if (!r) return;  // stopped
    if (counters_ != nullptr) LoaderCounters::AddSince(counters_->copier_wait_ns, asked);
    if (r->ok()) {
      // What the copy does not expect fails this batch, not the process.
      r.emplace(internal::CatchAsStatus("loader device stage",
                                        [&] { return ToDevice(std::move(*r).value()); }));
    }
    copied_.Put(b, std::move(*r));
    next_copy_ = b + 1;
    if (counters_ != nullptr) {
      const uint64_t now = ThreadCpuNanos();
      LoaderCounters::Add(counters_->copier_cpu_ns, now - cpu);
      cpu = now;
    }
  }
}

Result<Batch> DeviceStage::ToDevice(Batch batch) {
  const std::shared_ptr<BatchMemory>& mem = BatchBuilder::Memory(batch);
  const std::string what =
      "batch " + std::to_string(batch.index()) + " of epoch " + std::to_string(batch.epoch());
  if (!mem->pinned()) {
    auto pin = stager_.Pin(mem->data(), mem->capacity());
    if (!pin.ok()) return pin.status().WithContext(what);
    mem->set_pin(std::move(pin).value());
  }
  gpu::Stager::AfterCopy decode;
  Status decode_error;  // a sample's own error, reported as the CPU path reports it
  if (gpu_decode_ != nullptr && mem->gpu_decode() != nullptr) {
    decode = [this, &mem, &decode_error](CudaStreamHandle stream, std::byte* device) {
      const auto start = Clock::now();
      decode_error = gpu_decode_->Run(*mem->gpu_decode(), mem->data(), stream, device, counters_);
      if (counters_ != nullptr) LoaderCounters::AddSince(counters_->gpu_decode_ns, start);
      return decode_error;
    };
  }
  auto copy =
      stager_.Copy({mem->data(), mem->size()}, mem, [this] { return stop_.load(); }, decode);
  if (!copy.ok()) {
    if (decode_error.code() == Code::kCorruption) return decode_error;
    return copy.status().WithContext(what);
  }
  BatchBuilder::AttachDevice(batch, std::move(copy).value());
  return batch;
}

Result<Batch> DeviceStage::Take(uint64_t index, Deadline unbuilt_deadline,
                                const Status& not_built) {
  constexpr auto kGrace = std::chrono::seconds(2);
  bool stuck = false;
  Clock::time_point stuck_since{};
  while (true) {
    std::optional<Result<Batch>> r =
        copied_.Take(index, Clock::now() + std::chrono::milliseconds(50));
    if (r) return std::move(*r);
    const bool waiting = stager_.waiting_for_memory();
    if (next_copy_ == index && !waiting && Clock::now() > unbuilt_deadline) return not_built;
    if (next_copy_ != index || !waiting) {
      stuck = false;
      continue;
    }
    const auto now = Clock::now();
    if (!stuck) {
      stuck = true;
      stuck_since = now;
    }
    if (now - stuck_since >= kGrace) {
      const gpu::StagerStats g = stager_.stats();
      return NoSpace(DeviceName(device_) + ": the device memory for batches (" +
                     std::to_string(g.device_bytes >> 20) +
                     " MiB, device_memory_budget) is all held by batches already delivered and "
                     "still alive; release batches sooner or raise device_memory_budget");
    }
  }
}

}  // namespace stoker
