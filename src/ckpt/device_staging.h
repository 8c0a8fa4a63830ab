// Device tensors to and from host memory for checkpoints (docs/checkpoint.md
// §9), internal. DeviceCopier owns what outlives a save: a copy stream per
// device, a pool of events, the pinned snapshot area (grown to the largest
// save's device bytes, never shrunk, reused by every save), the bounded
// ring's slots and the restore's pinned buffers. A StagedSave is one save's
// copies:
//
//   snapshot  every device tensor copied into the snapshot area in slices
//             of a chunk, each with an event; a chunk is written once the
//             events of the slices under it fired, so writes start while
//             later slices are still copied.
//   bounded   nothing copied up front; each chunk holding device bytes takes
//             a ring slot, copies its bytes into it and waits for them, and
//             gives the slot back once written.
//
// Either way the copies run on the copier's stream of each device, after an
// event recorded on the caller's stream at the call (never a device-wide
// synchronisation), and a failed copy fails that save with the device and
// the call named; the next save starts afresh.
//
// Thread safety: DeviceCopier is safe for concurrent use (the checkpointer
// starts one save at a time; restores may run beside it). A StagedSave is
// used by its save's writer threads and by its handle at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "ckpt/chunk_writer.h"
#include "ckpt/device_runtime.h"
#include "stoker/checkpoint.h"

namespace stoker::ckpt {

class StagedSave;

class DeviceCopier : public std::enable_shared_from_this<DeviceCopier> {
 public:
  DeviceCopier(std::shared_ptr<DeviceRuntime> runtime, const CheckpointerOptions& options)
      : rt_(std::move(runtime)), opt_(options) {}
  ~DeviceCopier();

  // Starts staging the device tensors of `tensors` (none: returns null).
  // Records the callers' stream events now, so the copies see what was
  // queued before this call. Snapshot: queues every copy; bounded: only
  // prepares the ring. Errors (out of pinned memory, a refused copy) are
  // returned here, before anything is written.
  Result<std::shared_ptr<StagedSave>> Start(std::span<const TensorRef> tensors,
                                            uint64_t chunk_bytes);

  // Pinned host memory held now (snapshot area, ring, restore buffers).
  uint64_t pinned_bytes() const;

  // Restore into device memory: a pinned buffer of at least `n` bytes for
  // copies into `device` (placed on its NUMA node: DeviceRuntime::HostAlloc;
  // -1: unknown), given back with GiveBack once the copies out of it have
  // landed.
  Result<std::span<std::byte>> TakeBuffer(size_t n, int device = -1);
  void GiveBack(std::span<std::byte> b);
  // Copies pinned host bytes into device memory on the copy streams and
  // waits for them (one event per device).
  struct HostToDevice {
    int device;
    void* dst;
    const void* src;
    size_t n;
  };
  Status CopyIn(std::span<const HostToDevice> copies);

 private:
  friend class StagedSave;
  struct Pinned {
    std::byte* p = nullptr;
    size_t n = 0;
    int device = -1;  // the GPU whose NUMA node holds it (-1: anywhere)
  };
  Result<DeviceRuntime::Stream> StreamOf(int device);  // mu_ held
  Result<DeviceRuntime::Event> TakeEvent(int device);
  void GiveEvent(int device, DeviceRuntime::Event e);
  Result<Pinned> Alloc(int device, size_t n, const char* what);
  void Free(Pinned& p);

  const std::shared_ptr<DeviceRuntime> rt_;
  const CheckpointerOptions opt_;
  mutable std::mutex mu_;
  std::map<int, DeviceRuntime::Stream> streams_;
  std::map<int, std::vector<DeviceRuntime::Event>> free_events_;
  Pinned snapshot_;
  std::vector<Pinned> ring_;  // the bounded ring's slots, one chunk each
  uint64_t ring_slot_ = 0;
  std::vector<Pinned> restore_free_;
  uint64_t restore_held_ = 0;  // pinned bytes of restore buffers, free or taken
  size_t restore_taken_ = 0;
  std::map<std::byte*, int> taken_device_;  // a taken restore buffer's Pinned::device
  std::condition_variable restore_cv_;
  std::atomic<uint64_t> pinned_{0};
};

// One save's device copies; the ChunkSource its writer reads chunks from.
class StagedSave final : public ChunkSource {
 public:
  ~StagedSave() override;

  // The tensors as the writer sees them: snapshot, device tensors point
  // into the snapshot area (host memory); bounded, unchanged.
  const std::vector<TensorRef>& tensors() const { return tensors_; }

  Result<std::span<const std::byte>> Acquire(size_t index, const ChunkPlan& c) override;
  void Release(size_t index) override;

  // Waits until every device byte has been copied to the host (bounded:
  // until the ring has taken the last chunk); the first copy error.
  Status WaitStaged();
  // The save ended (`s`): wakes WaitStaged with the failure if the copies
  // never finished.
  void Finish(const Status& s);

 private:
  friend class DeviceCopier;
  struct Slice {
    uint64_t begin = 0, end = 0;  // in the rank's stream
    int device = 0;
    DeviceRuntime::Event event = nullptr;
    bool waited = false;
  };
  Status WaitSlice(Slice& s, std::unique_lock<std::mutex>& l);  // l holds mu_
  Status CopyChunk(const ChunkPlan& c, std::byte* slot);

  std::shared_ptr<DeviceCopier> copier_;
  bool bounded_ = false;
  std::vector<TensorRef> tensors_;
  std::vector<std::pair<int, DeviceRuntime::Event>> caller_events_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slice> slices_;  // snapshot, by begin
  // Bounded: slots free, chunks with device bytes copied so far and in all.
  std::vector<size_t> free_slots_;
  std::map<size_t, size_t> slot_of_;  // chunk index -> slot
  size_t device_chunks_ = 0, copied_chunks_ = 0;
  Status error_;
  bool finished_ = false;
};

}  // namespace stoker::ckpt
