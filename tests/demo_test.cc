// The demo's measurement parts: the emulated round trip is paid once per
// operation on both sides (counted through the wrapper and the per-file
// loader), the accelerators search is monotone and stops, and `stoker demo
// --json` writes every figure under the documented names.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "stoker/loader.h"
#include "stoker/pack.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::RandomBytes;
using testing::TempDir;
using namespace std::chrono_literals;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

TEST(LatencyStoreTest, EveryOperationPaysOneRoundTrip) {
  auto inner = NewMemoryStore("latency-store-test");
  const auto data = RandomBytes(1000, 1);
  for (const char* k : {"a", "b", "c"}) ASSERT_OK(inner->Put(k, data));
  auto rt = std::make_shared<RoundTrip>(20ms);
  auto store = NewLatencyStore(inner, rt);

  auto t0 = Clock::now();
  std::vector<std::byte> buf(100);
  auto n = store->Read("a", 10, buf);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 100u);
  EXPECT_GE(Seconds(t0), 0.020);
  EXPECT_EQ(rt->operations(), 1u);
  ASSERT_TRUE(store->ReadAll("b").ok());
  ASSERT_TRUE(store->Stat("c").ok());
  ASSERT_TRUE(store->List("").ok());
  ASSERT_OK(store->Put("d", data));
  ASSERT_OK(store->Remove("d"));
  EXPECT_EQ(rt->operations(), 6u);

  // A queue: each request counts; none completes before its round trip, and
  // requests in flight wait theirs out together (not one after another).
  auto q = store->NewReadQueue({});
  ASSERT_TRUE(q.ok());
  std::vector<std::vector<std::byte>> dsts(5, std::vector<std::byte>(50));
  std::vector<ReadRequest> reqs;
  for (uint64_t i = 0; i < 5; ++i) reqs.push_back({"a", i * 50, dsts[i], i});
  t0 = Clock::now();
  ASSERT_OK((*q)->Submit(reqs));
  std::vector<ReadCompletion> done;
  auto got = (*q)->Wait(5, Clock::now() + 10s, &done);
  const double waited = Seconds(t0);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(done.size(), 5u);
  for (const auto& c : done) {
    EXPECT_TRUE(c.status.ok());
    EXPECT_EQ(c.bytes, 50u);
    EXPECT_EQ(0, std::memcmp(dsts[c.tag].data(), data.data() + c.tag * 50, 50));
  }
  EXPECT_GE(waited, 0.020);
  EXPECT_LT(waited, 5 * 0.020) << "requests in flight paid their round trips one by one";
  EXPECT_EQ(rt->operations(), 11u);
  EXPECT_EQ((*q)->Outstanding(), 0u);

  // A deadline before the round trip is over: TimedOut, nothing handed over.
  ASSERT_OK((*q)->Submit(std::span(reqs).first(1)));
  done.clear();
  auto early = (*q)->Wait(1, Clock::now() + 1ms, &done);
  EXPECT_EQ(early.status().code(), Code::kTimedOut);
  EXPECT_TRUE(done.empty());
  EXPECT_EQ((*q)->Outstanding(), 1u);
  ASSERT_TRUE((*q)->Wait(1, Clock::now() + 10s, &done).ok());
  EXPECT_EQ(done.size(), 1u);
}

// Sample files and their sources, as the demo has them.
PackSources MakeFiles(const fs::path& root, uint32_t files) {
  for (uint32_t i = 0; i < files; ++i) {
    testing::WriteFile(root / ("c" + std::to_string(i % 2)) / ("f" + std::to_string(i) + ".bin"),
                       RandomBytes(300 + i, i));
  }
  auto s = ScanImageFolder(root.string());
  EXPECT_TRUE(s.ok());
  return *s;
}

TEST(LatencyStoreTest, PerFileLoaderPaysOncePerFile) {
  TempDir d;
  const PackSources sources = MakeFiles(d.path() / "files", 23);
  auto rt = std::make_shared<RoundTrip>(1ms);
  LoaderOptions o;
  o.batch_size = 4;
  o.threads = 2;
  auto l = PerFileLoader::Open(sources, o, rt);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  uint64_t samples = 0;
  while (true) {
    auto b = (*l)->Next();
    if (!b.ok()) {
      ASSERT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
      break;
    }
    samples += b->size();
  }
  EXPECT_EQ(samples, 23u);
  EXPECT_EQ(rt->operations(), 23u);
}

TEST(LatencyStoreTest, LoaderPaysForEveryStoreOperation) {
  TempDir d;
  const PackSources sources = MakeFiles(d.path() / "files", 200);
  PackOptions po;
  po.shard_bytes = 8 << 10;
  auto m = Pack(sources, **OpenStore((d.path() / "ds").string()), po);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_GT(m->shards.size(), 5u);
  // Two wrappers: the outer one pays the round trip, the inner one (no
  // latency) counts what reached the store. Equal counts: every operation
  // the loader made paid once.
  auto reached = std::make_shared<RoundTrip>(0us);
  auto paid = std::make_shared<RoundTrip>(1ms);
  auto store =
      NewLatencyStore(NewLatencyStore(*OpenStore((d.path() / "ds").string()), reached), paid);
  LoaderOptions o;
  o.batch_size = 16;
  o.threads = 2;
  auto l = Loader::Open(store, o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  uint64_t samples = 0;
  while (true) {
    auto b = (*l)->Next();
    if (!b.ok()) {
      ASSERT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
      break;
    }
    samples += b->size();
  }
  EXPECT_EQ(samples, 200u);
  l->reset();
  EXPECT_GE(paid->operations(), m->shards.size() + 1) << "each shard and the manifest";
  EXPECT_EQ(paid->operations(), reached->operations());
}

AcceleratorTrial Trial(uint32_t n, double utilisation) {
  AcceleratorTrial t;
  t.accelerators = n;
  t.utilisation = utilisation;
  return t;
}

TEST(AcceleratorSearchTest, DoublesAndStopsAtTheFirstFailure) {
  std::vector<uint32_t> tried;
  auto s = SearchAccelerators(
      [&](uint32_t n) -> Result<AcceleratorTrial> {
        tried.push_back(n);
        return Trial(n, n <= 5 ? 0.95 : 0.5);
      },
      0.9, 64);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(tried, (std::vector<uint32_t>{1, 2, 4, 8}));
  EXPECT_EQ(s->supported, 4u);
  EXPECT_EQ(s->trials.size(), 4u);

  // A pass after a failure is never tried: the search is monotone.
  tried.clear();
  s = SearchAccelerators(
      [&](uint32_t n) -> Result<AcceleratorTrial> {
        tried.push_back(n);
        return Trial(n, n == 2 ? 0.5 : 1.0);
      },
      0.9, 64);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(tried, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(s->supported, 1u);

  // None busy: 0, after one trial.
  s = SearchAccelerators([&](uint32_t n) -> Result<AcceleratorTrial> { return Trial(n, 0.89); },
                         0.9, 64);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->supported, 0u);
  EXPECT_EQ(s->trials.size(), 1u);

  // Always busy: it stops at the cap.
  tried.clear();
  s = SearchAccelerators(
      [&](uint32_t n) -> Result<AcceleratorTrial> {
        tried.push_back(n);
        return Trial(n, 1.0);
      },
      0.9, 20);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(tried, (std::vector<uint32_t>{1, 2, 4, 8, 16}));
  EXPECT_EQ(s->supported, 16u);

  // A failing trial is an error, not a count.
  s = SearchAccelerators([&](uint32_t) -> Result<AcceleratorTrial> { return IoError("disk gone"); },
                         0.9, 8);
  EXPECT_EQ(s.status().code(), Code::kIoError);
  EXPECT_EQ(SearchAccelerators([&](uint32_t n) -> Result<AcceleratorTrial> { return Trial(n, 1); },
                               0.9, 0)
                .status()
                .code(),
            Code::kInvalidArgument);
}

TEST(AcceleratorSearchTest, RunAcceleratorsMeasuresEveryRank) {
  // A source that is always ready: every rank is busy all the time.
  auto t = RunAccelerators(
      3,
      [](uint32_t) -> Result<BatchSource> {
        return BatchSource([]() -> Result<Batch> { return Batch(); });
      },
      2ms, 1, 5);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->ranks.size(), 3u);
  for (const auto& r : t->ranks) EXPECT_EQ(r.steps, 5u);
  EXPECT_GT(t->utilisation, 0.5);
  // A source that runs dry before the measured steps end is an error.
  auto dry = RunAccelerators(
      2,
      [](uint32_t) -> Result<BatchSource> {
        return BatchSource([]() -> Result<Batch> { return OutOfRange("end"); });
      },
      1ms, 0, 3);
  EXPECT_EQ(dry.status().code(), Code::kOutOfRange);
}

std::string StokerBin() {
  if (const char* b = std::getenv("STOKER_BIN")) return b;
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "stoker").string();
}

TEST(DemoTest, JsonHasEveryFigure) {
  TempDir d;
  const std::string json = (d.path() / "demo.json").string();
  const std::string cmd = StokerBin() + " demo --dir " + (d.path() / "work").string() +
                          " --images 40 --classes 2 --batch-size 4 --steps 3 --warmup-steps 1 "
                          "--max-accelerators 2 --no-torch --round-trip-ms 0.2 --json " +
                          json + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("this node, this storage: per-file keeps"), std::string::npos) << out;
  EXPECT_NE(out.find("emulated network round trip of 0.200 ms"), std::string::npos) << out;
  const auto j = nlohmann::json::parse(std::ifstream(json));
  EXPECT_EQ(j.at("storage").at("mode"), "network");
  EXPECT_DOUBLE_EQ(j.at("storage").at("round_trip_ms").get<double>(), 0.2);
  EXPECT_EQ(j.at("model").at("name"), "resnet50-h100");
  EXPECT_GT(j.at("model").at("compute_seconds_per_sample").get<double>(), 0);
  for (const char* side : {"per_file", "stoker"}) {
    const auto& s = j.at(side);
    EXPECT_TRUE(s.at("accelerators_busy").is_number_unsigned()) << side;
    EXPECT_GT(s.at("storage_operations").get<uint64_t>(), 0u) << side;
    ASSERT_FALSE(s.at("trials").empty()) << side;
    for (const auto& t : s.at("trials")) {
      for (const char* k : {"accelerators", "utilisation", "min_rank_utilisation",
                            "nominal_compute_share", "samples_per_s", "wall_seconds", "busy"}) {
        EXPECT_TRUE(t.contains(k)) << side << " trial lacks " << k;
      }
    }
  }
  EXPECT_EQ(j.at("headline").at("per_file_accelerators"), j.at("per_file").at("accelerators_busy"));
  EXPECT_EQ(j.at("headline").at("stoker_accelerators"), j.at("stoker").at("accelerators_busy"));
  EXPECT_FALSE(j.at("torch").at("ran").get<bool>());
  EXPECT_FALSE(fs::exists(d.path() / "work")) << "the working folder is removed";

  // Bad input is named.
  FILE* bad = popen((StokerBin() + " demo --storage nfs 2>&1").c_str(), "r");
  out.clear();
  while ((n = fread(buf.data(), 1, buf.size(), bad)) > 0) out.append(buf.data(), n);
  EXPECT_NE(pclose(bad), 0);
  EXPECT_NE(out.find("--storage must be network, local or rados://"), std::string::npos) << out;
}

}  // namespace
}  // namespace stoker
