// Checkpoints of device tensors (docs/checkpoint.md §9) against the stand-in
// CUDA runtime (tests/ckpt_device_standin.h): copies ordered after the
// caller's stream, an asynchronous save returning once they are queued and
// WaitStaged once they landed, the bounded ring, pinned staging allocated
// once over many saves, a CUDA error failing that save through its handle
// (device and call named) and the next save working, out of pinned memory
// naming the size, and restores into device memory through pinned buffers.
// The same code runs on the CUDA runtime on the GPU machine
// (scripts/gpu/ckpt_gpu.sh).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "ckpt_device_standin.h"
#include "ckpt_reshard_data.h"
#include "testutil.h"

namespace stoker {
namespace {

using namespace std::chrono_literals;
using testing::StandInRuntime;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::atomic<int> g_unique{0};

// "Device memory" of the stand-in: host bytes the test owns.
struct DeviceTensor {
  std::string name;
  std::vector<std::byte> bytes;
  TensorRef Ref(void* stream) const {
    TensorRef t{name, DType::kUInt8, {int64_t(bytes.size())}, bytes, {}};
    t.device = 0;
    t.stream = stream;
    return t;
  }
};

class CkptDevice : public ::testing::Test {
 protected:
  void Open(CheckpointerOptions o = {}) {
    o.poll_interval = 5ms;
    o.retry_backoff = 5ms;
    uri_ = "mem://ckpt-device-" + std::to_string(g_unique++);
    ckpt_ = ckpt::NewCheckpointerOn(*OpenStore(uri_), o, rt_);
    auto s = rt_->NewStream(0);
    ASSERT_TRUE(s.ok());
    train_ = *s;
  }
  void TearDown() override {
    ckpt_.reset();
    if (train_ != nullptr) rt_->DestroyStream(0, train_);
  }
  static std::vector<DeviceTensor> State(size_t n, size_t bytes, uint8_t fill) {
    std::vector<DeviceTensor> v;
    for (size_t i = 0; i < n; ++i) {
      v.push_back(
          {"t" + std::to_string(i), std::vector<std::byte>(bytes + i, std::byte(fill + i))});
    }
    return v;
  }
  std::vector<TensorRef> Refs(const std::vector<DeviceTensor>& s) {
    std::vector<TensorRef> r;
    for (const DeviceTensor& t : s) r.push_back(t.Ref(train_));
    return r;
  }
  // Every tensor of `name` equals `want`.
  void ExpectSaved(const std::string& name, const std::vector<DeviceTensor>& want) {
    auto r = ckpt_->Restore(name, {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->tensors.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(r->tensors[i].data.size(), want[i].bytes.size());
      EXPECT_EQ(0,
                std::memcmp(r->tensors[i].data.data(), want[i].bytes.data(), want[i].bytes.size()))
          << name << " " << want[i].name;
    }
  }

  std::shared_ptr<StandInRuntime> rt_ = std::make_shared<StandInRuntime>();
  std::string uri_;
  std::unique_ptr<Checkpointer> ckpt_;
  void* train_ = nullptr;
};

SaveOptions Small() {
  SaveOptions o;
  o.chunk_bytes = 64 << 10;
  o.checksum_block_bytes = 16 << 10;
  return o;
}

TEST_F(CkptDevice, AsyncSnapshotCopiesWhatTheCallersStreamWroteAndReturnsBeforeTheCopies) {
  Open();
  std::vector<DeviceTensor> state = State(3, 300 << 10, 1);
  // A "kernel" still running on the training stream writes the tensors:
  // the copies must wait for it (an event on that stream), not read before.
  std::atomic<bool> kernel_done{false};
  rt_->Launch(train_, [&] {
    std::this_thread::sleep_for(100ms);
    for (DeviceTensor& t : state) std::memset(t.bytes.data(), 0x42, t.bytes.size());
    kernel_done = true;
  });
  auto h = ckpt_->SaveAsync("step-1", Refs(state), Small());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_FALSE(kernel_done) << "SaveAsync waited for the device instead of queueing copies";
  ASSERT_OK(h->WaitStaged());
  EXPECT_TRUE(kernel_done);
  // From here the caller may change them (the optimizer step).
  std::vector<DeviceTensor> saved = state;
  for (DeviceTensor& t : state) std::memset(t.bytes.data(), 0x99, t.bytes.size());
  ASSERT_OK(h->Wait());
  ExpectSaved("step-1", saved);
}

TEST_F(CkptDevice, BoundedRingHoldsOnlyItsSlotsAndSavesEverything) {
  CheckpointerOptions o;
  o.device_staging = CheckpointerOptions::DeviceStaging::kBounded;
  o.staging_ring_bytes = 128 << 10;  // two chunks of 64 KiB for 1.5 MiB of state
  Open(o);
  rt_->copy_delay = 200us;
  const std::vector<DeviceTensor> state = State(5, 300 << 10, 7);
  auto h = ckpt_->SaveAsync("step-1", Refs(state), Small());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_OK(h->WaitStaged());
  ASSERT_OK(h->Wait());
  EXPECT_EQ(rt_->pinned(), 128u << 10) << "the ring's two slots and nothing more";
  ExpectSaved("step-1", state);
  // A synchronous save through the same ring.
  ASSERT_OK(ckpt_->Save("step-2", Refs(state), Small()));
  ExpectSaved("step-2", state);
  EXPECT_EQ(rt_->host_allocs, 2u);
}

TEST_F(CkptDevice, HostAndDeviceTensorsTogether) {
  Open();
  const std::vector<DeviceTensor> device = State(2, 100 << 10, 3);
  std::vector<std::byte> host(5000, std::byte{9});
  std::vector<TensorRef> refs = Refs(device);
  refs.insert(refs.begin() + 1, TensorRef{"host", DType::kUInt8, {5000}, host, {}});
  ASSERT_OK(ckpt_->Save("sync", refs, Small()));
  auto h = ckpt_->SaveAsync("async", refs, Small());
  ASSERT_TRUE(h.ok());
  std::fill(host.begin(), host.end(), std::byte{1});  // host tensors: copied at the call
  ASSERT_OK(h->Wait());
  for (const char* name : {"sync", "async"}) {
    auto r = ckpt_->Restore(name, {});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->tensors[1].data[0], std::byte{9}) << name;
    EXPECT_EQ(
        0, std::memcmp(r->tensors[2].data.data(), device[1].bytes.data(), device[1].bytes.size()));
  }
}

TEST_F(CkptDevice, ACudaErrorFailsThatSaveThroughItsHandleAndTheNextOneWorks) {
  for (auto mode : {CheckpointerOptions::DeviceStaging::kSnapshot,
                    CheckpointerOptions::DeviceStaging::kBounded}) {
    CheckpointerOptions o;
    o.device_staging = mode;
    Open(o);
    const std::vector<DeviceTensor> state = State(3, 200 << 10, 5);
    rt_->FailCopy(4);  // fails on the stream, reported by the event after it
    auto h = ckpt_->SaveAsync("bad", Refs(state), Small());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    Status staged = h->WaitStaged();
    Status s = h->Wait();
    EXPECT_EQ(s.code(), Code::kIoError) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "cuda:0: cudaMemcpyAsync(device to host")) << s.message();
    EXPECT_TRUE(Contains(s.message(), "cudaErrorIllegalAddress")) << s.message();
    EXPECT_EQ(staged.code(), Code::kIoError) << staged.ToString();
    EXPECT_FALSE(ckpt_->ReadManifest("bad").ok()) << "nothing committed";
    auto next = ckpt_->SaveAsync("good", Refs(state), Small());
    ASSERT_TRUE(next.ok());
    ASSERT_OK(next->Wait());
    ExpectSaved("good", state);
    // A copy refused when queued: the save fails at once, naming it.
    rt_->RefuseCopy(1);
    Status refused = [&]() -> Status {
      auto r = ckpt_->SaveAsync("refused", Refs(state), Small());
      return r.ok() ? r->Wait() : r.status();
    }();
    EXPECT_EQ(refused.code(), Code::kInvalidArgument) << refused.ToString();
    EXPECT_TRUE(Contains(refused.message(), "cuda:0: cudaMemcpyAsync")) << refused.message();
    ASSERT_OK(ckpt_->Save("good-2", Refs(state), Small()));
    ExpectSaved("good-2", state);
    ckpt_.reset();
    rt_->DestroyStream(0, train_);
    train_ = nullptr;
  }
}

TEST_F(CkptDevice, OutOfPinnedMemoryNamesTheSizeAndFallsBackToNothing) {
  rt_->pinned_limit = 1 << 20;
  Open();
  const std::vector<DeviceTensor> state = State(4, 1 << 20, 2);  // 4 MiB
  Status s = ckpt_->Save("big", Refs(state), Small());
  EXPECT_EQ(s.code(), Code::kNoSpace) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "pinned staging for a snapshot of the device tensors (" +
                                        std::to_string((4 << 20) + 6) + " bytes)"))
      << s.message();
  EXPECT_TRUE(Contains(s.message(), "cudaHostAlloc")) << s.message();
  EXPECT_EQ(rt_->copies, 0u) << "no pageable copy instead";
  EXPECT_FALSE(ckpt_->ReadManifest("big").ok());
}

TEST_F(CkptDevice, AHundredSavesAllocatePinnedMemoryOnce) {
  Open();
  const std::vector<DeviceTensor> state = State(3, 100 << 10, 4);
  uint64_t pinned = 0;
  int64_t events = 0;
  for (int i = 0; i < 100; ++i) {
    auto h = ckpt_->SaveAsync("s-" + std::to_string(i), Refs(state), Small());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_OK(h->WaitStaged());
    if (i == 1) {
      pinned = rt_->pinned();
      events = rt_->live_events;
    }
    if (i > 1) {
      ASSERT_EQ(rt_->pinned(), pinned) << "save " << i;
      ASSERT_LE(rt_->live_events, events + 4) << "save " << i;
    }
  }
  ASSERT_OK(ckpt_->SaveAsync("last", Refs(state), Small())->Wait());
  EXPECT_EQ(rt_->host_allocs, 1u);
  ExpectSaved("last", state);
}

// Pinned staging is asked for the GPU it serves, so the CUDA runtime places
// it on that GPU's NUMA node: the save's device for the snapshot and the
// ring, the destination's for a restore's buffers.
TEST_F(CkptDevice, PinnedStagingIsAskedForTheDeviceItServes) {
  for (auto staging : {CheckpointerOptions::DeviceStaging::kSnapshot,
                       CheckpointerOptions::DeviceStaging::kBounded}) {
    CheckpointerOptions o;
    o.device_staging = staging;
    o.staging_ring_bytes = 256 << 10;
    Open(o);
    auto s1 = rt_->NewStream(1);
    ASSERT_TRUE(s1.ok());
    const std::vector<DeviceTensor> state = State(2, 300 << 10, 9);
    std::vector<TensorRef> refs = Refs(state);
    for (TensorRef& r : refs) r.device = 1, r.stream = *s1;
    const size_t before = rt_->AllocDevices().size();
    ASSERT_OK(ckpt_->Save("on-1", refs, Small()));
    std::vector<std::vector<std::byte>> device(2);
    std::vector<TensorDestination> dst;
    for (size_t i = 0; i < 2; ++i) {
      device[i].resize(state[i].bytes.size());
      TensorDestination d{state[i].name, device[i], {}, {}, {}};
      d.device = 1;
      dst.push_back(d);
    }
    ASSERT_OK(ckpt_->RestoreInto("on-1", dst, {}).status());
    for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(device[i] == state[i].bytes) << i;
    const std::vector<int> asked = rt_->AllocDevices();
    ASSERT_GT(asked.size(), before + 1) << "the save's staging and the restore's buffers";
    for (size_t i = before; i < asked.size(); ++i) EXPECT_EQ(asked[i], 1) << "allocation " << i;
    ckpt_.reset();
    rt_->DestroyStream(1, *s1);
    rt_->DestroyStream(0, train_);
    train_ = nullptr;
  }
}

TEST_F(CkptDevice, RestoresIntoDeviceMemoryThroughPinnedBuffers) {
  CheckpointerOptions o;
  o.staging_ring_bytes = 1 << 20;
  Open(o);
  const std::vector<DeviceTensor> state = State(3, 700 << 10, 6);
  ASSERT_OK(ckpt_->Save("step-1", Refs(state), Small()));
  std::vector<std::vector<std::byte>> device(3);
  std::vector<TensorDestination> dst;
  for (size_t i = 0; i < 3; ++i) {
    device[i].resize(state[i].bytes.size());
    TensorDestination d{state[i].name, device[i], {}, {}, {}};
    d.device = 0;
    dst.push_back(d);
  }
  const uint64_t copies = rt_->copies;
  const uint64_t snapshot = rt_->pinned();  // the save's staging, kept for the next save
  ASSERT_OK(ckpt_->RestoreInto("step-1", dst, {}).status());
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(device[i] == state[i].bytes) << i;
  EXPECT_GT(rt_->copies, copies) << "the bytes went in through host-to-device copies";
  // A piece of a sharded tensor, into device memory.
  const testing::GlobalTensor g = testing::MakeGlobal("g", DType::kFloat32, {512, 512}, 3);
  SaveOptions so = Small();
  ASSERT_OK(
      ckpt_->Save("step-2", std::vector<TensorRef>{{g.name, g.dtype, g.shape, g.bytes, {}}}, so));
  const testing::Piece want = testing::BoxPiece(g, {100, 128}, {300, 256});
  std::vector<std::byte> piece(want.bytes.size());
  TensorDestination d{g.name, piece, want.layout, g.dtype, want.shape};
  d.device = 1;
  ASSERT_OK(ckpt_->RestoreInto("step-2", {&d, 1}, {}).status());
  EXPECT_TRUE(piece == want.bytes);
  EXPECT_LE(rt_->pinned(), snapshot + (1u << 20)) << "restore buffers stay within the ring";
}

}  // namespace
}  // namespace stoker
