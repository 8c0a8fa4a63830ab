// Allocation failures in every kind of worker thread (issue 35): the
// loader's shard reader (whole shards and per-sample indexes) and assembly
// workers, ParallelFor's users, the checkpoint writer (sync and in the
// background), restore and verify. Each gets NoSpace naming the bytes and
// the part, the process goes on, and the next operation succeeds. Failures
// are injected with the allocator's test hook (core/aligned_memory.h);
// exceptions that escape a worker's body come out as a Status too
// (core/thread_boundary.h).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "ckpt/parallel.h"
#include "ckpt_testdata.h"
#include "core/aligned_memory.h"
#include "core/thread_boundary.h"
#include "stoker/checkpoint.h"
#include "stoker/loader.h"
#include "stoker/pack.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Allocations whose part contains `g_target` fail; each one failed is
// counted and its size kept. The error names one of them: with several
// workers failing at once (the checkpoint writer's chunks), not
// necessarily the first to fail.
std::atomic<const char*> g_target{nullptr};
std::atomic<uint64_t> g_failed{0};
std::mutex g_failed_mu;
std::vector<uint64_t> g_failed_sizes;

bool FailTarget(size_t bytes, std::string_view part) {
  const char* t = g_target.load();
  if (t == nullptr || part.find(t) == std::string_view::npos) return false;
  g_failed++;
  std::lock_guard lock(g_failed_mu);
  g_failed_sizes.push_back(bytes);
  return true;
}

// Whether `message` names one of the failed sizes as "N bytes".
bool NamesAFailedSize(const std::string& message) {
  std::lock_guard lock(g_failed_mu);
  for (const uint64_t n : g_failed_sizes) {
    if (Contains(message, std::to_string(n) + " bytes")) return true;
  }
  return false;
}

// Fails allocations for `part` while in scope.
class FailAllocations {
 public:
  explicit FailAllocations(const char* part) {
    g_failed = 0;
    std::lock_guard lock(g_failed_mu);
    g_failed_sizes.clear();
    g_target = part;
    internal::SetAllocationFailureHookForTesting(&FailTarget);
  }
  ~FailAllocations() { Stop(); }
  void Stop() {
    internal::SetAllocationFailureHookForTesting(nullptr);
    g_target = nullptr;
  }
};

// The NoSpace of an injected failure: names the bytes asked for and the part.
void ExpectNoSpace(const Status& st, const std::string& part) {
  EXPECT_EQ(st.code(), Code::kNoSpace) << st.ToString();
  EXPECT_GT(g_failed.load(), 0u) << "the hook was never asked for " << part;
  EXPECT_TRUE(NamesAFailedSize(st.message()))
      << st.ToString();
  EXPECT_TRUE(Contains(st.message(), part)) << st.ToString();
}

// ---- the allocator and the thread boundary ----------------------------------

TEST(AllocFailure, ScratchBufferIsNoSpaceAndUsableAfterwards) {
  internal::ScratchBuffer buf;
  {
    FailAllocations fail("test scratch");
    auto got = buf.Get(12345, "test scratch");
    ASSERT_FALSE(got.ok());
    ExpectNoSpace(got.status(), "test scratch");
    EXPECT_EQ(buf.size(), 0u);
  }
  auto got = buf.Get(12345, "test scratch");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  std::memset(*got, 1, 12345);
  EXPECT_GE(buf.size(), 12345u);
}

TEST(AllocFailure, ExceptionsInParallelForWorkersComeOutAsStatus) {
  for (int kind = 0; kind < 3; ++kind) {
    Status st = ckpt::ParallelFor(64, 4, [&](size_t i, size_t) -> Status {
      if (i == 37) {
        if (kind == 0) throw std::bad_alloc();
        if (kind == 1) throw std::runtime_error("the body's own error");
        throw 7;
      }
      return Status::Ok();
    });
    SCOPED_TRACE(kind);
    EXPECT_TRUE(Contains(st.message(), "checkpoint worker, item 37")) << st.ToString();
    if (kind == 0) {
      EXPECT_EQ(st.code(), Code::kNoSpace) << st.ToString();
    } else {
      EXPECT_EQ(st.code(), Code::kInternal) << st.ToString();
    }
    if (kind == 1) {
      EXPECT_TRUE(Contains(st.message(), "the body's own error")) << st.ToString();
    }
  }
  // A ParallelFor user's own allocation: NoSpace, and the next loop runs.
  std::vector<internal::ScratchBuffer> scratch(ckpt::Workers(16, 4));
  auto body = [&](size_t i, size_t w) -> Status {
    auto got = scratch[w].Get(1000 + i, "test worker buffer");
    return got.ok() ? Status::Ok() : got.status();
  };
  {
    FailAllocations fail("test worker buffer");
    ExpectNoSpace(ckpt::ParallelFor(16, 4, body), "test worker buffer");
  }
  EXPECT_TRUE(ckpt::ParallelFor(16, 4, body).ok());
}

TEST(AllocFailure, CatchAsStatusPassesResultsThrough) {
  Result<int> r = internal::CatchAsStatus("t", []() -> Result<int> { return 5; });
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 5);
  r = internal::CatchAsStatus("t", []() -> Result<int> { throw std::bad_alloc(); });
  EXPECT_EQ(r.status().code(), Code::kNoSpace);
}

// ---- the loader ---------------------------------------------------------------

struct Dataset {
  TempDir dir;
  std::string uri;
  Dataset() {
    const fs::path root = dir.path() / "src";
    for (uint32_t i = 0; i < 120; ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "c%02u/f%05u.bin", i % 3, i);
      testing::WriteFile(root / name, testing::RandomBytes(500 + i * 13, i + 1));
    }
    uri = (dir.path() / "ds").string();
    PackOptions po;
    po.shard_bytes = 16 << 10;
    auto m = Pack(root.string(), uri, po);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
  }
};

LoaderOptions Opts(const std::string& read_unit) {
  LoaderOptions o;
  o.batch_size = 8;
  o.threads = 3;
  o.seed = 5;
  o.read_unit = read_unit;
  return o;
}

// Batches until the first error; OK at the end of the epoch.
Status Drain(Loader& l, uint64_t* batches = nullptr) {
  while (true) {
    auto b = l.Next();
    if (!b.ok()) return b.status().code() == Code::kOutOfRange ? Status::Ok() : b.status();
    if (batches) ++*batches;
  }
}

struct LoaderCase {
  const char* read_unit;
  const char* part;  // the allocation that fails
};

class LoaderAllocFailure : public ::testing::TestWithParam<LoaderCase> {};

TEST_P(LoaderAllocFailure, IsNoSpaceNamingBytesAndPartAndTheNextEpochRuns) {
  Dataset ds;
  std::unique_ptr<Loader> loader;
  {
    // Armed before Open: Open starts the epoch, and its readers and workers
    // may fill every slot before the first Next.
    FailAllocations fail(GetParam().part);
    auto l = Loader::Open(ds.uri, Opts(GetParam().read_unit));
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    loader = std::move(l).value();
    Status st = Drain(*loader);
    ExpectNoSpace(st, GetParam().part);
    // Which batch or shard it was for.
    EXPECT_TRUE(Contains(st.message(), "batch ") || Contains(st.message(), "shard"))
        << st.ToString();
  }
  // The process lives, and so does the loader: the next epoch is whole.
  ASSERT_TRUE(loader->StartEpoch(1).ok());
  uint64_t batches = 0;
  ASSERT_TRUE(Drain(*loader, &batches).ok());
  EXPECT_EQ(batches, (120u + 7) / 8);
}

INSTANTIATE_TEST_SUITE_P(
    Workers, LoaderAllocFailure,
    ::testing::Values(LoaderCase{"shard", "loader batch buffer"},    // assembly worker
                      LoaderCase{"sample", "loader batch buffer"},   // assembly, per-sample
                      LoaderCase{"shard", "loader shard buffer"},    // whole-shard reader
                      LoaderCase{"sample", "loader shard index buffer"}),  // index reader
    [](const auto& info) {
      std::string p = info.param.part;
      for (char& c : p) c = c == ' ' ? '_' : c;
      return std::string(info.param.read_unit) + "_" + p;
    });

// ---- checkpoints ----------------------------------------------------------------

class CkptAllocFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = OpenCheckpointer("mem://alloc-failure-" + std::to_string(g_unique_++), {});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ckpt_ = std::move(*c);
  }
  static SaveOptions Small() {
    SaveOptions o;
    o.chunk_bytes = 16 << 10;  // chunks shared by small tensors: gathered
    return o;
  }
  static inline int g_unique_ = 0;
  std::unique_ptr<Checkpointer> ckpt_;
};

TEST_F(CkptAllocFailure, WriterIsNoSpaceAndTheNextSaveSucceeds) {
  auto c = testing::MakeCkptContent(3);
  {
    FailAllocations fail("checkpoint writer");
    ExpectNoSpace(ckpt_->Save("step-1", c.refs, Small()), "checkpoint writer's gather buffer");
  }
  ASSERT_TRUE(ckpt_->Save("step-2", c.refs, Small()).ok());
  auto r = ckpt_->Restore("step-2", {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors.size(), c.refs.size());
}

TEST_F(CkptAllocFailure, BackgroundWriterIsNoSpaceInItsHandle) {
  auto c = testing::MakeCkptContent(4);
  {
    FailAllocations fail("checkpoint writer");
    auto h = ckpt_->SaveAsync("step-1", c.refs, Small());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ExpectNoSpace(h->Wait(), "checkpoint writer's gather buffer");
  }
  auto h = ckpt_->SaveAsync("step-2", c.refs, Small());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->Wait().ok());
}

TEST_F(CkptAllocFailure, RestoreAndVerifyAreNoSpaceAndThenSucceed) {
  auto c = testing::MakeCkptContent(5);
  ASSERT_TRUE(ckpt_->Save("step-1", c.refs, Small()).ok());
  {
    FailAllocations fail("checkpoint restore");
    auto r = ckpt_->Restore("step-1", {});
    ASSERT_FALSE(r.ok());
    ExpectNoSpace(r.status(), "checkpoint restore's buffer of small tensors");
    EXPECT_TRUE(Contains(r.status().message(), "rank 0, tensors")) << r.status().ToString();
  }
  {
    // A piece of a tensor (a flat range): read through the read buffer.
    const TensorRef& t = c.refs[7];  // opt.state.0.exp_avg
    std::vector<std::byte> piece(t.data.size() / 2);
    TensorDestination d{t.name, piece, {TensorLayout::Kind::kFlat, t.shape, {}, 0}, t.dtype,
                        {int64_t(piece.size() / DTypeSize(t.dtype))}};
    {
      FailAllocations fail("checkpoint restore");
      auto r = ckpt_->RestoreInto("step-1", {&d, 1}, {});
      ASSERT_FALSE(r.ok());
      ExpectNoSpace(r.status(), "checkpoint restore's read buffer");
    }
    auto r = ckpt_->RestoreInto("step-1", {&d, 1}, {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(0, std::memcmp(piece.data(), t.data.data(), piece.size()));
  }
  {
    FailAllocations fail("checkpoint verify");
    ExpectNoSpace(ckpt_->Verify("step-1", nullptr), "checkpoint verify's read buffer");
  }
  EXPECT_TRUE(ckpt_->Verify("step-1", nullptr).ok());
  auto r = ckpt_->Restore("step-1", {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (size_t i = 0; i < c.refs.size(); ++i) {
    ASSERT_EQ(r->tensors[i].data.size(), c.refs[i].data.size());
    EXPECT_EQ(0, std::memcmp(r->tensors[i].data.data(), c.refs[i].data.data(),
                             c.refs[i].data.size()));
  }
}

}  // namespace
}  // namespace stoker
