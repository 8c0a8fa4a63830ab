// Resharding at load (docs/checkpoint.md §3.4, §4.1, §6), in one process:
// a state saved as W ranks is loaded as each rank of W' ranks with another
// split, element for element; only the bytes wanted (to the checksum block)
// are read; bad destinations and missing pieces are refused before any read;
// a damaged block is found by a ranged read; format 1 is still read. Every
// case runs on memory and POSIX stores, and on RADOS where
// STOKER_TEST_STORE_URI names a pool (CI's local Ceph cluster). The same on
// real ranks under mpirun: ckpt_reshard_mpi.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "ckpt/records.h"
#include "ckpt_reshard_data.h"
#include "stoker/format.h"
#include "testutil.h"

namespace stoker {
namespace {

using namespace std::chrono_literals;
using testing::CountingStore;
using testing::GlobalTensor;
using testing::Piece;
using testing::ShardedState;
using testing::TempDir;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::atomic<int> g_unique{0};

CheckpointerOptions Fast() {
  CheckpointerOptions o;
  o.retry_backoff = 5ms;
  o.poll_interval = 5ms;
  return o;
}

class CkptReshard : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(g_unique++);
    if (GetParam() == "Memory") {
      uri_ = "mem://reshard-" + tag;
    } else if (GetParam() == "Posix") {
      dir_ = std::make_unique<TempDir>();
      uri_ = dir_->str() + "/ckpt";
    } else {
      const char* env = std::getenv("STOKER_TEST_STORE_URI");
      if (env == nullptr || *env == '\0') {
        GTEST_SKIP() << "STOKER_TEST_STORE_URI is not set (CI sets it to the local Ceph "
                        "cluster's checkpoint pool)";
      }
      std::string u = env;
      const size_t q = u.find('?');
      uri_ = q == std::string::npos ? u + "-reshard-" + tag
                                    : u.substr(0, q) + "-reshard-" + tag + u.substr(q);
    }
    auto s = OpenStore(uri_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::make_shared<CountingStore>(*s);
    ckpt_ = NewCheckpointer(store_, Fast());
  }

  // Saves ShardedState(rows) as every rank of `world` (ranks above 0 first,
  // not waiting for the commit; rank 0 commits). `skip` drops one tensor of
  // one rank: {tensor index, rank}.
  void Save(const std::string& name, int64_t world, int64_t rows, SaveOptions base = {},
            std::pair<int, int64_t> skip = {-1, -1}) {
    const std::vector<GlobalTensor> state = ShardedState(rows);
    for (int64_t r = world - 1; r >= 0; --r) {
      auto [pieces, refs] = testing::SaveRank(state, world, r, skip);
      // A rank's own tensor, which a reshard never reads.
      pieces.push_back({{}, {1000}, std::vector<std::byte>(1000, std::byte(r))});
      refs.push_back({"own", DType::kUInt8, {1000}, pieces.back().bytes, {}});
      SaveOptions o = base;
      o.rank = static_cast<uint32_t>(r);
      o.world_size = static_cast<uint32_t>(world);
      o.wait_for_commit = false;
      o.coordination = SaveOptions::Coordination::kStore;
      o.commit_timeout = 30s;
      ASSERT_OK(ckpt_->Save(name, refs, o));
    }
  }

  // Loads rank `rank` of `world` with WantedPiece's split and checks every
  // byte. The chunk bytes it read and the bytes it received.
  std::pair<uint64_t, uint64_t> Load(const std::string& name, int64_t world, int64_t rank,
                                     int64_t rows) {
    const std::vector<GlobalTensor> state = ShardedState(rows);
    testing::LoadedRank l = testing::WantRank(state, world, rank);
    const uint64_t before = store_->chunk_bytes_read;
    RestoreOptions ro;
    ro.rank = static_cast<uint32_t>(rank);
    ro.world_size = static_cast<uint32_t>(world);
    auto m = ckpt_->RestoreInto(name, l.dst, ro);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(l.Difference(state), "") << "at rank " << rank << " of " << world;
    const uint64_t received = l.received;
    return {store_->chunk_bytes_read - before, received};
  }

  std::string uri_;
  std::unique_ptr<TempDir> dir_;
  std::shared_ptr<CountingStore> store_;
  std::unique_ptr<Checkpointer> ckpt_;
};

TEST_P(CkptReshard, SavedOnFourLoadsOnOneTwoThreeAndEight) {
  Save("step-1", 4, 64);
  for (int64_t world : {1, 2, 3, 8}) {
    for (int64_t rank = 0; rank < world; ++rank) Load("step-1", world, rank, 64);
  }
}

TEST_P(CkptReshard, PiecesAcrossSmallChunksAndBlocks) {
  SaveOptions o;
  o.chunk_bytes = 64 << 10;
  o.checksum_block_bytes = 4096;
  Save("step-1", 4, 96, o);
  auto m = ckpt_->ReadManifest("step-1");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->format_version, 2u);
  EXPECT_GT(m->ranks[0].chunks.size(), 2u);
  EXPECT_EQ(m->ranks[0].chunks[0].block_bytes, 4096u);
  for (int64_t world : {3, 5}) {
    for (int64_t rank = 0; rank < world; ++rank) Load("step-1", world, rank, 96);
  }
}

TEST_P(CkptReshard, EightToTwoReadsWhatEachRankReceives) {
  Save("step-1", 8, 2048);  // model.w: 8 MiB, 1 MiB a rank
  for (int64_t rank = 0; rank < 2; ++rank) {
    auto [read, received] = Load("step-1", 2, rank, 2048);
    EXPECT_LE(double(read), 1.05 * double(received))
        << "rank " << rank << " read " << read << " bytes for " << received;
  }
}

TEST_P(CkptReshard, ASliceReadsLittleMoreThanItself) {
  const GlobalTensor g = testing::MakeGlobal("big", DType::kFloat32, {4096, 256}, 9);
  SaveOptions o;
  o.checksum_block_bytes = 64 << 10;
  ASSERT_OK(ckpt_->Save("one", std::vector<TensorRef>{{g.name, g.dtype, g.shape, g.bytes, {}}}, o));
  const Piece want = testing::BoxPiece(g, {1000, 0}, {1000, 256});  // 1 MB of 4 MB
  std::vector<std::byte> got(want.bytes.size());
  TensorDestination d{g.name, got, want.layout, g.dtype, want.shape};
  const uint64_t before = store_->chunk_bytes_read;
  ASSERT_OK(ckpt_->RestoreInto("one", {&d, 1}, {}).status());
  EXPECT_TRUE(got == want.bytes);
  const uint64_t read = store_->chunk_bytes_read - before;
  EXPECT_LE(double(read), 1.05 * double(got.size()) + 2 * (64 << 10)) << read;
  EXPECT_LE(double(read), 1.15 * double(got.size())) << read;
}

TEST_P(CkptReshard, BadDestinationsAreRefusedNamingBothLayouts) {
  Save("step-1", 2, 16);
  const GlobalTensor w = ShardedState(16)[0];
  const Piece want = testing::DimPiece(w, 0, 2, 1);
  std::vector<std::byte> got(want.bytes.size());
  auto restore = [&](TensorDestination d) {
    const uint64_t before = store_->chunk_bytes_read;
    Status s = ckpt_->RestoreInto("step-1", {&d, 1}, {}).status();
    EXPECT_EQ(store_->chunk_bytes_read, before) << "read before refusing: " << s.ToString();
    return s;
  };
  Status s = restore({w.name, got, want.layout, DType::kFloat16, want.shape});
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "'model.w': another dtype")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "box [8, 1024] at [8, 0] of [16, 1024]")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "float32 of global shape [16, 1024] in 2 piece(s)"))
      << s.message();

  TensorLayout other = want.layout;
  other.global_shape = {17, 1024};
  s = restore({w.name, got, other, w.dtype, want.shape});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "another global shape")) << s.message();

  TensorLayout outside = want.layout;
  outside.offsets = {9, 0};
  s = restore({w.name, got, outside, w.dtype, want.shape});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "dimension 0: [9, 17) is not inside [0, 16)")) << s.message();

  s = restore({w.name, std::span(got).first(8), want.layout, w.dtype, want.shape});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "its memory is 8 bytes")) << s.message();

  s = restore({"model.nothing", got, want.layout, w.dtype, want.shape});
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_TRUE(Contains(s.message(), "no rank saved tensor 'model.nothing'")) << s.message();
}

TEST_P(CkptReshard, AMissingPieceNamesTheRankThatShouldHaveWrittenIt) {
  Save("step-1", 4, 16, {}, {0, 2});  // rank 2 saves no model.w
  const GlobalTensor w = ShardedState(16)[0];
  const Piece want = testing::DimPiece(w, 0, 1, 0);
  std::vector<std::byte> got(want.bytes.size());
  TensorDestination d{w.name, got, want.layout, w.dtype, want.shape};
  Status s = ckpt_->RestoreInto("step-1", {&d, 1}, {}).status();
  EXPECT_EQ(s.code(), Code::kNotFound) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "tensor 'model.w': no saved piece holds element [8, 0]"))
      << s.message();
  EXPECT_TRUE(Contains(s.message(), "rank(s) 2 saved no piece of it")) << s.message();
  // Rows that ranks 0, 1 and 3 hold still load.
  const Piece ok = testing::DimPiece(w, 0, 4, 3);
  std::vector<std::byte> mine(ok.bytes.size());
  TensorDestination d3{w.name, mine, ok.layout, w.dtype, ok.shape};
  ASSERT_OK(ckpt_->RestoreInto("step-1", {&d3, 1}, {}).status());
  EXPECT_TRUE(mine == ok.bytes);
}

TEST_P(CkptReshard, ADamagedBlockFailsTheRangedReadThatCoversIt) {
  SaveOptions o;
  o.checksum_block_bytes = 4096;
  Save("step-1", 2, 64, o);
  auto m = ckpt_->ReadManifest("step-1");
  ASSERT_TRUE(m.ok());
  // model.w of rank 1 is its first tensor; flip a byte in its third block.
  const ChunkInfo& c = m->ranks[1].chunks[0];
  auto bytes = store_->ReadAll(c.key);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[2 * 4096 + 5] ^= std::byte{1};
  ASSERT_OK(store_->Put(c.key, *bytes));
  const GlobalTensor w = ShardedState(64)[0];
  // Rows 32..33 of the global tensor: rank 1's first 8 KiB, blocks 0 and 1.
  const Piece clean = testing::BoxPiece(w, {32, 0}, {2, 1024});
  std::vector<std::byte> got(clean.bytes.size());
  TensorDestination d{w.name, got, clean.layout, w.dtype, clean.shape};
  ASSERT_OK(ckpt_->RestoreInto("step-1", {&d, 1}, {}).status());
  EXPECT_TRUE(got == clean.bytes);
  const Piece bad = testing::BoxPiece(w, {34, 0}, {1, 1024});  // block 2
  std::vector<std::byte> into(bad.bytes.size());
  TensorDestination db{w.name, into, bad.layout, w.dtype, bad.shape};
  Status s = ckpt_->RestoreInto("step-1", {&db, 1}, {}).status();
  EXPECT_EQ(s.code(), Code::kCorruption) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "checksum mismatch in block 2 (bytes 8192..12288)"))
      << s.message();
  EXPECT_TRUE(Contains(s.message(), "rank-00001/000000.chunk")) << s.message();
  // A whole-rank restore checks the blocks too.
  RestoreOptions ro;
  ro.rank = 1;
  ro.world_size = 2;
  EXPECT_EQ(ckpt_->Restore("step-1", ro).status().code(), Code::kCorruption);
  CheckpointVerifyReport report;
  EXPECT_EQ(ckpt_->Verify("step-1", &report).code(), Code::kCorruption);
}

TEST_P(CkptReshard, FormatOneIsStillReadAndRefusesLayouts) {
  SaveOptions o;
  o.format_version = 1;
  const GlobalTensor g = testing::MakeGlobal("t", DType::kInt32, {300, 7}, 4);
  ASSERT_OK(ckpt_->Save("v1", std::vector<TensorRef>{{g.name, g.dtype, g.shape, g.bytes, {}}}, o));
  auto m = ckpt_->ReadManifest("v1");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->format_version, 1u);
  EXPECT_TRUE(m->ranks[0].chunks[0].block_hashes.empty());
  auto manifest = store_->ReadAll("v1/manifest.stkc");
  ASSERT_TRUE(manifest.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(manifest->data()), 20),
            "STOKER-CHECKPOINT 1 ");
  auto r = ckpt_->Restore("v1", {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(0, std::memcmp(r->tensors[0].data.data(), g.bytes.data(), g.bytes.size()));
  // A slice of a format-1 tensor: the whole chunk is read and checked.
  const Piece want = testing::BoxPiece(g, {100, 2}, {50, 3});
  std::vector<std::byte> got(want.bytes.size());
  TensorDestination d{g.name, got, want.layout, g.dtype, want.shape};
  ASSERT_OK(ckpt_->RestoreInto("v1", {&d, 1}, {}).status());
  EXPECT_TRUE(got == want.bytes);

  const Piece piece = testing::DimPiece(g, 0, 2, 0);
  Status s = ckpt_->Save(
      "v1b", std::vector<TensorRef>{{g.name, g.dtype, piece.shape, piece.bytes, piece.layout}}, o);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "which checkpoint format 1 cannot hold")) << s.message();
}

TEST_P(CkptReshard, ABadLayoutIsRefusedAtSave) {
  const GlobalTensor g = testing::MakeGlobal("t", DType::kFloat32, {8, 8}, 1);
  Piece p = testing::DimPiece(g, 0, 2, 1);
  p.layout.offsets = {5, 0};
  Status s =
      ckpt_->Save("x", std::vector<TensorRef>{{g.name, g.dtype, p.shape, p.bytes, p.layout}}, {});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(
      Contains(s.message(), "tensor 't': layout box [4, 8] at [5, 0] of [8, 8]: dimension 0"))
      << s.message();
}

INSTANTIATE_TEST_SUITE_P(Backends, CkptReshard, ::testing::Values("Memory", "Posix", "Rados"));

// ---- records ------------------------------------------------------------------

TEST(CkptReshardRecords, LayoutsAndBlocksRoundTripAndAreChecked) {
  ckpt::PartRecord p;
  p.name = "s";
  p.world_size = 2;
  p.part.rank = 1;
  TensorInfo box{"a", DType::kFloat32, {2, 3}, 1, 0, 24, {}};
  box.layout = {TensorLayout::Kind::kBox, {4, 3}, {2, 0}, 0};
  TensorInfo flat{"b", DType::kUInt8, {10}, 1, 24, 10, {}};
  flat.layout = {TensorLayout::Kind::kFlat, {5, 5}, {}, 15};
  p.part.tensors = {box, flat};
  ChunkInfo c{"s/rank-00001/000000.chunk", 34, 0, 0, 16 << 10, {7}};
  p.part.chunks = {c};
  const std::string enc = ckpt::EncodePart(p);
  EXPECT_EQ(enc.rfind("STOKER-CKPT-PART 2 ", 0), 0u);
  auto d = ckpt::DecodePart(std::as_bytes(std::span(enc)), "x", "s");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->part.tensors[0].layout.offsets, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(d->part.tensors[1].layout.kind, TensorLayout::Kind::kFlat);
  EXPECT_EQ(d->part.tensors[1].layout.flat_start, 15u);
  EXPECT_EQ(d->part.chunks[0].block_hashes, (std::vector<uint64_t>{7}));

  auto edit = [&](const std::function<void(nlohmann::ordered_json&)>& f) {
    auto j = nlohmann::ordered_json::parse(enc.substr(enc.find('\n') + 1));
    f(j);
    const std::string body = j.dump();
    char h[17];
    std::snprintf(h, sizeof h, "%016llx",
                  static_cast<unsigned long long>(format::Hash64(std::as_bytes(std::span(body)))));
    const std::string framed =
        "STOKER-CKPT-PART 2 " + std::to_string(body.size()) + " " + h + "\n" + body;
    return ckpt::DecodePart(std::as_bytes(std::span(framed)), "x", "s").status();
  };
  struct Case {
    std::function<void(nlohmann::ordered_json&)> f;
    const char* words;
  };
  const std::vector<Case> cases = {
      {[](auto& j) { j["tensors"][0]["layout"]["offsets"][0] = 3; }, "runs past the global 4"},
      {[](auto& j) { j["tensors"][0]["layout"]["offsets"] = {0}; }, "differ in length"},
      {[](auto& j) { j["tensors"][1]["layout"]["flat_start"] = 16; }, "run past the 25"},
      {[](auto& j) {
         j["tensors"][1]["layout"]["offsets"] = {0, 0};
       },
       "exactly one of"},
      {[](auto& j) { j["chunks"][0]["blocks"] = "0000000000000007aa"; }, "18 hex digits"},
      {[](auto& j) { j["chunks"][0]["block_bytes"] = 100; }, "block_bytes: 100"},
      {[](auto& j) { j["chunks"][0].erase("blocks"); }, "missing key \"chunks[0].hash\""},
  };
  for (const Case& k : cases) {
    Status s = edit(k.f);
    EXPECT_EQ(s.code(), Code::kCorruption) << k.words << ": " << s.ToString();
    EXPECT_TRUE(Contains(s.message(), k.words)) << s.message();
  }
}

}  // namespace
}  // namespace stoker
