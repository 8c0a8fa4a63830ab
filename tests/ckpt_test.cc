// Checkpoints (docs/checkpoint.md): the records' validation, one corruption
// path at a time; save and restore byte for byte for every dtype; async saves
// that snapshot; many ranks; retention; retries; a full disk; and writers
// killed at random moments. The store-level tests run on the memory store,
// the POSIX store and, when STOKER_TEST_STORE_URI names one (CI: the local
// Ceph cluster's `checkpoint` pool), that store too.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "ckpt/records.h"
#include "ckpt_testdata.h"
#include "stoker/checkpoint.h"
#include "stoker/format.h"
#include "stoker/retrying_store.h"
#include "testutil.h"

namespace stoker {
namespace {

using namespace std::chrono_literals;
using testing::FlakyStore;
using testing::MakeCkptContent;
using testing::RandomBytes;
using testing::TempDir;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::span<const std::byte> Bytes(const std::string& s) { return std::as_bytes(std::span(s)); }

// ---- records ----------------------------------------------------------------

ckpt::PartRecord SamplePart() {
  auto c = MakeCkptContent(1);
  ckpt::PartRecord p;
  p.format_version = 1;  // format 1 is still read (and written on request)
  p.name = "step-1";
  p.world_size = 2;
  p.attempt = "a1";
  p.part.rank = 1;
  uint64_t at = 0;
  for (const TensorRef& t : c.refs) {
    p.part.tensors.push_back({t.name, t.dtype, t.shape, 1, at, t.data.size(), {}});
    at += t.data.size();
  }
  p.part.chunks.push_back({"step-1/rank-00001/000000.chunk", at - 100, 7, 0, 0, {}});
  p.part.chunks.push_back({"step-1/rank-00001/000001.chunk", 100, 9, at - 100, 0, {}});
  return p;
}

TEST(CkptRecords, PartRoundTrips) {
  const ckpt::PartRecord p = SamplePart();
  const std::string enc = ckpt::EncodePart(p);
  auto d = ckpt::DecodePart(Bytes(enc), "x", "step-1");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->attempt, "a1");
  EXPECT_EQ(d->world_size, 2u);
  ASSERT_EQ(d->part.tensors.size(), p.part.tensors.size());
  for (size_t i = 0; i < p.part.tensors.size(); ++i) {
    EXPECT_EQ(d->part.tensors[i].name, p.part.tensors[i].name);
    EXPECT_EQ(d->part.tensors[i].dtype, p.part.tensors[i].dtype);
    EXPECT_EQ(d->part.tensors[i].shape, p.part.tensors[i].shape);
    EXPECT_EQ(d->part.tensors[i].offset, p.part.tensors[i].offset);
  }
  ASSERT_EQ(d->part.chunks.size(), 2u);
  EXPECT_EQ(d->part.chunks[1].offset, p.part.chunks[1].offset);
  EXPECT_EQ(d->part.chunks[1].hash, 9u);
}

TEST(CkptRecords, ManifestRoundTripsAndKeepsMetadataOrder) {
  CheckpointManifest m;
  m.name = "step-1";
  m.sequence = 4;
  m.created_by = "t";
  m.created_unix_ms = 123;
  m.world_size = 1;
  m.metadata_json = R"({"zeta":1,"alpha":{"b":[1,2,{"c":null}],"a":"x"}})";
  RankPart r = SamplePart().part;
  r.rank = 0;
  for (auto& c : r.chunks) c.key.replace(c.key.find("rank-00001"), 10, "rank-00000");
  m.ranks.push_back(r);
  const std::string enc = ckpt::EncodeCheckpointManifest(m);
  auto d = ckpt::DecodeCheckpointManifest(Bytes(enc), "x", "step-1");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->metadata_json, m.metadata_json);
  EXPECT_EQ(d->sequence, 4u);
  EXPECT_EQ(d->bytes(), r.bytes());
}

// Re-frames a part whose JSON body `edit` changed, with a valid header, so
// that the body's own rules are what fails.
std::string EditPart(const std::function<void(nlohmann::ordered_json&)>& edit) {
  const std::string enc = ckpt::EncodePart(SamplePart());
  auto j = nlohmann::ordered_json::parse(enc.substr(enc.find('\n') + 1));
  edit(j);
  const std::string body = j.dump();
  return "STOKER-CKPT-PART 1 " + std::to_string(body.size()) + " " +
         [&] {
           char h[17];
           std::snprintf(h, sizeof h, "%016llx",
                         static_cast<unsigned long long>(format::Hash64(Bytes(body))));
           return std::string(h);
         }() +
         "\n" + body;
}

TEST(CkptRecords, EveryBadFieldIsNamed) {
  struct Case {
    const char* what;
    std::function<void(nlohmann::ordered_json&)> edit;
    const char* words;
  };
  const std::vector<Case> cases = {
      {"name", [](auto& j) { j["name"] = "step-2"; }, "name: 'step-2', but it lies under"},
      {"rank", [](auto& j) { j["rank"] = 2; }, "rank: 2 is not below world_size 2"},
      {"world", [](auto& j) { j["world_size"] = 0; }, "world_size: 0"},
      {"dtype", [](auto& j) { j["tensors"][1]["dtype"] = "float128"; }, "unknown dtype 'float128'"},
      {"bytes", [](auto& j) { j["tensors"][1]["bytes"] = 33; }, "tensors[1].bytes: 33, but shape"},
      {"gap", [](auto& j) { j["tensors"][2]["offset"] = 1; }, "tensors[2].offset: 1, expected"},
      {"dup", [](auto& j) { j["tensors"][2]["name"] = j["tensors"][1]["name"]; }, "appears twice"},
      {"dotdot", [](auto& j) { j["tensors"][2]["name"] = "a/../b"; }, "'..' path component"},
      {"escape", [](auto& j) { j["chunks"][0]["key"] = "step-1/../../etc/passwd"; },
       "chunks[0].key: 'step-1/../../etc/passwd': path component '..' starts with '.'"},
      {"outside", [](auto& j) { j["chunks"][0]["key"] = "other/x.chunk"; }, "not under 'step-1/'"},
      {"dupkey", [](auto& j) { j["chunks"][1]["key"] = j["chunks"][0]["key"]; }, "listed twice"},
      {"hash", [](auto& j) { j["chunks"][0]["hash"] = "XYZ"; }, "not 16 lowercase hex digits"},
      {"zero", [](auto& j) { j["chunks"][1]["bytes"] = 0; }, "chunks[1].bytes: 0"},
      {"short", [](auto& j) { j["chunks"][1]["bytes"] = 99; }, "past its chunks'"},
      {"long", [](auto& j) { j["chunks"][1]["bytes"] = 101; }, "the chunks hold"},
      {"shape", [](auto& j) { j["tensors"][0]["shape"][0] = -1; }, "shape: entry 0"},
      {"missing", [](auto& j) { j.erase("tensors"); }, "missing key \"tensors\""},
      {"type", [](auto& j) { j["chunks"] = 5; }, "chunks: expected an array"},
  };
  for (const Case& c : cases) {
    auto d =
        ckpt::DecodePart(Bytes(EditPart(c.edit)), "file:///r/step-1/rank-00001.part", "step-1");
    ASSERT_FALSE(d.ok()) << c.what;
    EXPECT_EQ(d.status().code(), Code::kCorruption) << c.what << ": " << d.status().ToString();
    EXPECT_TRUE(Contains(d.status().message(), c.words)) << c.what << ": " << d.status().message();
    EXPECT_TRUE(Contains(d.status().message(), "file:///r/step-1/rank-00001.part"));
  }
}

TEST(CkptRecords, HeaderProblems) {
  const std::string good = ckpt::EncodePart(SamplePart());
  auto code_of = [](const std::string& s) {
    return ckpt::DecodePart(Bytes(s), "w", "step-1").status();
  };
  std::string flipped = good;
  flipped[flipped.size() - 5] ^= 1;
  EXPECT_TRUE(Contains(code_of(flipped).message(), "body checksum mismatch"));
  EXPECT_TRUE(Contains(code_of(good.substr(0, good.size() - 1)).message(), "truncated"));
  std::string newer = good;
  newer.replace(0, std::strlen("STOKER-CKPT-PART 1"), "STOKER-CKPT-PART 3");
  EXPECT_EQ(code_of(newer).code(), Code::kUnsupported);
  EXPECT_TRUE(Contains(code_of(newer).message(), "newer stoker (checkpoint format v3"));
  EXPECT_TRUE(Contains(code_of("hello").message(), "not a stoker checkpoint part record"));
  // A manifest is not a part, and the other way round.
  EXPECT_TRUE(
      Contains(ckpt::DecodeCheckpointManifest(Bytes(good), "w", "step-1").status().message(),
               "not a stoker checkpoint manifest"));
}

TEST(CkptNames, Validated) {
  for (const char* bad : {"", "../x", "a/b", ".hidden", "latest", "-x", "a b", "x\n"}) {
    EXPECT_EQ(ValidateCheckpointName(bad).code(), Code::kInvalidArgument) << bad;
  }
  for (const char* good : {"step-000100", "a", "run1.epoch_3", "0"}) {
    EXPECT_TRUE(ValidateCheckpointName(good).ok()) << good;
  }
  for (DType t : {DType::kBool, DType::kBFloat16, DType::kComplex128, DType::kFloat8E5M2}) {
    auto back = ParseDType(DTypeName(t));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, t);
  }
}

// ---- over a store -------------------------------------------------------------

std::atomic<int> g_unique{0};

// A fresh checkpoint root on one backend.
struct Root {
  std::string uri;
  std::unique_ptr<TempDir> dir;
};

std::string InsertPath(const std::string& uri, const std::string& suffix) {
  size_t q = uri.find('?');
  if (q == std::string::npos) return uri + suffix;
  return uri.substr(0, q) + suffix + uri.substr(q);
}

class CkptStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string tag = std::to_string(::getpid()) + "-" + std::to_string(g_unique++);
    if (GetParam() == "Memory") {
      root_.uri = "mem://ckpt-" + tag;
    } else if (GetParam() == "Posix") {
      root_.dir = std::make_unique<TempDir>();
      root_.uri = root_.dir->str() + "/ckpt";
    } else {
      const char* env = std::getenv("STOKER_TEST_STORE_URI");
      if (env == nullptr || *env == '\0') {
        GTEST_SKIP() << "STOKER_TEST_STORE_URI is not set (CI sets it to the local Ceph "
                        "cluster's checkpoint pool)";
      }
      root_.uri = InsertPath(env, "-ckpt-" + tag);
    }
    auto c = OpenCheckpointer(root_.uri, Fast());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ckpt_ = std::move(*c);
    auto s = OpenStore(root_.uri);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = *s;
  }

  static CheckpointerOptions Fast() {
    CheckpointerOptions o;
    o.retry_backoff = 5ms;
    o.poll_interval = 5ms;
    return o;
  }

  static SaveOptions Small() {
    SaveOptions o;
    o.chunk_bytes = 16 << 10;  // many chunks, shared and split
    return o;
  }

  void ExpectRestores(const std::string& name, uint64_t seed, size_t scale = 1) {
    auto want = MakeCkptContent(seed, scale);
    auto r = ckpt_->Restore(name, {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->tensors.size(), want.refs.size());
    for (size_t i = 0; i < want.refs.size(); ++i) {
      const RestoredTensor& t = r->tensors[i];
      EXPECT_EQ(t.info.name, want.refs[i].name);
      EXPECT_EQ(t.info.dtype, want.refs[i].dtype);
      EXPECT_EQ(t.info.shape, want.refs[i].shape);
      ASSERT_EQ(t.data.size(), want.refs[i].data.size()) << t.info.name;
      EXPECT_EQ(0, std::memcmp(t.data.data(), want.refs[i].data.data(), t.data.size()))
          << t.info.name << " differs";
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data.data()) % 64, 0u) << t.info.name;
    }
  }

  Root root_;
  std::unique_ptr<Checkpointer> ckpt_;
  std::shared_ptr<Store> store_;
};

TEST_P(CkptStoreTest, RestoreEqualsWhatWasSavedForEveryDtype) {
  auto c = MakeCkptContent(5);
  SaveOptions o = Small();
  o.metadata_json = R"({"step":100,"note":"x"})";
  ASSERT_OK(ckpt_->Save("step-100", c.refs, o));
  ExpectRestores("step-100", 5);
  auto latest = ckpt_->Latest();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, "step-100");
  auto m = ckpt_->ReadManifest("");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->metadata_json, o.metadata_json);
  EXPECT_EQ(m->sequence, 1u);
  CheckpointVerifyReport report;
  ASSERT_OK(ckpt_->Verify("step-100", &report));
  EXPECT_GT(report.chunks, 10u);
  EXPECT_EQ(report.tensors, c.refs.size());

  // Into caller buffers, a subset, in the caller's order.
  std::vector<std::byte> a(c.refs[7].data.size()), b(c.refs[1].data.size());
  std::vector<TensorDestination> dst = {{c.refs[7].name, a, {}, {}, {}},
                                        {c.refs[1].name, b, {}, {}, {}}};
  ASSERT_TRUE(ckpt_->RestoreInto("step-100", dst, {}).ok());
  EXPECT_TRUE(std::equal(a.begin(), a.end(), c.refs[7].data.begin()));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), c.refs[1].data.begin()));
  std::vector<std::byte> wrong(3);
  std::vector<TensorDestination> bad = {{c.refs[7].name, wrong, {}, {}, {}}};
  EXPECT_EQ(ckpt_->RestoreInto("step-100", bad, {}).status().code(), Code::kInvalidArgument);
  std::vector<TensorDestination> unknown = {{"nope", wrong, {}, {}, {}}};
  auto u = ckpt_->RestoreInto("step-100", unknown, {});
  EXPECT_EQ(u.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(u.status().message(), "no tensor 'nope'"));
}

// Restore reads a chunk in pieces: large tensor parts straight into place
// (cut at 4 MiB), runs of small ones and parts of unwanted tensors through a
// buffer. Tensors of 6, 6 and 3 MiB among small ones, in chunks of 5 MiB,
// take every path, and a chunk mixes them.
TEST_P(CkptStoreTest, LargeAndSmallTensorsRestoreThroughEveryReadPath) {
  constexpr size_t kScale = 96;  // model.embed.weight and exp_avg: 6 MiB each
  auto c = MakeCkptContent(21, kScale);
  SaveOptions o;
  o.chunk_bytes = 5 << 20;
  ASSERT_OK(ckpt_->Save("big", c.refs, o));
  ExpectRestores("big", 21, kScale);

  // A subset: a large tensor that spans chunks and a small one; the parts of
  // the others in the same chunks are read but not delivered.
  auto find = [&](const std::string& name) {
    for (size_t i = 0; i < c.refs.size(); ++i) {
      if (c.refs[i].name == name) return i;
    }
    ADD_FAILURE() << name;
    return size_t{0};
  };
  const size_t big = find("opt.state.0.exp_avg"), small = find("extra.u8");
  std::vector<std::byte> a(c.refs[big].data.size()), b(c.refs[small].data.size());
  std::vector<TensorDestination> dst = {{c.refs[big].name, a, {}, {}, {}},
                                        {c.refs[small].name, b, {}, {}, {}}};
  ASSERT_OK(ckpt_->RestoreInto("big", dst, {}).status());
  EXPECT_TRUE(std::equal(a.begin(), a.end(), c.refs[big].data.begin()));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), c.refs[small].data.begin()));

  // A flipped byte in the middle of the first chunks (the first lies inside
  // model.embed.weight, read straight into place) and in their last byte:
  // each caught and named.
  auto m = ckpt_->ReadManifest("big");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_GE(m->ranks[0].chunks.size(), 3u);
  for (const ChunkInfo& chunk : {m->ranks[0].chunks[0], m->ranks[0].chunks[1]}) {
    auto raw = store_->ReadAll(chunk.key);
    ASSERT_TRUE(raw.ok());
    for (size_t at : {raw->size() / 2, raw->size() - 1}) {
      std::vector<std::byte> bad = *raw;
      bad[at] ^= std::byte{0x04};
      ASSERT_OK(store_->Put(chunk.key, bad));
      auto r = ckpt_->Restore("big", {});
      EXPECT_EQ(r.status().code(), Code::kCorruption) << chunk.key << " at " << at;
      EXPECT_TRUE(Contains(r.status().message(), chunk.key + ": checksum mismatch"))
          << r.status().message();
    }
    // Truncated by a byte.
    ASSERT_OK(store_->Put(chunk.key, std::span<const std::byte>(*raw).first(raw->size() - 1)));
    auto r = ckpt_->Restore("big", {});
    EXPECT_EQ(r.status().code(), Code::kCorruption);
    EXPECT_TRUE(Contains(r.status().message(), chunk.key + ": truncated")) << r.status().message();
    ASSERT_OK(store_->Put(chunk.key, *raw));
  }
  ExpectRestores("big", 21, kScale);
}

TEST_P(CkptStoreTest, AsyncSaveStoresTheValuesOfTheMomentOfTheCall) {
  auto c = MakeCkptContent(8, 4);
  auto h = ckpt_->SaveAsync("step-1", c.refs, Small());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  // The caller goes on training: every tensor changes at once.
  for (auto& d : c.data) std::fill(d.begin(), d.end(), std::byte{0x5a});
  ASSERT_OK(h->Wait());
  EXPECT_TRUE(h->Done());
  ExpectRestores("step-1", 8, 4);
  // The staging area is reused by the next async save.
  auto c2 = MakeCkptContent(9, 4);
  auto h2 = ckpt_->SaveAsync("step-2", c2.refs, Small());
  ASSERT_TRUE(h2.ok());
  ASSERT_OK(h2->WaitUntil(Clock::now() + 60s));
  ExpectRestores("step-2", 9, 4);
  ExpectRestores("step-1", 8, 4);
}

TEST_P(CkptStoreTest, AFlippedByteInAnyChunkNamesTheTensor) {
  auto c = MakeCkptContent(3);
  ASSERT_OK(ckpt_->Save("s", c.refs, Small()));
  auto m = ckpt_->ReadManifest("s");
  ASSERT_TRUE(m.ok());
  for (const ChunkInfo& chunk : m->ranks[0].chunks) {
    auto raw = store_->ReadAll(chunk.key);
    ASSERT_TRUE(raw.ok());
    std::vector<std::byte> bad = *raw;
    bad[bad.size() / 2] ^= std::byte{0x10};
    ASSERT_OK(store_->Put(chunk.key, bad));
    auto r = ckpt_->Restore("s", {});
    EXPECT_EQ(r.status().code(), Code::kCorruption) << chunk.key;
    EXPECT_TRUE(Contains(r.status().message(), chunk.key + ": checksum mismatch"))
        << r.status().message();
    // The tensor that holds the flipped byte is named.
    std::string holder;
    for (const TensorInfo& t : m->ranks[0].tensors) {
      const uint64_t at = chunk.offset + bad.size() / 2;
      if (t.offset <= at && at < t.offset + t.bytes) holder = t.name;
    }
    EXPECT_TRUE(Contains(r.status().message(), holder)) << r.status().message();
    CheckpointVerifyReport report;
    EXPECT_EQ(ckpt_->Verify("s", &report).code(), Code::kCorruption);
    ASSERT_EQ(report.problems.size(), 1u);
    EXPECT_TRUE(Contains(report.problems[0], holder));
    ASSERT_OK(store_->Put(chunk.key, *raw));
  }
  ExpectRestores("s", 3);

  // The manifest.
  const std::string key = "s/manifest.stkc";
  auto raw = store_->ReadAll(key);
  ASSERT_TRUE(raw.ok());
  std::vector<std::byte> bad = *raw;
  bad[bad.size() - 20] ^= std::byte{0x01};
  ASSERT_OK(store_->Put(key, bad));
  auto r = ckpt_->Restore("s", {});
  EXPECT_EQ(r.status().code(), Code::kCorruption);
  EXPECT_TRUE(Contains(r.status().message(), key + ": body checksum mismatch"))
      << r.status().message();
  // A damaged checkpoint is listed as such, and does not stop new commits
  // nor is it removed by their retention.
  auto list = ckpt_->List();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_TRUE(Contains((*list)[0].problem, "body checksum mismatch"));
  SaveOptions keep1 = Small();
  keep1.keep_last = 1;
  ASSERT_OK(ckpt_->Save("t", MakeCkptContent(4).refs, keep1));
  EXPECT_TRUE(store_->Stat(key).ok()) << "retention removed a damaged checkpoint";

  // A missing chunk.
  ASSERT_OK(store_->Put(key, *raw));
  ASSERT_OK(store_->Remove(m->ranks[0].chunks[0].key));
  r = ckpt_->Restore("s", {});
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(r.status().message(), m->ranks[0].chunks[0].key + ": chunk missing"));
  EXPECT_TRUE(Contains(r.status().message(), "model.embed.weight")) << r.status().message();
}

TEST_P(CkptStoreTest, BadArgumentsAndNamesWriteNothing) {
  auto c = MakeCkptContent(1);
  SaveOptions o = Small();
  for (const char* name : {"../escape", "a/b", ".x", "latest"}) {
    EXPECT_EQ(ckpt_->Save(name, c.refs, o).code(), Code::kInvalidArgument) << name;
  }
  std::vector<TensorRef> refs = c.refs;
  refs[2].name = "../../etc/passwd";
  auto s = ckpt_->Save("ok", refs, o);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "'..' path component")) << s.message();
  refs = c.refs;
  refs[3].name = refs[4].name;
  EXPECT_TRUE(Contains(ckpt_->Save("ok", refs, o).message(), "given twice"));
  refs = c.refs;
  refs[1].shape = {18};
  EXPECT_TRUE(
      Contains(ckpt_->Save("ok", refs, o).message(), "its shape and dtype (bfloat16) make 36"));
  o.rank = 2;
  o.world_size = 2;
  EXPECT_TRUE(Contains(ckpt_->Save("ok", c.refs, o).message(), "rank 2 is not below world_size 2"));
  o = Small();
  o.metadata_json = "[1]";
  EXPECT_TRUE(Contains(ckpt_->Save("ok", c.refs, o).message(), "metadata is not a JSON object"));
  o = Small();
  o.chunk_bytes = 10;
  EXPECT_EQ(ckpt_->SaveAsync("ok", c.refs, o).status().code(), Code::kInvalidArgument);
  auto all = store_->List("");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty()) << all->front().key;
  EXPECT_EQ(ckpt_->Restore("", {}).status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(ckpt_->Restore("", {}).status().message(), "no 'latest' pointer"));
  EXPECT_TRUE(Contains(ckpt_->Restore("nope", {}).status().message(), "no checkpoint nope at"));
}

TEST_P(CkptStoreTest, RetentionListingAndRemoval) {
  SaveOptions o = Small();
  o.keep_last = 2;
  for (int i = 1; i <= 4; ++i) {
    auto c = MakeCkptContent(i);
    ASSERT_OK(ckpt_->Save("step-" + std::to_string(i), c.refs, o));
  }
  EXPECT_EQ(ckpt_->Save("step-4", MakeCkptContent(4).refs, o).code(), Code::kAlreadyExists);
  auto list = ckpt_->List();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].name, "step-3");
  EXPECT_EQ((*list)[1].name, "step-4");
  EXPECT_EQ((*list)[1].sequence, 4u);
  EXPECT_TRUE((*list)[1].latest);
  EXPECT_FALSE((*list)[0].latest);
  EXPECT_EQ(store_->List("step-1/")->size(), 0u);

  // An incomplete one (a part without a commit) is listed as such and is
  // never removed by retention.
  ASSERT_OK(store_->Put("step-9/rank-00000/000000.chunk", RandomBytes(10, 1)));
  list = ckpt_->List();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ(list->back().name, "step-9");
  EXPECT_FALSE(list->back().committed);
  EXPECT_TRUE(
      Contains(ckpt_->Restore("step-9", {}).status().message(), "has objects but no manifest"));

  // Removing the latest moves `latest` back; removing the last drops it.
  ASSERT_OK(ckpt_->Remove("step-4"));
  EXPECT_EQ(*ckpt_->Latest(), "step-3");
  ExpectRestores("", 3);
  ASSERT_OK(ckpt_->Remove("step-3"));
  EXPECT_EQ(ckpt_->Latest().status().code(), Code::kNotFound);
  ASSERT_OK(ckpt_->Remove("step-9"));
  EXPECT_EQ(ckpt_->Remove("step-9").code(), Code::kNotFound);
  // Only the index's head and floor remain (docs/checkpoint.md §7).
  auto left = store_->List("");
  ASSERT_TRUE(left.ok());
  for (const ObjectInfo& o : *left) {
    EXPECT_TRUE(o.key == "_catalog/head" || o.key == "_catalog/floor") << o.key;
  }
}

// Counts the listings a checkpointer makes.
class CountingStore final : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  Result<std::vector<ObjectInfo>> List(std::string_view p) override {
    ++lists;
    return StoreWrapper::List(p);
  }
  std::atomic<int> lists{0};
};

TEST_P(CkptStoreTest, CommitsAndRetentionNeverListTheRoot) {
  auto counting = std::make_shared<CountingStore>(store_);
  auto c = NewCheckpointer(counting, Fast());
  SaveOptions o = Small();
  o.keep_last = 3;
  auto content = MakeCkptContent(1);
  ASSERT_OK(c->Save("first", content.refs, o));
  EXPECT_LE(counting->lists.load(), 1) << "a new root's index is built from one listing";
  counting->lists = 0;
  for (int i = 2; i <= 8; ++i) {
    ASSERT_OK(c->Save("step-" + std::to_string(i), content.refs, o));
  }
  EXPECT_EQ(counting->lists.load(), 0) << "commits and retention list nothing";
  auto list = c->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].name, "step-6");
  EXPECT_EQ((*list)[2].name, "step-8");
  EXPECT_EQ((*list)[2].sequence, 8u);
  // Removing the latest by hand moves `latest` back through the index.
  ASSERT_OK(c->Remove("step-8"));
  EXPECT_EQ(*c->Latest(), "step-7");
  ASSERT_OK(c->Save("step-9", content.refs, o));
  EXPECT_EQ(c->ReadManifest("step-9")->sequence, 9u) << "sequences are never reused";
}

TEST_P(CkptStoreTest, ARootWrittenBeforeTheIndexIsIndexedOnceAndKeepsItsOrder) {
  auto content = MakeCkptContent(2);
  for (int i = 1; i <= 4; ++i) {
    ASSERT_OK(ckpt_->Save("old-" + std::to_string(i), content.refs, Small()));
  }
  // A root of a stoker before the index: the same checkpoints, no `_catalog/`.
  auto index = store_->List("_catalog/");
  ASSERT_TRUE(index.ok());
  for (const ObjectInfo& o : *index) ASSERT_OK(store_->Remove(o.key));
  auto c = NewCheckpointer(store_, Fast());
  SaveOptions o = Small();
  o.keep_last = 2;
  ASSERT_OK(c->Save("new-5", content.refs, o));
  EXPECT_EQ(c->ReadManifest("new-5")->sequence, 5u);
  auto list = c->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].name, "old-4");
  EXPECT_EQ((*list)[1].name, "new-5");
  EXPECT_TRUE((*list)[1].latest);
}

TEST_P(CkptStoreTest, ALostOrCutShortIndexHeadIsRebuilt) {
  auto content = MakeCkptContent(4);
  for (int i = 1; i <= 3; ++i) {
    ASSERT_OK(ckpt_->Save("h-" + std::to_string(i), content.refs, Small()));
  }
  // The head is a hint whose durability waits for a sync: a machine crash
  // may leave it short, or stale.
  ASSERT_OK(store_->Put("_catalog/head", Bytes("1")));
  ASSERT_OK(ckpt_->Save("h-4", content.refs, Small()));
  EXPECT_EQ(ckpt_->ReadManifest("h-4")->sequence, 4u);
  ASSERT_OK(store_->Put("_catalog/head", Bytes("2\n")));  // stale: a few refused claims
  ASSERT_OK(ckpt_->Save("h-5", content.refs, Small()));
  EXPECT_EQ(ckpt_->ReadManifest("h-5")->sequence, 5u);
  ASSERT_OK(store_->Put("_catalog/auto", Bytes("x")));
  auto name = ckpt_->ClaimName();
  ASSERT_TRUE(name.ok()) << name.status().ToString();
  EXPECT_EQ(*name, "ckpt-000001");
}

TEST_P(CkptStoreTest, ClaimedNamesAreNewAndSkipCommittedOnes) {
  auto content = MakeCkptContent(3);
  ASSERT_OK(ckpt_->Save("ckpt-000001", content.refs, Small()));  // named by hand
  auto a = ckpt_->ClaimName();
  auto b = ckpt_->ClaimName();
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << b.status().ToString();
  EXPECT_EQ(*a, "ckpt-000002");
  EXPECT_EQ(*b, "ckpt-000003") << "a claimed name is taken even before its save";
  ASSERT_OK(ckpt_->Save(*b, content.refs, Small()));
  ASSERT_OK(ckpt_->Remove(*a));  // a claim without a save is removed like an incomplete one
  auto again = NewCheckpointer(store_, Fast())->ClaimName();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, "ckpt-000004");
}

TEST_P(CkptStoreTest, ManyRanksCommitOnlyWhenEveryPartIsDurable) {
  constexpr uint32_t kWorld = 3;
  std::vector<testing::CkptContent> content;
  for (uint32_t r = 0; r < kWorld; ++r) content.push_back(MakeCkptContent(20 + r));
  std::vector<Status> results(kWorld);
  std::vector<std::thread> ranks;
  for (uint32_t r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      // Each rank its own process in real life: its own Checkpointer.
      auto c = OpenCheckpointer(root_.uri, Fast());
      if (!c.ok()) {
        results[r] = c.status();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(30 * (kWorld - r)));
      SaveOptions o = Small();
      o.rank = r;
      o.world_size = kWorld;
      o.attempt = "t1";
      results[r] = (*c)->Save("step-7", content[r].refs, o);
    });
  }
  for (auto& t : ranks) t.join();
  for (uint32_t r = 0; r < kWorld; ++r) ASSERT_OK(results[r]);
  for (uint32_t r = 0; r < kWorld; ++r) {
    RestoreOptions ro;
    ro.rank = r;
    ro.world_size = kWorld;
    auto got = ckpt_->Restore("step-7", ro);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->tensors.size(), content[r].refs.size());
    for (size_t i = 0; i < got->tensors.size(); ++i) {
      EXPECT_EQ(0, std::memcmp(got->tensors[i].data.data(), content[r].refs[i].data.data(),
                               got->tensors[i].data.size()));
    }
  }
  RestoreOptions two;
  two.world_size = 2;
  auto mismatch = ckpt_->Restore("step-7", two);
  EXPECT_EQ(mismatch.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(mismatch.status().message(), "written by 3 rank(s), this job has 2"))
      << mismatch.status().message();
  RestoreOptions all;
  all.all_ranks = true;
  auto every = ckpt_->Restore("step-7", all);
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(every->tensors.size(), 3 * content[0].refs.size());
  EXPECT_EQ(every->tensors.back().info.rank, 2u);
}

TEST_P(CkptStoreTest, AMissingOrStaleRankNeverCommits) {
  ASSERT_OK(ckpt_->Save("step-1", MakeCkptContent(1).refs, Small()));
  // Rank 1 of an earlier attempt left its part; this attempt's rank 1 never
  // comes.
  auto other = OpenCheckpointer(root_.uri, Fast());
  ASSERT_TRUE(other.ok());
  SaveOptions o = Small();
  o.world_size = 2;
  o.rank = 1;
  o.attempt = "old";
  o.wait_for_commit = false;
  ASSERT_OK((*other)->Save("step-2", MakeCkptContent(2).refs, o));
  o.rank = 0;
  o.attempt = "new";
  o.commit_timeout = 300ms;
  Status s = ckpt_->Save("step-2", MakeCkptContent(3).refs, o);
  EXPECT_EQ(s.code(), Code::kTimedOut);
  EXPECT_TRUE(Contains(s.message(), "rank(s) 1 (its part says world_size 2, attempt 'old')"))
      << s.message();
  EXPECT_EQ(*ckpt_->Latest(), "step-1");
  EXPECT_TRUE(Contains(ckpt_->Restore("step-2", {}).status().message(), "no manifest"));
  ExpectRestores("", 1);
}

INSTANTIATE_TEST_SUITE_P(Backends, CkptStoreTest, ::testing::Values("Memory", "Posix", "EnvUri"),
                         [](const auto& info) { return info.param; });

// ---- retries and failed background writes -----------------------------------

TEST(CkptRetry, RetryableWriteErrorsAreRetried) {
  auto mem = NewMemoryStore("retry-" + std::to_string(::getpid()));
  auto flaky = std::make_shared<FlakyStore>(mem, 2, Unavailable("osd.1 is down"));
  CheckpointerOptions co;
  co.retry_backoff = 1ms;
  co.io_threads = 1;
  auto c = NewCheckpointer(flaky, co);
  auto content = MakeCkptContent(4);
  auto h = c->SaveAsync("a", content.refs, {});
  ASSERT_TRUE(h.ok());
  ASSERT_OK(h->Wait());
  auto r = c->Restore("a", {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

TEST(CkptRetry, AFailedBackgroundSaveIsReportedAndChangesNothing) {
  auto mem = NewMemoryStore("fail-" + std::to_string(::getpid()));
  auto c0 = NewCheckpointer(mem);
  ASSERT_OK(c0->Save("good", MakeCkptContent(1).refs, {}));
  auto flaky = std::make_shared<FlakyStore>(mem, 1000, Unavailable("osd.1 is down"));
  CheckpointerOptions co;
  co.retry_backoff = 1ms;
  co.write_retries = 2;
  auto c = NewCheckpointer(flaky, co);
  auto h = c->SaveAsync("bad", MakeCkptContent(2).refs, {});
  ASSERT_TRUE(h.ok());
  Status s = h->Wait();
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_TRUE(s.retryable());
  EXPECT_TRUE(Contains(s.message(), "osd.1 is down (after 3 attempts)")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "save of checkpoint bad at mem://")) << s.message();
  EXPECT_EQ(*c->Latest(), "good");
  auto r = c->Restore("", {});
  ASSERT_TRUE(r.ok());
  // A non-retryable error (a refused write) is not retried.
  auto refused = std::make_shared<FlakyStore>(mem, 1000, PermissionDenied("no caps"));
  co.io_threads = 1;
  auto c2 = NewCheckpointer(refused, co);
  EXPECT_EQ(c2->Save("bad2", MakeCkptContent(2).refs, {}).code(), Code::kPermissionDenied);
  EXPECT_EQ(refused->left_.load(), 999);
}

// Fails each chunk's first write part way, after showing the observer half
// of its bytes, and a name claim's first create after making it: writes
// that reached the store, or part of it, before their error.
class HalfWrites final : public StoreWrapper {
 public:
  using StoreWrapper::Put;
  using StoreWrapper::StoreWrapper;
  Status Put(std::string_view key, std::span<const std::byte> data,
             const WriteOptions& options) override {
    if (key.ends_with(".chunk") && First(key)) {
      if (options.observer != nullptr) (*options.observer)(data.first(data.size() / 2));
      return Unavailable("osd.2 went away mid-write");
    }
    Status s = StoreWrapper::Put(key, data, options);
    if (s.ok() && options.if_absent && key.ends_with("/claim") && First(key)) {
      return TimedOut("reply lost");
    }
    return s;
  }
  bool First(std::string_view key) {
    std::lock_guard<std::mutex> l(mu_);
    return seen_.insert(std::string(key)).second;
  }
  std::mutex mu_;
  std::set<std::string> seen_;
};

TEST(CkptRetry, RetriedWritesKeepChecksumsAndClaims) {
  auto mem = NewMemoryStore("half-" + std::to_string(::getpid()));
  auto half = std::make_shared<HalfWrites>(mem);
  CheckpointerOptions co;
  co.retry_backoff = 1ms;
  auto c = NewCheckpointer(half, co);
  // The claim's create succeeded though its caller heard an error: the name is ours.
  auto name = c->ClaimName();
  ASSERT_TRUE(name.ok()) << name.status().ToString();
  EXPECT_EQ(*name, "ckpt-000001");
  auto content = MakeCkptContent(6);
  SaveOptions o;
  o.chunk_bytes = 16 << 10;
  ASSERT_OK(c->Save(*name, content.refs, o));
  EXPECT_GT(half->seen_.size(), 2u) << "no chunk write failed: the test tests nothing";
  // Each chunk's checksum was taken over its bytes once, though the first
  // attempt showed half of them: restore and verify check every one.
  CheckpointVerifyReport report;
  ASSERT_OK(c->Verify(*name, &report));
  auto r = c->Restore(*name, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->tensors.size(), content.refs.size());
  for (size_t i = 0; i < content.refs.size(); ++i) {
    ASSERT_EQ(r->tensors[i].data.size(), content.refs[i].data.size());
    EXPECT_EQ(0, std::memcmp(r->tensors[i].data.data(), content.refs[i].data.data(),
                             content.refs[i].data.size()));
  }
}

// The wrapper itself: writes are retried only when asked, only for a
// retryable error, and the error left says how many attempts it took.
TEST(CkptRetry, RetryingStoreRetriesRetryableWritesOnlyWhenAsked) {
  auto mem = NewMemoryStore("rs-" + std::to_string(::getpid()));
  const auto data = RandomBytes(100, 1);
  RetryOptions o;
  o.first_backoff = 1ms;
  o.max_retries = 2;
  std::atomic<uint64_t> retries{0};
  o.retries = &retries;
  {  // off by default: one attempt
    auto flaky = std::make_shared<FlakyStore>(mem, 1, Unavailable("osd.1 is down"));
    RetryingStore rs(flaky, o);
    EXPECT_EQ(rs.Put("a.chunk", data).code(), Code::kUnavailable);
    EXPECT_EQ(flaky->left_.load(), 0);
  }
  o.writes = true;
  {  // a retryable error, fewer times than the retries: the write lands
    auto flaky = std::make_shared<FlakyStore>(mem, 2, Unavailable("osd.1 is down"));
    RetryingStore rs(flaky, o);
    ASSERT_OK(rs.Put("b.chunk", data));
    EXPECT_EQ(retries.load(), 2u);
    EXPECT_EQ(mem->Stat("b.chunk")->size, data.size());
  }
  {  // more times than the retries: the error, with the attempts
    auto flaky = std::make_shared<FlakyStore>(mem, 10, Unavailable("osd.1 is down"));
    RetryingStore rs(flaky, o);
    const PutObserver see = [](std::span<const std::byte>) {};
    Status s = rs.Put("c.chunk", data, {.durability = Durability::kDeferred, .observer = &see});
    EXPECT_EQ(s.code(), Code::kUnavailable);
    EXPECT_TRUE(s.retryable());
    EXPECT_TRUE(Contains(s.message(), "osd.1 is down (after 3 attempts)")) << s.message();
    EXPECT_EQ(flaky->left_.load(), 7);
  }
  {  // not retryable: one attempt, the error as it was
    auto flaky = std::make_shared<FlakyStore>(mem, 10, PermissionDenied("no caps"));
    RetryingStore rs(flaky, o);
    Status s = rs.Put("d.chunk", data);
    EXPECT_EQ(s.code(), Code::kPermissionDenied);
    EXPECT_EQ(s.message(), "no caps");
    EXPECT_EQ(flaky->left_.load(), 9);
  }
}

TEST(CkptRetry, WriteRetriesZeroTriesOnce) {
  auto mem = NewMemoryStore("once-" + std::to_string(::getpid()));
  auto flaky = std::make_shared<FlakyStore>(mem, 1, Unavailable("osd.1 is down"));
  CheckpointerOptions co;
  co.write_retries = 0;
  co.io_threads = 1;
  Status s = NewCheckpointer(flaky, co)->Save("a", MakeCkptContent(1).refs, {});
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_FALSE(Contains(s.message(), "attempts")) << s.message();
  EXPECT_EQ(flaky->left_.load(), 0);
}

// ---- past the page cache -----------------------------------------------------

// By default chunks are written and read with O_DIRECT: a save or restore
// leaves the chunks' bytes out of the page cache (the data a loader keeps
// cached stays), every read path still returns exact bytes (Restore's own
// 4 KiB-aligned memory, caller buffers that are aligned and that are not),
// and with both switched off the chunks go through the page cache.
TEST(CkptDirect, ChunksBypassThePageCacheUnlessSwitchedOff) {
  TempDir dir;
  const std::string why = testing::PageCacheBypassUnavailable(dir.path());
  if (!why.empty()) GTEST_SKIP() << why;
  constexpr size_t kScale = 96;  // tensors of 6 and 3 MiB among small ones
  auto content = MakeCkptContent(31, kScale);
  SaveOptions so;
  so.chunk_bytes = 4 << 20;
  auto cached_pages = [&](const CheckpointManifest& m) {
    long cached = 0, large = 0;
    for (const ChunkInfo& c : m.ranks[0].chunks) {
      if (c.bytes < (1 << 20)) continue;  // small objects are written buffered
      ++large;
      const long r = testing::ResidentPages(dir.path() / "ck" / c.key);
      EXPECT_GE(r, 0) << c.key;
      cached += r;
    }
    EXPECT_GE(large, 4);
    return std::pair{cached, large};
  };
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "direct" : "buffered");
    CheckpointerOptions co;
    if (!direct) {
      co.direct_reads = false;
      co.store.direct_writes = false;
    }
    std::filesystem::remove_all(dir.path() / "ck");
    auto c = OpenCheckpointer((dir.path() / "ck").string(), co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_OK((*c)->Save("a", content.refs, so));
    auto m = (*c)->ReadManifest("a");
    ASSERT_TRUE(m.ok());
    auto [after_save, large] = cached_pages(*m);
    if (direct) {
      EXPECT_LE(after_save, large) << "pages cached after a direct save";  // a tail page each
    } else {
      EXPECT_GT(after_save, large * 256) << "a buffered save leaves its chunks cached";
    }

    // Restore's own memory: large tensors 4 KiB-aligned.
    auto r = (*c)->Restore("a", {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->tensors.size(), content.refs.size());
    for (size_t i = 0; i < content.refs.size(); ++i) {
      const auto& want = content.refs[i].data;
      ASSERT_EQ(r->tensors[i].data.size(), want.size());
      EXPECT_EQ(0, std::memcmp(r->tensors[i].data.data(), want.data(), want.size()))
          << content.refs[i].name;
      if (want.size() >= (256 << 10)) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(r->tensors[i].data.data()) % kDirectIoAlignment, 0u)
            << content.refs[i].name;
      }
    }
    if (direct) {
      EXPECT_LE(cached_pages(*m).first, large) << "pages cached after a direct restore";
    }

    // Caller buffers at every alignment.
    for (size_t misalign : {size_t{0}, size_t{1}, size_t{64}}) {
      std::vector<std::unique_ptr<std::byte, decltype(&std::free)>> blocks;
      std::vector<TensorDestination> dst;
      for (const auto& t : content.refs) {
        blocks.emplace_back(
            static_cast<std::byte*>(std::aligned_alloc(
                kDirectIoAlignment,
                (t.data.size() + misalign) / kDirectIoAlignment * kDirectIoAlignment +
                    kDirectIoAlignment)),
            &std::free);
        dst.push_back({t.name, {blocks.back().get() + misalign, t.data.size()}, {}, {}, {}});
      }
      ASSERT_OK((*c)->RestoreInto("a", dst, {}).status());
      for (size_t i = 0; i < dst.size(); ++i) {
        EXPECT_EQ(0,
                  std::memcmp(dst[i].data.data(), content.refs[i].data.data(), dst[i].data.size()))
            << content.refs[i].name << " misaligned by " << misalign;
      }
    }
  }
}

// Restore faults its new memory in from threads of its own while the reads
// land (MADV_POPULATE_WRITE, which never changes bytes): every restore of a
// state well above the threshold (16 MiB) is exact, whichever got to a page
// first.
TEST(CkptRestore, NewMemoryFaultedInAheadKeepsEveryByte) {
  TempDir dir;
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorRef> refs;
  for (size_t i = 0; i < 6; ++i) {
    data.push_back(RandomBytes((8 << 20) + i * 4099, 500 + i));
    refs.push_back(
        {"t" + std::to_string(i), DType::kUInt8, {int64_t(data.back().size())}, data.back(), {}});
  }
  auto c = OpenCheckpointer(dir.str() + "/ck");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  SaveOptions o;
  o.chunk_bytes = 2 << 20;
  ASSERT_OK((*c)->Save("a", refs, o));
  for (int round = 0; round < 5; ++round) {
    auto r = (*c)->Restore("a", {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->tensors.size(), data.size());
    for (size_t i = 0; i < data.size(); ++i) {
      ASSERT_EQ(r->tensors[i].data.size(), data[i].size());
      EXPECT_EQ(0, std::memcmp(r->tensors[i].data.data(), data[i].data(), data[i].size()))
          << "round " << round << ", tensor " << i;
    }
  }
}

// ---- leftovers of killed saves -------------------------------------------------

// Sets the modification time of `dir` and every folder under it an hour back:
// a leftover older than the age retention and removal wait for.
void Age(const std::filesystem::path& dir) {
  const auto past = std::filesystem::file_time_type::clock::now() - std::chrono::hours(1);
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    std::filesystem::last_write_time(e.path(), past);
  }
  std::filesystem::last_write_time(dir, past);
}

// What a save killed between its folder's mkdir and its first temporary
// file leaves: NAME/rank-00000/, empty.
std::filesystem::path EmptyLeftover(const std::string& root, const std::string& name, bool old) {
  const std::filesystem::path dir = std::filesystem::path(root) / name;
  std::filesystem::create_directories(dir / "rank-00000");
  if (old) Age(dir);
  return dir;
}

TEST(CkptLeftovers, EmptyFoldersAreNoCheckpointsAndRmTakesOnlyDeadOnes) {
  TempDir dir;
  const std::string uri = dir.str() + "/ckpt";
  auto c = OpenCheckpointer(uri);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_OK((*c)->Save("a", MakeCkptContent(1).refs, {}));
  const auto dead = EmptyLeftover(uri, "dead", /*old=*/true);
  const auto fresh = EmptyLeftover(uri, "fresh", /*old=*/false);
  // A folder with a temporary file only: a write under way (written just
  // now), or a killed one (idle ten minutes and more).
  const auto busy = EmptyLeftover(uri, "busy", /*old=*/true);
  std::ofstream(busy / "rank-00000" / ".000000.chunk.tmp.1.1") << "x";
  const auto killed = EmptyLeftover(uri, "killed", /*old=*/false);
  std::ofstream(killed / "rank-00000" / ".000000.chunk.tmp.1.2") << "x";
  Age(killed);

  auto list = (*c)->List();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 1u) << "a leftover listed as a checkpoint: " << list->back().name;
  EXPECT_EQ(list->front().name, "a");

  ASSERT_OK((*c)->Remove("dead"));
  EXPECT_FALSE(std::filesystem::exists(dead));
  ASSERT_OK((*c)->Remove("killed"));
  EXPECT_FALSE(std::filesystem::exists(killed));
  for (const auto& kept : {fresh, busy}) {
    Status s = (*c)->Remove(kept.filename().string());
    EXPECT_EQ(s.code(), Code::kNotFound) << s.ToString();
    EXPECT_TRUE(Contains(s.message(), "left alone")) << s.message();
    EXPECT_TRUE(std::filesystem::exists(kept / "rank-00000")) << kept;
  }
  EXPECT_EQ((*c)->Remove("never").code(), Code::kNotFound);
  CheckpointVerifyReport report;
  ASSERT_OK((*c)->Verify("a", &report));
}

TEST(CkptLeftovers, RetentionTakesDeadLeftoversOfClaimedSavesAndKeepsLiveOnes) {
  TempDir dir;
  const std::string uri = dir.str() + "/ckpt";
  auto c = OpenCheckpointer(uri);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto store = *OpenStore(uri);
  auto seq = [](int n) {
    char b[64];
    std::snprintf(b, sizeof b, "_catalog/seq/%020d", n);
    return std::string(b);
  };
  auto put = [&](const std::string& key, const std::string& v) {
    ASSERT_OK(store->Put(key, std::as_bytes(std::span(v))));
  };
  ASSERT_OK((*c)->Save("a", MakeCkptContent(1).refs, {}));  // sequence 1
  // A save of "dead" claimed sequence 2 and was killed after its mkdir.
  put(seq(2), "dead\n");
  const auto dead = EmptyLeftover(uri, "dead", /*old=*/true);
  SaveOptions keep1;
  keep1.keep_last = 1;
  ASSERT_OK((*c)->Save("b", MakeCkptContent(2).refs, keep1));  // sequence 3
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_EQ(store->Stat(seq(2)).status().code(), Code::kNotFound) << "the dead claim stayed";
  EXPECT_EQ(store->Stat("a/manifest.stkc").status().code(), Code::kNotFound);
  // A save of "live" claimed 4 and has just made its folder: kept, and so is
  // its claim, though it is older than the commit after it.
  put(seq(4), "live\n");
  const auto live = EmptyLeftover(uri, "live", /*old=*/false);
  ASSERT_OK((*c)->Save("c", MakeCkptContent(3).refs, keep1));  // sequence 5
  EXPECT_TRUE(std::filesystem::exists(live / "rank-00000"));
  EXPECT_TRUE(store->Stat(seq(4)).ok());
  auto list = (*c)->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ(list->front().name, "c");
  // Once it is old (its writer dead), the next commit's retention takes it.
  Age(live);
  ASSERT_OK((*c)->Save("d", MakeCkptContent(4).refs, keep1));
  EXPECT_FALSE(std::filesystem::exists(live));
  EXPECT_EQ(store->Stat(seq(4)).status().code(), Code::kNotFound);
}

// ---- a full disk ------------------------------------------------------------

TEST(CkptFullDisk, NoSpaceIsAClearErrorAndThePreviousCheckpointSurvives) {
  TempDir dir;
  const std::string mnt = dir.str() + "/small";
  std::filesystem::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=4m") != 0) {
    GTEST_SKIP() << "cannot mount a 4 MiB tmpfs to fill (" << std::strerror(errno)
                 << "; needs root or CAP_SYS_ADMIN)";
  }
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};
  auto c = OpenCheckpointer(mnt);
  ASSERT_TRUE(c.ok());
  SaveOptions o;
  o.chunk_bytes = 256 << 10;
  ASSERT_OK((*c)->Save("small", MakeCkptContent(1).refs, o));    // ~0.4 MiB
  Status s = (*c)->Save("big", MakeCkptContent(2, 64).refs, o);  // ~20 MiB
  EXPECT_EQ(s.code(), Code::kNoSpace) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "save of checkpoint big at")) << s.message();
  EXPECT_EQ(*(*c)->Latest(), "small");
  CheckpointVerifyReport r;
  ASSERT_OK((*c)->Verify("small", &r));
  ASSERT_OK((*c)->Remove("big"));  // what the failed save left goes
  auto again = MakeCkptContent(3);
  ASSERT_OK((*c)->Save("after", again.refs, o));
}

// ---- writers killed at random moments ---------------------------------------

// Restore("") (the latest) equals what ckpt_writer saved under `latest`:
// MakeCkptContent of its seed at `scale`, byte for byte. With `seed` given,
// checkpoint `latest` itself, saved from that seed.
::testing::AssertionResult LatestRestoresWhatWasSaved(Checkpointer& c, const std::string& latest,
                                                      size_t scale,
                                                      std::optional<uint64_t> seed = {}) {
  auto want = MakeCkptContent(seed ? *seed : testing::SeedOfName(latest), scale);
  auto got = c.Restore(seed ? latest : "", {});
  if (!got.ok()) return ::testing::AssertionFailure() << got.status().ToString();
  if (got->tensors.size() != want.refs.size()) {
    return ::testing::AssertionFailure() << latest << ": " << got->tensors.size() << " tensors";
  }
  for (size_t i = 0; i < want.refs.size(); ++i) {
    if (got->tensors[i].data.size() != want.refs[i].data.size() ||
        std::memcmp(got->tensors[i].data.data(), want.refs[i].data.data(),
                    want.refs[i].data.size()) != 0) {
      return ::testing::AssertionFailure() << latest << " " << want.refs[i].name << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

class CkptKillTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CkptKillTest, AKilledSaveNeverLeavesLatestOnAnIncompleteCheckpoint) {
  std::unique_ptr<TempDir> dir;
  std::string uri;
  int trials = 16;
  if (GetParam() == "Posix") {
    dir = std::make_unique<TempDir>();
    uri = dir->str() + "/ckpt";
  } else {
    const char* env = std::getenv("STOKER_TEST_STORE_URI");
    if (env == nullptr || *env == '\0') {
      GTEST_SKIP() << "STOKER_TEST_STORE_URI is not set (CI sets it to the local Ceph cluster)";
    }
    uri = InsertPath(env, "-kill-" + std::to_string(::getpid()));
    trials = 8;
  }
  auto c = OpenCheckpointer(uri);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::mt19937 rng(1234);
  std::string previous;
  std::set<std::string> interrupted;
  for (int trial = 0; trial < trials; ++trial) {
    const std::string start = std::to_string(trial * 1000);
    const bool async = trial % 2 == 1;
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const char* null_out = "/dev/null";
      std::freopen(null_out, "w", stdout);
      ::execl(CKPT_WRITER_PATH, "ckpt_writer", uri.c_str(), start.c_str(), "1000", "65536", "8",
              async ? "async" : "sync", nullptr);
      ::_exit(127);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 600));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer ended by itself: " << status;

    auto list = (*c)->List();
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    for (const CheckpointListing& l : *list) {
      if (!l.committed) {
        interrupted.insert(l.name);
        continue;
      }
      CheckpointVerifyReport report;
      ASSERT_OK((*c)->Verify(l.name, &report));
    }
    auto latest = (*c)->Latest();
    if (!latest.ok()) {
      ASSERT_EQ(latest.status().code(), Code::kNotFound);
      ASSERT_TRUE(previous.empty()) << "latest vanished";
      continue;
    }
    ASSERT_TRUE(LatestRestoresWhatWasSaved(**c, *latest, 8));
    if (!previous.empty()) {
      CheckpointVerifyReport report;
      ASSERT_OK((*c)->Verify(previous, &report));  // never damaged
    }
    previous = *latest;
  }
  std::printf("kill test (%s): %d trials, %d left an incomplete checkpoint behind\n",
              GetParam().c_str(), trials, int(interrupted.size()));
  EXPECT_GT(interrupted.size(), 0u) << "no kill landed inside a save; the test proved nothing";
  // Clean up what the writers left (RADOS pools outlive the test).
  auto list = (*c)->List();
  ASSERT_TRUE(list.ok());
  for (const CheckpointListing& l : *list) ASSERT_OK((*c)->Remove(l.name));
  if (dir) {
    // A kill between the store's mkdir of a checkpoint's folder and its
    // first temporary file leaves an empty folder, which no listing shows;
    // once it is old enough, `ckpt rm` takes it (seen once in CI).
    for (const auto& e : std::filesystem::directory_iterator(uri)) {
      const std::string name = e.path().filename().string();
      if (!e.is_directory() || name == "_catalog") continue;
      Age(e.path());
      Status s = (*c)->Remove(name);
      EXPECT_TRUE(s.ok()) << "left in " << name << ": " << s.ToString();
    }
    // Nothing left on disk, not even the hidden temporary files of the
    // chunks each kill cut short, nor their folders; only a `latest` whose
    // write a kill cut short can leave its temporary file (a few bytes) at
    // the root, which no checkpoint's removal reaches.
    std::vector<std::string> left;
    for (const auto& e : std::filesystem::recursive_directory_iterator(uri)) {
      const std::string name = e.path().filename().string();
      if (e.path().parent_path() == uri && name.starts_with(".latest.tmp.")) continue;
      // The root's index (and a temporary file of its head a kill cut short).
      if (e.path().string().starts_with(uri + "/_catalog")) continue;
      left.push_back(e.path().string());
    }
    EXPECT_TRUE(left.empty()) << left.size() << " entries left, the first " << left.front();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CkptKillTest, ::testing::Values("Posix", "EnvUri"),
                         [](const auto& info) { return info.param; });

// Two processes saving to one root at once with automatic names: every
// save gets a name of its own and a sequence of its own, and every one
// restores what its writer saved.
TEST(CkptAutoNames, TwoProcessesSavingAtOnceNeverCollide) {
  TempDir dir;
  const std::string uri = dir.str() + "/ckpt";
  constexpr int kEach = 8;
  std::vector<FILE*> pipes;
  for (int w = 0; w < 2; ++w) {
    const std::string cmd = std::string(CKPT_WRITER_PATH) + " " + uri + " " +
                            std::to_string(w * 100) + " " + std::to_string(kEach) + " 65536 1 auto";
    FILE* p = ::popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    pipes.push_back(p);
  }
  std::map<std::string, uint64_t> seed_of;
  int lines = 0;
  for (FILE* p : pipes) {
    char name[64];
    unsigned long long seed;
    while (std::fscanf(p, "committed %63s %llu\n", name, &seed) == 2) {
      ++lines;
      EXPECT_TRUE(seed_of.emplace(name, seed).second) << name << " was given twice";
    }
    EXPECT_EQ(::pclose(p), 0);
  }
  EXPECT_EQ(lines, 2 * kEach);
  auto c = OpenCheckpointer(uri);
  ASSERT_TRUE(c.ok());
  auto list = (*c)->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), size_t(2 * kEach));
  std::set<uint64_t> sequences;
  for (const CheckpointListing& l : *list) {
    EXPECT_TRUE(l.committed) << l.name;
    EXPECT_TRUE(sequences.insert(l.sequence).second) << "sequence " << l.sequence << " twice";
    ASSERT_TRUE(seed_of.count(l.name)) << l.name;
    EXPECT_TRUE(LatestRestoresWhatWasSaved(**c, l.name, 1, seed_of[l.name])) << l.name;
  }
  EXPECT_EQ(*sequences.rbegin(), uint64_t(2 * kEach));
}

// A power cut (testing::PowerCutDisk) at a random moment of a writer's
// saves: whatever was not made durable is lost, which a killed process never
// shows (its writes stay in the page cache). After the restart: `latest`
// names a checkpoint that restores byte for byte, every committed checkpoint
// verifies, and every save that returned before the cut is still committed
// (a save that returned is durable). Buffered and direct chunk writes, sync
// and async saves.
TEST(CkptPowerCut, APowerCutNeverLosesAReturnedSaveNorLeavesLatestOnAnIncompleteOne) {
  if (std::string why = testing::PowerCutDisk::Unavailable(); !why.empty()) {
    GTEST_SKIP() << "no power-cut disk: " << why;
  }
  testing::PowerCutDisk disk(8ull << 30);  // sparse: only what is written takes space
  const std::string uri = disk.str() + "/ckpt";
  std::mt19937 rng(4321);
  std::set<std::string> returned;  // saves that returned OK before a cut
  int interrupted = 0, lost_in_flight = 0;
  const int trials = 10;
  // Trial t saves w-<t*1000>, ... Its chunks: 64 KiB through the page cache,
  // or 1 MiB past it (with larger tensors).
  auto direct_trial = [](uint64_t trial) { return trial % 4 >= 2; };
  auto scale_of = [&](uint64_t seed) -> size_t { return direct_trial(seed / 1000) ? 32 : 8; };
  for (int trial = 0; trial < trials; ++trial) {
    const std::string start = std::to_string(trial * 1000);
    const bool async = trial % 2 == 1;
    const std::string chunk = direct_trial(trial) ? "1048576" : "65536";
    const std::string scale = std::to_string(scale_of(trial * 1000));
    int out[2];
    ASSERT_EQ(::pipe(out), 0);
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(out[1], STDERR_FILENO);  // its EIO at the cut, shown if it ended early
      ::close(out[0]);
      ::close(out[1]);
      ::execl(CKPT_WRITER_PATH, "ckpt_writer", uri.c_str(), start.c_str(), "200", chunk.c_str(),
              scale.c_str(), async ? "async" : "sync", nullptr);
      ::_exit(127);
    }
    ::close(out[1]);
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 700));
    const std::string cut = disk.Cut();
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    std::string printed;
    char buf[4096];
    for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) printed.append(buf, size_t(n));
    ::close(out[0]);
    ASSERT_EQ(cut, "");
    ASSERT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 1))
        << "the writer ended before the cut (status " << status << "): " << printed;
    // What the writer said it saved, before the cut: after the cut every
    // write fails (EIO), so no save can return OK after it.
    std::string last_returned;
    for (size_t at = 0; (at = printed.find("committed ", at)) != std::string::npos;) {
      const size_t end = printed.find('\n', at);
      if (end == std::string::npos) break;  // a line cut short by the kill
      last_returned = printed.substr(at + 10, end - at - 10);
      returned.insert(last_returned);
      at = end;
    }

    disk.Remount();
    // The checkpointer (and its store's descriptors) closes at the end of
    // each trial, before the next unmount.
    auto c = OpenCheckpointer(uri);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto list = (*c)->List();
    ASSERT_TRUE(list.ok()) << list.status().ToString();
    std::set<std::string> committed;
    for (const CheckpointListing& l : *list) {
      if (!l.committed) {
        ++interrupted;
        ASSERT_OK((*c)->Remove(l.name));  // what a killed save leaves can be removed
        continue;
      }
      committed.insert(l.name);
      CheckpointVerifyReport report;
      const Status v = (*c)->Verify(l.name, &report);
      ASSERT_TRUE(v.ok()) << "trial " << trial << ": " << v.ToString();
    }
    for (const std::string& name : returned) {
      ASSERT_TRUE(committed.count(name)) << "trial " << trial << ": " << name
                                         << " was saved (Save returned OK) before the cut, "
                                            "and is not committed after it";
    }
    auto latest = (*c)->Latest();
    if (returned.empty() && !latest.ok()) {
      ASSERT_EQ(latest.status().code(), Code::kNotFound);
      continue;
    }
    ASSERT_TRUE(latest.ok()) << "trial " << trial << ": " << latest.status().ToString();
    ASSERT_TRUE(committed.count(*latest)) << *latest;
    if (!last_returned.empty()) {
      ASSERT_GE(testing::SeedOfName(*latest), testing::SeedOfName(last_returned))
          << "latest moved back past a save that returned";
      if (*latest != last_returned) ++lost_in_flight;  // a save durable, not yet returned
    }
    ASSERT_TRUE(LatestRestoresWhatWasSaved(**c, *latest, scale_of(testing::SeedOfName(*latest))));
  }
  std::printf(
      "power-cut test: %d trials, %zu saves returned before a cut, %d incomplete "
      "checkpoint(s) left, %d save(s) committed but not yet returned at the cut\n",
      trials, returned.size(), interrupted, lost_in_flight);
  EXPECT_GT(returned.size(), 0u) << "no save finished before a cut; the test proved nothing";
}

// ---- saved states: the structure document (docs/checkpoint.md §8) -----------

TEST(CkptState, BuiltInCppRestoresByKeyPath) {
  TempDir d;
  auto c = OpenCheckpointer(d.str() + "/ckpt");
  ASSERT_TRUE(c.ok());
  const auto w = RandomBytes(4 * 6, 1), b = RandomBytes(8, 2);
  StateBuilder s;
  ASSERT_OK(s.SetTensor("model.layer.weight", DType::kFloat32, {2, 3}, w));
  ASSERT_OK(s.SetTensor("model.layer.bias", DType::kFloat64, {1}, b));
  ASSERT_OK(s.SetInt("step", 1200));
  ASSERT_OK(s.SetFloat("optim.lr", 0.001));
  ASSERT_OK(s.SetFloat("optim.nan", std::nan("")));
  ASSERT_OK(s.SetString("optim.name", "adam"));
  EXPECT_EQ(s.SetInt("step", 1).code(), Code::kInvalidArgument) << "set twice";
  EXPECT_EQ(s.SetInt("step.x", 1).code(), Code::kInvalidArgument) << "an int is no dict";
  EXPECT_EQ(s.SetInt("a..b", 1).code(), Code::kInvalidArgument);
  ASSERT_OK((*c)->Save("s1", s.Tensors(), {}));

  auto st = ReadStateStructure(**c, "s1");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  auto step = st->Find("step");
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->type, "int");
  EXPECT_EQ(step->value, "1200");
  EXPECT_EQ(st->Find("optim.nan")->type, "float");
  EXPECT_EQ(st->Find("model")->type, "dict");
  EXPECT_EQ(st->Find("model")->items, 1u);
  auto missing = st->Find("model.layer.gamma");
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(missing.status().message(), "'model.layer', a dict of 2"))
      << missing.status().ToString();

  std::vector<std::byte> got(w.size());
  auto info = RestoreStatePath(**c, "", "model.layer.weight", got);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(got, w);
  EXPECT_EQ(info->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(RestoreStatePath(**c, "s1", "step", got).status().code(), Code::kInvalidArgument);
  // A checkpoint of plain tensors has no structure: NotFound, said so.
  ASSERT_OK((*c)->Save("flat", MakeCkptContent(1).refs, {}));
  auto flat = ReadStateStructure(**c, "flat");
  EXPECT_EQ(flat.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(flat.status().message(), "without a structure"));
}

TEST(CkptState, BadDocumentsAreCorruptionOrUnsupported) {
  auto parse = [](const std::string& doc) {
    return StateStructure::Parse(Bytes(doc), "doc").status();
  };
  EXPECT_EQ(parse("not json").code(), Code::kCorruption);
  EXPECT_EQ(parse(R"({"format":"other","version":1,"root":null})").code(), Code::kCorruption);
  EXPECT_EQ(parse(R"({"format":"stoker.python.state","version":2,"root":null})").code(),
            Code::kUnsupported);
  EXPECT_EQ(parse(R"({"format":"stoker.python.state","version":1,"root":{"x":1,"y":2}})").code(),
            Code::kCorruption);
  EXPECT_EQ(parse(R"({"format":"stoker.python.state","version":1,"root":{"tensor":3}})").code(),
            Code::kCorruption);
  EXPECT_EQ(parse(R"({"format":"stoker.python.state","version":1,"root":{"dict":[[1]]}})").code(),
            Code::kCorruption);
  EXPECT_TRUE(
      parse(R"({"format":"stoker.python.state","version":1,"root":[1,{"tuple":[]}]})").ok());
}

#ifdef STOKER_PYTHONPATH
// A state saved by the Python package (stoker.save of nested dicts, lists,
// numpy arrays and scalars) read back by C++ alone, by key path.
TEST(CkptState, SavedFromPythonRestoredInCppByKeyPath) {
  TempDir d;
  const std::string root = d.str() + "/ckpt";
  const std::string script =
      "import numpy as np, stoker\n"
      "w = np.arange(12, dtype=np.float32).reshape(3, 4)\n"
      "state = {'model': {'layer1.weight': w, 'bias': np.ones(3, np.int64)},\n"
      "         'optim': {'param_groups': [{'lr': 0.5, 'betas': (0.9, 0.99)}], 'state': {0: w}},\n"
      "         'step': 7, 'tag': 'run-1', 'none': None}\n"
      "stoker.save(state, '" +
      root + "', name='py', rank=0, world_size=1)\n";
  const std::string cmd =
      "PYTHONPATH=" STOKER_PYTHONPATH " /usr/bin/python3 -c \"" + script + "\" 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ASSERT_EQ(::pclose(p), 0) << out;

  auto c = OpenCheckpointer(root);
  ASSERT_TRUE(c.ok());
  auto st = ReadStateStructure(**c, "py");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->Find("step")->value, "7");
  EXPECT_EQ(st->Find("tag")->value, "\"run-1\"");
  EXPECT_EQ(st->Find("none")->type, "none");
  EXPECT_EQ(st->Find("optim.param_groups.0.lr")->value, "0.5");
  EXPECT_EQ(st->Find("optim.param_groups.0.betas")->type, "tuple");
  EXPECT_EQ(st->Find("optim.state.0")->type, "ndarray");
  std::vector<float> w(12);
  auto info =
      RestoreStatePath(**c, "py", "model.layer1.weight", std::as_writable_bytes(std::span(w)));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->dtype, DType::kFloat32);
  EXPECT_EQ(info->shape, (std::vector<int64_t>{3, 4}));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(w[i], float(i));
  std::vector<int64_t> bias(3);
  ASSERT_TRUE(
      RestoreStatePath(**c, "py", "model.bias", std::as_writable_bytes(std::span(bias))).ok());
  EXPECT_EQ(bias, (std::vector<int64_t>{1, 1, 1}));
}
#endif

}  // namespace
}  // namespace stoker
