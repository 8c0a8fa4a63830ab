// Packing: ImageFolder and list sources, shard cutting, the errors a user
// meets (empty or unreadable files, a destination holding a dataset, bad list
// lines), verify naming bad shards and samples, and atomicity: a pack killed
// at any point leaves no readable dataset.
#include "stoker/pack.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "stoker/dataset.h"
#include "stoker/loader.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::OpenPathForOthers;
using testing::RandomBytes;
using testing::RunUnprivileged;
using testing::TempDir;

void MakeTree(const fs::path& root, uint32_t files, uint32_t classes, size_t size) {
  for (uint32_t i = 0; i < files; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "k%02u/f%05u.bin", i % classes, i);
    testing::WriteFile(root / name, RandomBytes(size + i % 97, i));
  }
}

std::string StokerBin() {
  if (const char* b = std::getenv("STOKER_BIN")) return b;
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "stoker").string();
}

TEST(PackTest, ImageFolderLabelsAreSortedClassFolders) {
  TempDir d;
  for (const char* c : {"zebra", "ant", "moose"}) {
    testing::WriteFile(d.path() / "src" / c / "a.jpg", RandomBytes(10, 1));
    testing::WriteFile(d.path() / "src" / c / "b.jpg", RandomBytes(10, 2));
  }
  testing::WriteFile(d.path() / "src" / ".hidden" / "x.jpg", RandomBytes(10, 3));
  testing::WriteFile(d.path() / "src" / "ant" / ".DS_Store", RandomBytes(10, 3));
  auto s = ScanImageFolder((d.path() / "src").string());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->classes, (std::vector<std::string>{"ant", "moose", "zebra"}));
  ASSERT_EQ(s->files.size(), 6u);
  EXPECT_EQ(s->files[0].label, 0);
  EXPECT_EQ(s->files[2].label, 1);
  EXPECT_EQ(s->files[5].label, 2);
  EXPECT_NE(s->files[5].path.find("zebra/b.jpg"), std::string::npos);
}

TEST(PackTest, FileAtTheRootOfAnImageFolderIsAnError) {
  TempDir d;
  testing::WriteFile(d.path() / "src" / "a" / "x", RandomBytes(10, 1));
  testing::WriteFile(d.path() / "src" / "stray.jpg", RandomBytes(10, 1));
  auto s = ScanImageFolder((d.path() / "src").string());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("stray.jpg"), std::string::npos);
}

TEST(PackTest, ListFileWithRelativePathsAndComments) {
  TempDir d;
  testing::WriteFile(d.path() / "data" / "a.bin", RandomBytes(100, 1));
  testing::WriteFile(d.path() / "data" / "b.bin", RandomBytes(200, 2));
  std::ofstream(d.path() / "list.txt") << "# samples\n\ndata/a.bin 3\n"
                                       << (d.path() / "data" / "b.bin").string() << "\t7\n";
  auto s = ReadListFile((d.path() / "list.txt").string());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->files.size(), 2u);
  EXPECT_EQ(s->files[0].label, 3);
  EXPECT_EQ(s->files[1].label, 7);
  EXPECT_TRUE(fs::exists(s->files[0].path));
  auto m = Pack((d.path() / "list.txt").string(), (d.path() / "ds").string(), PackOptions{});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->sample_count, 2u);
}

TEST(PackTest, BadListLinesNameTheLine) {
  TempDir d;
  auto check = [&](const std::string& text, const std::string& words) {
    std::ofstream(d.path() / "l.txt") << text;
    auto s = ReadListFile((d.path() / "l.txt").string());
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
    EXPECT_NE(s.status().message().find(words), std::string::npos) << s.status().ToString();
  };
  check("a.bin 1\nb.bin\n", "l.txt:2: expected 'PATH LABEL'");
  check("a.bin one\n", "l.txt:1: label 'one' is not an integer");
  check("a.bin -1\n", "negative");
  check("my file.bin 1\n", "paths may not contain spaces");
  check("# nothing\n", "no samples");
}

TEST(PackTest, EmptyOrMissingSourceFileFailsAndCreatesNoDataset) {
  TempDir d;
  MakeTree(d.path() / "src", 20, 2, 1000);
  testing::WriteFile(d.path() / "src" / "k00" / "empty.bin", {});
  auto m = Pack((d.path() / "src").string(), (d.path() / "ds").string(), PackOptions{});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("empty.bin"), std::string::npos) << m.status().ToString();
  EXPECT_NE(m.status().message().find("empty source file"), std::string::npos);
  EXPECT_FALSE(fs::exists(d.path() / "ds" / format::kManifestKey));

  std::ofstream(d.path() / "list.txt") << "src/k00/f00000.bin 0\nsrc/missing.bin 1\n";
  m = Pack((d.path() / "list.txt").string(), (d.path() / "ds").string(), PackOptions{});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNotFound);
  EXPECT_NE(m.status().message().find("missing.bin"), std::string::npos);
  EXPECT_FALSE(fs::exists(d.path() / "ds" / format::kManifestKey));
}

// As root, pack runs in a child that has dropped to nobody (see
// RunUnprivileged), whom the source file's mode 000 stops.
TEST(PackTest, UnreadableSourceFileFails) {
  TempDir d;
  MakeTree(d.path() / "src", 4, 1, 100);
  const fs::path locked = d.path() / "src" / "k00" / "f00001.bin";
  fs::permissions(locked, fs::perms::none);
  const fs::path out = d.path() / "out";
  fs::create_directories(out);
  fs::permissions(out, fs::perms::all);  // nobody writes the destination
  OpenPathForOthers(out);
  const std::string failure = RunUnprivileged([&]() -> std::string {
    auto m = Pack((d.path() / "src").string(), (out / "ds").string(), PackOptions{});
    if (m.status().code() != Code::kPermissionDenied) return "Pack: " + m.status().ToString();
    if (m.status().message().find("f00001.bin") == std::string::npos) {
      return "the error does not name the file: " + m.status().ToString();
    }
    if (fs::exists(out / "ds" / format::kManifestKey)) return "a manifest was written";
    return "";
  });
  EXPECT_EQ(failure, "");
}

TEST(PackTest, DestinationHoldingADatasetIsRefused) {
  TempDir d;
  MakeTree(d.path() / "src", 10, 2, 100);
  const std::string ds = (d.path() / "ds").string();
  ASSERT_TRUE(Pack((d.path() / "src").string(), ds, PackOptions{}).ok());
  auto again = Pack((d.path() / "src").string(), ds, PackOptions{});
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists);
  EXPECT_NE(again.status().message().find("already holds a stoker dataset"), std::string::npos);
}

TEST(PackTest, ShardsStayUnderTheTargetAndSamplesAreWhole) {
  TempDir d;
  MakeTree(d.path() / "src", 200, 3, 3000);
  testing::WriteFile(d.path() / "src" / "k01" / "huge.bin", RandomBytes(100000, 5));
  PackOptions o;
  o.shard_bytes = 32 << 10;
  auto m = Pack((d.path() / "src").string(), (d.path() / "ds").string(), o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->sample_count, 201u);
  int oversize = 0;
  for (const auto& s : m->shards) {
    EXPECT_EQ(s.bytes % format::kShardAlignment, 0u);
    if (s.bytes > o.shard_bytes) {
      ++oversize;
      EXPECT_EQ(s.samples, 1u);  // only a sample bigger than the target
    }
  }
  EXPECT_EQ(oversize, 1);
  // Same sources, same cut.
  auto again = Pack((d.path() / "src").string(), (d.path() / "ds2").string(), o);
  ASSERT_EQ(again->shards.size(), m->shards.size());
  for (size_t i = 0; i < m->shards.size(); ++i)
    EXPECT_EQ(again->shards[i].samples, m->shards[i].samples);
  auto store = OpenStore((d.path() / "ds").string());
  auto report = VerifyDataset(**store);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok());
  EXPECT_EQ(report->samples_checked, 201u);
}

// The default pack shuffles (seeded): shards mix classes, the same seed
// packs the same way, and PackedOrder says where each source went.
TEST(PackTest, ShufflesSoShardsMixClassesAndSaysWhere) {
  TempDir d;
  MakeTree(d.path() / "src", 400, 4, 100);
  auto sources = ScanImageFolder((d.path() / "src").string());
  ASSERT_TRUE(sources.ok());
  PackOptions o;
  o.shard_bytes = 8 << 10;
  const std::string ds = (d.path() / "ds").string();
  auto m = Pack(*sources, **OpenStore(ds), o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_GT(m->shards.size(), 4u);
  LoaderOptions lo;
  lo.shuffle = false;
  lo.batch_size = m->shards[0].samples;
  auto l = Loader::Open(ds, lo);
  ASSERT_TRUE(l.ok());
  auto first = (*l)->Next();
  ASSERT_TRUE(first.ok());
  std::set<int64_t> labels(first->int64("label")->values.begin(),
                           first->int64("label")->values.end());
  EXPECT_EQ(labels.size(), 4u) << "the first shard should hold every class";
  const auto order = PackedOrder(sources->files.size(), o);
  const auto* image = first->bytes("image");
  for (size_t i = 0; i < first->size(); ++i) {
    const auto& src = sources->files[order[first->sample_ids()[i]]];
    auto want = testing::ReadFile(src.path);
    auto got = image->data.subspan(image->offsets[i], image->offsets[i + 1] - image->offsets[i]);
    ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin(), want.end()));
    EXPECT_EQ(first->int64("label")->values[i], src.label);
  }
  EXPECT_EQ(PackedOrder(400, o), order);
  PackOptions other = o;
  other.shuffle_seed = 1;
  EXPECT_NE(PackedOrder(400, other), order);
  other.shuffle = false;
  auto identity = PackedOrder(400, other);
  EXPECT_TRUE(std::is_sorted(identity.begin(), identity.end()));
}

TEST(VerifyTest, NamesEveryBadShardAndSample) {
  TempDir d;
  MakeTree(d.path() / "src", 60, 2, 1500);
  PackOptions o;
  o.shard_bytes = 16 << 10;
  const std::string ds = (d.path() / "ds").string();
  auto m = Pack((d.path() / "src").string(), ds, o);
  ASSERT_TRUE(m.ok());
  ASSERT_GE(m->shards.size(), 4u);
  // Two bad samples in shard 0, a bad header in shard 1, shard 2 missing.
  auto path0 = fs::path(ds) / m->shards[0].key;
  auto b0 = testing::ReadFile(path0);
  b0[format::kShardHeaderBytes + 5] ^= std::byte{1};
  b0[format::kShardHeaderBytes + 1600] ^= std::byte{1};  // inside the second record
  testing::WriteFile(path0, b0);
  auto path1 = fs::path(ds) / m->shards[1].key;
  auto b1 = testing::ReadFile(path1);
  b1[0] = std::byte{'X'};
  testing::WriteFile(path1, b1);
  fs::remove(fs::path(ds) / m->shards[2].key);

  auto store = OpenStore(ds);
  auto report = VerifyDataset(**store);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->problems.size(), 4u);
  std::map<std::string, std::vector<int64_t>> by_shard;
  for (const auto& p : report->problems) by_shard[p.shard_key].push_back(p.sample);
  std::sort(by_shard[m->shards[0].key].begin(), by_shard[m->shards[0].key].end());
  EXPECT_EQ(by_shard[m->shards[0].key], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(by_shard[m->shards[1].key], (std::vector<int64_t>{-1}));
  EXPECT_EQ(by_shard[m->shards[2].key], (std::vector<int64_t>{-1}));
  for (const auto& p : report->problems) {
    if (p.shard_key == m->shards[2].key) {
      EXPECT_EQ(p.status.code(), Code::kNotFound);
    }
    if (p.shard_key == m->shards[1].key) {
      EXPECT_EQ(p.status.code(), Code::kCorruption);
    }
  }
}

// A shard that grew after packing (bytes appended) is a problem, also through
// the command (exit 1), though its first bytes are whole.
TEST(VerifyTest, AShardThatGrewAfterPackingIsReported) {
  TempDir d;
  MakeTree(d.path() / "src", 20, 2, 1500);
  PackOptions o;
  o.shard_bytes = 16 << 10;
  const std::string ds = (d.path() / "ds").string();
  auto m = Pack((d.path() / "src").string(), ds, o);
  ASSERT_TRUE(m.ok());
  const auto path = fs::path(ds) / m->shards.back().key;
  {
    std::ofstream f(path, std::ios::binary | std::ios::app);
    f << "appended";
  }
  auto store = OpenStore(ds);
  auto report = VerifyDataset(**store);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_EQ(report->problems[0].shard_key, m->shards.back().key);
  EXPECT_EQ(report->problems[0].status.code(), Code::kCorruption);
  EXPECT_NE(report->problems[0].status.message().find("grown"), std::string::npos)
      << report->problems[0].status.ToString();
  const std::string cmd = StokerBin() + " verify " + ds + " > /dev/null 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) == 1) << cmd << " exited " << rc;
}

// A pack killed at a random point leaves either nothing a reader takes for a
// dataset, or (if it got as far as its commit) a complete, valid dataset.
// The next pack into the same place succeeds and removes the leftovers.
TEST(PackAtomicity, KilledPackLeavesNoReadableDataset) {
  TempDir d;
  MakeTree(d.path() / "src", 400, 4, 60000);  // ~24 MB: a pack takes a while
  const std::string bin = StokerBin();
  ASSERT_TRUE(fs::exists(bin)) << bin;
  std::mt19937 rng(12345);
  auto start_pack = [&](const std::string& ds) {
    const pid_t pid = fork();
    if (pid == 0) {
      execl(bin.c_str(), bin.c_str(), "pack", "--quiet", "--shard-mib", "0.25", "--threads", "2",
            (d.path() / "src").c_str(), ds.c_str(), nullptr);
      _exit(127);
    }
    return pid;
  };
  // How long a whole pack takes on this machine: the kills land within 1.25
  // times that, most of them mid-pack, some after its commit (a fixed
  // 300 ms window missed most packs on a fast machine).
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t whole = start_pack((d.path() / "whole").string());
  ASSERT_GE(whole, 0);
  int whole_status = 0;
  waitpid(whole, &whole_status, 0);
  ASSERT_TRUE(WIFEXITED(whole_status) && WEXITSTATUS(whole_status) == 0);
  const uint64_t pack_us = std::max<uint64_t>(
      1000, std::chrono::duration_cast<std::chrono::microseconds>(
                std::chrono::steady_clock::now() - t0)
                .count());
  int killed_before_commit = 0;
  for (int trial = 0; trial < 12; ++trial) {
    const std::string ds = (d.path() / ("ds" + std::to_string(trial))).string();
    const pid_t pid = start_pack(ds);
    ASSERT_GE(pid, 0);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % (pack_us * 5 / 4)));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    auto store = OpenStore(ds);
    ASSERT_TRUE(store.ok());
    auto l = Loader::Open(ds, LoaderOptions{});
    if (WIFSIGNALED(status)) {
      if (!l.ok()) {
        ++killed_before_commit;
        EXPECT_EQ(l.status().code(), Code::kNotFound) << l.status().ToString();
        // Nothing under the dataset's name but shards, maybe the shard
        // table no manifest names, the pack's note and invisible temps.
        auto objs = (*store)->List("");
        if (objs.ok()) {
          for (const auto& o : *objs) {
            EXPECT_TRUE(o.key.rfind("shards/", 0) == 0 || o.key == format::kShardTableKey ||
                        o.key == "pack.pending")
                << o.key;
          }
        }
      } else {
        // Killed after its commit: the dataset must be whole.
        auto report = VerifyDataset(**store);
        ASSERT_TRUE(report.ok());
        EXPECT_TRUE(report->ok());
      }
    } else {
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      ASSERT_TRUE(l.ok());
    }
    // Packing again into the same place works and leaves only its own shards.
    PackOptions o;
    o.shard_bytes = 1 << 20;
    if (!l.ok()) {
      auto m = Pack((d.path() / "src").string(), ds, o);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      auto objs = (*store)->List("shards/");
      ASSERT_TRUE(objs.ok());
      EXPECT_EQ(objs->size(), m->shards.size());
      EXPECT_FALSE((*store)->Stat("pack.pending").ok()) << "the note goes with the commit";
      auto report = VerifyDataset(**store);
      ASSERT_TRUE(report.ok());
      EXPECT_TRUE(report->ok());
    }
  }
  std::printf("a whole pack took %llu us; %d of 12 kills landed before its commit\n",
              (unsigned long long)pack_us, killed_before_commit);
  EXPECT_GT(killed_before_commit, 3) << "the kills should mostly land mid-pack";
}

// ---- the shard table on the store (docs/format.md §7) --------------------------

std::vector<std::byte> BytesOf(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// Counts the listings a caller makes, and the reads of one key.
class CountingStore final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<std::vector<ObjectInfo>> List(std::string_view p) override {
    ++lists;
    return StoreWrapper::List(p);
  }
  Result<std::vector<std::string>> ListKeys(std::string_view p) override {
    ++lists;
    return StoreWrapper::ListKeys(p);
  }
  Result<size_t> Read(std::string_view k, uint64_t off, std::span<std::byte> dst) override {
    if (k == format::kShardTableKey) ++table_reads;
    return StoreWrapper::Read(k, off, dst);
  }
  std::atomic<int> lists{0};
  std::atomic<int> table_reads{0};
};

// `files` sources of about `size` bytes in 2 classes under d/src, packed
// into 16 KiB shards at d/ds.
Result<format::Manifest> PackSmall(const TempDir& d, uint32_t files, size_t size,
                                   bool shuffle = true) {
  MakeTree(d.path() / "src", files, 2, size);
  PackOptions o;
  o.shard_bytes = 16 << 10;
  o.shuffle = shuffle;
  return Pack((d.path() / "src").string(), (d.path() / "ds").string(), o);
}

TEST(PackTest, WritesTheShardTableAndASmallManifest) {
  TempDir d;
  const fs::path ds = d.path() / "ds";
  auto m = PackSmall(d, 120, 2000);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_GT(m->shards.size(), 10u);
  EXPECT_EQ(m->table.key, format::kShardTableKey);
  EXPECT_EQ(m->table.records, m->shards.size());
  EXPECT_EQ(fs::file_size(ds / format::kShardTableKey), m->table.bytes);
  EXPECT_EQ(m->table.bytes, 64 + 8 + 24 * m->shards.size());
  EXPECT_LT(fs::file_size(ds / format::kManifestKey), 600u) << "no shard list in the manifest";
  EXPECT_FALSE(fs::exists(ds / "pack.pending"));
  auto store = OpenStore(ds.string());
  auto read = ReadManifest(**store);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->format_version, 2u) << "bytes + int64 fields stay format v2";
  ASSERT_EQ(read->shards.size(), m->shards.size());
  for (size_t i = 0; i < m->shards.size(); ++i) {
    EXPECT_EQ(read->shards.bytes(i), m->shards.bytes(i));
    EXPECT_EQ(read->shards.index_hash(i), m->shards.index_hash(i));
    EXPECT_EQ(read->shards.first_sample(i), m->shards.first_sample(i));
  }
  auto only = ReadManifestOnly(**store);
  ASSERT_TRUE(only.ok());
  EXPECT_TRUE(only->shards.empty());
  uint64_t streamed = 0;
  ASSERT_TRUE(ForEachShard(**store, *only, [&](uint32_t i, const format::ShardInfo& s) {
                EXPECT_EQ(i, streamed);
                EXPECT_EQ(s.key, m->shards.key(i));
                ++streamed;
                return Status::Ok();
              }).ok());
  EXPECT_EQ(streamed, m->shards.size());
  auto l = Loader::Open(ds.string(), LoaderOptions{});
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto report = VerifyDataset(**store);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->ok());
  EXPECT_EQ(report->shards_checked, m->shards.size());
}

// Pack learns which shards an earlier, killed pack may have left from that
// pack's note, and removes them after its commit, without a listing.
TEST(PackTest, RemovesLeftoversWithoutListingTheStore) {
  TempDir d;
  MakeTree(d.path() / "src", 40, 2, 1000);
  const fs::path ds = d.path() / "ds";
  // What a pack of 50 shards killed after its 46th left, with a gap.
  testing::WriteFile(ds / "pack.pending", BytesOf(std::string("STOKER-PACK-PENDING 50\n")));
  for (uint32_t s = 0; s < 46; ++s) {
    if (s == 44) continue;
    testing::WriteFile(ds / format::ShardKey(s), RandomBytes(4096, s));
  }
  testing::WriteFile(ds / "other.bin", RandomBytes(10, 1));  // not a pack's
  auto posix = OpenStore(ds.string());
  ASSERT_TRUE(posix.ok());
  CountingStore counting(*posix);
  PackOptions o;
  o.shard_bytes = 16 << 10;
  auto m = Pack(*ScanSources((d.path() / "src").string()), counting, o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_LT(m->shards.size(), 40u);
  EXPECT_EQ(counting.lists.load(), 0) << "pack listed the store";
  auto left = (*posix)->ListKeys("");
  ASSERT_TRUE(left.ok());
  std::vector<std::string> want = {"manifest.stoker", "other.bin", "shards.table"};
  for (uint32_t s = 0; s < m->shards.size(); ++s) want.push_back(format::ShardKey(s));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(*left, want);
  auto report = VerifyDataset(**posix);
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(report->ok());
}

// A dataset whose table is damaged on the store: the error names the store's
// table and the records, from every reader (ReadManifest, the loader,
// verify, the command).
TEST(DatasetTable, DamagedTableIsAClearError) {
  TempDir d;
  const fs::path ds = d.path() / "ds";
  auto m = PackSmall(d, 60, 1500);
  ASSERT_TRUE(m.ok());
  const fs::path table = ds / format::kShardTableKey;
  const auto whole = testing::ReadFile(table);
  const std::string name = ds.string() + "/shards.table";
  auto open_error = [&] {
    auto store = OpenStore(ds.string());
    auto r = ReadManifest(**store);
    return r.ok() ? Status::Ok() : r.status();
  };
  auto expect_everywhere = [&](Code code, const std::string& what) {
    const Status st = open_error();
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_NE(st.message().find(name), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find(what), std::string::npos) << st.ToString();
    auto l = Loader::Open(ds.string(), LoaderOptions{});
    ASSERT_FALSE(l.ok());
    EXPECT_NE(l.status().message().find(what), std::string::npos) << l.status().ToString();
    auto v = VerifyDataset(**OpenStore(ds.string()));
    ASSERT_FALSE(v.ok());
    EXPECT_NE(v.status().message().find(what), std::string::npos) << v.status().ToString();
    for (const char* cmd : {" inspect ", " verify "}) {
      const std::string line = StokerBin() + cmd + ds.string() + " 2>&1";
      FILE* p = popen(line.c_str(), "r");
      ASSERT_NE(p, nullptr);
      std::string out;
      char buf[512];
      while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
      const int rc = pclose(p);
      EXPECT_TRUE(WIFEXITED(rc) && WEXITSTATUS(rc) >= 10) << line << ": " << out;
      EXPECT_NE(out.find(what), std::string::npos) << line << ": " << out;
    }
  };
  // Truncated: the records present are counted.
  const size_t n = m->shards.size();
  testing::WriteFile(table, {whole.begin(), whole.begin() + 64 + 8 + 24 * 3 + 5});
  expect_everywhere(Code::kCorruption,
                    "truncated: " + std::to_string(n) + " records expected, 3 present");
  // A flipped byte in a record: its block, by its records.
  auto flipped = whole;
  flipped[64 + 8 + 24 * 2 + 1] ^= std::byte{1};
  testing::WriteFile(table, flipped);
  expect_everywhere(Code::kCorruption,
                    "records 0.." + std::to_string(n - 1) + " (block 0): checksum mismatch");
  // A newer table version.
  auto newer = whole;
  newer[8] = std::byte{2};
  testing::WriteFile(table, newer);
  expect_everywhere(Code::kUnsupported, "shard table v2; this build reads v1");
  // Gone.
  fs::remove(table);
  expect_everywhere(Code::kCorruption, "missing (the manifest names it");
}

// A dataset an older stoker packed (format 1: the shards listed in the
// manifest, no table) still opens, loads, verifies and inspects.
TEST(DatasetTable, DatasetOfAnOlderStokerStillOpens) {
  TempDir d;
  const fs::path ds = d.path() / "ds";
  auto m = PackSmall(d, 50, 1500, /*shuffle=*/false);
  ASSERT_TRUE(m.ok());
  const std::string v1 = format::EncodeManifestV1(*m);
  testing::WriteFile(ds / format::kManifestKey, BytesOf(v1));
  fs::remove(ds / format::kShardTableKey);
  auto store = OpenStore(ds.string());
  auto read = ReadManifest(**store);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->format_version, 1u);
  EXPECT_TRUE(read->table.key.empty());
  EXPECT_EQ(read->shards.size(), m->shards.size());
  LoaderOptions lo;
  lo.shuffle = false;
  lo.batch_size = 10;
  auto l = Loader::Open(ds.string(), lo);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  uint64_t samples = 0;
  while (true) {
    auto b = (*l)->Next();
    if (!b.ok()) break;
    samples += b->size();
  }
  EXPECT_EQ(samples, 50u);
  auto report = VerifyDataset(**store);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->ok());
  EXPECT_EQ(report->samples_checked, 50u);
}

// A table larger than one read (8 MiB: 350 000 records) is read and
// streamed in several ranged reads, each block checked; a bad block past
// the first read is named by its records.
TEST(DatasetTable, LargeTableInSeveralReads) {
  auto store = std::shared_ptr<Store>(new CountingStore(NewMemoryStore()));
  auto& counting = static_cast<CountingStore&>(*store);
  format::Manifest m;
  m.dataset_id = format::NewDatasetId();
  m.fields = {{"data", format::FieldType::kBytes}};
  constexpr uint32_t kShards = 500000;
  m.shards.reserve(kShards);
  for (uint32_t i = 0; i < kShards; ++i) m.shards.AppendNumbered(8192, 3, i * 7ull);
  m.sample_count = m.shards.total_samples();
  m.payload_bytes = m.sample_count * 10;
  m.max_sample_bytes = 10;
  auto table = format::EncodeShardTable(m, &m.table);
  ASSERT_GT(table.size(), 8u << 20);
  const std::string text = format::EncodeManifest(m);
  ASSERT_TRUE(store->Put(format::kShardTableKey, table).ok());
  ASSERT_TRUE(store->Put(format::kManifestKey, BytesOf(text)).ok());
  auto read = ReadManifest(*store);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(read->shards.size(), kShards);
  EXPECT_EQ(read->shards.index_hash(kShards - 1), (kShards - 1) * 7ull);
  EXPECT_EQ(counting.table_reads.load(), 2) << "12 MB in reads of 8 MiB";
  auto only = ReadManifestOnly(*store);
  ASSERT_TRUE(only.ok());
  uint64_t seen = 0;
  ASSERT_TRUE(ForEachShard(*store, *only, [&](uint32_t, const format::ShardInfo&) {
                ++seen;
                return Status::Ok();
              }).ok());
  EXPECT_EQ(seen, kShards);
  // A record of block 6 (records 393216..458751), in the second read.
  const size_t at = 64 + 8 * 8 + 24 * size_t{400000} + 9;
  table[at] ^= std::byte{1};
  ASSERT_TRUE(store->Put(format::kShardTableKey, table).ok());
  auto bad = ReadManifest(*store);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kCorruption);
  EXPECT_NE(bad.status().message().find("shards.table: records 393216..458751 (block 6)"),
            std::string::npos)
      << bad.status().ToString();
  // Streaming hands over the blocks before the bad one, then stops.
  seen = 0;
  Status st = ForEachShard(*store, *only, [&](uint32_t, const format::ShardInfo&) {
    ++seen;
    return Status::Ok();
  });
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_EQ(seen, 393216u);
}

}  // namespace
}  // namespace stoker
