// The loader's versioned resume state (LoaderState, CheckResumeState): a
// state saved by one loader resumes another over the same dataset and order,
// and is refused, naming both values, over another dataset, seed, shuffle or
// window; a bare (version 0) position is checked only against the dataset's
// size; a newer version is Unsupported.
#include <gtest/gtest.h>

#include <filesystem>

#include "stoker/loader.h"
#include "stoker/pack.h"
#include "stoker/plan.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::RandomBytes;
using testing::TempDir;

format::Manifest SomeManifest(uint8_t id) {
  format::Manifest m;
  m.dataset_id.fill(id);
  m.sample_count = 100;
  return m;
}

TEST(LoaderStateTest, TheSameIdentityResumesAnotherIsRefused) {
  const format::Manifest m = SomeManifest(7);
  LoaderOptions o;
  o.seed = 5;
  o.world_size = 4;
  const LoaderState s = IdentifiedState(2, 40, m, o);
  EXPECT_EQ(s.version, kLoaderStateVersion);
  EXPECT_EQ(s.dataset_id, m.IdHex());
  EXPECT_EQ(s.world_size, 4u);
  LoaderOptions other_world = o;
  other_world.world_size = 2;  // the position is global: any world size resumes
  EXPECT_TRUE(CheckResumeState(s, m, other_world).ok());

  auto refused = [&](const format::Manifest& mm, const LoaderOptions& oo, const char* what) {
    Status st = CheckResumeState(s, mm, oo);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << what;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.ToString();
  };
  refused(SomeManifest(8), o, "dataset");
  LoaderOptions seed = o;
  seed.seed = 6;
  refused(m, seed, "seed 5, this loader has 6");
  LoaderOptions window = o;
  window.shuffle_window_shards = 2;
  refused(m, window, "shuffle_window_shards");
  LoaderOptions unshuffled = o;
  unshuffled.shuffle = false;
  refused(m, unshuffled, "shuffle");

  LoaderState bare(1, 100);
  EXPECT_TRUE(CheckResumeState(bare, SomeManifest(9), seed).ok()) << "version 0: no identity";
  bare.position = 101;
  EXPECT_EQ(CheckResumeState(bare, m, o).code(), Code::kInvalidArgument);
  LoaderState newer = s;
  newer.version = kLoaderStateVersion + 1;
  EXPECT_EQ(CheckResumeState(newer, m, o).code(), Code::kUnsupported);
}

// A state saved under epoch order version 1 (state version 1): refused
// mid-epoch when shuffled, naming both order versions; fine where the two
// orders agree (position 0, or no shuffle).
TEST(LoaderStateTest, AStateOfTheOldOrderIsRefusedMidEpoch) {
  const format::Manifest m = SomeManifest(7);
  LoaderOptions o;
  LoaderState old = IdentifiedState(3, 40, m, o);
  old.version = 1;
  Status st = CheckResumeState(old, m, o);
  EXPECT_EQ(st.code(), Code::kUnsupported) << st.ToString();
  EXPECT_NE(st.message().find("order version 1"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("order version " + std::to_string(kPlanOrderVersion)),
            std::string::npos)
      << st.ToString();
  old.position = 0;
  EXPECT_TRUE(CheckResumeState(old, m, o).ok());
  LoaderOptions unshuffled = o;
  unshuffled.shuffle = false;
  LoaderState plain = IdentifiedState(3, 40, m, unshuffled);
  plain.version = 1;
  EXPECT_TRUE(CheckResumeState(plain, m, unshuffled).ok());
}

TEST(LoaderStateTest, OpenRefusesAStateOfAnotherDataset) {
  TempDir d;
  for (int i = 0; i < 20; ++i) {
    testing::WriteFile(d.path() / "src" / "c0" / ("f" + std::to_string(i)), RandomBytes(300, i));
  }
  const std::string uri = (d.path() / "ds").string();
  auto m = Pack((d.path() / "src").string(), uri, PackOptions{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  LoaderOptions o;
  o.batch_size = 4;
  o.start = IdentifiedState(0, 8, *m, o);
  auto ok = Loader::Open(uri, o);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->state().position, 8u);
  o.start.dataset_id = SomeManifest(1).IdHex();
  auto bad = Loader::Open(uri, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find(m->IdHex()), std::string::npos) << bad.status().ToString();
}

}  // namespace
}  // namespace stoker
