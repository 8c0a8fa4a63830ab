// GPU delivery: device names and errors everywhere; on a machine with a GPU,
// the bytes on the device equal the shards' bytes for random batches, no
// device or pinned buffer is reused before the work that reads it is done,
// memory stays flat over many epochs, and a CUDA error mid-epoch, an
// exhausted budget and out-of-memory are clear errors after which the loader
// shuts down cleanly. Tests that need a GPU skip, saying why, where there is
// none (CI builds the CUDA code on machines without one).
#include "gpu/h2d_bench.h"
#include "stoker/gpu.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "gpu/stager.h"
#include "stoker/loader.h"
#include "stoker/pack.h"
#include "testutil.h"

#ifdef STOKER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu/cuda_util.h"
#endif

namespace stoker {
namespace {

using testing::RandomBytes;
using testing::TempDir;

// ---- everywhere ---------------------------------------------------------------

TEST(GpuDevice, ParsesDeviceNames) {
  EXPECT_EQ(*ParseDevice(""), -1);
  EXPECT_EQ(*ParseDevice("cpu"), -1);
  EXPECT_EQ(*ParseDevice("cuda"), 0);
  EXPECT_EQ(*ParseDevice("cuda:0"), 0);
  EXPECT_EQ(*ParseDevice("cuda:13"), 13);
  for (const char* bad : {"gpu0", "cuda:", "cuda:-1", "cuda:+1", "cuda:1x", "cuda:0 ", "CUDA:0"}) {
    auto r = ParseDevice(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().ToString();
  }
}

// A small dataset of random samples (16 KiB to 200 KiB), packed in file
// order so that sample id i is the i-th file.
struct Dataset {
  TempDir dir;
  std::vector<std::vector<std::byte>> samples;
  std::string uri;

  explicit Dataset(uint32_t count, size_t min = 16 << 10, size_t max = 200 << 10) {
    const auto src = dir.path() / "src";
    for (uint32_t i = 0; i < count; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "c0/s%05u.bin", i);
      samples.push_back(RandomBytes(min + (uint64_t(i) * 104729) % (max - min + 1), 1000 + i));
      testing::WriteFile(src / name, samples.back());
    }
    uri = (dir.path() / "ds").string();
    PackOptions po;
    po.shuffle = false;
    po.shard_bytes = 1 << 20;
    auto m = Pack(src.string(), uri, po);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
  }
};

LoaderOptions GpuOptions(const std::string& device) {
  LoaderOptions o;
  o.batch_size = 32;
  o.threads = 4;
  o.seed = 7;
  o.shuffle_window_shards = 4;
  o.memory_budget = 128 << 20;
  o.device = device;
  return o;
}

TEST(GpuDevice, MalformedDeviceIsInvalidArgument) {
  Dataset ds(8);
  auto l = Loader::Open(ds.uri, GpuOptions("gpu:0"));
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kInvalidArgument);
  EXPECT_NE(l.status().message().find("gpu:0"), std::string::npos);
}

#ifdef STOKER_HAVE_CUDA
// Whether this machine has a usable GPU, and if not, why.
Status GpuPresent() { return GetCudaDevice(0).status(); }

#define SKIP_WITHOUT_GPU()                                                                     \
  do {                                                                                         \
    if (Status st = GpuPresent(); !st.ok()) {                                                  \
      GTEST_SKIP() << "needs a CUDA GPU, and this machine has none usable: " << st.ToString(); \
    }                                                                                          \
  } while (0)

TEST(GpuDevice, NoGpuIsAClearErrorNamingTheDeviceAndTheCall) {
  if (GpuPresent().ok()) GTEST_SKIP() << "this machine has a GPU; the no-GPU path is for CI";
  Dataset ds(8);
  auto l = Loader::Open(ds.uri, GpuOptions("cuda:0"));
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kUnavailable) << l.status().ToString();
  EXPECT_FALSE(l.status().retryable());
  EXPECT_NE(l.status().message().find("cuda:0"), std::string::npos) << l.status().ToString();
  EXPECT_NE(l.status().message().find("cudaGetDeviceCount"), std::string::npos);
}

TEST(GpuDevice, CudaErrorsMapToOneTable) {
  EXPECT_TRUE(gpu::CudaStatus(0, "cudaFree", cudaSuccess).ok());
  const Status oom = gpu::CudaStatus(1, "cudaMallocAsync(64 bytes)", cudaErrorMemoryAllocation);
  EXPECT_EQ(oom.code(), Code::kNoSpace);
  EXPECT_EQ(oom.message().rfind("cuda:1: cudaMallocAsync(64 bytes): ", 0), 0u) << oom.message();
  EXPECT_NE(oom.message().find("cudaErrorMemoryAllocation"), std::string::npos);
  const Status none = gpu::CudaStatus(0, "cudaGetDeviceCount", cudaErrorNoDevice);
  EXPECT_EQ(none.code(), Code::kUnavailable);
  EXPECT_FALSE(none.retryable());
  EXPECT_EQ(gpu::CudaStatus(0, "cudaSetDevice", cudaErrorInvalidDevice).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(gpu::CudaStatus(0, "cudaStreamWaitEvent", cudaErrorInvalidResourceHandle).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(gpu::CudaStatus(0, "cudaMemcpyAsync", cudaErrorIllegalAddress).code(), Code::kIoError);
}

// ---- with a GPU -----------------------------------------------------------------

// A stream of the test's own (the consumer's), destroyed after every batch.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() {
    (void)cudaStreamSynchronize(s);
    (void)cudaStreamDestroy(s);
  }
  CudaStreamHandle handle() const { return reinterpret_cast<CudaStreamHandle>(s); }
};

// The device copy of `b` brought back to the host on `stream` (after the
// stream waits for the loader's copy).
std::vector<std::byte> DeviceBytes(const Batch& b, const Stream& stream) {
  EXPECT_TRUE(b.device()->WaitOn(stream.handle()).ok());
  std::vector<std::byte> out(b.device()->size());
  EXPECT_EQ(
      cudaMemcpyAsync(out.data(), b.device()->data(), out.size(), cudaMemcpyDeviceToHost, stream.s),
      cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(stream.s), cudaSuccess);
  return out;
}

// Checks a batch's device bytes column against the samples it names.
void ExpectColumnMatches(const Batch& b, const std::vector<std::byte>& dev, const Dataset& ds) {
  const auto* col = b.bytes("image");
  ASSERT_NE(col, nullptr);
  const std::byte* host_base = b.buffer().data();
  const size_t data_at = static_cast<size_t>(col->data.data() - host_base);
  const size_t offsets_at = reinterpret_cast<const std::byte*>(col->offsets.data()) - host_base;
  ASSERT_EQ(b.device_pointer(col->data.data()),
            b.device()->data() + data_at);  // same layout on the device
  for (size_t i = 0; i < b.size(); ++i) {
    uint64_t begin, end;
    std::memcpy(&begin, dev.data() + offsets_at + i * 8, 8);
    std::memcpy(&end, dev.data() + offsets_at + (i + 1) * 8, 8);
    const auto& want = ds.samples[b.sample_ids()[i]];
    ASSERT_EQ(end - begin, want.size()) << "sample " << b.sample_ids()[i];
    ASSERT_EQ(std::memcmp(dev.data() + data_at + begin, want.data(), want.size()), 0)
        << "sample " << b.sample_ids()[i] << " differs on the device";
  }
}

// A loader on cuda:0 over `ds` with a device memory budget (0: default).
Result<std::unique_ptr<Loader>> OpenOnGpu(const Dataset& ds, uint64_t device_budget) {
  LoaderOptions o = GpuOptions("cuda:0");
  o.device_memory_budget = device_budget;
  return Loader::Open(ds.uri, o);
}

TEST(GpuLoader, BytesOnTheDeviceEqualTheShardBytes) {
  SKIP_WITHOUT_GPU();
  Dataset ds(600);
  // Every read unit: records collated from shard buffers, read straight
  // into the pinned batch buffers, or copied there from the mapped shards.
  for (const char* unit : {"shard", "sample", "map"}) {
    SCOPED_TRACE(unit);
    LoaderOptions o = GpuOptions("cuda:0");
    o.prefetch_batches = 2;  // buffers come round often
    o.read_unit = unit;
    auto l = Loader::Open(ds.uri, o);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ((*l)->read_unit(), unit);
    Stream stream;
    uint64_t batches = 0;
    for (uint64_t epoch = 0; epoch < 3; ++epoch) {
      ASSERT_TRUE((*l)->StartEpoch(epoch).ok());
      while (true) {
        auto b = (*l)->Next();
        if (!b.ok()) {
          ASSERT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
          break;
        }
        ASSERT_NE(b->device(), nullptr);
        EXPECT_EQ(b->device()->device(), 0);
        const auto dev = DeviceBytes(*b, stream);
        ASSERT_EQ(dev.size(), b->buffer().size());
        ASSERT_EQ(std::memcmp(dev.data(), b->buffer().data(), dev.size()), 0);
        ExpectColumnMatches(*b, dev, ds);
        batches++;
      }
    }
    EXPECT_GT(batches, 50u);
    const LoaderStats s = (*l)->stats();
    EXPECT_GT(s.h2d_bytes, 0u);
    EXPECT_GT(s.h2d_time.count(), 0);
  }
}

// A host function on the consumer's stream stands in for a slow kernel: the
// consumer queues "read this batch" behind it, drops the batch at once, and
// goes on. A device buffer reused before that read ran would hand the
// consumer a later batch's bytes.
TEST(GpuLoader, NoDeviceBufferIsReusedBeforeTheConsumerIsDone) {
  SKIP_WITHOUT_GPU();
  Dataset ds(400);
  const uint64_t budget = 24 << 20;  // a few batches: blocks come round fast
  auto l = OpenOnGpu(ds, budget);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  Stream stream;
  std::vector<std::vector<std::byte>> expected, landed;
  while (true) {
    auto b = (*l)->Next();
    if (!b.ok()) break;
    ASSERT_TRUE(b->device()->WaitOn(stream.handle()).ok());
    ASSERT_EQ(
        cudaLaunchHostFunc(
            stream.s, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(5)); },
            nullptr),
        cudaSuccess);
    expected.emplace_back(b->buffer().begin(), b->buffer().end());
    landed.emplace_back(b->device()->size());
    ASSERT_EQ(cudaMemcpyAsync(landed.back().data(), b->device()->data(), landed.back().size(),
                              cudaMemcpyDeviceToHost, stream.s),
              cudaSuccess);
    // `b` is dropped here, with the read still queued behind the sleep.
  }
  ASSERT_EQ(cudaStreamSynchronize(stream.s), cudaSuccess);
  ASSERT_GT(expected.size(), 8u);
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(landed[i], expected[i]) << "batch " << i << " was overwritten before it was read";
  }
  EXPECT_LE((*l)->stats().peak_device_bytes, budget);
}

// The stager keeps a copy's host buffer until the copy has landed: each
// keep-alive checks, as it is released, that its copy's event completed.
TEST(GpuStager, HostBufferIsHeldUntilItsCopyLands) {
  SKIP_WITHOUT_GPU();
  gpu::StagerOptions so;
  so.memory_budget = 256 << 20;
  auto stager = gpu::Stager::Open(so);
  ASSERT_TRUE(stager.ok()) << stager.status().ToString();
  const size_t size = 32 << 20;
  std::vector<std::byte> host(size, std::byte{0x42});
  auto pin = (*stager)->Pin(host.data(), host.size());
  ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  std::atomic<int> released{0}, early{0};
  std::vector<std::shared_ptr<DeviceBatch>> batches(24);
  for (size_t i = 0; i < batches.size(); ++i) {
    // The keep-alive's own reference to its batch, to ask about the copy.
    auto mine = std::make_shared<std::shared_ptr<DeviceBatch>>();
    std::shared_ptr<const void> keep(nullptr, [&released, &early, mine](const void*) {
      auto ready = (*mine)->Ready();
      if (!ready.ok() || !*ready) early++;
      released++;
    });
    auto b = (*stager)->Copy({host.data(), host.size()}, std::move(keep), nullptr);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    *mine = *b;
    batches[i] = *b;
    if (i % 3 == 2) {  // the consumer drops batches while copies are in flight
      for (size_t k = i - 2; k <= i; ++k) batches[k].reset();
    }
  }
  ASSERT_TRUE((*stager)->Drain().ok());
  EXPECT_EQ(early.load(), 0) << "a host buffer was released before its copy landed";
  EXPECT_EQ(released.load(), int(batches.size()));
}

TEST(GpuLoader, DeviceAndPinnedMemoryDoNotGrowOverEpochs) {
  SKIP_WITHOUT_GPU();
  Dataset ds(300);
  const uint64_t budget = 48 << 20;
  auto l = OpenOnGpu(ds, budget);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  Stream stream;
  size_t free_after_warmup = 0, total = 0;
  uint64_t pinned_warm = 0;
  for (uint64_t epoch = 0; epoch < 40; ++epoch) {
    ASSERT_TRUE((*l)->StartEpoch(epoch).ok());
    while (true) {
      auto b = (*l)->Next();
      if (!b.ok()) break;
      ASSERT_TRUE(b->device()->WaitOn(stream.handle()).ok());
    }
    ASSERT_EQ(cudaStreamSynchronize(stream.s), cudaSuccess);
    const LoaderStats s = (*l)->stats();
    EXPECT_LE(s.peak_device_bytes, budget) << "epoch " << epoch;
    if (epoch < 4) {  // warm-up: the pools reach their working size
      pinned_warm = std::max(pinned_warm, s.pinned_bytes);
      ASSERT_EQ(cudaMemGetInfo(&free_after_warmup, &total), cudaSuccess);
    } else {
      // Batch sizes vary with their samples, so a block may be replaced by
      // a larger one; a leak would grow with every epoch.
      EXPECT_LE(s.pinned_bytes, 2 * pinned_warm) << "epoch " << epoch;
    }
  }
  size_t free_now = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_now, &total), cudaSuccess);
  EXPECT_GE(free_now + budget, free_after_warmup)
      << "device memory grew past the pool's budget over epochs";
  l->reset();
  EXPECT_GT(pinned_warm, 0u);
}

TEST(GpuLoader, DeviceIndexOutOfRangeNamesTheDevice) {
  SKIP_WITHOUT_GPU();
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  Dataset ds(8);
  const std::string name = "cuda:" + std::to_string(count);
  auto l = Loader::Open(ds.uri, GpuOptions(name));
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kInvalidArgument) << l.status().ToString();
  EXPECT_NE(l.status().message().find(name), std::string::npos) << l.status().ToString();
  EXPECT_NE(l.status().message().find("out of range"), std::string::npos);
}

TEST(GpuLoader, CudaErrorMidEpochIsReportedAndTheLoaderShutsDown) {
  SKIP_WITHOUT_GPU();
  Dataset ds(300);
  auto l = Loader::Open(ds.uri, GpuOptions("cuda:0"));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  gpu::InjectCopyFailure(4, static_cast<int>(cudaErrorLaunchFailure));
  uint64_t good = 0;
  Status error;
  while (true) {
    auto b = (*l)->Next();
    if (!b.ok()) {
      error = b.status();
      break;
    }
    good++;
  }
  gpu::InjectCopyFailure(0, 0);
  EXPECT_GE(good, 1u);
  EXPECT_LT(good, (*l)->num_batches());
  EXPECT_NE(error.message().find("cuda:0"), std::string::npos) << error.ToString();
  EXPECT_NE(error.message().find("cudaMemcpyAsync"), std::string::npos) << error.ToString();
  // Sticky until the next epoch, which works again.
  EXPECT_EQ((*l)->Next().status(), error);
  ASSERT_TRUE((*l)->StartEpoch(1).ok());
  auto b = (*l)->Next();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  l->reset();  // shuts down with batches in flight: must not hang or leak
}

TEST(GpuLoader, OutOfDeviceMemoryIsNoSpaceNamingTheDeviceAndTheCall) {
  SKIP_WITHOUT_GPU();
  Dataset ds(200);
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  // Take all but 4 MiB of the device, so the loader's first batch block fails.
  void* hog = nullptr;
  ASSERT_EQ(cudaMalloc(&hog, free - (4 << 20)), cudaSuccess);
  {
    LoaderOptions o = GpuOptions("cuda:0");
    o.batch_size = 64;  // about 7 MiB: more than is left
    o.device_memory_budget = 1ull << 30;
    auto l = Loader::Open(ds.uri, o);
    if (l.ok()) {
      auto b = (*l)->Next();
      ASSERT_FALSE(b.ok());
      EXPECT_EQ(b.status().code(), Code::kNoSpace) << b.status().ToString();
      EXPECT_NE(b.status().message().find("cuda:0"), std::string::npos) << b.status().ToString();
      EXPECT_NE(b.status().message().find("cudaMalloc"), std::string::npos);
    } else {  // the stream itself could not be made: also a named error
      EXPECT_NE(l.status().message().find("cuda:0"), std::string::npos) << l.status().ToString();
    }
  }
  ASSERT_EQ(cudaFree(hog), cudaSuccess);
}

TEST(GpuLoader, ConsumerHoldingTheWholeBudgetGetsAnErrorNotAHang) {
  SKIP_WITHOUT_GPU();
  Dataset ds(400);
  auto l = OpenOnGpu(ds, 16 << 20);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::vector<Batch> held;
  Status error;
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    auto b = (*l)->Next();
    if (!b.ok()) {
      error = b.status();
      break;
    }
    held.push_back(std::move(*b));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_EQ(error.code(), Code::kNoSpace) << error.ToString();
  EXPECT_NE(error.message().find("device_memory_budget"), std::string::npos);
  held.clear();
  l->reset();
}

TEST(GpuBench, H2dSweepReportsEveryKind) {
  SKIP_WITHOUT_GPU();
  H2dBenchOptions o;
  o.sizes = {1 << 20, 8 << 20};
  o.bytes_per_run = 64 << 20;
  o.repeats = 2;
  auto r = BenchH2d(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->results.size(), 4 * 2 + 2u);
  EXPECT_GT(r->h2d_pinned_gbps, 0);
  EXPECT_GT(r->h2d_pageable_gbps, 0);
  EXPECT_GT(r->d2h_pinned_gbps, 0);
  EXPECT_GT(r->h2d_stoker_gbps, 0);
}

#else  // no CUDA in this build

TEST(GpuDevice, BuildWithoutCudaSaysSo) {
  EXPECT_FALSE(BuiltWithCuda());
  Dataset ds(8);
  auto l = Loader::Open(ds.uri, GpuOptions("cuda:0"));
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kUnsupported);
  EXPECT_NE(l.status().message().find("cuda:0"), std::string::npos);
  EXPECT_NE(l.status().message().find("STOKER_WITH_CUDA"), std::string::npos);
}

#endif

}  // namespace
}  // namespace stoker
