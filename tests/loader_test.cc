// The loader end to end on the POSIX store (both engines) and the memory
// store: delivered bytes equal the source files, exactly-once across ranks,
// resume equals the uninterrupted run, decode equals a direct decode,
// corruption and missing shards named, clean shutdown, bounded memory.
#include "stoker/loader.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "core/stream_copy.h"
#include "loader/batch_builder.h"
#include "loader/resize.h"
#include "bench/bench.h"
#include "stoker/pack.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::RandomBytes;
using testing::TempDir;

// An ImageFolder of random files (sizes `min`..`max`), packed into a dataset.
struct Fixture {
  TempDir dir;
  PackSources sources;
  std::vector<std::vector<std::byte>> contents;  // by sample id
  std::string uri;
  format::Manifest manifest;

  Fixture(uint32_t files, uint32_t classes, size_t min, size_t max, uint64_t shard_bytes,
          const std::string& engine = "auto") {
    const fs::path root = dir.path() / "src";
    for (uint32_t i = 0; i < files; ++i) {
      const size_t size = min + (i * 7919) % (max - min + 1);
      char name[64];
      std::snprintf(name, sizeof name, "c%02u/f%05u.bin", i % classes, i);
      testing::WriteFile(root / name, RandomBytes(size, i + 1));
    }
    auto s = ScanImageFolder(root.string());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    sources = *s;
    for (const auto& f : sources.files) contents.push_back(testing::ReadFile(f.path));
    uri = (dir.path() / "ds").string();
    PackOptions po;
    po.shard_bytes = shard_bytes;
    po.store.posix_engine = engine;
    auto m = Pack(root.string(), uri, po);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    manifest = *m;
    // Sample ids are positions in the packed (shuffled) order.
    PackSources packed;
    std::vector<std::vector<std::byte>> packed_contents;
    for (uint64_t i : PackedOrder(sources.files.size(), po)) {
      packed.files.push_back(sources.files[i]);
      packed_contents.push_back(contents[i]);
    }
    sources.files = std::move(packed.files);
    contents = std::move(packed_contents);
  }
};

// XORs byte `at` of a file with `mask` (twice restores it).
void FlipByte(const fs::path& path, size_t at, std::byte mask) {
  auto bytes = testing::ReadFile(path);
  bytes.at(at) ^= mask;
  testing::WriteFile(path, bytes);
}

LoaderOptions Opts(uint32_t batch, const std::string& engine = "auto") {
  LoaderOptions o;
  o.batch_size = batch;
  o.threads = 2;
  o.seed = 17;
  o.shuffle_window_shards = 3;
  o.memory_budget = 64 << 20;
  o.store.posix_engine = engine;
  return o;
}

// Every batch of one epoch, checked against the sources as it arrives.
std::vector<uint64_t> ReadEpochChecked(Loader& l, const Fixture& f, uint64_t* padding = nullptr) {
  std::vector<uint64_t> ids;
  while (true) {
    auto b = l.Next();
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
      break;
    }
    const auto* image = b->bytes("image");
    const auto* label = b->int64("label");
    EXPECT_NE(image, nullptr);
    EXPECT_NE(label, nullptr);
    if (!image || !label) break;
    for (size_t i = 0; i < b->size(); ++i) {
      const uint64_t id = b->sample_ids()[i];
      const auto& want = f.contents.at(id);
      auto got = image->data.subspan(image->offsets[i], image->offsets[i + 1] - image->offsets[i]);
      EXPECT_TRUE(got.size() == want.size() && std::equal(got.begin(), got.end(), want.begin()))
          << "sample " << id << " differs from " << f.sources.files[id].path;
      EXPECT_EQ(label->values[i], f.sources.files[id].label);
      if (padding) *padding += b->padding()[i];
      ids.push_back(id);
    }
  }
  return ids;
}

class LoaderEngines : public ::testing::TestWithParam<std::string> {};

TEST_P(LoaderEngines, DeliversEverySampleExactlyOnceWithTheSourceBytes) {
  Fixture f(300, 5, 1, 20000, 64 << 10, GetParam());
  ASSERT_GT(f.manifest.shards.size(), 20u);
  auto l = Loader::Open(f.uri, Opts(16, GetParam()));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ((*l)->num_batches(), (300 + 15) / 16);
  auto ids = ReadEpochChecked(**l, f);
  std::set<uint64_t> unique(ids.begin(), ids.end());
  EXPECT_EQ(ids.size(), 300u);
  EXPECT_EQ(unique.size(), 300u);
  EXPECT_FALSE(std::is_sorted(ids.begin(), ids.end()));  // shuffled
  EXPECT_EQ((*l)->state().position, 300u);
  auto stats = (*l)->stats();
  EXPECT_EQ(stats.samples_delivered, 300u);
  EXPECT_LE(stats.peak_buffer_bytes, Opts(16).memory_budget);
}

TEST_P(LoaderEngines, DirectIo) {
  Fixture f(100, 3, 100, 9000, 32 << 10, GetParam());
  LoaderOptions o = Opts(8, GetParam());
  o.direct_io = true;
  auto l = Loader::Open(f.uri, o);
  ASSERT_TRUE(l.ok());
  auto first = (*l)->Next();
  if (!first.ok() && first.status().code() == Code::kUnsupported) {
    GTEST_SKIP() << "this filesystem refuses O_DIRECT: " << first.status().ToString();
  }
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE((*l)->StartEpoch(0).ok());
  EXPECT_EQ(ReadEpochChecked(**l, f).size(), 100u);
}

INSTANTIATE_TEST_SUITE_P(Posix, LoaderEngines, ::testing::Values("io_uring", "threads"),
                         [](const auto& info) { return info.param; });

TEST(LoaderTest, RanksTogetherCoverTheDatasetExactlyOnce) {
  Fixture f(203, 4, 1, 3000, 16 << 10);
  for (uint32_t world : {1u, 2u, 3u, 8u}) {
    for (bool drop_last : {false, true}) {
      std::map<uint64_t, int> seen;
      uint64_t padding = 0;
      uint64_t batches = 0;
      for (uint32_t r = 0; r < world; ++r) {
        LoaderOptions o = Opts(5);
        o.rank = r;
        o.world_size = world;
        o.drop_last = drop_last;
        auto l = Loader::Open(f.uri, o);
        ASSERT_TRUE(l.ok()) << l.status().ToString();
        if (r == 0) batches = (*l)->num_batches();
        EXPECT_EQ((*l)->num_batches(), batches);
        for (uint64_t id : ReadEpochChecked(**l, f, &padding)) seen[id]++;
      }
      uint64_t total = 0;
      for (auto& [id, c] : seen) total += c;
      if (drop_last) {
        EXPECT_EQ(total, batches * 5 * world);
        for (auto& [id, c] : seen) EXPECT_EQ(c, 1);
      } else {
        EXPECT_EQ(seen.size(), 203u) << "world " << world;
        EXPECT_EQ(total, 203u + padding);
      }
    }
  }
}

TEST(LoaderTest, ResumeEqualsUninterrupted) {
  Fixture f(150, 3, 1, 5000, 16 << 10);
  auto full = Loader::Open(f.uri, Opts(7));
  ASSERT_TRUE(full.ok());
  auto all = ReadEpochChecked(**full, f);
  for (uint64_t k : {0, 1, 5, 21, 22}) {
    auto l = Loader::Open(f.uri, Opts(7));
    ASSERT_TRUE(l.ok());
    std::vector<uint64_t> got;
    for (uint64_t i = 0; i < k; ++i) {
      auto b = (*l)->Next();
      ASSERT_TRUE(b.ok());
      got.insert(got.end(), b->sample_ids().begin(), b->sample_ids().end());
    }
    const LoaderState state = (*l)->state();
    l->reset();  // the job dies here
    LoaderOptions o = Opts(7);
    o.start = state;
    auto resumed = Loader::Open(f.uri, o);
    ASSERT_TRUE(resumed.ok());
    auto rest = ReadEpochChecked(**resumed, f);
    got.insert(got.end(), rest.begin(), rest.end());
    EXPECT_EQ(got, all) << "resumed after " << k << " batches";
  }
}

TEST(LoaderTest, ResumeSkipsConsumedShardsWithoutReadingThem) {
  Fixture f(200, 2, 2000, 4000, 16 << 10);
  LoaderOptions o = Opts(10);
  o.shuffle = false;
  o.start = {0, 190};
  auto l = Loader::Open(f.uri, o);
  ASSERT_TRUE(l.ok());
  auto b = (*l)->Next();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->size(), 10u);
  EXPECT_EQ(b->index(), 19u);
  EXPECT_EQ((*l)->Next().status().code(), Code::kOutOfRange);
  // Only the shards holding samples 190..199 were read.
  const uint64_t want = f.manifest.ShardOf(199) - f.manifest.ShardOf(190) + 1;
  EXPECT_LT(want, f.manifest.shards.size() / 4);
  EXPECT_EQ((*l)->stats().shards_read, want);
}

// Waits (up to a minute: a condition, not a timing) until `l` has read more
// than `shards` shards.
bool ReadMoreThan(const Loader& l, uint64_t shards) {
  const auto deadline = Clock::now() + std::chrono::minutes(1);
  while (l.stats().shards_read <= shards) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Loader::Prefetch: the next epoch's reads start at once, and its
// StartEpoch keeps them: with a read done before StartEpoch, a restart
// would read that shard twice.
TEST(LoaderPrefetch, TheNextEpochsStartEpochKeepsWhatWasReadAhead) {
  Fixture f(200, 2, 2000, 4000, 16 << 10);
  const uint64_t shards = f.manifest.shards.size();
  auto opened = Loader::Open(f.uri, Opts(10));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Loader& l = **opened;
  // Open's start is kept the same way.
  ASSERT_TRUE(ReadMoreThan(l, 0));
  ASSERT_TRUE(l.StartEpoch(0, 0).ok());
  const std::vector<uint64_t> epoch0 = ReadEpochChecked(l, f);
  EXPECT_EQ(l.stats().shards_read, shards);

  ASSERT_TRUE(l.Prefetch(1).ok());
  ASSERT_TRUE(ReadMoreThan(l, shards)) << "Prefetch(1) read nothing";
  EXPECT_EQ(l.state().epoch, 1u);
  ASSERT_TRUE(l.StartEpoch(1, 0).ok());
  ASSERT_TRUE(l.StartEpoch(1, 0).ok());  // still untouched: kept again
  EXPECT_EQ(l.num_batches(), 20u);
  const std::vector<uint64_t> epoch1 = ReadEpochChecked(l, f);
  EXPECT_EQ(l.stats().shards_read, 2 * shards) << "a shard of epoch 1 was read twice";
  EXPECT_NE(epoch1, epoch0);
  LoaderOptions fresh = Opts(10);
  fresh.start = {1, 0};
  auto other = Loader::Open(f.uri, fresh);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(ReadEpochChecked(**other, f), epoch1) << "the kept epoch is epoch 1, in order";

  // Another epoch or position than the one read ahead starts over.
  ASSERT_TRUE(l.Prefetch(2).ok());
  ASSERT_TRUE(l.StartEpoch(2, 100).ok());
  auto b = l.Next();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->index(), 10u);
  // A Next() ends the keeping: the StartEpoch after it starts from the top.
  ASSERT_TRUE(l.Prefetch(3).ok());
  ASSERT_TRUE(l.Next().ok());
  ASSERT_TRUE(l.Next().ok());
  ASSERT_TRUE(l.StartEpoch(3, 0).ok());
  b = l.Next();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->epoch(), 3u);
  EXPECT_EQ(b->index(), 0u);
}

TEST(LoaderTest, EpochsDifferAndRepeat) {
  Fixture f(120, 3, 1, 3000, 16 << 10);
  auto a = Loader::Open(f.uri, Opts(10));
  auto e0 = ReadEpochChecked(**a, f);
  ASSERT_TRUE((*a)->StartEpoch(1).ok());
  auto e1 = ReadEpochChecked(**a, f);
  EXPECT_NE(e0, e1);
  auto b = Loader::Open(f.uri, Opts(10));
  EXPECT_EQ(ReadEpochChecked(**b, f), e0);
}

TEST(LoaderTest, SelectedFieldsOnly) {
  Fixture f(40, 2, 10, 100, 16 << 10);
  LoaderOptions o = Opts(8);
  o.fields = {"label"};
  auto l = Loader::Open(f.uri, o);
  ASSERT_TRUE(l.ok());
  auto b = (*l)->Next();
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->bytes("image"), nullptr);
  ASSERT_NE(b->int64("label"), nullptr);
  EXPECT_EQ(b->int64("label")->values.size(), 8u);
}

// The decode workers' resize against bilinear in floating point (half-pixel
// centres, edges clamped): within one grey level for every shape, the
// degenerate ones (one row or column, on either side) included.
TEST(LoaderTest, ResizeIsBilinearWithinOneLevel) {
  auto reference = [](const uint8_t* src, uint32_t sh, uint32_t sw, uint32_t dh, uint32_t dw) {
    std::vector<uint8_t> out(size_t(dh) * dw * 3);
    auto tap = [](uint32_t i, uint32_t n, uint32_t d, uint32_t* i0, uint32_t* i1, float* w) {
      float f = (float(i) + 0.5f) * float(n) / float(d) - 0.5f;
      if (f < 0) f = 0;
      *i0 = std::min<uint32_t>(uint32_t(f), n - 1);
      *i1 = std::min<uint32_t>(*i0 + 1, n - 1);
      *w = f - float(*i0);
    };
    for (uint32_t y = 0; y < dh; ++y) {
      uint32_t y0, y1, x0, x1;
      float wy, wx;
      tap(y, sh, dh, &y0, &y1, &wy);
      for (uint32_t x = 0; x < dw; ++x) {
        tap(x, sw, dw, &x0, &x1, &wx);
        for (int c = 0; c < 3; ++c) {
          auto px = [&](uint32_t yy, uint32_t xx) {
            return float(src[(size_t(yy) * sw + xx) * 3 + c]);
          };
          const float top = px(y0, x0) + (px(y0, x1) - px(y0, x0)) * wx;
          const float bot = px(y1, x0) + (px(y1, x1) - px(y1, x0)) * wx;
          out[(size_t(y) * dw + x) * 3 + c] = uint8_t(top + (bot - top) * wy + 0.5f);
        }
      }
    }
    return out;
  };
  uint64_t seed = 1;
  auto next = [&] {
    return uint32_t((seed = seed * 6364136223846793005ull + 1442695040888963407ull) >> 33);
  };
  for (int t = 0; t < 200; ++t) {
    const uint32_t sh = 1 + next() % (t < 40 ? 3 : 500), sw = 1 + next() % (t % 2 ? 3 : 500);
    const uint32_t dh = 1 + next() % (t % 3 ? 260 : 3), dw = 1 + next() % 260;
    const std::vector<std::byte> bytes = RandomBytes(size_t(sh) * sw * 3, t + 1);
    const auto* src = reinterpret_cast<const uint8_t*>(bytes.data());
    std::vector<uint8_t> got(size_t(dh) * dw * 3);
    ResizeBilinear(src, sh, sw, got.data(), dh, dw);
    const std::vector<uint8_t> want = reference(src, sh, sw, dh, dw);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_LE(std::abs(int(got[i]) - int(want[i])), 1)
          << sh << "x" << sw << " -> " << dh << "x" << dw << " at " << i;
    }
  }
}

// The collate copy (streaming stores): every length and alignment of source
// and destination copies exactly its bytes, and nothing either side.
TEST(LoaderTest, StreamCopyCopiesExactlyItsBytesAtAnyAlignment) {
  const std::vector<std::byte> src = RandomBytes(80000, 7);
  std::vector<std::byte> dst(80000 + 256);
  for (size_t n : {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 4095, 4096, 4097, 70001}) {
    for (size_t d = 0; d < 19; ++d) {
      for (size_t so : {0, 1, 7, 16, 33}) {
        std::fill(dst.begin(), dst.end(), std::byte{0xA5});
        StreamCopy(dst.data() + 64 + d, src.data() + so, n);
        StreamFence();
        ASSERT_EQ(std::memcmp(dst.data() + 64 + d, src.data() + so, n), 0)
            << "n " << n << " dst offset " << d << " src offset " << so;
        for (size_t k = 0; k < 64 + d; ++k) ASSERT_EQ(dst[k], std::byte{0xA5}) << "before, n " << n;
        for (size_t k = 64 + d + n; k < dst.size(); ++k) {
          ASSERT_EQ(dst[k], std::byte{0xA5}) << "after, n " << n;
        }
      }
    }
  }
}

TEST(LoaderTest, BatchOutlivesItsLoaderAndShutdownMidEpochIsClean) {
  Fixture f(200, 2, 1000, 9000, 16 << 10);
  Batch kept;
  {
    auto l = Loader::Open(f.uri, Opts(9));
    ASSERT_TRUE(l.ok());
    auto b = (*l)->Next();
    ASSERT_TRUE(b.ok());
    kept = *b;
    // The loader dies with reads and batches in flight.
  }
  const auto* image = kept.bytes("image");
  ASSERT_NE(image, nullptr);
  for (size_t i = 0; i < kept.size(); ++i) {
    const auto& want = f.contents[kept.sample_ids()[i]];
    auto got = image->data.subspan(image->offsets[i], image->offsets[i + 1] - image->offsets[i]);
    ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
  }
  // Many open/close cycles mid-epoch: no hang, no leaked threads (the
  // thread count returns to where it was). io_uring's workers (iou-wrk-*,
  // iou-sqp-*) are the kernel's: they come and go on their own (one that
  // exited in the loop failed this in CI), so they are not counted.
  auto thread_count = [] {
    size_t n = 0;
    for (auto& e : fs::directory_iterator("/proc/self/task")) {
      std::ifstream comm(e.path() / "comm");
      std::string name;
      std::getline(comm, name);
      if (!name.starts_with("iou-")) ++n;
    }
    return n;
  };
  const size_t threads_before = thread_count();
  for (int i = 0; i < 20; ++i) {
    auto l = Loader::Open(f.uri, Opts(9));
    ASSERT_TRUE(l.ok());
    for (int k = 0; k < i % 3; ++k) ASSERT_TRUE((*l)->Next().ok());
  }
  EXPECT_EQ(thread_count(), threads_before);
}

TEST(LoaderTest, MemoryStaysWithinTheBudget) {
  Fixture f(400, 4, 20000, 40000, 256 << 10);
  LoaderOptions o = Opts(16);
  o.memory_budget = 6 << 20;
  o.shuffle_window_shards = 2;
  o.prefetch_batches = 2;
  auto l = Loader::Open(f.uri, o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(ReadEpochChecked(**l, f).size(), 400u);
  EXPECT_LE((*l)->stats().peak_buffer_bytes, o.memory_budget);
}

TEST(LoaderTest, TooSmallABudgetIsRefusedWithWhatItNeeds) {
  Fixture f(100, 2, 20000, 40000, 256 << 10);
  LoaderOptions o = Opts(16);
  o.memory_budget = 1 << 20;
  auto l = Loader::Open(f.uri, o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kInvalidArgument);
  EXPECT_NE(l.status().message().find("memory_budget"), std::string::npos);
  EXPECT_NE(l.status().message().find("needs at least"), std::string::npos);
}

TEST(LoaderTest, BadOptions) {
  Fixture f(20, 2, 10, 100, 16 << 10);
  auto expect_invalid = [&](LoaderOptions o, const std::string& words) {
    auto l = Loader::Open(f.uri, o);
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), Code::kInvalidArgument);
    EXPECT_NE(l.status().message().find(words), std::string::npos) << l.status().ToString();
  };
  LoaderOptions o = Opts(0);
  expect_invalid(o, "batch_size");
  o = Opts(4);
  o.rank = 2;
  o.world_size = 2;
  expect_invalid(o, "rank 2");
  o = Opts(4);
  o.fields = {"nope"};
  expect_invalid(o, "no field 'nope'");
  o = Opts(4);
  o.decode.field = "label";
  expect_invalid(o, "not a bytes field");
  o = Opts(4);
  o.read_unit = "record";
  expect_invalid(o, "read_unit must be auto, shard, sample or map, not 'record'");
  for (const char* unit : {"sample", "map"}) {
    o = Opts(4);
    o.read_unit = unit;
    o.direct_io = true;
    expect_invalid(o, "read_unit " + std::string(unit) + " cannot be used with direct_io");
  }
}

TEST(LoaderTest, NoDatasetIsNotFound) {
  TempDir d;
  auto l = Loader::Open(d.str(), Opts(4));
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kNotFound);
  EXPECT_NE(l.status().message().find("no stoker dataset at " + d.str()), std::string::npos);
}

// Flips one byte inside a sample's record: the batch holding that sample
// fails with a message naming the shard and the sample.
TEST(LoaderTest, CorruptSampleIsNamedNotDelivered) {
  Fixture f(60, 2, 500, 800, 16 << 10);
  const auto& shard = f.manifest.shards[1];
  const fs::path path = fs::path(f.uri) / shard.key;
  FlipByte(path, format::kShardHeaderBytes + 10, std::byte{0x40});  // inside the first record
  auto l = Loader::Open(f.uri, Opts(4));
  ASSERT_TRUE(l.ok());
  Status err;
  while (true) {
    auto b = (*l)->Next();
    if (!b.ok()) {
      err = b.status();
      break;
    }
    for (uint64_t id : b->sample_ids())
      ASSERT_NE(id, shard.first_sample) << "corrupt sample delivered";
  }
  EXPECT_EQ(err.code(), Code::kCorruption) << err.ToString();
  EXPECT_NE(err.message().find(shard.key), std::string::npos) << err.ToString();
  EXPECT_NE(err.message().find("sample 0 (global " + std::to_string(shard.first_sample)),
            std::string::npos)
      << err.ToString();
  // The failure is sticky until the next StartEpoch.
  EXPECT_EQ((*l)->Next().status().code(), Code::kCorruption);
}

TEST(LoaderTest, MissingShardIsNamed) {
  Fixture f(60, 2, 500, 800, 16 << 10);
  fs::remove(fs::path(f.uri) / f.manifest.shards[2].key);
  auto l = Loader::Open(f.uri, Opts(4));
  ASSERT_TRUE(l.ok());
  Status err;
  while (err.ok()) {
    auto b = (*l)->Next();
    if (!b.ok()) err = b.status();
  }
  EXPECT_EQ(err.code(), Code::kNotFound) << err.ToString();
  EXPECT_NE(err.message().find(f.manifest.shards[2].key), std::string::npos) << err.ToString();
}

TEST(LoaderTest, TruncatedShardIsCorruption) {
  Fixture f(60, 2, 500, 800, 16 << 10);
  const fs::path path = fs::path(f.uri) / f.manifest.shards[0].key;
  fs::resize_file(path, 4096);
  auto l = Loader::Open(f.uri, Opts(4));
  ASSERT_TRUE(l.ok());
  Status err;
  while (err.ok()) {
    auto b = (*l)->Next();
    if (!b.ok()) err = b.status();
  }
  EXPECT_EQ(err.code(), Code::kCorruption) << err.ToString();
  EXPECT_NE(err.message().find("truncated"), std::string::npos) << err.ToString();
  EXPECT_NE(err.message().find(f.manifest.shards[0].key), std::string::npos);
}

// ---- read units: whole shards, or each record straight into the batch ----

// Every batch of one epoch, each column's bytes (ids, padding, offsets and
// values) in order, and where each array starts in the batch's buffer.
std::vector<std::vector<std::byte>> EpochBuffers(Loader& l) {
  std::vector<std::vector<std::byte>> out;
  while (true) {
    auto b = l.Next();
    if (!b.ok()) {
      EXPECT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
      break;
    }
    std::vector<std::byte> v;
    auto add = [&](const void* p, size_t n) {
      const auto* at = static_cast<const std::byte*>(p);
      const uint64_t where = n ? uint64_t(at - b->buffer().data()) : 0;
      const auto* w = reinterpret_cast<const std::byte*>(&where);
      v.insert(v.end(), w, w + sizeof where);
      v.insert(v.end(), at, at + n);
    };
    add(b->sample_ids().data(), b->sample_ids().size_bytes());
    add(b->padding().data(), b->padding().size_bytes());
    for (const auto& c : b->bytes_columns()) {
      add(c.offsets.data(), c.offsets.size_bytes());
      add(c.data.data(), c.data.size_bytes());
    }
    for (const auto& c : b->int64_columns()) add(c.values.data(), c.values.size_bytes());
    const uint64_t size = b->buffer().size();
    const auto* z = reinterpret_cast<const std::byte*>(&size);
    v.insert(v.end(), z, z + sizeof size);
    out.push_back(std::move(v));
  }
  return out;
}

// Reads until the first error (OK if none).
Status FirstError(Loader& l, uint64_t bad_sample = UINT64_MAX) {
  while (true) {
    auto b = l.Next();
    if (!b.ok()) return b.status().code() == Code::kOutOfRange ? Status::Ok() : b.status();
    for (uint64_t id : b->sample_ids()) EXPECT_NE(id, bad_sample) << "corrupt sample delivered";
  }
}

// Per-sample reads through each POSIX engine ("io_uring", "threads": the
// engine reads the manifest; records are preads), and mapped reads ("map").
class LoaderReadUnits : public ::testing::TestWithParam<std::string> {
 protected:
  std::string Engine() const { return GetParam() == "map" ? "auto" : GetParam(); }
  std::string Unit() const { return GetParam() == "map" ? "map" : "sample"; }
  LoaderOptions Sample(uint32_t batch) const {
    LoaderOptions o = Opts(batch, Engine());
    o.read_unit = Unit();
    return o;
  }
};

TEST_P(LoaderReadUnits, SampleReadsDeliverExactlyWhatShardReadsDeliver) {
  Fixture f(300, 5, 1, 20000, 64 << 10, Engine());
  for (const std::vector<std::string>& fields :
       {std::vector<std::string>{}, {"label"}, {"image"}, {"label", "image", "label"}}) {
    SCOPED_TRACE(fields.size());
    LoaderOptions sample = Sample(16), shard = Opts(16, Engine());
    sample.fields = shard.fields = fields;
    shard.read_unit = "shard";
    auto a = Loader::Open(f.uri, sample);
    auto b = Loader::Open(f.uri, shard);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
    EXPECT_EQ((*a)->read_unit(), Unit());
    EXPECT_EQ((*b)->read_unit(), "shard");
    const auto got = EpochBuffers(**a);
    ASSERT_EQ(got.size(), (300u + 15) / 16);
    EXPECT_TRUE(got == EpochBuffers(**b)) << "the batches differ byte for byte";
    // Records were read (all their fields, checked), not whole shards.
    const LoaderStats st = (*a)->stats();
    EXPECT_GE(st.bytes_read, f.manifest.payload_bytes);
    EXPECT_LT(st.bytes_read, f.manifest.payload_bytes + f.manifest.shards.size() * 8192);
    EXPECT_EQ(st.shards_read, f.manifest.shards.size());
  }
  // And against the source files, over two epochs.
  auto l = Loader::Open(f.uri, Sample(16));
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(ReadEpochChecked(**l, f).size(), 300u);
  ASSERT_TRUE((*l)->StartEpoch(1).ok());
  EXPECT_EQ(ReadEpochChecked(**l, f).size(), 300u);
}

TEST_P(LoaderReadUnits, CorruptRecordIsNamedNotDelivered) {
  Fixture f(60, 2, 500, 800, 16 << 10, Engine());
  const auto& shard = f.manifest.shards[1];
  const fs::path path = fs::path(f.uri) / shard.key;
  FlipByte(path, format::kShardHeaderBytes + 10, std::byte{0x40});  // inside the first record
  auto l = Loader::Open(f.uri, Sample(4));
  ASSERT_TRUE(l.ok());
  const Status err = FirstError(**l, shard.first_sample);
  EXPECT_EQ(err.code(), Code::kCorruption) << err.ToString();
  EXPECT_NE(err.message().find(f.uri), std::string::npos) << err.ToString();
  EXPECT_NE(err.message().find(shard.key), std::string::npos) << err.ToString();
  EXPECT_NE(err.message().find("sample 0 (global " + std::to_string(shard.first_sample) +
                               "): checksum mismatch"),
            std::string::npos)
      << err.ToString();
  EXPECT_EQ((*l)->Next().status().code(), Code::kCorruption) << "sticky until StartEpoch";
}

TEST_P(LoaderReadUnits, CorruptIndexOrHeaderIsNamed) {
  Fixture f(60, 2, 500, 800, 16 << 10, Engine());
  for (const bool header : {true, false}) {
    const auto& shard = f.manifest.shards[header ? 0 : 2];
    const fs::path path = fs::path(f.uri) / shard.key;
    const auto bytes = testing::ReadFile(path);
    const uint64_t index_offset = *reinterpret_cast<const uint64_t*>(bytes.data() + 40);
    const size_t at = header ? 20 : index_offset + 3;
    FlipByte(path, at, std::byte{0x01});
    auto l = Loader::Open(f.uri, Sample(4));
    ASSERT_TRUE(l.ok());
    const Status err = FirstError(**l);
    FlipByte(path, at, std::byte{0x01});  // mended for the next round
    EXPECT_NE(err.message().find(f.uri), std::string::npos) << err.ToString();
    EXPECT_EQ(err.code(), Code::kCorruption) << err.ToString();
    EXPECT_NE(err.message().find(shard.key), std::string::npos) << err.ToString();
    EXPECT_NE(err.message().find(header ? "header checksum" : "index"), std::string::npos)
        << err.ToString();
  }
}

TEST_P(LoaderReadUnits, MissingOrTruncatedShardIsNamed) {
  Fixture f(60, 2, 500, 800, 16 << 10, Engine());
  fs::remove(fs::path(f.uri) / f.manifest.shards[2].key);
  auto l = Loader::Open(f.uri, Sample(4));
  ASSERT_TRUE(l.ok());
  Status err = FirstError(**l);
  EXPECT_EQ(err.code(), Code::kNotFound) << err.ToString();
  EXPECT_NE(err.message().find(f.manifest.shards[2].key), std::string::npos) << err.ToString();

  Fixture g(60, 2, 500, 800, 16 << 10, Engine());
  const fs::path path = fs::path(g.uri) / g.manifest.shards[0].key;
  fs::resize_file(path, 4096);
  l = Loader::Open(g.uri, Sample(4));
  ASSERT_TRUE(l.ok());
  err = FirstError(**l);
  EXPECT_EQ(err.code(), Code::kCorruption) << err.ToString();
  EXPECT_NE(err.message().find("truncated"), std::string::npos) << err.ToString();
  EXPECT_NE(err.message().find(g.manifest.shards[0].key), std::string::npos) << err.ToString();
}

TEST_P(LoaderReadUnits, ShardTruncatedWhileTheEpochRunsIsNamed) {
  // Cut after Open: whether the reader still has the index to read or the
  // workers the records, the error says "truncated" and names the shard;
  // no batch with bytes past the cut is delivered.
  Fixture f(80, 2, 3000, 4000, 64 << 10, Engine());
  const auto& last = f.manifest.shards.back();
  auto l = Loader::Open(f.uri, Sample(4));
  ASSERT_TRUE(l.ok());
  fs::resize_file(fs::path(f.uri) / last.key, 8192);
  const Status err = FirstError(**l);
  EXPECT_EQ(err.code(), Code::kCorruption) << err.ToString();
  EXPECT_NE(err.message().find("truncated"), std::string::npos) << err.ToString();
  EXPECT_NE(err.message().find(last.key), std::string::npos) << err.ToString();
}

// A store whose record reads block until released: a disk that stopped.
class BlockingReads final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view key) override {
    STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> r, target()->OpenReader(key));
    return std::unique_ptr<ObjectReader>(std::make_unique<Reader>(std::move(r), this));
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  // Map, WillNeed and CountMapped forwarded by the wrapper.
  struct Reader final : ObjectReaderWrapper {
    Reader(std::unique_ptr<ObjectReader> r, BlockingReads* s)
        : ObjectReaderWrapper(std::move(r)), store(s) {}
    Result<size_t> ReadV(uint64_t o, std::span<const std::span<std::byte>> d) override {
      {
        std::unique_lock lock(store->mu_);
        store->cv_.wait(lock, [&] { return store->released_; });
      }
      return ObjectReaderWrapper::ReadV(o, d);
    }
    BlockingReads* store;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

TEST_P(LoaderReadUnits, BlockedRecordReadIsTimedOutNotAHang) {
  Fixture f(40, 2, 500, 800, 16 << 10, Engine());
  auto store = std::make_shared<BlockingReads>(*OpenStore(f.uri, Sample(4).store));
  LoaderOptions o = Sample(4);
  o.read_timeout = std::chrono::milliseconds(300);
  auto l = Loader::Open(store, o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const auto start = Clock::now();
  auto b = (*l)->Next();
  const auto waited = Clock::now() - start;
  store->Release();  // so that the workers can finish and the loader close
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kTimedOut) << b.status().ToString();
  EXPECT_NE(b.status().message().find("batch 0 of epoch 0 was not built within read_timeout"),
            std::string::npos)
      << b.status().ToString();
  EXPECT_NE(b.status().message().find(f.uri), std::string::npos) << b.status().ToString();
  EXPECT_GE(waited, std::chrono::milliseconds(300));
  EXPECT_LT(waited, std::chrono::seconds(5));
  // After the stall the next epoch reads normally.
  ASSERT_TRUE((*l)->StartEpoch(1).ok());
  EXPECT_EQ(ReadEpochChecked(**l, f).size(), 40u);
}

INSTANTIATE_TEST_SUITE_P(Posix, LoaderReadUnits, ::testing::Values("io_uring", "threads", "map"),
                         [](const auto& info) { return info.param; });

// ---- mapped reads (read_unit "map") ----

// A store whose reader of one shard cuts that shard's file right after it
// is mapped: the file shrinks under the loader's mapping (rewritten in place
// by someone else), so loads past its new end raise SIGBUS.
class CutAfterMapping final : public StoreWrapper {
 public:
  CutAfterMapping(std::shared_ptr<Store> s, std::string key, fs::path path, uint64_t keep)
      : StoreWrapper(std::move(s)), key_(std::move(key)), path_(std::move(path)), keep_(keep) {}
  Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view key) override {
    STOKER_ASSIGN_OR_RETURN(std::unique_ptr<ObjectReader> r, target()->OpenReader(key));
    if (key != key_) return r;
    return std::unique_ptr<ObjectReader>(std::make_unique<Reader>(std::move(r), this));
  }

 private:
  // ReadV, WillNeed and CountMapped forwarded by the wrapper.
  struct Reader final : ObjectReaderWrapper {
    Reader(std::unique_ptr<ObjectReader> r, CutAfterMapping* s)
        : ObjectReaderWrapper(std::move(r)), store(s) {}
    Result<std::span<const std::byte>> Map() override {
      auto m = ObjectReaderWrapper::Map();
      if (m.ok()) fs::resize_file(store->path_, store->keep_);
      return m;
    }
    CutAfterMapping* store;
  };
  const std::string key_;
  const fs::path path_;
  const uint64_t keep_;
};

TEST(LoaderMappedReads, ShardCutUnderTheMappingIsNamedNotACrash) {
  Fixture f(80, 2, 3000, 4000, 64 << 10);
  const auto& victim = f.manifest.shards[1];
  auto store = std::make_shared<CutAfterMapping>(*OpenStore(f.uri), victim.key,
                                                 fs::path(f.uri) / victim.key, 8192);
  LoaderOptions o = Opts(4);
  o.read_unit = "map";
  auto l = Loader::Open(store, o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const Status err = FirstError(**l);
  EXPECT_EQ(err.code(), Code::kCorruption) << err.ToString();
  EXPECT_NE(err.message().find("truncated behind the loader"), std::string::npos) << err.ToString();
  EXPECT_NE(err.message().find(f.uri + "/" + victim.key + ": sample "), std::string::npos)
      << err.ToString();
  EXPECT_NE(err.message().find("the file's 8192 bytes now"), std::string::npos) << err.ToString();
  // The process goes on, and so does the loader: the next epoch names the
  // shard as truncated before mapping it.
  ASSERT_TRUE((*l)->StartEpoch(1).ok());
  const Status again = FirstError(**l);
  EXPECT_EQ(again.code(), Code::kCorruption) << again.ToString();
  EXPECT_NE(again.message().find(victim.key + ": truncated"), std::string::npos)
      << again.ToString();
}

// Mapped reads from a store that cannot map: refused at Open, saying what
// can; the memory store's objects can be mapped (its bytes).
class CannotMap final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  StoreCapabilities capabilities() const override {
    StoreCapabilities c = StoreWrapper::capabilities();
    c.mapped_reads = false;
    return c;
  }
};

TEST(LoaderMappedReads, StoreThatCannotMapIsRefusedAtOpenMemoryStoreMaps) {
  Fixture f(50, 2, 10, 2000, 16 << 10);
  LoaderOptions o = Opts(6);
  o.read_unit = "map";
  auto refused = Loader::Open(std::make_shared<CannotMap>(*OpenStore(f.uri)), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(f.uri + " cannot be mapped"), std::string::npos)
      << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("use read_unit sample or shard"), std::string::npos);
  auto mem = NewMemoryStore();
  auto posix = OpenStore(f.uri);
  auto listed = (*posix)->List("");
  ASSERT_TRUE(listed.ok());
  for (const auto& obj : *listed) ASSERT_TRUE(mem->Put(obj.key, *(*posix)->ReadAll(obj.key)).ok());
  auto l = Loader::Open(mem, o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ((*l)->read_unit(), "map");
  EXPECT_EQ(ReadEpochChecked(**l, f).size(), 50u);
}

// Records longer than the chunk mapped reads check and copy at a time
// (256 KiB), with several fields and one delivered twice: every byte in
// place, and a flipped byte late in a long record is caught.
TEST(LoaderMappedReads, LongRecordsAreCheckedAndCopiedWhole) {
  Fixture f(12, 2, 600 << 10, 900 << 10, 4 << 20);
  LoaderOptions o = Opts(3);
  o.read_unit = "map";
  o.memory_budget = 0;
  for (const std::vector<std::string>& fields :
       {std::vector<std::string>{}, {"image", "label", "image"}}) {
    o.fields = fields;
    LoaderOptions shard = o;
    shard.read_unit = "shard";
    auto a = Loader::Open(f.uri, o);
    auto b = Loader::Open(f.uri, shard);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
    EXPECT_TRUE(EpochBuffers(**a) == EpochBuffers(**b)) << "the batches differ byte for byte";
  }
  o.fields = {};
  const auto& shard = f.manifest.shards[0];
  FlipByte(fs::path(f.uri) / shard.key, format::kShardHeaderBytes + (550 << 10), std::byte{0x08});
  auto l = Loader::Open(f.uri, o);
  ASSERT_TRUE(l.ok());
  const Status err = FirstError(**l, shard.first_sample);
  EXPECT_EQ(err.code(), Code::kCorruption) << err.ToString();
  EXPECT_NE(err.message().find("sample 0 (global " + std::to_string(shard.first_sample) +
                               "): checksum mismatch"),
            std::string::npos)
      << err.ToString();
}

// Records the depth of the read queues the loader asks for.
class DepthSeen final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& o) override {
    depth = o.depth;
    return target()->NewReadQueue(o);
  }
  std::atomic<uint32_t> depth{0};
};

// Shard reads in flight follow the workers by default (8 to 64), so a
// large node's workers each have a shard to wait on; an explicit count
// stays.
TEST(LoaderTest, ReadsInFlightFollowTheWorkersByDefault) {
  Fixture f(40, 2, 100, 5000, 16 << 10);
  auto depth = [&](uint32_t threads, uint32_t reads) {
    auto store = std::make_shared<DepthSeen>(*OpenStore(f.uri));
    LoaderOptions o = Opts(4);
    o.read_unit = "shard";
    o.threads = threads;
    o.reads_in_flight = reads;
    auto l = Loader::Open(store, o);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    if (!l.ok()) return 0u;
    EXPECT_EQ(ReadEpochChecked(**l, f).size(), 40u);
    EXPECT_EQ((*l)->options().reads_in_flight, store->depth.load()) << "options() says it";
    return store->depth.load();
  };
  EXPECT_EQ(depth(2, 0), kAutoReadsMin);
  EXPECT_EQ(depth(16, 0), 16u);
  EXPECT_EQ(depth(200, 0), kAutoReadsMax);
  EXPECT_EQ(depth(16, 3), 3u);
}

TEST(LoaderTest, AutoReadsLargeLocalRecordsOneByOne) {
  Fixture big(40, 2, kSampleReadMinBytes, kSampleReadMinBytes + 5000, 1 << 20);
  Fixture small(40, 2, 100, 5000, 64 << 10);
  auto unit = [](std::shared_ptr<Store> store, LoaderOptions o) {
    auto l = Loader::Open(std::move(store), o);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    return l.ok() ? std::string((*l)->read_unit()) : std::string();
  };
  LoaderOptions o = Opts(4);
  o.memory_budget = 256 << 20;
  EXPECT_EQ(unit(*OpenStore(big.uri), o), "sample");
  EXPECT_EQ(unit(*OpenStore(small.uri), o), "shard");
  EXPECT_EQ(unit(std::make_shared<StoreWrapper>(*OpenStore(big.uri)), o), "sample")
      << "a wrapper forwards local_reads()";
  LoaderOptions direct = o;
  direct.direct_io = true;
  EXPECT_EQ(unit(*OpenStore(big.uri), direct), "shard");
  LoaderOptions forced = o;
  forced.read_unit = "shard";
  EXPECT_EQ(unit(*OpenStore(big.uri), forced), "shard");
  forced.read_unit = "sample";
  EXPECT_EQ(unit(*OpenStore(small.uri), forced), "sample");
  // Per-sample reads keep only headers and indexes ahead: little memory.
  auto l = Loader::Open(big.uri, o);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(ReadEpochChecked(**l, big).size(), 40u);
  const uint64_t batch = 4 * (kSampleReadMinBytes + 5000 + 64);
  EXPECT_LE((*l)->stats().peak_buffer_bytes, (o.prefetch_batches + 3) * batch + (1 << 20));
}

TEST(LoaderTest, MemoryStoreWorksToo) {
  Fixture f(50, 2, 10, 2000, 16 << 10);
  auto mem = NewMemoryStore();
  auto posix = OpenStore(f.uri);
  auto listed = (*posix)->List("");
  ASSERT_TRUE(listed.ok());
  for (const auto& obj : *listed) {
    auto data = (*posix)->ReadAll(obj.key);
    ASSERT_TRUE(mem->Put(obj.key, *data).ok());
  }
  auto l = Loader::Open(mem, Opts(6));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(ReadEpochChecked(**l, f).size(), 50u);
}

#ifdef STOKER_HAVE_TURBOJPEG
TEST(LoaderDecodeTest, DecodedImagesEqualADirectDecodeOfTheSourceFiles) {
  TempDir d;
  SynthOptions so;
  so.images = 24;
  so.classes = 3;
  so.mean_bytes = 20000;
  ASSERT_TRUE(SynthesizeImageFolder((d.path() / "img").string(), so).ok());
  auto sources = ScanImageFolder((d.path() / "img").string());
  ASSERT_TRUE(sources.ok());
  const std::string uri = (d.path() / "ds").string();
  ASSERT_TRUE(Pack((d.path() / "img").string(), uri, PackOptions{}).ok());
  PackSources packed;
  for (uint64_t i : PackedOrder(sources->files.size(), PackOptions{})) {
    packed.files.push_back(sources->files[i]);
  }
  sources->files = packed.files;
  for (const char* unit : {"shard", "sample", "map"}) {
    SCOPED_TRACE(unit);
    LoaderOptions o = Opts(5);
    o.decode.field = "image";
    o.decode.height = 32;
    o.decode.width = 48;
    o.read_unit = unit;
    auto l = Loader::Open(uri, o);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    EXPECT_EQ((*l)->read_unit(), unit);
    size_t seen = 0;
    std::vector<uint8_t> want(32 * 48 * 3), scratch;
    while (true) {
      auto b = (*l)->Next();
      if (!b.ok()) {
        ASSERT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
        break;
      }
      const auto* img = b->image("image");
      ASSERT_NE(img, nullptr);
      EXPECT_EQ(img->height, 32u);
      EXPECT_EQ(img->width, 48u);
      ASSERT_EQ(img->data.size(), b->size() * 32 * 48 * 3);
      for (size_t i = 0; i < b->size(); ++i) {
        const auto& src = sources->files[b->sample_ids()[i]];
        auto jpeg = testing::ReadFile(src.path);
        ASSERT_TRUE(DecodeJpegResized(jpeg, 32, 48, want, &scratch).ok());
        ASSERT_TRUE(
            std::equal(want.begin(), want.end(),
                       reinterpret_cast<const uint8_t*>(img->data.data()) + i * want.size()));
        EXPECT_EQ(b->int64("label")->values[i], src.label);
        ++seen;
      }
    }
    EXPECT_EQ(seen, 24u);
  }
}

TEST(LoaderDecodeTest, NotAJpegIsCorruptionNamingTheSample) {
  Fixture f(10, 1, 100, 200, 16 << 10);
  LoaderOptions o = Opts(5);
  o.decode.field = "image";
  auto l = Loader::Open(f.uri, o);
  ASSERT_TRUE(l.ok());
  auto b = (*l)->Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kCorruption);
  EXPECT_NE(b.status().message().find("sample"), std::string::npos) << b.status().ToString();
  EXPECT_NE(b.status().message().find("not a JPEG"), std::string::npos) << b.status().ToString();
}
#endif

// The scale benchmark's dataset: its table as the writer writes it, its
// shards made on read; a loader over it gets every sample once, each the
// bytes WriteScaleDataset documents (sample i of its shard: i repeated).
TEST(ScaleDatasetTest, ALoaderReadsEverySyntheticSampleOnce) {
  auto meta = NewMemoryStore();
  auto m = WriteScaleDataset(*meta, {1003, 10, 6});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->shards.size(), 10u);
  EXPECT_EQ(m->shards.samples(0), 101u);  // 1003 = 3 x 101 + 7 x 100
  EXPECT_EQ(m->shards.samples(9), 100u);
  auto store = NewSyntheticShardStore(meta);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  EXPECT_EQ((*store)->Put("shards/000001.stks", {}).code(), Code::kPermissionDenied);
  auto keys = (*store)->ListKeys("shards/");
  ASSERT_TRUE(keys.ok());
  EXPECT_EQ(keys->size(), 10u);
  LoaderOptions o;
  o.batch_size = 16;
  o.shuffle_window_shards = 3;
  auto l = Loader::Open(*store, o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  std::vector<int> seen(1003, 0);
  while (true) {
    auto b = (*l)->Next();
    if (!b.ok()) {
      ASSERT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
      break;
    }
    const auto& col = b->bytes_columns().at(0);
    for (size_t k = 0; k < b->size(); ++k) {
      const uint64_t id = b->sample_ids()[k];
      ASSERT_LT(id, seen.size());
      seen[id]++;
      const int64_t shard = m->ShardOf(id);
      const uint32_t local = uint32_t(id - m->shards.first_sample(size_t(shard)));
      ASSERT_EQ(col.offsets[k + 1] - col.offsets[k], 6u);
      for (uint64_t i = 0; i < 6; ++i) {
        ASSERT_EQ(uint8_t(col.data[col.offsets[k] + i]), uint8_t(local >> (8 * (i % 4))))
            << "sample " << id;
      }
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 1003);
}

}  // namespace
}  // namespace stoker
