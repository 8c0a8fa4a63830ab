// DatasetWriter: typed records in, a dataset out; bad records, a killed
// writer, a full disk, parts written in parallel and committed once.
#include "stoker/writer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/loader.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using format::FieldSpec;
using format::FieldValue;
using testing::TempDir;

std::vector<FieldSpec> Schema() {
  std::vector<FieldSpec> f;
  for (auto [name, type] : std::initializer_list<std::pair<const char*, const char*>>{
           {"image", "jpeg"}, {"caption", "str"}, {"meta", "json"}, {"score", "float32"},
           {"tokens", "uint32[*]"}, {"label", "int64"}}) {
    f.push_back(*format::ParseFieldSpec(name, type));
  }
  return f;
}

std::span<const std::byte> B(std::string_view s) { return std::as_bytes(std::span(s)); }

// Record i: an image of i % 5000 + 1 bytes, a caption, JSON, a score, i % 7
// tokens and a label.
struct Rec {
  std::vector<std::byte> image;
  std::string caption, meta;
  std::vector<uint32_t> tokens;
  std::vector<FieldValue> values;
};
Rec MakeRec(uint64_t i) {
  Rec r;
  r.image = testing::RandomBytes(i * 37 % 5000 + 1, i);
  r.caption = "caption " + std::to_string(i) + " ünï";
  r.meta = "{\"i\": " + std::to_string(i) + ", \"tags\": [\"a\"]}";
  for (uint32_t t = 0; t < i % 7; ++t) r.tokens.push_back(static_cast<uint32_t>(i * 100 + t));
  r.values.resize(6);
  r.values[0].bytes = r.image;
  r.values[1].bytes = B(r.caption);
  r.values[2].bytes = B(r.meta);
  r.values[3].f64 = 0.5 * static_cast<double>(i);
  r.values[4].bytes = std::as_bytes(std::span(r.tokens));
  r.values[5].i64 = -static_cast<int64_t>(i);
  return r;
}

// Every sample of the dataset at `uri` is MakeRec(first + its index).
void ExpectRecords(const std::string& uri, uint64_t n, uint64_t first = 0) {
  auto store = OpenStore(uri);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto m = ReadManifest(**store);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->sample_count, n);
  // The schema, and last the block sums of its token field (format.md §3.5).
  std::vector<FieldSpec> want = Schema();
  want.push_back(format::BlockSumsFieldFor(want[4], format::kDefaultTokenBlockBytes));
  EXPECT_EQ(m->fields, want);
  EXPECT_EQ(m->format_version, 3u);
  uint64_t seen = 0;
  for (uint32_t s = 0; s < m->shards.size(); ++s) {
    auto e = format::ExpectationFor(*m, s);
    auto bytes = (*store)->ReadAll(e.key);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto view = format::ShardView::Parse(*bytes, e);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    for (uint32_t k = 0; k < view->sample_count(); ++k, ++seen) {
      ASSERT_TRUE(view->VerifySample(k).ok());
      Rec want = MakeRec(first + seen);
      for (size_t f : {0u, 1u, 2u, 4u}) {
        auto got = view->Field(k, static_cast<uint32_t>(f));
        ASSERT_TRUE(std::equal(got.begin(), got.end(), want.values[f].bytes.begin(),
                               want.values[f].bytes.end()))
            << "sample " << seen << " field " << f;
      }
      float score;
      std::memcpy(&score, view->Field(k, 3).data(), 4);
      EXPECT_EQ(score, static_cast<float>(want.values[3].f64));
      EXPECT_EQ(view->Int64(k, 5), want.values[5].i64);
    }
  }
  EXPECT_EQ(seen, n);
}

TEST(DatasetWriter, TypedRecordsRoundTripAndShardsAreCut) {
  TempDir d;
  const std::string uri = (d.path() / "ds").string();
  WriterOptions o;
  o.shard_bytes = 64 << 10;
  o.threads = 3;
  std::vector<WriterProgress> seen;
  o.progress = [&](const WriterProgress& p) { seen.push_back(p); };
  auto w = DatasetWriter::Create(uri, Schema(), o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (uint64_t i = 0; i < 500; ++i) ASSERT_TRUE((*w)->Write(MakeRec(i).values).ok()) << i;
  EXPECT_FALSE(fs::exists(d.path() / "ds" / "manifest.stoker")) << "nothing visible before Close";
  EXPECT_TRUE(fs::exists(d.path() / "ds" / "pack.pending"));
  auto m = (*w)->Close();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_GT(m->shards.size(), 10u);
  for (const auto& s : m->shards) EXPECT_LE(s.bytes, 64u << 10);
  EXPECT_FALSE(fs::exists(d.path() / "ds" / "pack.pending"));
  ExpectRecords(uri, 500);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().records, 500u);
  EXPECT_EQ(seen.back().shards_stored, m->shards.size());
  EXPECT_EQ(seen.back().bytes, m->payload_bytes);
  // Close again: the same result; Write after Close is refused.
  EXPECT_EQ((*w)->Close()->IdHex(), m->IdHex());
  EXPECT_EQ((*w)->Write(MakeRec(0).values).code(), Code::kInvalidArgument);
  // A second writer into a dataset is refused.
  auto again = DatasetWriter::Create(uri, Schema(), o);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists);
}

TEST(DatasetWriter, BadRecordsNameTheRecordAndTheFieldAndAreNotWritten) {
  TempDir d;
  const std::string uri = (d.path() / "ds").string();
  auto w = DatasetWriter::Create(uri, Schema(), {});
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write(MakeRec(0).values).ok());
  struct Case {
    size_t field;
    std::string value;
    std::string want;
  };
  const std::string bad_utf8 = "ok \xC3\x28 no";
  const std::string surrogate = "\xED\xA0\x80";
  const std::string overlong = "\xC0\xAF";
  for (const Case& c : std::vector<Case>{
           {1, bad_utf8, "'caption' (str) is not UTF-8 (byte 3)"},
           {1, surrogate, "is not UTF-8 (byte 0)"},
           {1, overlong, "is not UTF-8 (byte 0)"},
           {2, "{\"a\": }", "'meta' (json) is not one JSON value"},
           {2, "{} {}", "is not one JSON value"},
           {4, "abcdef", "'tokens' (array uint32[*]) has length 6, not a multiple of 4 (uint32 elements)"}}) {
    Rec r = MakeRec(1);
    r.values[c.field].bytes = B(c.value);
    Status st = (*w)->Write(r.values);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << c.want;
    EXPECT_NE(st.message().find("record 1: field "), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find(c.want), std::string::npos) << st.ToString();
  }
  Rec r = MakeRec(1);
  r.values.pop_back();
  Status st = (*w)->Write(r.values);
  EXPECT_NE(st.message().find("record 1: 5 values, the schema has 6 fields (image, caption"),
            std::string::npos)
      << st.ToString();
  // The writer goes on after a bad record: record 1 is the next good one.
  ASSERT_TRUE((*w)->Write(MakeRec(1).values).ok());
  ASSERT_TRUE((*w)->Close().ok());
  ExpectRecords(uri, 2);

  // Bad schemas and an empty dataset.
  auto bad = DatasetWriter::Create((d.path() / "x").string(),
                                   {{"a b", format::FieldType::kBytes}}, {});
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  auto empty = DatasetWriter::Create((d.path() / "empty").string(), Schema(), {});
  ASSERT_TRUE(empty.ok());
  auto none = (*empty)->Close();
  EXPECT_EQ(none.status().code(), Code::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no records written"), std::string::npos);
  EXPECT_FALSE(fs::exists(d.path() / "empty" / "manifest.stoker"));
}

TEST(DatasetWriter, AKilledWriterLeavesNothingVisibleAndTheNextCleansUp) {
  TempDir d;
  const std::string uri = (d.path() / "ds").string();
  WriterOptions o;
  o.shard_bytes = 16 << 10;
  {
    auto w = DatasetWriter::Create(uri, Schema(), o);
    ASSERT_TRUE(w.ok());
    for (uint64_t i = 0; i < 400; ++i) ASSERT_TRUE((*w)->Write(MakeRec(i).values).ok());
    // Destroyed without Close: a kill, an exception.
  }
  EXPECT_FALSE(fs::exists(d.path() / "ds" / "manifest.stoker"));
  auto store = OpenStore(uri);
  EXPECT_EQ(ReadManifest(**store).status().code(), Code::kNotFound);
  size_t left = 0;
  for (auto& e : fs::directory_iterator(d.path() / "ds" / "shards")) left += e.is_regular_file();
  EXPECT_GT(left, 20u);
  // The next writer here writes fewer records; the killed one's extra
  // shards and the note go.
  auto w = DatasetWriter::Create(uri, Schema(), o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (uint64_t i = 0; i < 30; ++i) ASSERT_TRUE((*w)->Write(MakeRec(i).values).ok());
  auto m = (*w)->Close();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  size_t now = 0;
  for (auto& e : fs::directory_iterator(d.path() / "ds" / "shards")) now += e.is_regular_file();
  EXPECT_EQ(now, m->shards.size());
  EXPECT_FALSE(fs::exists(d.path() / "ds" / "pack.pending"));
  ExpectRecords(uri, 30);
}

TEST(DatasetWriter, AFullDiskNamesTheShardAndCommitsNothing) {
  if (std::string why = testing::PowerCutDisk::Unavailable(); !why.empty()) {
    GTEST_SKIP() << "no small file system to fill: " << why;
  }
  testing::PowerCutDisk disk(8 << 20);
  const std::string uri = (disk.path() / "ds").string();
  WriterOptions o;
  o.shard_bytes = 256 << 10;
  auto w = DatasetWriter::Create(uri, Schema(), o);
  ASSERT_TRUE(w.ok());
  Status st;
  std::vector<std::byte> big = testing::RandomBytes(100 << 10, 3);
  for (uint64_t i = 0; i < 400 && st.ok(); ++i) {
    Rec r = MakeRec(i);
    r.values[0].bytes = big;
    st = (*w)->Write(r.values);
  }
  auto m = (*w)->Close();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNoSpace) << m.status().ToString();
  EXPECT_NE(m.status().message().find("storing shard "), std::string::npos) << m.status().ToString();
  EXPECT_NE(m.status().message().find("no dataset was created"), std::string::npos);
  if (!st.ok()) EXPECT_EQ(st.code(), Code::kNoSpace) << st.ToString();
  EXPECT_FALSE(fs::exists(disk.path() / "ds" / "manifest.stoker"));
}


TEST(DatasetWriter, PartsWrittenInParallelAndCommittedOnce) {
  TempDir d;
  const std::string uri = (d.path() / "ds").string();
  constexpr uint32_t kParts = 4;
  constexpr uint64_t kPer = 150;
  WriterOptions o;
  o.shard_bytes = 32 << 10;
  // Part 2 is not there yet: the commit names it.
  std::vector<std::thread> writers;
  std::vector<Status> results(kParts);
  auto write_part = [&](uint32_t p) {
    auto w = DatasetWriter::CreatePart(uri, p, Schema(), o);
    if (!w.ok()) {
      results[p] = w.status();
      return;
    }
    for (uint64_t i = 0; i < kPer; ++i) {
      if (Status st = (*w)->Write(MakeRec(p * kPer + i).values); !st.ok()) {
        results[p] = st;
        return;
      }
    }
    results[p] = (*w)->Close().status();
  };
  for (uint32_t p : {0u, 1u, 3u}) writers.emplace_back(write_part, p);
  for (auto& t : writers) t.join();
  for (uint32_t p : {0u, 1u, 3u}) ASSERT_TRUE(results[p].ok()) << results[p].ToString();
  auto missing = CommitParts(uri, kParts);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_NE(missing.status().message().find("part 2 of 4"), std::string::npos)
      << missing.status().ToString();
  EXPECT_FALSE(fs::exists(d.path() / "ds" / "manifest.stoker"));
  // Its writer runs (again) and the commit goes through.
  write_part(2);
  ASSERT_TRUE(results[2].ok()) << results[2].ToString();
  auto m = CommitParts(uri, kParts);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->shards.parts().size(), kParts);
  EXPECT_EQ(m->shards.key(0), "parts/000000/shards/000000.stks");
  EXPECT_EQ(m->shards.Find(m->shards.key(m->shards.size() - 1)),
            static_cast<int64_t>(m->shards.size() - 1));
  EXPECT_EQ(m->shards.Find("parts/000009/shards/000000.stks"), -1);
  // Read back through the table and the parts: every record, in part order.
  ExpectRecords(uri, kParts * kPer);
  // The loader reads it as any dataset: every sample once.
  LoaderOptions lo;
  lo.batch_size = 32;
  lo.fields = {"label"};
  auto loader = Loader::Open(uri, lo);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  std::vector<int64_t> labels;
  for (;;) {
    auto batch = (*loader)->Next();
    if (!batch.ok()) {
      ASSERT_EQ(batch.status().code(), Code::kOutOfRange) << batch.status().ToString();
      break;
    }
    const auto& v = batch->int64("label")->values;
    labels.insert(labels.end(), v.begin(), v.end());
  }
  std::sort(labels.begin(), labels.end());
  ASSERT_EQ(labels.size(), kParts * kPer);
  for (size_t i = 0; i < labels.size(); ++i) {
    ASSERT_EQ(labels[i], -static_cast<int64_t>(labels.size() - 1 - i));
  }
  // Committed once: again is AlreadyExists.
  EXPECT_EQ(CommitParts(uri, kParts).status().code(), Code::kAlreadyExists);

  // A part of another schema is refused, naming it.
  TempDir e;
  const std::string other = (e.path() / "ds").string();
  auto a = DatasetWriter::CreatePart(other, 0, Schema(), o);
  ASSERT_TRUE((*a)->Write(MakeRec(0).values).ok());
  ASSERT_TRUE((*a)->Close().ok());
  auto b = DatasetWriter::CreatePart(other, 1, {{"x", format::FieldType::kBytes}}, o);
  FieldValue v;
  v.bytes = B("x");
  ASSERT_TRUE((*b)->Write(std::span(&v, 1)).ok());
  ASSERT_TRUE((*b)->Close().ok());
  auto bad = CommitParts(other, 2);
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("part 1"), std::string::npos) << bad.status().ToString();
}

// A rank that got no input closes an empty part; the commit leaves it out
// and the dataset reads as the other parts' records. All parts empty:
// no dataset.
TEST(DatasetWriter, EmptyPartsCommitWithTheOthers) {
  TempDir d;
  const std::string uri = (d.path() / "ds").string();
  WriterOptions o;
  o.shard_bytes = 32 << 10;
  constexpr uint64_t kPer = 100;
  for (uint32_t p = 0; p < 4; ++p) {
    auto w = DatasetWriter::CreatePart(uri, p, Schema(), o);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    if (p == 1 || p == 3) {  // parts 0 and 2 hold records; 1 (inside) and 3 (last) none
      auto m = (*w)->Close();
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      EXPECT_EQ(m->sample_count, 0u);
      EXPECT_EQ(m->shards.size(), 0u);
      continue;
    }
    const uint64_t first = p == 0 ? 0 : kPer;  // the records in dataset order
    for (uint64_t i = 0; i < kPer; ++i) ASSERT_TRUE((*w)->Write(MakeRec(first + i).values).ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  auto m = CommitParts(uri, 4);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->sample_count, 2 * kPer);
  ASSERT_EQ(m->shards.parts().size(), 2u);
  EXPECT_EQ(m->shards.parts()[1].prefix, "parts/000002");
  // The shard after part 0's last is part 2's first.
  uint32_t first_of_2 = m->shards.parts()[0].shards;
  EXPECT_EQ(m->shards.key(first_of_2), "parts/000002/shards/000000.stks");
  EXPECT_EQ(m->shards.key(m->shards.size() - 1).rfind("parts/000002/", 0), 0u);
  ExpectRecords(uri, 2 * kPer);

  // Every part empty: refused, and nothing committed.
  TempDir e;
  const std::string none = (e.path() / "ds").string();
  for (uint32_t p = 0; p < 2; ++p) {
    auto w = DatasetWriter::CreatePart(none, p, Schema(), o);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE((*w)->Close().ok());
  }
  auto bad = CommitParts(none, 2);
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("none of its 2 parts"), std::string::npos)
      << bad.status().ToString();
  EXPECT_FALSE(fs::exists(e.path() / "ds" / "manifest.stoker"));
  // A whole dataset (not a part) with no record is still refused.
  TempDir f;
  auto whole = DatasetWriter::Create((f.path() / "ds").string(), Schema(), o);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ((*whole)->Close().status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace stoker
