// Mixtures (issue 36): each global batch's shares within ±1 of weight x
// batch, sources on their own epochs, the same global stream on any world
// size and across a resume, weight schedules without repeats or skips, and
// every bad input named.
#include "stoker/mix.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "stoker/dataset.h"
#include "stoker/import.h"
#include "stoker/tokens.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

TEST(MixCounts, EachShareWithinOneOfWeightTimesBatchAndExactOnAverage) {
  const std::vector<std::vector<double>> cases = {
      {1, 1, 1}, {0.7, 0.2, 0.1}, {5, 3, 1, 1, 0.01}, {1e-6, 1}, {0.3}};
  for (const auto& w : cases) {
    double sum = 0;
    for (double x : w) sum += x;
    for (uint32_t batch : {1u, 7u, 64u, 1000u}) {
      std::vector<double> total(w.size(), 0);
      const uint64_t steps = 2000;
      for (uint64_t step = 0; step < steps; ++step) {
        const auto c = MixCounts(w, batch, 42, step);
        ASSERT_EQ(c, MixCounts(w, batch, 42, step));  // a pure function
        uint64_t n = 0;
        for (size_t i = 0; i < w.size(); ++i) {
          const double q = w[i] / sum * batch;
          ASSERT_GE(double(c[i]), std::floor(q)) << "step " << step;
          ASSERT_LE(double(c[i]), std::floor(q) + 1) << "step " << step;
          n += c[i];
          total[i] += c[i];
        }
        ASSERT_EQ(n, batch);
      }
      for (size_t i = 0; i < w.size(); ++i) {
        EXPECT_NEAR(total[i] / steps, w[i] / sum * batch, 0.05) << "batch " << batch;
      }
    }
  }
}

// Token datasets of `docs` documents of 1..80 tokens each (JSONL, uint16).
std::string MakeSource(const fs::path& dir, const std::string& name, uint32_t docs, uint64_t seed) {
  const fs::path p = dir / (name + ".jsonl");
  {
    std::ofstream f(p);
    uint64_t x = seed;
    for (uint32_t d = 0; d < docs; ++d) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const uint32_t len = 1 + uint32_t((x >> 33) % 80);
      f << "{\"tokens\": [";
      for (uint32_t t = 0; t < len; ++t) f << (t ? "," : "") << (d * 7 + t) % 60000;
      f << "]}\n";
    }
  }
  ImportOptions o;
  o.fields = {format::ParseFieldSpec("tokens", "uint16[*]").value()};
  o.writer.shard_bytes = 8192;
  const std::string path = p.string(), uri = (dir / name).string();
  EXPECT_TRUE(ImportJsonl(std::span(&path, 1), uri, o).ok());
  return uri;
}

// What one step gave, over all ranks in rank order: (source, window) pairs.
using Step = std::vector<std::pair<int64_t, uint64_t>>;

std::vector<Step> RunMix(const std::vector<MixSource>& sources, MixOptions o, uint32_t world,
                         uint64_t steps, MixState* end = nullptr) {
  std::vector<std::unique_ptr<Mix>> ranks;
  for (uint32_t r = 0; r < world; ++r) {
    o.rank = r;
    o.world_size = world;
    auto m = Mix::Open(sources, o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return {};
    ranks.push_back(std::move(m).value());
  }
  std::vector<Step> out(steps);
  for (uint64_t s = 0; s < steps; ++s) {
    for (auto& m : ranks) {
      auto b = m->Next();
      EXPECT_TRUE(b.ok()) << b.status().ToString();
      if (!b.ok()) return out;
      EXPECT_EQ(b->size(), o.batch_size / world);
      EXPECT_EQ(b->fixed("tokens")->item_shape, std::vector<int64_t>{o.sequence_length + 1});
      const auto* src = b->int64("source");
      for (size_t i = 0; i < b->size(); ++i)
        out[s].emplace_back(src->values[i], b->sample_ids()[i]);
    }
  }
  if (end) *end = ranks[0]->state();
  return out;
}

class MixTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A small source (repeats), a middling one and a large one.
    for (auto [name, docs] : {std::pair{"small", 12u}, {"mid", 150u}, {"large", 900u}}) {
      sources_.push_back({MakeSource(dir_.path(), name, docs, docs), 1.0, 0, ""});
    }
    sources_[0].weight = 0.3;
    sources_[1].weight = 0.5;
    sources_[2].weight = 0.2;
    options_.batch_size = 24;
    options_.sequence_length = 32;
    options_.seed = 3;
  }
  // Source i's stream of windows: position p's window (epochs one after
  // another, each in TokenWindows' order).
  std::vector<uint64_t> Stream(size_t i, uint64_t count) {
    auto store = OpenStore(sources_[i].uri).value();
    auto ds = TokenDataset::Open(store, ReadManifest(*store).value(), {}).value();
    std::vector<uint64_t> out;
    const uint64_t per_epoch = (ds->total_tokens() - 1) / options_.sequence_length;
    for (uint64_t e = 0; out.size() < count; ++e) {
      auto w = TokenWindows::Build(ds->doc_tokens(), options_.sequence_length,
                                   ds->manifest().Id64(), true, options_.seed, e);
      EXPECT_EQ(w.size(), per_epoch);
      for (uint64_t p = 0; p < w.size() && out.size() < count; ++p) out.push_back(w.WindowAt(p));
    }
    return out;
  }
  TempDir dir_;
  std::vector<MixSource> sources_;
  MixOptions options_;
};

TEST_F(MixTest, EveryGlobalBatchHoldsEachSourcesShareAndSourcesKeepTheirEpochs) {
  const uint64_t steps = 40;
  std::vector<Step> got = RunMix(sources_, options_, 1, steps);
  ASSERT_EQ(got.size(), steps);
  std::vector<std::multiset<uint64_t>> per_source(3);
  std::vector<uint64_t> given(3, 0);
  for (uint64_t s = 0; s < steps; ++s) {
    const std::vector<double> w{0.3, 0.5, 0.2};
    const auto want = MixCounts(w, 24, options_.seed, s);
    std::vector<uint32_t> have(3, 0);
    for (auto [src, k] : got[s]) {
      ++have[src];
      per_source[src].insert(k);
    }
    EXPECT_EQ(have, want) << "step " << s;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_LE(std::abs(double(have[i]) - w[i] * 24), 1.0);
      given[i] += have[i];
    }
  }
  // Each source gave exactly the first windows of its own stream: the small
  // one ran through several epochs, the large one is still in its first.
  for (size_t i = 0; i < 3; ++i) {
    const std::vector<uint64_t> stream = Stream(i, given[i]);
    EXPECT_EQ(per_source[i], std::multiset<uint64_t>(stream.begin(), stream.end())) << i;
  }
  auto m = Mix::Open(sources_, options_).value();
  const MixStats st = m->stats();
  EXPECT_LT(st.epoch_windows[0] * 2, given[0]);  // the small source repeats
  EXPECT_GT(st.epoch_windows[2], given[2]);      // the large one does not
}

// stats() counts what the consumer got, not what the producer built ahead:
// CI once saw 610 windows after 30 steps of 20 (issue 36's Python test).
TEST_F(MixTest, StatsCountDeliveredStepsNotPrefetchedOnes) {
  options_.prefetch_batches = 4;
  auto m = Mix::Open(sources_, options_).value();
  std::vector<uint64_t> got(3, 0);
  for (int s = 0; s < 3; ++s) {
    auto b = m->Next().value();
    const auto* src = b.int64("source");
    for (size_t i = 0; i < b.size(); ++i) ++got[size_t(src->values[i])];
  }
  // Let the producer fill its 4 steps ahead: its reads show in bytes_read.
  uint64_t bytes = 0;
  for (int i = 0; i < 200 && (bytes == 0 || bytes != m->stats().bytes_read); ++i) {
    bytes = m->stats().bytes_read;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const MixStats st = m->stats();
  EXPECT_EQ(st.steps, 3u);
  EXPECT_EQ(st.windows, got);
  EXPECT_EQ(got[0] + got[1] + got[2], 3u * options_.batch_size);
}

TEST_F(MixTest, SameGlobalStreamOnAnyWorldSizeAndAcrossAResume) {
  const std::vector<Step> whole = RunMix(sources_, options_, 1, 12);
  EXPECT_EQ(RunMix(sources_, options_, 4, 12), whole);
  MixState saved;
  std::vector<Step> first = RunMix(sources_, options_, 4, 5, &saved);
  EXPECT_EQ(saved.step, 5u);
  ASSERT_EQ(saved.positions.size(), 3u);
  for (uint32_t world : {2u, 3u, 8u}) {
    MixOptions o = options_;
    o.start = saved;
    std::vector<Step> rest = RunMix(sources_, o, world, 7);
    std::vector<Step> joined = first;
    joined.insert(joined.end(), rest.begin(), rest.end());
    EXPECT_EQ(joined, whole) << "resumed on " << world;
  }
}

TEST_F(MixTest, ScheduleChangesWeightsWithoutRepeatsOrSkips) {
  MixOptions o = options_;
  o.schedule = {{6, {0.1, 0.1, 0.8}}};
  const uint64_t steps = 14;
  MixState end;
  std::vector<Step> got = RunMix(sources_, o, 2, steps, &end);
  std::vector<std::multiset<uint64_t>> per_source(3);
  std::vector<uint64_t> given(3, 0);
  for (uint64_t s = 0; s < steps; ++s) {
    const std::vector<double> w =
        s < 6 ? std::vector<double>{0.3, 0.5, 0.2} : std::vector<double>{0.1, 0.1, 0.8};
    const auto want = MixCounts(w, 24, o.seed, s);
    std::vector<uint32_t> have(3, 0);
    for (auto [src, k] : got[s]) ++have[src], per_source[src].insert(k), ++given[src];
    EXPECT_EQ(have, want) << "step " << s;
  }
  for (size_t i = 0; i < 3; ++i) {
    const std::vector<uint64_t> stream = Stream(i, given[i]);
    EXPECT_EQ(per_source[i], std::multiset<uint64_t>(stream.begin(), stream.end())) << i;
    EXPECT_EQ(end.positions[i], given[i]);
  }
  EXPECT_EQ(end.weights, (std::vector<double>{0.1, 0.1, 0.8}));
  // Resuming the scheduled run at a step before the change, too.
  MixState mid;
  RunMix(sources_, o, 1, 4, &mid);
  MixOptions r = o;
  r.start = mid;
  std::vector<Step> rest = RunMix(sources_, r, 3, steps - 4);
  for (uint64_t s = 4; s < steps; ++s) EXPECT_EQ(rest[s - 4], got[s]) << s;
}

TEST_F(MixTest, BadInputIsNamed) {
  auto refused = [&](std::vector<MixSource> s, MixOptions o, const std::string& want) {
    auto m = Mix::Open(s, o);
    ASSERT_FALSE(m.ok()) << want;
    EXPECT_EQ(m.status().code(), Code::kInvalidArgument) << m.status().ToString();
    EXPECT_NE(m.status().ToString().find(want), std::string::npos) << m.status().ToString();
  };
  for (double bad : {0.0, -1.0, std::nan("")}) {
    auto s = sources_;
    s[1].weight = bad;
    refused(s, options_, "source 1 (" + sources_[1].uri + "): weight");
  }
  auto s = sources_;
  s[2].sequence_length = 64;
  refused(s, options_, "source 2 (" + sources_[2].uri + "): sequence_length 64");
  MixOptions o = options_;
  o.world_size = 5;
  refused(sources_, o, "not a multiple of world_size 5");
  o = options_;
  o.schedule = {{3, {1, 2}}};
  refused(sources_, o, "2 weights for 3 sources");
  o = options_;
  o.schedule = {{0, {1, 2, 3}}};
  refused(sources_, o, "increasing");
  o = options_;
  o.sequence_length = 100000;
  refused(sources_, o, "source 0");
  // A state of another mixture: other weights, other sources, other seed.
  MixState saved;
  RunMix(sources_, options_, 1, 3, &saved);
  s = sources_;
  s[0].weight = 0.4;
  o = options_;
  o.start = saved;
  refused(s, o, "weights");
  s = sources_;
  std::swap(s[0], s[1]);
  refused(s, o, "dataset");
  s = sources_;
  s.pop_back();
  refused(s, o, "3 sources");
  o.seed = 4;
  refused(sources_, o, "seed");
  o = options_;
  o.start = saved;
  o.batch_size = 48;
  refused(sources_, o, "batch_size");
}

}  // namespace
}  // namespace stoker
