// A stand-in for the CUDA runtime behind ckpt::DeviceRuntime, as the NCCL
// backend's tests have theirs: "device memory" is host memory, each stream
// runs its work in order on a thread of its own (so copies really happen
// later than they are queued, and only after the events they wait for),
// events fire when their stream reaches them. Faults are injected as CUDA
// would report them: a copy refused when queued, or one that fails on the
// stream and is reported by the next synchronisation; pinned memory runs
// out past a limit. It counts what a test checks: pinned bytes held, host
// allocations, live events and streams, copies.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "ckpt/device_runtime.h"
#include "stoker/gpu.h"

namespace stoker::testing {

class StandInRuntime final : public ckpt::DeviceRuntime {
 public:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> work;
    bool stop = false;
    std::thread thread;
  };
  struct Ev {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t recorded = 0, fired = 0;
    Status status;
  };

  ~StandInRuntime() override {
    std::vector<std::unique_ptr<Queue>> all;
    {
      std::lock_guard l(mu_);
      all.swap(all_);
    }
    for (auto& q : all) Stop(*q);
  }

  // ---- DeviceRuntime
  Result<void*> HostAlloc(int device, size_t bytes) override {
    std::lock_guard l(mu_);
    alloc_devices.push_back(device);
    if (pinned_ + bytes > pinned_limit) {
      return NoSpace("cuda:0: cudaHostAlloc(" + std::to_string(bytes) +
                     " bytes of pinned memory): out of memory (cudaErrorMemoryAllocation)");
    }
    pinned_ += bytes;
    ++host_allocs;
    void* p = ::operator new(bytes);
    sizes_[p] = bytes;
    return p;
  }
  void HostFree(void* p) override {
    std::lock_guard l(mu_);
    pinned_ -= sizes_.at(p);
    sizes_.erase(p);
    ::operator delete(p);
  }
  Result<Stream> NewStream(int device) override {
    if (device < 0 || device >= devices) {
      return InvalidArgument(DeviceName(device) +
                             ": cudaSetDevice: invalid device ordinal (cudaErrorInvalidDevice)");
    }
    return static_cast<Stream>(MakeQueue());
  }
  void DestroyStream(int, Stream s) override {
    std::unique_ptr<Queue> q;
    {
      std::lock_guard l(mu_);
      for (auto it = all_.begin(); it != all_.end(); ++it) {
        if (it->get() == s) {
          q = std::move(*it);
          all_.erase(it);
          --live_streams;
          break;
        }
      }
    }
    if (q) Stop(*q);  // its queued work runs first
  }
  // As in CUDA, an event may be destroyed while work queued on a stream
  // still refers to it: that work keeps it until it has run.
  Result<Event> NewEvent(int) override {
    ++live_events;
    auto ev = std::make_shared<Ev>();
    std::lock_guard l(mu_);
    events_[ev.get()] = ev;
    return static_cast<Event>(ev.get());
  }
  void DestroyEvent(int, Event e) override {
    --live_events;
    std::lock_guard l(mu_);
    events_.erase(e);
  }
  Status Record(int device, Event e, Stream s) override {
    std::shared_ptr<Ev> ev = EventOf(e);
    uint64_t gen;
    {
      std::lock_guard l(ev->mu);
      gen = ++ev->recorded;
    }
    Queue* q = QueueOf(device, s);
    Enqueue(q, [ev, gen, q, this] {
      std::lock_guard l(ev->mu);
      ev->fired = gen;
      ev->status = TakeStreamError(q);
      ev->cv.notify_all();
    });
    return Status::Ok();
  }
  Status StreamWait(int device, Stream s, Event e) override {
    std::shared_ptr<Ev> ev = EventOf(e);
    uint64_t gen;
    {
      std::lock_guard l(ev->mu);
      gen = ev->recorded;
    }
    Enqueue(QueueOf(device, s), [ev, gen] {
      std::unique_lock l(ev->mu);
      ev->cv.wait(l, [&] { return ev->fired >= gen; });
    });
    return Status::Ok();
  }
  Status CopyD2H(int device, void* dst, const void* src, size_t n, Stream s) override {
    return Copy(device, dst, src, n, s, "device to host");
  }
  Status CopyH2D(int device, void* dst, const void* src, size_t n, Stream s) override {
    return Copy(device, dst, src, n, s, "host to device");
  }
  Status Synchronize(int, Event e) override {
    std::shared_ptr<Ev> ev = EventOf(e);
    std::unique_lock l(ev->mu);
    const uint64_t gen = ev->recorded;
    ev->cv.wait(l, [&] { return ev->fired >= gen; });
    return ev->status;
  }

  // ---- for tests
  // Work on a stream of the "training job": a kernel that runs `f`.
  void Launch(Stream s, std::function<void()> f) { Enqueue(QueueOf(0, s), std::move(f)); }
  // The `nth` copy from now (1 = the next) is refused when queued.
  void RefuseCopy(uint64_t nth) { refuse_at_ = copies.load() + nth; }
  // The `nth` copy from now fails on its stream (an illegal address).
  void FailCopy(uint64_t nth) { fail_at_ = copies.load() + nth; }
  uint64_t pinned() const {
    std::lock_guard l(mu_);
    return pinned_;
  }

  uint64_t pinned_limit = UINT64_MAX;
  int devices = 2;
  std::chrono::microseconds copy_delay{0};  // per copy, on the stream
  std::atomic<uint64_t> copies{0}, copied_bytes{0}, host_allocs{0};
  std::vector<int> alloc_devices;  // HostAlloc's device argument, call by call (mu_)
  std::vector<int> AllocDevices() const {
    std::lock_guard l(mu_);
    return alloc_devices;
  }
  std::atomic<int64_t> live_events{0}, live_streams{0};

 private:
  Status Copy(int device, void* dst, const void* src, size_t n, Stream s, const char* kind) {
    const uint64_t k = ++copies;
    const std::string call =
        "cudaMemcpyAsync(" + std::string(kind) + ", " + std::to_string(n) + " bytes)";
    if (k == refuse_at_) {
      return InvalidArgument(DeviceName(device) + ": " + call +
                             ": invalid argument (cudaErrorInvalidValue)");
    }
    Queue* q = QueueOf(device, s);
    const bool fail = k == fail_at_;
    Enqueue(q, [=, this] {
      if (copy_delay.count() > 0) std::this_thread::sleep_for(copy_delay);
      if (fail) {
        SetStreamError(q, IoError(DeviceName(device) + ": " + call +
                                  ": an illegal memory access was encountered "
                                  "(cudaErrorIllegalAddress)"));
        return;
      }
      std::memcpy(dst, src, n);
      copied_bytes += n;
    });
    return Status::Ok();
  }

  std::shared_ptr<Ev> EventOf(Event e) {
    std::lock_guard l(mu_);
    return events_.at(e);
  }

  Queue* MakeQueue() {
    auto q = std::make_unique<Queue>();
    Queue* raw = q.get();
    raw->thread = std::thread([raw] {
      while (true) {
        std::function<void()> f;
        {
          std::unique_lock l(raw->mu);
          raw->cv.wait(l, [&] { return raw->stop || !raw->work.empty(); });
          if (raw->work.empty()) return;
          f = std::move(raw->work.front());
          raw->work.pop_front();
        }
        f();
      }
    });
    std::lock_guard l(mu_);
    all_.push_back(std::move(q));
    ++live_streams;
    return raw;
  }
  Queue* QueueOf(int device, Stream s) {
    if (s != nullptr) return static_cast<Queue*>(s);
    std::lock_guard l(default_mu_);
    if (default_ == nullptr) default_ = MakeQueue();  // the legacy default stream
    return default_;
  }
  static void Enqueue(Queue* q, std::function<void()> f) {
    std::lock_guard l(q->mu);
    q->work.push_back(std::move(f));
    q->cv.notify_one();
  }
  static void Stop(Queue& q) {
    {
      std::lock_guard l(q.mu);
      q.stop = true;
      q.cv.notify_all();
    }
    if (q.thread.joinable()) q.thread.join();
  }
  void SetStreamError(Queue* q, Status s) {
    std::lock_guard l(err_mu_);
    errors_.emplace_back(q, std::move(s));
  }
  Status TakeStreamError(Queue* q) {
    std::lock_guard l(err_mu_);
    for (auto it = errors_.begin(); it != errors_.end(); ++it) {
      if (it->first == q) {
        Status s = it->second;
        errors_.erase(it);
        return s;
      }
    }
    return Status::Ok();
  }

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Queue>> all_;
  std::unordered_map<void*, size_t> sizes_;
  std::unordered_map<void*, std::shared_ptr<Ev>> events_;
  uint64_t pinned_ = 0;
  std::mutex default_mu_;
  Queue* default_ = nullptr;
  std::mutex err_mu_;
  std::vector<std::pair<Queue*, Status>> errors_;
  std::atomic<uint64_t> refuse_at_{0}, fail_at_{0};
};

}  // namespace stoker::testing
