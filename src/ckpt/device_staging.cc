// Device tensors to and from pinned host memory (device_staging.h,
// docs/checkpoint.md §9).
#include "ckpt/device_staging.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "stoker/gpu.h"

namespace stoker::ckpt {

// ---- DeviceCopier -------------------------------------------------------------

DeviceCopier::~DeviceCopier() {
  Free(snapshot_);
  for (Pinned& p : ring_) Free(p);
  for (Pinned& p : restore_free_) Free(p);
  for (auto& [device, events] : free_events_) {
    for (DeviceRuntime::Event e : events) rt_->DestroyEvent(device, e);
  }
  for (auto& [device, s] : streams_) rt_->DestroyStream(device, s);
}

uint64_t DeviceCopier::pinned_bytes() const { return pinned_.load(std::memory_order_relaxed); }

Result<DeviceCopier::Pinned> DeviceCopier::Alloc(int device, size_t n, const char* what) {
  auto p = rt_->HostAlloc(device, n);
  if (!p.ok()) {
    // Never a silent fall back to pageable copies: say what was asked.
    return Status(p.status().code(),
                  "pinned staging for " + std::string(what) + " (" + std::to_string(n) +
                      " bytes): " + p.status().message(),
                  p.status().retryable());
  }
  pinned_ += n;
  return Pinned{static_cast<std::byte*>(*p), n, device};
}

void DeviceCopier::Free(Pinned& p) {
  if (p.p == nullptr) return;
  rt_->HostFree(p.p);
  pinned_ -= p.n;
  p = {};
}

Result<DeviceRuntime::Stream> DeviceCopier::StreamOf(int device) {
  auto it = streams_.find(device);
  if (it != streams_.end()) return it->second;
  STOKER_ASSIGN_OR_RETURN(DeviceRuntime::Stream s, rt_->NewStream(device));
  streams_.emplace(device, s);
  return s;
}

Result<DeviceRuntime::Event> DeviceCopier::TakeEvent(int device) {
  {
    std::lock_guard l(mu_);
    auto& free = free_events_[device];
    if (!free.empty()) {
      DeviceRuntime::Event e = free.back();
      free.pop_back();
      return e;
    }
  }
  return rt_->NewEvent(device);
}

void DeviceCopier::GiveEvent(int device, DeviceRuntime::Event e) {
  std::lock_guard l(mu_);
  free_events_[device].push_back(e);
}

Result<std::shared_ptr<StagedSave>> DeviceCopier::Start(std::span<const TensorRef> tensors,
                                                        uint64_t chunk_bytes) {
  uint64_t device_bytes = 0;
  std::set<std::pair<int, void*>> callers;
  for (const TensorRef& t : tensors) {
    if (t.device < 0) continue;
    device_bytes += t.data.size();
    callers.emplace(t.device, t.stream);
  }
  if (callers.empty()) return std::shared_ptr<StagedSave>();
  // The staging lies on the NUMA node of the save's (first) GPU: a rank
  // saves from one device.
  const int home = callers.begin()->first;
  auto save = std::shared_ptr<StagedSave>(new StagedSave());
  save->copier_ = shared_from_this();
  save->bounded_ = opt_.device_staging == CheckpointerOptions::DeviceStaging::kBounded;
  save->tensors_.assign(tensors.begin(), tensors.end());
  // The copy stream of each device waits for what the caller's stream has
  // queued so far: an event recorded there now.
  for (const auto& [device, caller] : callers) {
    DeviceRuntime::Stream copy;
    {
      std::lock_guard l(mu_);
      STOKER_ASSIGN_OR_RETURN(copy, StreamOf(device));
    }
    STOKER_ASSIGN_OR_RETURN(DeviceRuntime::Event e, TakeEvent(device));
    save->caller_events_.emplace_back(device, e);
    STOKER_RETURN_IF_ERROR(rt_->Record(device, e, caller));
    STOKER_RETURN_IF_ERROR(rt_->StreamWait(device, copy, e));
  }
  if (save->bounded_) {
    const uint64_t slots = std::max<uint64_t>(2, opt_.staging_ring_bytes / chunk_bytes);
    std::lock_guard l(mu_);
    if (ring_slot_ < chunk_bytes || ring_.size() != slots || ring_[0].device != home) {
      for (Pinned& p : ring_) Free(p);
      ring_.clear();
      ring_slot_ = 0;
      for (uint64_t i = 0; i < slots; ++i) {
        STOKER_ASSIGN_OR_RETURN(Pinned p, Alloc(home, chunk_bytes, "the bounded ring"));
        ring_.push_back(p);
      }
      ring_slot_ = chunk_bytes;
    }
    for (size_t i = 0; i < ring_.size(); ++i) save->free_slots_.push_back(i);
    for (const ChunkPlan& c : PlanChunks(tensors, chunk_bytes)) {
      if (std::any_of(c.segments.begin(), c.segments.end(),
                      [](const Segment& s) { return s.device >= 0; })) {
        ++save->device_chunks_;
      }
    }
    return save;
  }
  // Snapshot: one area for every device tensor, queued now, in slices of
  // a chunk so that writes start as soon as the first slices land.
  {
    std::lock_guard l(mu_);
    if (snapshot_.n < device_bytes || snapshot_.device != home) {
      Free(snapshot_);
      STOKER_ASSIGN_OR_RETURN(snapshot_,
                              Alloc(home, device_bytes, "a snapshot of the device tensors"));
    }
  }
  uint64_t at = 0, stream = 0;
  for (TensorRef& t : save->tensors_) {
    const uint64_t n = t.data.size();
    if (t.device >= 0) {
      DeviceRuntime::Stream copy;
      {
        std::lock_guard l(mu_);
        STOKER_ASSIGN_OR_RETURN(copy, StreamOf(t.device));
      }
      std::byte* dst = snapshot_.p + at;
      for (uint64_t off = 0; off < n; off += chunk_bytes) {
        const uint64_t len = std::min(chunk_bytes, n - off);
        STOKER_RETURN_IF_ERROR(rt_->CopyD2H(t.device, dst + off, t.data.data() + off, len, copy));
        STOKER_ASSIGN_OR_RETURN(DeviceRuntime::Event e, TakeEvent(t.device));
        save->slices_.push_back({stream + off, stream + off + len, t.device, e, false});
        STOKER_RETURN_IF_ERROR(rt_->Record(t.device, e, copy));
      }
      t.data = {dst, n};
      t.device = -1;
      t.stream = nullptr;
      at += n;
    }
    stream += n;
  }
  return save;
}

Result<std::span<std::byte>> DeviceCopier::TakeBuffer(size_t n, int device) {
  std::unique_lock l(mu_);
  while (true) {
    for (size_t i = 0; i < restore_free_.size(); ++i) {
      if (restore_free_[i].n >= n && restore_free_[i].device == device) {
        Pinned p = restore_free_[i];
        restore_free_.erase(restore_free_.begin() + i);
        ++restore_taken_;
        taken_device_[p.p] = p.device;
        return std::span<std::byte>(p.p, p.n);
      }
    }
    // The buffers stay within the ring's size: free ones too small (or of
    // another device) go first; while the rest are taken, wait for one to come back (unless
    // none is taken: one buffer is always allowed).
    while (!restore_free_.empty() && restore_held_ + n > opt_.staging_ring_bytes) {
      restore_held_ -= restore_free_.back().n;
      Free(restore_free_.back());
      restore_free_.pop_back();
    }
    if (restore_held_ + n <= opt_.staging_ring_bytes || restore_taken_ == 0) break;
    restore_cv_.wait(l);
  }
  l.unlock();
  STOKER_ASSIGN_OR_RETURN(Pinned p, Alloc(device, n, "a restore into device memory"));
  l.lock();
  restore_held_ += p.n;
  ++restore_taken_;
  taken_device_[p.p] = p.device;
  return std::span<std::byte>(p.p, p.n);
}

void DeviceCopier::GiveBack(std::span<std::byte> b) {
  std::lock_guard l(mu_);
  auto it = taken_device_.find(b.data());
  restore_free_.push_back({b.data(), b.size(), it == taken_device_.end() ? -1 : it->second});
  if (it != taken_device_.end()) taken_device_.erase(it);
  --restore_taken_;
  restore_cv_.notify_one();
}

Status DeviceCopier::CopyIn(std::span<const HostToDevice> copies) {
  std::map<int, DeviceRuntime::Stream> used;
  for (const HostToDevice& c : copies) {
    DeviceRuntime::Stream copy;
    {
      std::lock_guard l(mu_);
      STOKER_ASSIGN_OR_RETURN(copy, StreamOf(c.device));
    }
    STOKER_RETURN_IF_ERROR(rt_->CopyH2D(c.device, c.dst, c.src, c.n, copy));
    used.emplace(c.device, copy);
  }
  for (const auto& [device, copy] : used) {
    STOKER_ASSIGN_OR_RETURN(DeviceRuntime::Event e, TakeEvent(device));
    Status s = rt_->Record(device, e, copy);
    if (s.ok()) s = rt_->Synchronize(device, e);
    GiveEvent(device, e);
    STOKER_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

// ---- StagedSave ---------------------------------------------------------------

StagedSave::~StagedSave() {
  // Nothing may still copy into memory another save will reuse.
  for (Slice& s : slices_) {
    if (!s.waited) (void)copier_->rt_->Synchronize(s.device, s.event);
    copier_->GiveEvent(s.device, s.event);
  }
  // A caller's event goes back to the pool only once it fired (it has,
  // unless the save failed before its copies were queued), so that the copy
  // stream's wait on it is never left on an event that is recorded again.
  for (auto& [device, e] : caller_events_) {
    (void)copier_->rt_->Synchronize(device, e);
    copier_->GiveEvent(device, e);
  }
}

Status StagedSave::WaitSlice(Slice& s, std::unique_lock<std::mutex>& l) {
  if (s.waited) return Status::Ok();
  // Not holding the lock while the copy runs: other writers' chunks whose
  // slices landed go on (slices_ itself never changes after Start).
  l.unlock();
  Status st = copier_->rt_->Synchronize(s.device, s.event);
  l.lock();
  s.waited = true;
  if (!st.ok() && error_.ok()) error_ = st;
  return st;
}

Result<std::span<const std::byte>> StagedSave::Acquire(size_t index, const ChunkPlan& c) {
  if (!bounded_) {
    // The slices under the chunk's bytes have landed (or failed).
    std::unique_lock l(mu_);
    auto it = std::upper_bound(slices_.begin(), slices_.end(), c.offset,
                               [](uint64_t o, const Slice& s) { return o < s.end; });
    for (; it != slices_.end() && it->begin < c.offset + c.bytes; ++it) {
      STOKER_RETURN_IF_ERROR(WaitSlice(*it, l));
    }
    if (!error_.ok()) return error_;
    return std::span<const std::byte>();
  }
  const bool device = std::any_of(c.segments.begin(), c.segments.end(),
                                  [](const Segment& s) { return s.device >= 0; });
  if (!device) return std::span<const std::byte>();
  size_t slot;
  {
    std::unique_lock l(mu_);
    cv_.wait(l, [&] { return !free_slots_.empty() || !error_.ok(); });
    if (!error_.ok()) return error_;
    slot = free_slots_.back();
    free_slots_.pop_back();
    slot_of_[index] = slot;
  }
  std::byte* p = copier_->ring_[slot].p;
  Status s = CopyChunk(c, p);
  std::lock_guard l(mu_);
  if (!s.ok()) {
    if (error_.ok()) error_ = s;
    cv_.notify_all();
    return s;
  }
  if (++copied_chunks_ == device_chunks_) cv_.notify_all();
  return std::span<const std::byte>(p, c.bytes);
}

Status StagedSave::CopyChunk(const ChunkPlan& c, std::byte* slot) {
  std::map<int, DeviceRuntime::Stream> used;
  uint64_t at = 0;
  for (const Segment& seg : c.segments) {
    if (seg.device < 0) {
      std::memcpy(slot + at, seg.src, seg.bytes);
    } else {
      DeviceRuntime::Stream copy;
      {
        std::lock_guard l(copier_->mu_);
        STOKER_ASSIGN_OR_RETURN(copy, copier_->StreamOf(seg.device));
      }
      STOKER_RETURN_IF_ERROR(
          copier_->rt_->CopyD2H(seg.device, slot + at, seg.src, seg.bytes, copy));
      used.emplace(seg.device, copy);
    }
    at += seg.bytes;
  }
  for (const auto& [device, copy] : used) {
    STOKER_ASSIGN_OR_RETURN(DeviceRuntime::Event e, copier_->TakeEvent(device));
    Status s = copier_->rt_->Record(device, e, copy);
    if (s.ok()) s = copier_->rt_->Synchronize(device, e);
    copier_->GiveEvent(device, e);
    STOKER_RETURN_IF_ERROR(s);
  }
  return Status::Ok();
}

void StagedSave::Release(size_t index) {
  std::lock_guard l(mu_);
  auto it = slot_of_.find(index);
  if (it == slot_of_.end()) return;
  free_slots_.push_back(it->second);
  slot_of_.erase(it);
  cv_.notify_all();
}

Status StagedSave::WaitStaged() {
  std::unique_lock l(mu_);
  if (!bounded_) {
    for (Slice& s : slices_) (void)WaitSlice(s, l);
    return error_;
  }
  cv_.wait(l, [&] { return copied_chunks_ >= device_chunks_ || !error_.ok() || finished_; });
  if (!error_.ok()) return error_;
  if (copied_chunks_ < device_chunks_) {
    return Cancelled("the save ended before its device tensors were copied");
  }
  return Status::Ok();
}

void StagedSave::Finish(const Status& s) {
  std::lock_guard l(mu_);
  finished_ = true;
  if (!s.ok() && error_.ok() && copied_chunks_ < device_chunks_) error_ = s;
  cv_.notify_all();
}

}  // namespace stoker::ckpt
