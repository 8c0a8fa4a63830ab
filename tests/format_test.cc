// Tests of the dataset format (docs/format.md): round trips, and one test per
// corruption path of the manifest (§2.4) and the shard (§3.4), each checking
// the code and that the message names the object (and the sample).
#include "stoker/format.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "testutil.h"

namespace stoker::format {
namespace {

using Bytes = std::vector<std::byte>;
using stoker::testing::RandomBytes;

// ---- helpers -----------------------------------------------------------------

// Status has `code` and its message contains every one of `parts`.
::testing::AssertionResult HasError(const Status& s, Code code,
                                    std::initializer_list<std::string_view> parts) {
  if (s.code() != code) {
    return ::testing::AssertionFailure() << "code " << CodeName(s.code()) << ", expected "
                                         << CodeName(code) << " (" << s.ToString() << ")";
  }
  for (std::string_view p : parts) {
    if (s.message().find(p) == std::string::npos) {
      return ::testing::AssertionFailure() << "'" << s.message() << "' lacks '" << p << "'";
    }
  }
  return ::testing::AssertionSuccess() << s.ToString();
}

template <typename T>
::testing::AssertionResult Fails(const Result<T>& r, Code code,
                                 std::initializer_list<std::string_view> parts) {
  if (r.ok()) return ::testing::AssertionFailure() << "succeeded, expected an error";
  return HasError(r.status(), code, parts);
}

template <typename T>
void Put(Bytes& b, size_t off, T v) {  // the tests run on little-endian hosts
  std::memcpy(b.data() + off, &v, sizeof v);
}
template <typename T>
T Get(const Bytes& b, size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

Bytes AsBytes(std::string_view s) {
  Bytes b(s.size());
  if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());
  return b;
}

// Independent of the library: the header hash of §3.1.
void ResealHeader(Bytes& b) { Put<uint64_t>(b, 56, XXH3_64bits(b.data(), 56)); }
// Recomputes the index hash from the header (§3.1), when the header's index
// lies inside `b`, and then the header hash; returns the index hash (for the
// expectation).
uint64_t Reseal(Bytes& b) {
  uint64_t off = Get<uint64_t>(b, 40);
  uint64_t len = uint64_t{Get<uint32_t>(b, 36)} * Get<uint16_t>(b, 14);
  uint64_t h = Get<uint64_t>(b, 48);
  if (off <= b.size() && len <= b.size() - off) h = XXH3_64bits(b.data() + off, len);
  Put<uint64_t>(b, 48, h);
  ResealHeader(b);
  return h;
}

DatasetId TestId(uint8_t seed) {
  DatasetId id;
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<uint8_t>(seed * 31 + i);
  return id;
}

struct Sample {
  Bytes image;
  int64_t label = 0;
};

std::vector<FieldSpec> ImageLabel() {
  return {{"image", FieldType::kBytes}, {"label", FieldType::kInt64}};
}

// A dataset in memory, packed like `stoker pack` does (§5.1).
struct Dataset {
  Manifest m;
  std::vector<Bytes> shards;
  std::vector<Sample> samples;
};

Dataset MakeDataset(size_t n, uint64_t target, uint64_t seed, size_t max_image = 3000) {
  Dataset d;
  d.m.dataset_id = TestId(static_cast<uint8_t>(seed));
  d.m.fields = ImageLabel();
  d.m.classes = {"cat", "dog", "ünïcødé"};
  d.m.created_by = "format_test";
  d.m.format_version = FormatVersionFor(d.m.fields);  // bytes + int64: still v2
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; ++i) {
    size_t len = rng() % (max_image + 1);
    d.samples.push_back({RandomBytes(len, seed * 1000003 + i), static_cast<int64_t>(rng())});
  }
  auto builder = std::make_unique<ShardBuilder>(d.m.fields, d.m.dataset_id, 0);
  auto finish = [&] {
    ShardInfo info;
    info.key = ShardKey(static_cast<uint32_t>(d.shards.size()));
    info.samples = builder->sample_count();
    info.first_sample = d.m.sample_count;
    d.m.sample_count += info.samples;
    d.m.payload_bytes += builder->payload_bytes();
    d.m.max_sample_bytes = std::max(d.m.max_sample_bytes, builder->max_sample_bytes());
    d.shards.push_back(builder->Finish(&info.index_hash));
    info.bytes = d.shards.back().size();
    d.m.shards.push_back(info);
  };
  for (const Sample& s : d.samples) {
    FieldValue v[2] = {{s.image, 0}, {{}, s.label}};
    if (builder->sample_count() > 0 && builder->SizeWith(v) > target) {
      finish();
      builder = std::make_unique<ShardBuilder>(d.m.fields, d.m.dataset_id,
                                               static_cast<uint32_t>(d.shards.size()));
    }
    EXPECT_TRUE(builder->Add(v).ok());
  }
  if (builder->sample_count() > 0) finish();
  return d;
}

// ---- basics ------------------------------------------------------------------

TEST(FormatBasics, Hash64IsXxh3Seed0) {
  Bytes b = RandomBytes(1000, 7);
  EXPECT_EQ(Hash64(b), XXH3_64bits(b.data(), b.size()));
  EXPECT_EQ(Hash64({}), 0x2D06800538D394C2ull);  // XXH3-64 of the empty input
  // Every length class of XXH3 (short, mid, long with a partial stripe and
  // block) and unaligned starts: the AVX2 path must agree with the library.
  Bytes big = RandomBytes(70000, 9);
  for (size_t len : {1u, 3u, 4u, 8u, 9u, 16u, 17u, 128u, 129u, 240u, 241u, 1023u, 1024u, 1025u,
                     4096u, 65536u, 69999u}) {
    for (size_t off : {0u, 1u}) {
      std::span<const std::byte> s(big.data() + off, len);
      ASSERT_EQ(Hash64(s), XXH3_64bits(s.data(), s.size())) << len << "+" << off;
    }
  }
}

TEST(FormatBasics, Hash64StreamEqualsHash64OfTheWhole) {
  Bytes big = RandomBytes(300000, 11);
  {
    Hash64Stream h;
    EXPECT_EQ(h.Digest(), Hash64({}));  // nothing handed in: the empty input
  }
  // Whole inputs of every length class, cut into pieces of sizes that cross
  // XXH3's internal stripe and block boundaries, empty pieces included.
  for (size_t len : {0u, 1u, 17u, 240u, 241u, 1024u, 4096u, 65536u, 262144u, 299999u}) {
    for (size_t piece : {1u, 7u, 64u, 1000u, 1024u, 65536u, 300000u}) {
      if (piece < 64 && len > 5000) continue;  // keeps the test fast
      Hash64Stream h;
      const std::span<const std::byte> all(big.data(), len);
      for (size_t off = 0; off < len; off += piece) {
        h.Update(all.subspan(off, std::min(piece, len - off)));
        h.Update({});
      }
      ASSERT_EQ(h.Digest(), Hash64(all)) << len << " in pieces of " << piece;
    }
  }
}

TEST(FormatBasics, IndexEntryBytes) {
  EXPECT_EQ(IndexEntryBytes(1), 24u);
  EXPECT_EQ(IndexEntryBytes(2), 24u);
  EXPECT_EQ(IndexEntryBytes(3), 32u);
  EXPECT_EQ(IndexEntryBytes(4), 32u);
  EXPECT_EQ(IndexEntryBytes(64), 272u);
}

TEST(FormatBasics, ShardKeyAndFieldTypeName) {
  EXPECT_EQ(ShardKey(0), "shards/000000.stks");
  EXPECT_EQ(ShardKey(42), "shards/000042.stks");
  EXPECT_EQ(ShardKey(1234567), "shards/1234567.stks");
  EXPECT_EQ(FieldTypeName(FieldType::kBytes), "bytes");
  EXPECT_EQ(FieldTypeName(FieldType::kInt64), "int64");
}

TEST(FormatBasics, NewDatasetIdIsRandom) {
  DatasetId a = NewDatasetId(), b = NewDatasetId();
  EXPECT_NE(a, b);
  EXPECT_NE(a, DatasetId{});
}

TEST(FormatBasics, ManifestHelpers) {
  Manifest m;
  for (size_t i = 0; i < m.dataset_id.size(); ++i) m.dataset_id[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(m.IdHex(), "000102030405060708090a0b0c0d0e0f");
  EXPECT_EQ(m.Id64(), 0x0706050403020100ull);  // §5.2: first 8 bytes, LE
  m.fields = ImageLabel();
  EXPECT_EQ(m.FieldIndex("image"), 0);
  EXPECT_EQ(m.FieldIndex("label"), 1);
  EXPECT_EQ(m.FieldIndex("nope"), -1);
  EXPECT_EQ(m.ShardOf(0), -1);  // no shards
  for (const ShardInfo& s : {ShardInfo{"a", 4096, 3, 0, 0}, ShardInfo{"b", 4096, 1, 3, 0},
                             ShardInfo{"c", 4096, 5, 4, 0}}) {
    m.shards.push_back(s);
  }
  m.sample_count = 9;
  const int64_t want[] = {0, 0, 0, 1, 2, 2, 2, 2, 2, -1, -1};
  for (uint64_t s = 0; s < 11; ++s) EXPECT_EQ(m.ShardOf(s), want[s]) << s;
  EXPECT_EQ(m.ShardOf(UINT64_MAX), -1);
}

// ---- shards: round trips -----------------------------------------------------

TEST(ShardRoundTrip, ManySamples) {
  constexpr uint64_t kTarget = 256 << 10;
  Dataset d = MakeDataset(2000, kTarget, 1);
  ASSERT_GT(d.shards.size(), 5u);
  uint64_t global = 0;
  for (uint32_t s = 0; s < d.shards.size(); ++s) {
    const Bytes& shard = d.shards[s];
    EXPECT_EQ(shard.size() % kShardAlignment, 0u);
    EXPECT_LE(shard.size(), kTarget);
    ShardExpectation e = ExpectationFor(d.m, s);
    auto v = ShardView::Parse(shard, e);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(v->sample_count(), d.m.shards[s].samples);
    EXPECT_EQ(v->field_count(), 2u);
    EXPECT_EQ(v->shard_number(), s);
    EXPECT_EQ(v->dataset_id(), d.m.dataset_id);
    EXPECT_EQ(v->first_sample(), d.m.shards[s].first_sample);
    EXPECT_EQ(v->key(), d.m.shards[s].key);
    EXPECT_TRUE(v->VerifyPadding().ok());
    for (uint32_t i = 0; i < v->sample_count(); ++i, ++global) {
      const Sample& want = d.samples[global];
      auto img = v->Field(i, 0);
      ASSERT_EQ(img.size(), want.image.size());
      EXPECT_TRUE(std::equal(img.begin(), img.end(), want.image.begin()));
      EXPECT_EQ(v->Int64(i, 1), want.label);
      EXPECT_EQ(v->Field(i, 1).size(), 8u);
      EXPECT_EQ(v->Record(i).size(), want.image.size() + 8);
      EXPECT_EQ(v->Record(i).data(), img.data());
      ASSERT_TRUE(v->VerifySample(i).ok());
    }
    EXPECT_TRUE(ShardView::ParseStandalone(shard, e.key).ok());
  }
  EXPECT_EQ(global, d.samples.size());
}

TEST(ShardRoundTrip, EmptyBytesFieldsAndExtremeLabels) {
  const int64_t labels[] = {0, -1, INT64_MIN, INT64_MAX, 42};
  ShardBuilder b(ImageLabel(), TestId(2), 0);
  for (int64_t l : labels) {
    FieldValue v[2] = {{{}, 0}, {{}, l}};
    ASSERT_TRUE(b.Add(v).ok());
  }
  EXPECT_EQ(b.payload_bytes(), 8u * 5);
  EXPECT_EQ(b.max_sample_bytes(), 8u);
  uint64_t ih;
  Bytes shard = b.Finish(&ih);
  EXPECT_EQ(shard.size(), 4096u);
  auto v = ShardView::ParseStandalone(shard, "s");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(v->index_hash(), ih);
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_TRUE(v->Field(i, 0).empty());
    EXPECT_EQ(v->Int64(i, 1), labels[i]);
    EXPECT_TRUE(v->VerifySample(i).ok());
  }
}

TEST(ShardRoundTrip, OneHugeSampleGetsItsOwnShard) {
  // 10 MiB, more than the 4 MiB target: the packer gives it a shard of its
  // own, larger than the target (§5.1).
  Bytes big = RandomBytes(10 << 20, 99);
  ShardBuilder b(ImageLabel(), TestId(3), 0);
  FieldValue v[2] = {{big, 0}, {{}, 7}};
  EXPECT_GT(b.SizeWith(v), kDefaultShardBytes);
  ASSERT_TRUE(b.Add(v).ok());
  uint64_t ih;
  Bytes shard = b.Finish(&ih);
  EXPECT_GT(shard.size(), kDefaultShardBytes);
  EXPECT_EQ(shard.size() % kShardAlignment, 0u);
  auto view = ShardView::ParseStandalone(shard, "big");
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  auto f = view->Field(0, 0);
  ASSERT_EQ(f.size(), big.size());
  EXPECT_EQ(std::memcmp(f.data(), big.data(), big.size()), 0);
  EXPECT_EQ(view->Int64(0, 1), 7);
  EXPECT_TRUE(view->VerifySample(0).ok());
}

TEST(ShardRoundTrip, SizeWithPredictsFinish) {
  ShardBuilder b(ImageLabel(), TestId(4), 0);
  uint64_t predicted = 0;
  for (int i = 0; i < 300; ++i) {
    Bytes img = RandomBytes(i * 13 % 1000, i);
    FieldValue v[2] = {{img, 0}, {{}, i}};
    predicted = b.SizeWith(v);
    ASSERT_TRUE(b.Add(v).ok());
  }
  uint64_t ih;
  EXPECT_EQ(b.Finish(&ih).size(), predicted);
}

TEST(ShardRoundTrip, FieldCounts) {
  for (uint32_t fc : {1u, 3u, 7u, 64u}) {
    std::vector<FieldSpec> fields;
    for (uint32_t f = 0; f < fc; ++f) {
      fields.push_back(
          {"f" + std::to_string(f), f % 3 == 2 ? FieldType::kInt64 : FieldType::kBytes});
    }
    ShardBuilder b(fields, TestId(5), 9);
    std::vector<Bytes> vals;
    for (uint32_t i = 0; i < 20; ++i) {
      std::vector<FieldValue> v(fc);
      for (uint32_t f = 0; f < fc; ++f) {
        vals.push_back(RandomBytes((i + f) % 17, i * 100 + f));
        v[f].bytes = vals.back();
        v[f].i64 = int64_t{i} * 1000 + f;
      }
      ASSERT_TRUE(b.Add(v).ok());
    }
    uint64_t ih;
    Bytes shard = b.Finish(&ih);
    EXPECT_EQ(Get<uint16_t>(shard, 14), IndexEntryBytes(fc));
    ShardExpectation e{"k", fields, 9, TestId(5), fc, 20, shard.size(), ih, 0};
    auto view = ShardView::Parse(shard, e);
    ASSERT_TRUE(view.ok()) << fc << ": " << view.status().ToString();
    size_t n = 0;
    for (uint32_t i = 0; i < 20; ++i) {
      for (uint32_t f = 0; f < fc; ++f, ++n) {
        if (fields[f].type == FieldType::kInt64) {
          EXPECT_EQ(view->Int64(i, f), int64_t{i} * 1000 + f);
        } else {
          auto got = view->Field(i, f);
          EXPECT_TRUE(std::equal(got.begin(), got.end(), vals[n].begin(), vals[n].end()));
        }
      }
      EXPECT_TRUE(view->VerifySample(i).ok());
    }
    EXPECT_TRUE(view->VerifyPadding().ok());
  }
}

TEST(ShardRoundTrip, AccessorsOutOfRangeAreEmpty) {
  Dataset d = MakeDataset(5, kDefaultShardBytes, 6, 10);
  auto v = ShardView::Parse(d.shards[0], ExpectationFor(d.m, 0));
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->Record(5).empty());
  EXPECT_TRUE(v->Field(0, 2).empty());
  EXPECT_TRUE(v->Field(5, 0).empty());
  EXPECT_EQ(v->Int64(0, 0 /* bytes field, not 8 long */), 0);
  EXPECT_TRUE(HasError(v->VerifySample(5), Code::kInvalidArgument, {"shards/000000.stks"}));
  EXPECT_TRUE(HasError(ShardView().VerifyPadding(), Code::kInvalidArgument, {}));
}

TEST(ShardBuilderTest, RejectsWrongValueCount) {
  ShardBuilder b(ImageLabel(), TestId(7), 4);
  FieldValue v[3];
  EXPECT_TRUE(HasError(b.Add(std::span(v, 1)), Code::kInvalidArgument, {"shard 4", "1 values"}));
  EXPECT_TRUE(HasError(b.Add(std::span(v, 3)), Code::kInvalidArgument, {"3 values"}));
  EXPECT_EQ(b.sample_count(), 0u);
}

// ---- shards: one test per corruption path (§3.4) -----------------------------

constexpr std::string_view kKey = "shards/000003.stks";
constexpr uint32_t kShardNo = 3;
constexpr uint64_t kFirst = 100;
constexpr uint32_t kSamples = 20;

class ShardCorruption : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardBuilder b(fields_, TestId(8), kShardNo);
    uint64_t records = 0;
    for (uint32_t i = 0; i < kSamples; ++i) {
      // About 8 KiB in all, so that the shard is two blocks long.
      size_t len = 200 + i * 37 % 301;
      // Records end 5 bytes past a multiple of 8: padding before the index.
      if (i == kSamples - 1) len += (13 - (records + len + 8) % 8) % 8;
      images_.push_back(RandomBytes(len, 500 + i));
      FieldValue v[2] = {{images_.back(), 0}, {{}, int64_t{i} - 10}};
      ASSERT_TRUE(b.Add(v).ok());
      records += len + 8;
    }
    records_end_ = kShardHeaderBytes + records;
    shard_ = b.Finish(&index_hash_);
    ASSERT_EQ(records_end_ % 8, 5u);
    ASSERT_EQ(shard_.size(), 8192u);
    ASSERT_TRUE(ShardView::Parse(shard_, Expect()).ok());
  }

  ShardExpectation Expect() const {
    return ShardExpectation{std::string(kKey), fields_,       kShardNo,    TestId(8), 2,
                            kSamples,          shard_.size(), index_hash_, kFirst};
  }
  // Parses `b` with the fixture's expectation, its index hash replaced.
  Result<ShardView> ParseResealed(Bytes& b) {
    ShardExpectation e = Expect();
    e.index_hash = Reseal(b);
    return ShardView::Parse(b, e);
  }
  // Offset of sample i's index entry.
  size_t Entry(uint32_t i) const { return Get<uint64_t>(shard_, 40) + i * 24; }

  std::vector<FieldSpec> fields_ = ImageLabel();
  std::vector<Bytes> images_;
  Bytes shard_;
  uint64_t index_hash_ = 0;
  uint64_t records_end_ = 0;
};

TEST_F(ShardCorruption, Truncated) {
  for (size_t len : {size_t{0}, size_t{63}, size_t{64}, shard_.size() - 4096, shard_.size() - 1}) {
    Bytes b(shard_.begin(), shard_.begin() + len);
    EXPECT_TRUE(Fails(ShardView::Parse(b, Expect()), Code::kCorruption,
                      {kKey, "truncated: " + std::to_string(len) + " bytes, expected " +
                                 std::to_string(shard_.size())}))
        << len;
    EXPECT_TRUE(Fails(ShardView::ParseStandalone(b, kKey), Code::kCorruption, {kKey, "truncated"}))
        << len;
  }
}

TEST_F(ShardCorruption, TruncatedStandaloneFromIndexOffset) {
  // A multiple of 4096 long, but the header's index lies past the end.
  Bytes b(shard_.begin(), shard_.end() - 4096);
  ASSERT_GE(b.size(), 4096u);
  // The index may or may not survive the cut; either way it is caught.
  EXPECT_TRUE(Fails(ShardView::ParseStandalone(b, kKey), Code::kCorruption, {kKey}));
}

TEST_F(ShardCorruption, SizeDiffersFromManifest) {
  ShardExpectation e = Expect();
  e.bytes = shard_.size() + 4096;
  EXPECT_TRUE(Fails(ShardView::Parse(shard_, e), Code::kCorruption,
                    {kKey, "truncated", "expected " + std::to_string(e.bytes)}));
  e.bytes = shard_.size() - 4096;
  EXPECT_TRUE(Fails(ShardView::Parse(shard_, e), Code::kCorruption,
                    {kKey, "manifest says " + std::to_string(e.bytes)}));
}

TEST_F(ShardCorruption, TrailingData) {
  Bytes b = shard_;
  b.resize(b.size() + 4096);
  EXPECT_TRUE(Fails(ShardView::ParseStandalone(b, kKey), Code::kCorruption,
                    {kKey, "data after the index"}));
  ShardExpectation e = Expect();
  e.bytes = b.size();
  EXPECT_TRUE(Fails(ShardView::Parse(b, e), Code::kCorruption, {kKey, "data after the index"}));
}

TEST_F(ShardCorruption, WrongMagic) {
  Bytes b = shard_;
  b[3] = std::byte{'X'};
  EXPECT_TRUE(Fails(ShardView::Parse(b, Expect()), Code::kCorruption, {kKey, "bad magic"}));
  EXPECT_TRUE(Fails(ShardView::ParseStandalone(b, kKey), Code::kCorruption, {kKey, "bad magic"}));
}

TEST_F(ShardCorruption, NewerVersionIsUnsupported) {
  Bytes b = shard_;
  Put<uint32_t>(b, 8, 2);  // not resealed: the version is checked first
  EXPECT_TRUE(Fails(ShardView::Parse(b, Expect()), Code::kUnsupported,
                    {kKey, "written by a newer stoker (format v2; this build reads v1)"}));
  Put<uint32_t>(b, 8, 0);
  ResealHeader(b);
  EXPECT_TRUE(Fails(ShardView::Parse(b, Expect()), Code::kCorruption, {kKey, "version 0"}));
}

TEST_F(ShardCorruption, HeaderChecksumMismatch) {
  // Any header byte after magic and version (those have their own checks).
  for (size_t off : {12u, 14u, 16u, 31u, 32u, 36u, 40u, 48u, 56u, 63u}) {
    Bytes b = shard_;
    b[off] ^= std::byte{0x01};
    EXPECT_TRUE(
        Fails(ShardView::Parse(b, Expect()), Code::kCorruption, {kKey, "header checksum mismatch"}))
        << off;
  }
}

TEST_F(ShardCorruption, WrongFieldCount) {
  ShardExpectation e = Expect();
  e.field_count = 3;
  EXPECT_TRUE(Fails(ShardView::Parse(shard_, e), Code::kCorruption,
                    {kKey, "header says 2 fields, manifest says 3"}));
  for (uint16_t fc : {uint16_t{0}, uint16_t{65}, uint16_t{65535}}) {
    Bytes b = shard_;
    Put<uint16_t>(b, 12, fc);
    ResealHeader(b);
    EXPECT_TRUE(Fails(ShardView::ParseStandalone(b, kKey), Code::kCorruption,
                      {kKey, "header says " + std::to_string(fc) + " fields"}));
  }
}

TEST_F(ShardCorruption, WrongIndexEntrySize) {
  Bytes b = shard_;
  Put<uint16_t>(b, 14, 32);
  ResealHeader(b);
  EXPECT_TRUE(Fails(ShardView::Parse(b, Expect()), Code::kCorruption,
                    {kKey, "index entry size 32, expected 24 for 2 fields"}));
  Put<uint16_t>(b, 14, 0);
  ResealHeader(b);
  EXPECT_TRUE(
      Fails(ShardView::ParseStandalone(b, kKey), Code::kCorruption, {kKey, "index entry size 0"}));
}

TEST_F(ShardCorruption, WrongDatasetId) {
  ShardExpectation e = Expect();
  e.dataset_id[5] ^= 1;
  EXPECT_TRUE(Fails(ShardView::Parse(shard_, e), Code::kCorruption,
                    {kKey, "shard belongs to another dataset"}));
}

TEST_F(ShardCorruption, WrongShardNumber) {
  ShardExpectation e = Expect();
  e.shard_number = 4;
  EXPECT_TRUE(Fails(ShardView::Parse(shard_, e), Code::kCorruption,
                    {kKey, "shard number 3, manifest says 4"}));
}

TEST_F(ShardCorruption, WrongSampleCount) {
  ShardExpectation e = Expect();
  e.samples = kSamples + 1;
  EXPECT_TRUE(Fails(ShardView::Parse(shard_, e), Code::kCorruption,
                    {kKey, "header says 20 samples, manifest says 21"}));
  // Standalone: 0 samples, or more than fit in the object.
  for (uint32_t n : {0u, UINT32_MAX}) {
    Bytes b = shard_;
    Put<uint32_t>(b, 36, n);
    ResealHeader(b);
    EXPECT_TRUE(Fails(ShardView::ParseStandalone(b, kKey), Code::kCorruption,
                      {kKey, "header says " + std::to_string(n) + " samples"}))
        << n;
  }
  // More than the object has room for: with a valid header, the object is
  // what is short.
  Bytes b = shard_;
  Put<uint32_t>(b, 36, kSamples + 200);
  ResealHeader(b);
  EXPECT_TRUE(Fails(ShardView::ParseStandalone(b, kKey), Code::kCorruption,
                    {kKey, "truncated: 8192 bytes, expected"}));
}

TEST_F(ShardCorruption, IndexOffsetOutOfBounds) {
  for (uint64_t off : {uint64_t{0}, uint64_t{8}, uint64_t{65}, kMaxShardBytes, uint64_t{1} << 63,
                       UINT64_MAX - 7, UINT64_MAX}) {
    Bytes b = shard_;
    Put<uint64_t>(b, 40, off);
    ResealHeader(b);  // the index hash cannot be computed: the index is nowhere
    EXPECT_TRUE(Fails(ShardView::Parse(b, Expect()), Code::kCorruption,
                      {kKey, "index offset " + std::to_string(off) + " outside the object"}))
        << off;
    EXPECT_TRUE(Fails(ShardView::ParseStandalone(b, kKey), Code::kCorruption,
                      {kKey, "index offset " + std::to_string(off)}));
  }
  // Past the end of this object, but not of every shard: with a valid
  // header, the object is what is short.
  const uint64_t size = shard_.size();
  for (uint64_t off : {size - 8, size, size + 8}) {
    Bytes b = shard_;
    Put<uint64_t>(b, 40, off);
    ResealHeader(b);
    EXPECT_TRUE(Fails(ShardView::Parse(b, Expect()), Code::kCorruption,
                      {kKey, "truncated: 8192 bytes, expected 12288"}))
        << off;
  }
}

TEST_F(ShardCorruption, IndexOffsetInsideButWrong) {
  // Inside the object, but the object's size does not follow from it.
  Bytes b = shard_;
  Put<uint64_t>(b, 40, 64);
  EXPECT_TRUE(Fails(ParseResealed(b), Code::kCorruption, {kKey, "data after the index"}));
}

TEST_F(ShardCorruption, IndexHashHeaderVsManifest) {
  ShardExpectation e = Expect();
  e.index_hash ^= 1;
  EXPECT_TRUE(Fails(ShardView::Parse(shard_, e), Code::kCorruption, {kKey, "manifest says"}));
}

TEST_F(ShardCorruption, IndexChecksumMismatch) {
  // An index byte changed, the header (and manifest) left as they were.
  Bytes b = shard_;
  b[Entry(4) + 3] ^= std::byte{0x10};
  EXPECT_TRUE(
      Fails(ShardView::Parse(b, Expect()), Code::kCorruption, {kKey, "index checksum mismatch"}));
  EXPECT_TRUE(Fails(ShardView::ParseStandalone(b, kKey), Code::kCorruption,
                    {kKey, "index checksum mismatch"}));
}

TEST_F(ShardCorruption, EntryOffsetNotContiguous) {
  Bytes b = shard_;
  Put<uint64_t>(b, Entry(7), Get<uint64_t>(b, Entry(7)) + 1);
  EXPECT_TRUE(
      Fails(ParseResealed(b), Code::kCorruption, {kKey, "sample 7 (global 107): record offset"}));
  b = shard_;
  Put<uint64_t>(b, Entry(0), 0);
  EXPECT_TRUE(Fails(ParseResealed(b), Code::kCorruption,
                    {kKey, "sample 0 (global 100): record offset 0, expected 64"}));
}

TEST_F(ShardCorruption, EntryPaddingNotZero) {
  // One field: entries of 24 bytes, 4 of them padding.
  std::vector<FieldSpec> one = {{"blob", FieldType::kBytes}};
  ShardBuilder builder(one, TestId(8), kShardNo);
  Bytes img = RandomBytes(10, 1);
  FieldValue v[1] = {{img, 0}};
  ASSERT_TRUE(builder.Add(v).ok());
  ASSERT_TRUE(builder.Add(v).ok());
  uint64_t ih;
  Bytes b = builder.Finish(&ih);
  b[Get<uint64_t>(b, 40) + 24 + 21] = std::byte{1};
  ShardExpectation e{std::string(kKey), one,       kShardNo, TestId(8), 1, 2,
                     b.size(),          Reseal(b), kFirst};
  EXPECT_TRUE(Fails(ShardView::Parse(b, e), Code::kCorruption,
                    {kKey, "sample 1 (global 101): index entry padding is not zero"}));
}

TEST_F(ShardCorruption, FieldLengthsRunIntoIndex) {
  // The last record grown past index_offset.
  Bytes b = shard_;
  size_t len_at = Entry(kSamples - 1) + 16;
  Put<uint32_t>(b, len_at, Get<uint32_t>(b, len_at) + 8);
  EXPECT_TRUE(Fails(ParseResealed(b), Code::kCorruption,
                    {kKey, "sample 19 (global 119): record of", "runs into the index"}));
  // A huge length on the first sample: no overflow, no read past the end.
  b = shard_;
  Put<uint32_t>(b, Entry(0) + 16, UINT32_MAX);
  EXPECT_TRUE(Fails(ParseResealed(b), Code::kCorruption,
                    {kKey, "sample 0 (global 100)", "runs into the index"}));
  Put<uint32_t>(b, Entry(0) + 20, UINT32_MAX);  // without a schema, both fields can be huge
  Reseal(b);
  EXPECT_TRUE(Fails(ShardView::ParseStandalone(b, kKey), Code::kCorruption,
                    {kKey, "sample 0 (global 0)", "runs into the index"}));
}

TEST_F(ShardCorruption, Int64FieldLengthNot8) {
  // label 7 bytes, image 1 byte longer: offsets still add up.
  Bytes b = shard_;
  size_t e5 = Entry(5);
  Put<uint32_t>(b, e5 + 16, Get<uint32_t>(b, e5 + 16) + 1);
  Put<uint32_t>(b, e5 + 20, 7);
  EXPECT_TRUE(
      Fails(ParseResealed(b), Code::kCorruption,
            {kKey, "sample 5 (global 105): field 'label' (int64) has length 7, expected 8"}));
  // Without the schema it is a valid shard of two bytes fields.
  EXPECT_TRUE(ShardView::ParseStandalone(b, kKey).ok());
}

TEST_F(ShardCorruption, RecordsEndBeforeIndex) {
  // The last record shrunk by 8: records end 8 bytes before they should.
  Bytes b = shard_;
  size_t len_at = Entry(kSamples - 1) + 16;
  ASSERT_GE(Get<uint32_t>(b, len_at), 8u);
  Put<uint32_t>(b, len_at, Get<uint32_t>(b, len_at) - 8);
  EXPECT_TRUE(Fails(ParseResealed(b), Code::kCorruption,
                    {kKey, "records end at " + std::to_string(records_end_ - 8)}));
}

TEST_F(ShardCorruption, RecordChecksumMismatch) {
  Bytes b = shard_;
  uint64_t off = Get<uint64_t>(b, Entry(5));
  b[off + 2] ^= std::byte{0x40};
  // Records are not checked by Parse (the loader verifies each sample).
  auto v = ShardView::Parse(b, Expect());
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  for (uint32_t i = 0; i < kSamples; ++i) {
    if (i == 5) {
      EXPECT_TRUE(HasError(v->VerifySample(i), Code::kCorruption,
                           {std::string(kKey) + ": sample 5 (global 105): checksum mismatch"}));
    } else {
      EXPECT_TRUE(v->VerifySample(i).ok()) << i;
    }
  }
  // The label of the last sample (its last 8 bytes) is covered too.
  b = shard_;
  b[records_end_ - 1] ^= std::byte{1};
  v = ShardView::Parse(b, Expect());
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(HasError(v->VerifySample(kSamples - 1), Code::kCorruption,
                       {kKey, "sample 19 (global 119): checksum mismatch"}));
}

TEST_F(ShardCorruption, RecordHashInIndexChanged) {
  Bytes b = shard_;
  Put<uint64_t>(b, Entry(2) + 8, Get<uint64_t>(b, Entry(2) + 8) + 1);
  auto v = ParseResealed(b);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(HasError(v->VerifySample(2), Code::kCorruption,
                       {kKey, "sample 2 (global 102): checksum mismatch"}));
}

TEST_F(ShardCorruption, NonZeroPadding) {
  uint64_t index_end = Get<uint64_t>(shard_, 40) + kSamples * 24;
  // Before the index, and after it.
  for (uint64_t off :
       {records_end_, Get<uint64_t>(shard_, 40) - 1, index_end, uint64_t{shard_.size() - 1}}) {
    Bytes b = shard_;
    b[off] = std::byte{0xff};
    auto v = ShardView::Parse(b, Expect());
    ASSERT_TRUE(v.ok()) << off << ": " << v.status().ToString();
    EXPECT_TRUE(HasError(v->VerifyPadding(), Code::kCorruption,
                         {kKey, "non-zero padding at offset " + std::to_string(off)}));
  }
}

// Every single byte of a shard is under a check: flip any one and Parse,
// VerifySample or VerifyPadding fails; flip several and nothing crashes.
TEST_F(ShardCorruption, RandomFlips) {
  std::mt19937_64 rng(2024);
  auto detected = [&](const Bytes& b, bool standalone) {
    auto v = standalone ? ShardView::ParseStandalone(b, kKey) : ShardView::Parse(b, Expect());
    if (!v.ok()) {
      EXPECT_NE(v.status().message().find(kKey), std::string::npos) << v.status().ToString();
      return true;
    }
    bool bad = !v->VerifyPadding().ok();
    for (uint32_t i = 0; i < v->sample_count(); ++i) {
      bad |= !v->VerifySample(i).ok();
      for (uint32_t f = 0; f < v->field_count(); ++f) (void)v->Int64(i, f);
    }
    return bad;
  };
  for (int iter = 0; iter < 2000; ++iter) {
    Bytes b = shard_;
    size_t off = rng() % b.size();
    b[off] ^= std::byte(1 + rng() % 255);
    EXPECT_TRUE(detected(b, iter % 2 == 0)) << "flip at " << off << " undetected";
    // Several flips, some in the header and index: must not crash.
    Bytes c = shard_;
    int n = 1 + rng() % 8;
    for (int k = 0; k < n; ++k) {
      size_t o = rng() % 3 == 0 ? rng() % 64 : rng() % c.size();
      c[o] = std::byte(rng());
    }
    if (rng() % 4 == 0) Reseal(c);  // get past the hashes
    (void)detected(c, true);
  }
}

// ---- index-only views (per-sample reads) -------------------------------------

// The header and the index range of `b`, as the loader reads them.
Result<ShardView> ParseIndexOf(const Bytes& b, const ShardExpectation& e) {
  uint64_t offset, length;
  ShardView::IndexRange(e, &offset, &length);
  const Bytes header(b.begin(), b.begin() + std::min<size_t>(b.size(), kShardHeaderBytes));
  const size_t end = std::min<size_t>(b.size(), offset + length);
  const Bytes tail(b.begin() + std::min<size_t>(b.size(), offset), b.begin() + end);
  return ShardView::ParseIndex(header, tail, offset, e);
}

TEST_F(ShardCorruption, IndexOnlyViewAgreesWithTheWholeShard) {
  uint64_t offset, length;
  ShardView::IndexRange(Expect(), &offset, &length);
  EXPECT_EQ(offset + length, shard_.size());
  EXPECT_LT(length, shard_.size()) << "the index range is the tail, not the whole shard";
  auto whole = ShardView::Parse(shard_, Expect());
  auto index = ParseIndexOf(shard_, Expect());
  ASSERT_TRUE(whole.ok() && index.ok()) << index.status().ToString();
  ASSERT_EQ(index->sample_count(), kSamples);
  EXPECT_EQ(index->index_offset(), whole->index_offset());
  for (uint32_t i = 0; i < kSamples; ++i) {
    const auto rec = whole->Record(i);
    EXPECT_EQ(index->RecordOffset(i), uint64_t(rec.data() - shard_.data())) << i;
    EXPECT_EQ(index->FieldLength(i, 0), images_[i].size()) << i;
    EXPECT_EQ(index->FieldLength(i, 1), 8u) << i;
    EXPECT_TRUE(index->CheckRecord(i, Hash64(rec)).ok()) << i;
    EXPECT_TRUE(index->Record(i).empty()) << "an index-only view has no records";
  }
  const Status bad = index->CheckRecord(3, Hash64(whole->Record(4)));
  EXPECT_EQ(bad.code(), Code::kCorruption);
  EXPECT_EQ(bad.message(), std::string(kKey) + ": sample 3 (global 103): checksum mismatch");
  EXPECT_EQ(index->VerifySample(0).code(), Code::kInvalidArgument);
  EXPECT_EQ(index->VerifyPadding().code(), Code::kInvalidArgument);
  EXPECT_EQ(index->FieldLength(kSamples, 0), 0u);
  EXPECT_EQ(index->FieldLength(0, 2), 0u);
}

TEST_F(ShardCorruption, IndexOnlyViewDetectsWhatParseDetects) {
  // A flip in the header or the index range: Parse's error, also without
  // the records.
  uint64_t offset, length;
  ShardView::IndexRange(Expect(), &offset, &length);
  std::mt19937_64 rng(77);
  for (int iter = 0; iter < 500; ++iter) {
    Bytes b = shard_;
    const size_t at = iter % 2 ? rng() % kShardHeaderBytes : offset + rng() % length;
    b[at] ^= std::byte(1 + rng() % 255);
    auto whole = ShardView::Parse(b, Expect());
    auto index = ParseIndexOf(b, Expect());
    if (whole.ok()) {
      // Padding after the index: Parse takes it too (verify's full check
      // sees it); the index view must still agree.
      EXPECT_TRUE(index.ok()) << "flip at " << at << ": " << index.status().ToString();
      continue;
    }
    ASSERT_FALSE(index.ok()) << "flip at " << at << " undetected without the records";
    EXPECT_EQ(index.status().ToString(), whole.status().ToString()) << "flip at " << at;
  }
  // Bytes read short, into the index: named.
  const size_t index_end = Get<uint64_t>(shard_, 40) + kSamples * 24;
  const Bytes header(shard_.begin(), shard_.begin() + kShardHeaderBytes);
  const Bytes tail(shard_.begin() + offset, shard_.begin() + index_end - 1);
  EXPECT_TRUE(Fails(ShardView::ParseIndex(header, tail, offset, Expect()), Code::kCorruption,
                    {kKey, "outside the bytes read"}));
  EXPECT_TRUE(Fails(ShardView::ParseIndex({header.data(), 63}, tail, offset, Expect()),
                    Code::kCorruption, {kKey, "truncated: 63 bytes"}));
}

// ---- manifest ---------------------------------------------------------------

constexpr std::string_view kWhere = "file:///data/ds/manifest.stoker";

// A header line for `body`, as EncodeManifest and EncodeManifestV1 write it.
std::string Seal(std::string_view body, uint32_t version = 1) {
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(body.data(), body.size())));
  return "STOKER-DATASET " + std::to_string(version) + " " + std::to_string(body.size()) + " " +
         hash + "\n" + std::string(body);
}

Result<Manifest> Decode(std::string_view text) { return DecodeManifest(AsBytes(text), kWhere); }

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    d_ = MakeDataset(300, 64 << 10, 11);
    d_.m.format_version = 1;
    ASSERT_GE(d_.m.shards.size(), 3u);
    text_ = EncodeManifestV1(d_.m);
    body_ = nlohmann::ordered_json::parse(text_.substr(text_.find('\n') + 1));
  }
  // The valid body with `edit` applied, sealed and decoded.
  template <typename F>
  Result<Manifest> DecodeEdited(F edit) {
    nlohmann::ordered_json j = body_;
    edit(j);
    return Decode(Seal(j.dump()));
  }

  Dataset d_;
  std::string text_;
  nlohmann::ordered_json body_;
};

void ExpectSameManifest(const Manifest& a, const Manifest& b) {
  EXPECT_EQ(a.format_version, b.format_version);
  EXPECT_EQ(a.dataset_id, b.dataset_id);
  EXPECT_EQ(a.created_by, b.created_by);
  ASSERT_EQ(a.fields.size(), b.fields.size());
  for (size_t i = 0; i < a.fields.size(); ++i) {
    EXPECT_EQ(a.fields[i].name, b.fields[i].name);
    EXPECT_EQ(a.fields[i].type, b.fields[i].type);
  }
  EXPECT_EQ(a.classes, b.classes);
  EXPECT_EQ(a.sample_count, b.sample_count);
  EXPECT_EQ(a.payload_bytes, b.payload_bytes);
  EXPECT_EQ(a.max_sample_bytes, b.max_sample_bytes);
  ASSERT_EQ(a.shards.size(), b.shards.size());
  for (size_t i = 0; i < a.shards.size(); ++i) {
    EXPECT_EQ(a.shards[i].key, b.shards[i].key);
    EXPECT_EQ(a.shards[i].bytes, b.shards[i].bytes);
    EXPECT_EQ(a.shards[i].samples, b.shards[i].samples);
    EXPECT_EQ(a.shards[i].first_sample, b.shards[i].first_sample);
    EXPECT_EQ(a.shards[i].index_hash, b.shards[i].index_hash);
  }
}

// ManifestTest is the format 1 manifest (§2.5), which lists its shards: what
// older stokers wrote and this one still reads. Format 2 is ManifestV2Test.
TEST_F(ManifestTest, RoundTrip) {
  EXPECT_EQ(text_.rfind("STOKER-DATASET 1 ", 0), 0u);
  auto m = Decode(text_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSameManifest(*m, d_.m);
  EXPECT_EQ(EncodeManifestV1(*m), text_);  // deterministic
  // Every shard parses against its expectation from the decoded manifest.
  for (uint32_t i = 0; i < m->shards.size(); ++i) {
    auto v = ShardView::Parse(d_.shards[i], ExpectationFor(*m, i));
    EXPECT_TRUE(v.ok()) << v.status().ToString();
  }
}

TEST_F(ManifestTest, EmptyDatasetIsValid) {
  Manifest m;
  m.dataset_id = TestId(1);
  m.fields = ImageLabel();
  auto d = Decode(EncodeManifestV1(m));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->sample_count, 0u);
  EXPECT_TRUE(d->shards.empty());
}

TEST_F(ManifestTest, UnknownKeysAndWhitespaceAccepted) {
  nlohmann::ordered_json j = body_;
  j["comment"] = "added by a later v1 writer";
  j["shards"][0]["extra"] = {1, 2};
  auto m = Decode(Seal(j.dump(2)));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSameManifest(*m, d_.m);
}

TEST_F(ManifestTest, BadHeaderLine) {
  const std::string body = text_.substr(text_.find('\n') + 1);
  const std::string hash = text_.substr(text_.find('\n') - 16, 16);
  const std::string len = std::to_string(body.size());
  const std::string bad[] = {
      "",
      "STOKER",
      "{\"format_version\":1}",
      "stoker-dataset 1 " + len + " " + hash + "\n" + body,
      "STOKER-DATASET 1 " + len + " " + hash,  // no newline at all
      "STOKER-DATASET 1 " + len + " " + hash + std::string(200, ' ') + "\n" + body,
      "STOKER-DATASET x " + len + " " + hash + "\n" + body,
      "STOKER-DATASET 01 " + len + " " + hash + "\n" + body,
      "STOKER-DATASET -1 " + len + " " + hash + "\n" + body,
      "STOKER-DATASET  1 " + len + " " + hash + "\n" + body,
      "STOKER-DATASET 1\n" + body,
      "STOKER-DATASET 1 " + len + "\n" + body,
      "STOKER-DATASET 1 0" + len + " " + hash + "\n" + body,
      "STOKER-DATASET 1 +" + len + " " + hash + "\n" + body,
      "STOKER-DATASET 1 99999999999999999999999 " + hash + "\n" + body,
      "STOKER-DATASET 1 " + len + "  " + hash + "\n" + body,
      "STOKER-DATASET 1 " + len + " " + hash + " \n" + body,
      "STOKER-DATASET 1 " + len + " " + hash + "\r\n" + body,
      "STOKER-DATASET 1 " + len + " " + hash.substr(1) + "\n" + body,
      "STOKER-DATASET 1 " + len + " 0x" + hash.substr(2) + "\n" + body,
      "STOKER-DATASET 1 " + len + " ABCDEF0123456789\n" + body,
  };
  for (const std::string& t : bad) {
    EXPECT_TRUE(Fails(Decode(t), Code::kCorruption, {kWhere})) << t.substr(0, 80);
    auto r = Decode(t);
    if (!r.ok()) {
      EXPECT_EQ(r.status().message().rfind(kWhere, 0), 0u);
    }
  }
}

TEST_F(ManifestTest, NewerVersionIsUnsupported) {
  std::string body = text_.substr(text_.find('\n') + 1);
  EXPECT_TRUE(Fails(Decode(Seal(body, 4)), Code::kUnsupported,
                    {kWhere, "written by a newer stoker (format v4; this build reads v3)"}));
  // A v1 body under a v2 header line.
  EXPECT_TRUE(Fails(Decode(Seal(body, 2)), Code::kCorruption,
                    {kWhere, "format_version: 1, header says 2"}));
  // The rest of a newer header line is not this version's business.
  EXPECT_TRUE(
      Fails(Decode("STOKER-DATASET 7 whatever comes next\n"), Code::kUnsupported, {"format v7"}));
  EXPECT_TRUE(Fails(Decode(Seal(body, 0)), Code::kCorruption, {kWhere, "format version 0"}));
  // Body and header disagree.
  nlohmann::ordered_json j = body_;
  j["format_version"] = 2;
  EXPECT_TRUE(Fails(Decode(Seal(j.dump())), Code::kCorruption,
                    {kWhere, "format_version: 2, header says 1"}));
}

TEST_F(ManifestTest, LengthMismatch) {
  EXPECT_TRUE(Fails(Decode(text_.substr(0, text_.size() - 1)), Code::kCorruption,
                    {kWhere, "truncated: body is"}));
  EXPECT_TRUE(Fails(Decode(text_ + " "), Code::kCorruption, {kWhere, "header says"}));
  size_t nl = text_.find('\n');
  EXPECT_TRUE(Fails(Decode(text_.substr(0, nl + 1)), Code::kCorruption, {kWhere, "truncated"}));
}

TEST_F(ManifestTest, BodyChecksumMismatch) {
  std::string t = text_;
  size_t at = t.find("\"cat\"");
  ASSERT_NE(at, std::string::npos);
  t[at + 1] = 'b';  // "bat": still valid JSON, hash no longer matches
  EXPECT_TRUE(Fails(Decode(t), Code::kCorruption, {kWhere, "body checksum mismatch"}));
}

TEST_F(ManifestTest, InvalidJson) {
  const std::string bodies[] = {
      "",
      "{",
      "{\"format_version\":1,}",
      "{\"format_version\":1} x",
      "{\"format_version\":1} {}",
      "/* c */ {\"format_version\":1}",
      "{\"a\":\"\xff\xfe\"}",  // invalid UTF-8 in a string
      "{\"a\":\"\xc3\"}",      // truncated UTF-8 sequence
      "{\"a\":1,\"a\":2}",     // duplicate key
      "{\"fields\":[{\"name\":\"x\",\"name\":\"y\"}]}",
      std::string(1000, '[') + std::string(1000, ']'),
      "{\"a\":" + std::string(10, '[') + std::string(10, ']') + "}",
      "\xef\xbb\xbf{}",  // BOM
      "{'a':1}",
      "{\"a\":NaN}",
  };
  for (const std::string& b : bodies) {
    EXPECT_TRUE(Fails(Decode(Seal(b)), Code::kCorruption, {kWhere, "invalid JSON"})) << b;
  }
  EXPECT_TRUE(Fails(Decode(Seal("{\"a\":1,\"a\":2}")), Code::kCorruption, {"duplicate key \"a\""}));
  EXPECT_TRUE(Fails(Decode(Seal(std::string(100000, '['))), Code::kCorruption, {"nested"}));
  // Valid JSON, but not an object.
  for (const char* b : {"[]", "1", "\"x\"", "null"}) {
    EXPECT_TRUE(Fails(Decode(Seal(b)), Code::kCorruption, {kWhere, "expected an object"})) << b;
  }
}

TEST_F(ManifestTest, MissingKeys) {
  for (const char* key : {"format_version", "dataset_id", "created_by", "fields", "classes",
                          "sample_count", "payload_bytes", "max_sample_bytes", "shards"}) {
    EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j.erase(key); }), Code::kCorruption,
                      {kWhere, "missing key \"" + std::string(key) + "\""}))
        << key;
  }
  for (const char* key : {"name", "type"}) {
    EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["fields"][1].erase(key); }), Code::kCorruption,
                      {kWhere, "missing key \"fields[1]." + std::string(key) + "\""}))
        << key;
  }
  for (const char* key : {"key", "bytes", "samples", "first_sample", "index_hash"}) {
    EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["shards"][2].erase(key); }), Code::kCorruption,
                      {kWhere, "missing key \"shards[2]." + std::string(key) + "\""}))
        << key;
  }
}

TEST_F(ManifestTest, WrongTypes) {
  using J = nlohmann::ordered_json;
  struct Case {
    std::vector<std::string> path;  // keys and array indices
    J value;
    std::string name;  // as the message spells it
  };
  const Case cases[] = {
      {{"format_version"}, "1", "format_version: expected an unsigned integer, got string"},
      {{"format_version"}, 1.0, "format_version: expected an unsigned integer, got number"},
      {{"format_version"}, uint64_t{1} << 32, "format_version: 4294967296 is larger"},
      {{"dataset_id"}, 5, "dataset_id: expected a string, got number"},
      {{"created_by"}, nullptr, "created_by: expected a string, got null"},
      {{"fields"}, J::object(), "fields: expected an array, got object"},
      {{"fields", "0"}, "image", "fields[0]: expected an object, got string"},
      {{"fields", "0", "name"}, 3, "fields[0].name: expected a string"},
      {{"fields", "1", "type"}, true, "fields[1].type: expected a string, got boolean"},
      {{"classes"}, "cat", "classes: expected an array, got string"},
      {{"classes", "1"}, 1, "classes[1]: expected a string, got number"},
      {{"sample_count"}, -1, "sample_count: expected an unsigned integer"},
      {{"sample_count"}, 1e30, "sample_count: expected an unsigned integer"},
      {{"payload_bytes"}, "12", "payload_bytes: expected an unsigned integer"},
      {{"max_sample_bytes"}, J::array(), "max_sample_bytes: expected an unsigned integer"},
      {{"shards"}, J::object(), "shards: expected an array, got object"},
      {{"shards", "1"}, J::array(), "shards[1]: expected an object, got array"},
      {{"shards", "1", "key"}, 1, "shards[1].key: expected a string"},
      {{"shards", "1", "bytes"}, -4096, "shards[1].bytes: expected an unsigned integer"},
      {{"shards", "1", "bytes"}, 4096.0, "shards[1].bytes: expected an unsigned integer"},
      {{"shards", "1", "samples"}, uint64_t{1} << 32, "shards[1].samples: 4294967296 is larger"},
      {{"shards", "1", "first_sample"}, "0", "shards[1].first_sample: expected an unsigned"},
      {{"shards", "1", "index_hash"}, 12345, "shards[1].index_hash: expected a string"},
  };
  for (const Case& c : cases) {
    auto r = DecodeEdited([&](J& j) {
      J* at = &j;
      for (const std::string& p : c.path) {
        at = at->is_array() ? &(*at)[std::stoul(p)] : &(*at)[p];
      }
      *at = c.value;
    });
    EXPECT_TRUE(Fails(r, Code::kCorruption, {kWhere, c.name})) << c.name;
  }
}

TEST_F(ManifestTest, BadDatasetId) {
  for (const char* id :
       {"", "00", "000102030405060708090a0b0c0d0e0", "000102030405060708090A0B0C0D0E0F",
        "000102030405060708090a0b0c0d0e0g", "000102030405060708090a0b0c0d0e0f00"}) {
    EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["dataset_id"] = id; }), Code::kCorruption,
                      {kWhere, "dataset_id: '"}))
        << id;
  }
}

TEST_F(ManifestTest, BadFields) {
  using J = nlohmann::ordered_json;
  EXPECT_TRUE(Fails(DecodeEdited([](J& j) { j["fields"] = J::array(); }), Code::kCorruption,
                    {kWhere, "fields: 0 fields, expected 1..64"}));
  EXPECT_TRUE(
      Fails(DecodeEdited([](J& j) {
              for (int i = 2; i < 65; ++i) {
                j["fields"].push_back({{"name", "f" + std::to_string(i)}, {"type", "bytes"}});
              }
            }),
            Code::kCorruption, {kWhere, "fields: 65 fields"}));
  EXPECT_TRUE(Fails(DecodeEdited([](J& j) { j["fields"][1]["name"] = "image"; }), Code::kCorruption,
                    {kWhere, "fields[1].name: duplicate field name 'image'"}));
  for (std::string name : {std::string(), std::string("a-b"), std::string("é"), std::string("a b"),
                           std::string(65, 'x')}) {
    EXPECT_TRUE(Fails(DecodeEdited([&](J& j) { j["fields"][0]["name"] = name; }), Code::kCorruption,
                      {kWhere, "fields[0].name: '"}))
        << name;
  }
  EXPECT_TRUE(DecodeEdited([](J& j) { j["fields"][0]["name"] = std::string(64, 'x'); }).ok());
  for (const char* type : {"float32", "Bytes", "", "int32"}) {
    EXPECT_TRUE(Fails(DecodeEdited([&](J& j) { j["fields"][1]["type"] = type; }), Code::kCorruption,
                      {kWhere, "fields[1].type: unknown field type '" + std::string(type) + "'"}));
  }
}

TEST_F(ManifestTest, NonContiguousFirstSample) {
  EXPECT_TRUE(Fails(DecodeEdited([](auto& j) {
                      j["shards"][1]["first_sample"] =
                          j["shards"][1]["first_sample"].template get<uint64_t>() + 1;
                    }),
                    Code::kCorruption, {kWhere, "shards[1].first_sample", "expected"}));
  EXPECT_TRUE(Fails(DecodeEdited([](auto& j) { j["shards"][0]["first_sample"] = 1; }),
                    Code::kCorruption, {kWhere, "shards[0].first_sample: 1, expected 0"}));
  // Two shards swapped.
  EXPECT_TRUE(Fails(DecodeEdited([](auto& j) { std::swap(j["shards"][0], j["shards"][1]); }),
                    Code::kCorruption, {kWhere, "shards[0].first_sample"}));
}

TEST_F(ManifestTest, SampleCountMismatch) {
  EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["sample_count"] = d_.m.sample_count + 1; }),
                    Code::kCorruption, {kWhere, "sample_count", "but the shards hold"}));
  EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["shards"].erase(j["shards"].size() - 1); }),
                    Code::kCorruption, {kWhere, "sample_count"}));
}

TEST_F(ManifestTest, BadShardKeys) {
  for (std::string key :
       {std::string("../x"), std::string("a/../../x"), std::string("/abs"), std::string("a//b"),
        std::string("a/./b"), std::string("a/"), std::string(""), std::string("."),
        std::string("manifest.stoker"), std::string("sp ace"), std::string("a\\b"),
        std::string("x\ny"), std::string(513, 'k')}) {
    EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["shards"][1]["key"] = key; }),
                      Code::kCorruption, {kWhere, "shards[1].key: bad key"}))
        << key;
  }
  EXPECT_TRUE(DecodeEdited([](auto& j) { j["shards"][1]["key"] = "a/b-c/d_e.0"; }).ok());
}

TEST_F(ManifestTest, DuplicateShardKeys) {
  EXPECT_TRUE(Fails(DecodeEdited([](auto& j) { j["shards"][2]["key"] = j["shards"][0]["key"]; }),
                    Code::kCorruption,
                    {kWhere, "shards[2].key: duplicate key 'shards/000000.stks'"}));
}

TEST_F(ManifestTest, BadShardBytes) {
  const std::pair<uint64_t, const char*> cases[] = {
      {4097, "is not a multiple of 4096"}, {4095, "is not a multiple of 4096"},
      {0, "is outside 4096..4294967296"},  {kMaxShardBytes + 4096, "is outside"},
      {UINT64_MAX - 4095, "is outside"},
  };
  for (auto [bytes, what] : cases) {
    EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["shards"][1]["bytes"] = bytes; }),
                      Code::kCorruption, {kWhere, "shards[1].bytes: ", what}))
        << bytes;
  }
}

TEST_F(ManifestTest, BadShardSamples) {
  EXPECT_TRUE(Fails(DecodeEdited([](auto& j) { j["shards"][1]["samples"] = 0; }), Code::kCorruption,
                    {kWhere, "shards[1].samples: 0 is outside"}));
  // 4096-byte shard: at most (4096-64)/24 = 168 samples.
  EXPECT_TRUE(Fails(DecodeEdited([](auto& j) {
                      j["shards"][0]["bytes"] = 4096;
                      j["shards"][0]["samples"] = 169;
                    }),
                    Code::kCorruption, {kWhere, "shards[0].samples: 169 is outside 1..168"}));
}

TEST_F(ManifestTest, BadIndexHash) {
  for (const char* h : {"", "123", "0123456789ABCDEF", "0123456789abcdeg", "0123456789abcdef0"}) {
    EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["shards"][0]["index_hash"] = h; }),
                      Code::kCorruption, {kWhere, "shards[0].index_hash: '"}))
        << h;
  }
}

TEST_F(ManifestTest, InconsistentTotals) {
  const uint64_t n = d_.m.sample_count;
  EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["payload_bytes"] = n * 8 - 1; }),
                    Code::kCorruption, {kWhere, "payload_bytes", "8 bytes per sample"}));
  EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["payload_bytes"] = uint64_t{1} << 40; }),
                    Code::kCorruption, {kWhere, "payload_bytes", "does not fit"}));
  EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["max_sample_bytes"] = d_.m.payload_bytes + 1; }),
                    Code::kCorruption, {kWhere, "max_sample_bytes", "larger than payload_bytes"}));
  EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) { j["max_sample_bytes"] = 8; }), Code::kCorruption,
                    {kWhere, "max_sample_bytes", "less than payload_bytes"}));
  EXPECT_TRUE(Fails(DecodeEdited([&](auto& j) {
                      j["max_sample_bytes"] = 7;
                      j["payload_bytes"] = 7;
                    }),
                    Code::kCorruption, {kWhere, "payload_bytes"}));
  // Empty dataset with a payload.
  Manifest m;
  m.dataset_id = TestId(1);
  m.fields = ImageLabel();
  m.payload_bytes = 1;
  EXPECT_TRUE(Fails(Decode(EncodeManifestV1(m)), Code::kCorruption, {kWhere, "payload_bytes"}));
}

TEST_F(ManifestTest, ExceptionsNeverEscape) {
  // Inputs that make nlohmann throw on access if the decoder were careless.
  using J = nlohmann::ordered_json;
  EXPECT_FALSE(DecodeEdited([](J& j) { j["shards"][0] = J::array({1, 2}); }).ok());
  EXPECT_FALSE(DecodeEdited([](J& j) { j["fields"][0] = nullptr; }).ok());
  EXPECT_FALSE(DecodeEdited([](J& j) { j["classes"] = J::array({J::object()}); }).ok());
}

// Every single-byte change of a manifest is detected; several never crash.
TEST_F(ManifestTest, RandomFlips) {
  std::mt19937_64 rng(77);
  const std::string body = text_.substr(text_.find('\n') + 1);
  for (int iter = 0; iter < 2000; ++iter) {
    std::string t = text_;
    size_t off = rng() % t.size();
    t[off] = static_cast<char>(t[off] ^ (1 + rng() % 255));
    auto r = Decode(t);
    EXPECT_FALSE(r.ok()) << "flip at " << off << " undetected";
    if (!r.ok()) {
      EXPECT_EQ(r.status().message().rfind(kWhere, 0), 0u);
    }
    // Flips in the body, resealed: gets past the checksum to the JSON checks.
    std::string b = body;
    int n = 1 + rng() % 4;
    for (int k = 0; k < n; ++k) b[rng() % b.size()] = static_cast<char>(rng());
    auto r2 = Decode(Seal(b));
    if (r2.ok()) {
      // Whatever was accepted re-encodes to something equivalent.
      auto again = Decode(EncodeManifestV1(*r2));
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      ExpectSameManifest(*again, *r2);
    } else {
      EXPECT_EQ(r2.status().message().rfind(kWhere, 0), 0u) << r2.status().ToString();
    }
  }
}

// ---- shard table (ShardTable in memory) -----------------------------------------

TEST(ShardTableTest, KeysFollowTheShardNumberUnlessTheyDoNot) {
  ShardTable t;
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t.total_samples(), 0u);
  EXPECT_EQ(t.ShardOf(0), -1);
  t.push_back({ShardKey(0), 8192, 3, 0, 11});
  t.AppendNumbered(4096, 1, 22);
  t.push_back({ShardKey(2), 4096, 5, 999, 33});  // first_sample comes from the counts
  ASSERT_EQ(t.size(), 3u);
  EXPECT_FALSE(t.has_own_keys());
  EXPECT_EQ(t.key(1), "shards/000001.stks");
  EXPECT_EQ(t.bytes(0), 8192u);
  EXPECT_EQ(t.samples(2), 5u);
  EXPECT_EQ(t.first_sample(2), 4u);
  EXPECT_EQ(t.index_hash(1), 22u);
  EXPECT_EQ(t.total_samples(), 9u);
  EXPECT_EQ(t.total_bytes(), 16384u);
  const ShardInfo s = t[2];
  EXPECT_EQ(s.key, ShardKey(2));
  EXPECT_EQ(s.first_sample, 4u);
  EXPECT_EQ(t.back().index_hash, 33u);
  const int64_t want[] = {0, 0, 0, 1, 2, 2, 2, 2, 2, -1};
  for (uint64_t x = 0; x < 10; ++x) EXPECT_EQ(t.ShardOf(x), want[x]) << x;
  EXPECT_EQ(t.Find("shards/000002.stks"), 2);
  EXPECT_EQ(t.Find("shards/000003.stks"), -1);   // past the end
  EXPECT_EQ(t.Find("shards/0000002.stks"), -1);  // not as ShardKey writes it
  EXPECT_EQ(t.Find("shards/00002.stks"), -1);
  EXPECT_EQ(t.Find("x/000002.stks"), -1);
  std::vector<uint32_t> samples;
  for (const auto& info : t) samples.push_back(info.samples);
  EXPECT_EQ(samples, (std::vector<uint32_t>{3, 1, 5}));
  EXPECT_EQ(t.begin()->bytes, 8192u);

  // A key of its own (a v1 manifest's): from then on every key is kept.
  t.push_back({"other/a", 4096, 1, 9, 44});
  EXPECT_TRUE(t.has_own_keys());
  EXPECT_EQ(t.key(0), ShardKey(0));
  EXPECT_EQ(t.key(3), "other/a");
  EXPECT_EQ(t.Find("other/a"), 3);
  EXPECT_EQ(t.Find(ShardKey(1)), 1);
  t.AppendNumbered(4096, 1, 55);
  EXPECT_EQ(t.key(4), ShardKey(4));
  t.clear();
  EXPECT_TRUE(t.empty());
  EXPECT_FALSE(t.has_own_keys());
  EXPECT_EQ(t.total_samples(), 0u);
}

// Found by the manifest fuzzer: shard 0's own key was dropped (the table
// then named it shards/000000.stks, which shard 1 had).
TEST(ShardTableTest, TheFirstShardsOwnKeyIsKept) {
  ShardTable t;
  t.push_back({"shards/551615.stks", kShardAlignment, 32, 0, 1});
  t.push_back({"shards/000000.stks", kShardAlignment, 8, 32, 2});
  EXPECT_TRUE(t.has_own_keys());
  EXPECT_EQ(t.key(0), "shards/551615.stks");
  EXPECT_EQ(t.key(1), "shards/000000.stks");
  EXPECT_EQ(t.Find("shards/551615.stks"), 0);
  EXPECT_EQ(t.Find("shards/000000.stks"), 1);
}

TEST(ShardTableTest, ShardKeyNumber) {
  EXPECT_EQ(ShardKeyNumber("shards/000000.stks"), 0);
  EXPECT_EQ(ShardKeyNumber("shards/1234567.stks"), 1234567);
  EXPECT_EQ(ShardKeyNumber("shards/4294967295.stks"), int64_t{UINT32_MAX});
  EXPECT_EQ(ShardKeyNumber("shards/4294967296.stks"), -1);
  EXPECT_EQ(ShardKeyNumber("shards/01234567.stks"), -1);
  EXPECT_EQ(ShardKeyNumber("shards/00000a.stks"), -1);
  EXPECT_EQ(ShardKeyNumber("shards/000000.stk"), -1);
  EXPECT_EQ(ShardKeyNumber(""), -1);
}

// A million shards with keys made from their numbers: no string is kept.
TEST(ShardTableTest, AMillionShardsKeepNoKeys) {
  constexpr size_t kShards = 1'000'000;
  ShardTable t;
  t.reserve(kShards);
  for (size_t i = 0; i < kShards; ++i) t.AppendNumbered(4 << 20, 100, i);
  EXPECT_FALSE(t.has_own_keys());
  EXPECT_EQ(t.total_samples(), kShards * 100);
  EXPECT_EQ(t.ShardOf(kShards * 100 - 1), int64_t{kShards - 1});
  EXPECT_EQ(t.key(kShards - 1), "shards/999999.stks");
  EXPECT_EQ(t.Find("shards/999999.stks"), int64_t{kShards - 1});
}

// ---- shard table (the file, §7) ----------------------------------------------------

constexpr std::string_view kTableWhere = "file:///data/ds/shards.table";

// Independent of the library: recomputes the block checksums, their hash
// and the header hash of a table (§7.1) from its header's counts, where they
// lie inside `t`; points the manifest at the result.
void ResealTable(Bytes& t, Manifest* m) {
  const uint64_t records = Get<uint64_t>(t, 16);
  const uint32_t k = Get<uint32_t>(t, 40);
  const uint32_t blocks = Get<uint32_t>(t, 44);
  const uint64_t at = 64 + 8ull * blocks;
  for (uint32_t b = 0; b < blocks && k > 0; ++b) {
    const uint64_t first = uint64_t{b} * k;
    const uint64_t count = first < records ? std::min<uint64_t>(k, records - first) : 0;
    const uint64_t off = at + first * 24;
    if (off + count * 24 <= t.size() && 64 + 8 * (b + 1) <= t.size()) {
      Put<uint64_t>(t, 64 + 8 * b, XXH3_64bits(t.data() + off, count * 24));
    }
  }
  if (at <= t.size()) Put<uint64_t>(t, 48, XXH3_64bits(t.data() + 64, 8ull * blocks));
  Put<uint64_t>(t, 56, XXH3_64bits(t.data(), 56));
  m->table.header_hash = Get<uint64_t>(t, 56);
  m->table.bytes = t.size();
}

class ShardTableFile : public ::testing::Test {
 protected:
  void SetUp() override {
    // A shard count that leaves the last block of 4 short.
    for (uint64_t target = 16 << 10; d_.m.shards.size() % 4 == 0; target += 4096) {
      d_ = MakeDataset(300, target, 12, 1500);
    }
    ASSERT_GE(d_.m.shards.size(), 10u);
    // Blocks of 4 records: several blocks, the last one short.
    table_ = EncodeShardTable(d_.m, &d_.m.table, 4);
    ASSERT_NE(d_.m.shards.size() % 4, 0u) << "the last block should be short";
    text_ = EncodeManifest(d_.m);
    auto m = DecodeManifest(AsBytes(text_), kWhere);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    m_ = *m;
  }
  // Decodes `t` against a copy of the manifest, after `edit` of the copy.
  template <typename F>
  Result<Manifest> DecodeTable(const Bytes& t, F edit) {
    Manifest m = m_;
    edit(m);
    STOKER_RETURN_IF_ERROR(DecodeShardTable(t, kTableWhere, &m));
    return m;
  }
  Result<Manifest> DecodeTable(const Bytes& t) {
    return DecodeTable(t, [](Manifest&) {});
  }
  // `t` changed by `edit`, resealed, decoded against a manifest naming it.
  template <typename F>
  Result<Manifest> DecodeEditedTable(F edit) {
    Bytes t = table_;
    edit(t);
    Manifest m = m_;
    ResealTable(t, &m);
    STOKER_RETURN_IF_ERROR(DecodeShardTable(t, kTableWhere, &m));
    return m;
  }
  size_t blocks() const { return (d_.m.shards.size() + 3) / 4; }
  size_t record(size_t i) const { return 64 + 8 * blocks() + 24 * i; }

  Dataset d_;
  Bytes table_;
  std::string text_;
  Manifest m_;  // decoded, without its shards
};

TEST_F(ShardTableFile, RoundTrip) {
  EXPECT_EQ(text_.rfind("STOKER-DATASET 2 ", 0), 0u);
  const auto body = nlohmann::json::parse(text_.substr(text_.find('\n') + 1));
  EXPECT_FALSE(body.contains("shards")) << "the shards are in the table";
  EXPECT_EQ(body["shard_table"]["key"], "shards.table");
  EXPECT_EQ(body["shard_table"]["records"], d_.m.shards.size());
  EXPECT_EQ(m_.format_version, 2u);
  EXPECT_TRUE(m_.shards.empty());
  EXPECT_EQ(m_.table.key, kShardTableKey);
  EXPECT_EQ(m_.table.records, d_.m.shards.size());
  EXPECT_EQ(m_.table.bytes, table_.size());
  EXPECT_EQ(table_.size(), 64 + 8 * blocks() + 24 * d_.m.shards.size());
  EXPECT_EQ(std::memcmp(table_.data(), "STOKSTBL", 8), 0);
  auto m = DecodeTable(table_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSameManifest(*m, d_.m);
  EXPECT_EQ(EncodeManifest(*m), text_);  // deterministic
  ShardTableRef again;
  EXPECT_TRUE(EncodeShardTable(*m, &again, 4) == table_);
  for (uint32_t i = 0; i < m->shards.size(); ++i) {
    auto v = ShardView::Parse(d_.shards[i], ExpectationFor(*m, i));
    EXPECT_TRUE(v.ok()) << v.status().ToString();
  }
  // The writer's blocks (65536 records): one block here, the same shards.
  ShardTableRef ref;
  const Bytes one = EncodeShardTable(d_.m, &ref);
  EXPECT_EQ(one.size(), 64 + 8 + 24 * d_.m.shards.size());
  Manifest m1 = m_;
  m1.table = ref;
  ASSERT_TRUE(DecodeShardTable(one, kTableWhere, &m1).ok());
  ExpectSameManifest(m1, d_.m);
}

TEST_F(ShardTableFile, TheManifestStaysSmallWhateverTheShards) {
  Manifest big = d_.m;
  big.shards.clear();
  big.sample_count = 0;
  for (uint32_t i = 0; i < 200000; ++i) big.shards.AppendNumbered(4 << 20, 100, i);
  big.sample_count = big.shards.total_samples();
  big.payload_bytes = big.sample_count * 100;
  big.max_sample_bytes = 100;
  const Bytes table = EncodeShardTable(big, &big.table);
  EXPECT_EQ(table.size(), 64 + 8 * 4 + 24 * 200000u);  // 4 blocks of 65536
  const std::string text = EncodeManifest(big);
  EXPECT_LT(text.size(), 600u);
  EXPECT_LT(text.size(), text_.size() + 40) << "O(1) in the shards";
  auto m = DecodeManifest(AsBytes(text), kWhere);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_TRUE(DecodeShardTable(table, kTableWhere, &*m).ok());
  EXPECT_EQ(m->shards.size(), 200000u);
  EXPECT_EQ(m->shards.first_sample(199999), 19999900u);
}

TEST_F(ShardTableFile, StreamedInPiecesAsReadWhole) {
  ShardTableReader r(m_, std::string(kTableWhere));
  ASSERT_TRUE(r.Header(std::span(table_).first(64), table_.size()).ok());
  EXPECT_EQ(r.block_count(), blocks());
  EXPECT_EQ(r.record_count(), d_.m.shards.size());
  ASSERT_TRUE(r.Sums(std::span(table_).subspan(r.sums_offset(), r.sums_bytes())).ok());
  std::vector<ShardInfo> seen;
  for (uint32_t b = 0; b < r.block_count(); ++b) {
    uint64_t offset, length;
    r.BlockRange(b, &offset, &length);
    ASSERT_TRUE(
        r.Block(b, std::span(table_).subspan(offset, length), [&](uint32_t i, const ShardInfo& s) {
           EXPECT_EQ(i, seen.size());
           seen.push_back(s);
         }).ok());
  }
  ASSERT_TRUE(r.Finish().ok());
  ASSERT_EQ(seen.size(), d_.m.shards.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    const ShardInfo want = d_.m.shards[i];
    EXPECT_EQ(seen[i].key, want.key);
    EXPECT_EQ(seen[i].bytes, want.bytes);
    EXPECT_EQ(seen[i].samples, want.samples);
    EXPECT_EQ(seen[i].first_sample, want.first_sample);
    EXPECT_EQ(seen[i].index_hash, want.index_hash);
  }
  // Out of order, and finishing early: the caller's mistakes.
  ShardTableReader early(m_, std::string(kTableWhere));
  ASSERT_TRUE(early.Header(std::span(table_).first(64), table_.size()).ok());
  ASSERT_TRUE(early.Sums(std::span(table_).subspan(64, 8 * blocks())).ok());
  ShardTable t;
  EXPECT_EQ(early.Block(1, std::span(table_).subspan(record(4), 96), &t).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(early.Finish().code(), Code::kInvalidArgument);
}

TEST_F(ShardTableFile, EmptyDatasetHasAnEmptyTable) {
  Manifest m;
  m.dataset_id = TestId(3);
  m.fields = ImageLabel();
  const Bytes t = EncodeShardTable(m, &m.table);
  EXPECT_EQ(t.size(), 64u);
  auto d = DecodeManifest(AsBytes(EncodeManifest(m)), kWhere);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(DecodeShardTable(t, kTableWhere, &*d).ok());
  EXPECT_TRUE(d->shards.empty());
}

TEST_F(ShardTableFile, Truncated) {
  const size_t n = d_.m.shards.size();
  const std::string expected = std::to_string(n) + " records expected, ";
  struct Case {
    size_t length;
    size_t present;
  };
  const Case cases[] = {{0, 0},
                        {10, 0},
                        {63, 0},
                        {64, 0},
                        {64 + 8 * blocks() - 1, 0},
                        {record(0), 0},
                        {record(5) + 7, 5},
                        {record(n) - 1, n - 1}};
  for (const Case& c : cases) {
    const Bytes t(table_.begin(), table_.begin() + c.length);
    EXPECT_TRUE(
        Fails(DecodeTable(t), Code::kCorruption,
              {kTableWhere, "truncated: " + expected + std::to_string(c.present) + " present"}))
        << c.length;
  }
  Bytes longer = table_;
  longer.push_back(std::byte{0});
  EXPECT_TRUE(
      Fails(DecodeTable(longer), Code::kCorruption, {kTableWhere, "(data after the last record)"}));
  // A read that ended early, in pieces: the block it starves says so.
  ShardTableReader r(m_, std::string(kTableWhere));
  ASSERT_TRUE(r.Header(std::span(table_).first(64), table_.size()).ok());
  ASSERT_TRUE(r.Sums(std::span(table_).subspan(64, 8 * blocks())).ok());
  ShardTable t;
  EXPECT_TRUE(HasError(r.Block(0, std::span(table_).subspan(record(0), 50), &t), Code::kCorruption,
                       {kTableWhere, expected + "2 present"}));
}

TEST_F(ShardTableFile, BadHeader) {
  Bytes t = table_;
  t[3] = std::byte{'X'};
  EXPECT_TRUE(Fails(DecodeTable(t), Code::kCorruption, {kTableWhere, "bad magic"}));
  t = table_;
  t[30] ^= std::byte{1};  // in the dataset id, not resealed
  EXPECT_TRUE(Fails(DecodeTable(t), Code::kCorruption, {kTableWhere, "header checksum mismatch"}));
  EXPECT_TRUE(Fails(DecodeEditedTable([](Bytes& b) { Put<uint32_t>(b, 8, 0); }), Code::kCorruption,
                    {kTableWhere, "shard table version 0"}));
  EXPECT_TRUE(
      Fails(DecodeEditedTable([](Bytes& b) { Put<uint32_t>(b, 8, 2); }), Code::kUnsupported,
            {kTableWhere, "written by a newer stoker (shard table v2; this build reads v1)"}));
  EXPECT_TRUE(Fails(DecodeEditedTable([](Bytes& b) { Put<uint32_t>(b, 12, 32); }),
                    Code::kCorruption, {kTableWhere, "record size 32, expected 24"}));
  EXPECT_TRUE(Fails(DecodeEditedTable([](Bytes& b) { Put<uint32_t>(b, 40, 0); }), Code::kCorruption,
                    {kTableWhere, "blocks of 0 records, expected 1..1048576"}));
  EXPECT_TRUE(Fails(DecodeEditedTable([](Bytes& b) { Put<uint32_t>(b, 40, (1u << 20) + 1); }),
                    Code::kCorruption, {kTableWhere, "blocks of 1048577 records"}));
  EXPECT_TRUE(Fails(DecodeEditedTable([](Bytes& b) { Put<uint32_t>(b, 40, 5); }), Code::kCorruption,
                    {kTableWhere, "blocks, expected"}));
  EXPECT_TRUE(Fails(DecodeEditedTable([](Bytes& b) { Put<uint64_t>(b, 16, uint64_t{1} << 33); }),
                    Code::kCorruption, {kTableWhere, "more than 2^32-1 shards"}));
}

TEST_F(ShardTableFile, NotTheTableTheManifestNames) {
  // Another dataset's table (its own manifest would name it).
  EXPECT_TRUE(Fails(DecodeEditedTable([](Bytes& b) { b[24] ^= std::byte{0xff}; }),
                    Code::kCorruption, {kTableWhere, "table belongs to another dataset (id "}));
  // The manifest says one more record (and the size that goes with it).
  EXPECT_TRUE(
      Fails(DecodeTable(table_, [](Manifest& m) { m.table.records++; }), Code::kCorruption,
            {kTableWhere, std::to_string(d_.m.shards.size()) + " records, the manifest says " +
                              std::to_string(d_.m.shards.size() + 1)}));
  // Same dataset, other contents (a killed pack's table under the key): the
  // manifest's hash of the header tells them apart.
  Bytes other = table_;
  Put<uint64_t>(other, record(2) + 8, 12345);  // an index hash
  Manifest m = m_;
  ResealTable(other, &m);
  EXPECT_TRUE(Fails(DecodeTable(other), Code::kCorruption,
                    {kTableWhere, "header hash", "the manifest says"}));
  EXPECT_TRUE(DecodeShardTable(other, kTableWhere, &m).ok()) << "consistent in itself";
  EXPECT_TRUE(Fails(DecodeTable(table_, [](Manifest& m) { m.table.bytes += 8; }), Code::kCorruption,
                    {kTableWhere, "bytes, the manifest says"}));
}

TEST_F(ShardTableFile, BadChecksums) {
  Bytes t = table_;
  t[64 + 8] ^= std::byte{1};  // block 1's checksum
  EXPECT_TRUE(Fails(DecodeTable(t), Code::kCorruption, {kTableWhere, "block checksums mismatch"}));
  // A record's byte: its block is named by its records.
  t = table_;
  t[record(5) + 3] ^= std::byte{1};
  EXPECT_TRUE(Fails(DecodeTable(t), Code::kCorruption,
                    {kTableWhere, "records 4..7 (block 1): checksum mismatch"}));
  const size_t last = d_.m.shards.size() - 1;
  t = table_;
  t[record(last) + 20] ^= std::byte{1};
  const size_t first_of_last = last / 4 * 4;
  EXPECT_TRUE(
      Fails(DecodeTable(t), Code::kCorruption,
            {kTableWhere, "records " + std::to_string(first_of_last) + ".." + std::to_string(last) +
                              " (block " + std::to_string(last / 4) + "): checksum mismatch"}));
  // Every single-byte change is detected.
  std::mt19937_64 rng(5);
  for (int iter = 0; iter < 500; ++iter) {
    Bytes b = table_;
    const size_t at = rng() % b.size();
    b[at] ^= std::byte(1 + rng() % 255);
    auto r = DecodeTable(b);
    ASSERT_FALSE(r.ok()) << "flip at " << at << " undetected";
    EXPECT_EQ(r.status().message().rfind(kTableWhere, 0), 0u) << r.status().ToString();
  }
}

TEST_F(ShardTableFile, BadRecords) {
  const std::string k5 = "record 5 (shards/000005.stks): ";
  EXPECT_TRUE(Fails(DecodeEditedTable([&](Bytes& b) { Put<uint32_t>(b, record(5) + 16, 0); }),
                    Code::kCorruption, {kTableWhere, k5 + "bytes 0 is outside 4096..4294967296"}));
  EXPECT_TRUE(
      Fails(DecodeEditedTable([&](Bytes& b) { Put<uint32_t>(b, record(5) + 16, (1u << 20) + 1); }),
            Code::kCorruption, {kTableWhere, k5 + "bytes 4294971392 is outside"}));
  EXPECT_TRUE(Fails(DecodeEditedTable([&](Bytes& b) { Put<uint32_t>(b, record(5) + 20, 0); }),
                    Code::kCorruption, {kTableWhere, k5 + "samples 0 is outside 1.."}));
  EXPECT_TRUE(Fails(DecodeEditedTable([&](Bytes& b) {
                      Put<uint32_t>(b, record(5) + 16, 1);  // 4096 bytes: at most 168 samples
                      Put<uint32_t>(b, record(5) + 20, 169);
                    }),
                    Code::kCorruption,
                    {kTableWhere, k5 + "samples 169 is outside 1..168 for a shard of 4096 bytes"}));
  EXPECT_TRUE(Fails(DecodeEditedTable([&](Bytes& b) {
                      Put<uint64_t>(b, record(5), Get<uint64_t>(b, record(5)) + 1);
                    }),
                    Code::kCorruption,
                    {kTableWhere, k5 + "first_sample", "(the sum of the samples before it)"}));
  // Two records swapped.
  EXPECT_TRUE(
      Fails(DecodeEditedTable([&](Bytes& b) {
              std::swap_ranges(b.begin() + record(0), b.begin() + record(1), b.begin() + record(1));
            }),
            Code::kCorruption, {kTableWhere, "record 0 (shards/000000.stks): first_sample"}));
}

TEST_F(ShardTableFile, TotalsDisagreeWithTheManifest) {
  // One sample more in the last shard, and first samples still consistent.
  const size_t last = d_.m.shards.size() - 1;
  EXPECT_TRUE(Fails(DecodeEditedTable([&](Bytes& b) {
                      Put<uint32_t>(b, record(last) + 20, Get<uint32_t>(b, record(last) + 20) + 1);
                    }),
                    Code::kCorruption,
                    {kTableWhere, "the records hold " + std::to_string(d_.m.sample_count + 1) +
                                      " samples, the manifest's sample_count is " +
                                      std::to_string(d_.m.sample_count)}));
  // Every shard 4096 bytes: the payload does not fit.
  EXPECT_TRUE(Fails(DecodeEditedTable([&](Bytes& b) {
                      for (size_t i = 0; i <= last; ++i) Put<uint32_t>(b, record(i) + 16, 1);
                    }),
                    Code::kCorruption,
                    {kTableWhere, "payload_bytes", "does not fit in the shards' record areas"}));
}

// The v2 manifest's own fields (§2.2, §2.4): what names the table.
TEST_F(ShardTableFile, BadTableReference) {
  using J = nlohmann::ordered_json;
  const J body = J::parse(text_.substr(text_.find('\n') + 1));
  auto decode = [&](auto edit) {
    J j = body;
    edit(j);
    return DecodeManifest(AsBytes(Seal(j.dump(), 2)), kWhere);
  };
  EXPECT_TRUE(decode([](J&) {}).ok());
  EXPECT_TRUE(Fails(decode([](J& j) { j.erase("shard_table"); }), Code::kCorruption,
                    {kWhere, "missing key \"shard_table\""}));
  EXPECT_TRUE(Fails(decode([](J& j) { j["shard_table"] = J::array(); }), Code::kCorruption,
                    {kWhere, "shard_table: expected an object, got array"}));
  for (const char* key : {"key", "records", "bytes", "header_hash"}) {
    EXPECT_TRUE(Fails(decode([&](J& j) { j["shard_table"].erase(key); }), Code::kCorruption,
                      {kWhere, "missing key \"shard_table." + std::string(key) + "\""}))
        << key;
  }
  for (const char* key : {"../t", "/t", "manifest.stoker", "a b", ""}) {
    EXPECT_TRUE(Fails(decode([&](J& j) { j["shard_table"]["key"] = key; }), Code::kCorruption,
                      {kWhere, "shard_table.key: bad key"}))
        << key;
  }
  EXPECT_TRUE(Fails(decode([](J& j) { j["shard_table"]["records"] = uint64_t{1} << 32; }),
                    Code::kCorruption, {kWhere, "shard_table.records: 4294967296 is larger"}));
  EXPECT_TRUE(Fails(decode([](J& j) { j["shard_table"]["bytes"] = 100; }), Code::kCorruption,
                    {kWhere, "shard_table.bytes: 100 is less than"}));
  EXPECT_TRUE(Fails(decode([](J& j) { j["shard_table"]["header_hash"] = "12"; }), Code::kCorruption,
                    {kWhere, "shard_table.header_hash: '12'"}));
  EXPECT_TRUE(Fails(decode([](J& j) { j["max_sample_bytes"] = 1u << 30; }), Code::kCorruption,
                    {kWhere, "max_sample_bytes"}));
  // A shard list in a v2 body is not this version's (unknown keys are
  // ignored); the table is still what counts.
  auto m = decode([](J& j) { j["shards"] = J::array({1, 2}); });
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->shards.empty());
  EXPECT_TRUE(Fails(DecodeManifest(AsBytes(Seal(body.dump(), 4)), kWhere), Code::kUnsupported,
                    {kWhere, "format v4; this build reads v3"}));
}

// What older stokers wrote still decodes, its own keys included.
TEST(OldManifest, Version1DecodesWithItsShards) {
  Dataset d = MakeDataset(200, 32 << 10, 13);
  const std::string v1 = EncodeManifestV1(d.m);
  EXPECT_EQ(v1.rfind("STOKER-DATASET 1 ", 0), 0u);
  auto m = DecodeManifest(AsBytes(v1), kWhere);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->format_version, 1u);
  EXPECT_TRUE(m->table.key.empty());
  d.m.format_version = 1;
  ExpectSameManifest(*m, d.m);
  EXPECT_FALSE(m->shards.has_own_keys());
  // Keys of its own (a v1 writer's convention only): kept as written.
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(v1.substr(v1.find('\n') + 1));
  j["shards"][1]["key"] = "elsewhere/one.bin";
  auto own = DecodeManifest(AsBytes(Seal(j.dump(), 1)), kWhere);
  ASSERT_TRUE(own.ok()) << own.status().ToString();
  EXPECT_TRUE(own->shards.has_own_keys());
  EXPECT_EQ(own->shards.key(1), "elsewhere/one.bin");
  EXPECT_EQ(own->shards.key(2), ShardKey(2));
  EXPECT_EQ(own->shards.Find("elsewhere/one.bin"), 1);
  EXPECT_EQ(ExpectationFor(*own, 1).key, "elsewhere/one.bin");
  // Re-encoded as v2, the table keeps no keys: shard i is ShardKey(i).
  Manifest v2 = *m;
  const Bytes table = EncodeShardTable(v2, &v2.table);
  auto again = DecodeManifest(AsBytes(EncodeManifest(v2)), kWhere);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(DecodeShardTable(table, kTableWhere, &*again).ok());
  ExpectSameManifest(*again, [&] {
    Manifest want = d.m;
    want.format_version = 2;
    return want;
  }());
}


// ---- typed fields (format 3, docs/format.md §2.2, §3.2) --------------------

std::vector<FieldSpec> TypedFields() {
  std::vector<FieldSpec> f;
  for (auto [name, type] : std::initializer_list<std::pair<const char*, const char*>>{
           {"image", "jpeg"}, {"caption", "str"}, {"meta", "json"}, {"score", "float32"},
           {"weight", "float64"}, {"tokens", "uint32[*]"}, {"emb", "float16[4]"},
           {"boxes", "float32[*,4]"}, {"label", "int64"}}) {
    auto spec = ParseFieldSpec(name, type);
    EXPECT_TRUE(spec.ok()) << name << ": " << spec.status().ToString();
    f.push_back(*spec);
  }
  return f;
}

TEST(TypedFields, ParseFieldSpec) {
  auto f = TypedFields();
  EXPECT_EQ(f[0].type, FieldType::kBytes);
  EXPECT_EQ(f[1].type, FieldType::kString);
  EXPECT_EQ(f[2].type, FieldType::kJson);
  EXPECT_EQ(f[3].FixedBytes(), 4u);
  EXPECT_EQ(f[4].FixedBytes(), 8u);
  EXPECT_EQ(f[5].type, FieldType::kArray);
  EXPECT_EQ(f[5].dtype, DType::kUInt32);
  EXPECT_EQ(f[5].shape, std::vector<int64_t>{kVariableDim});
  EXPECT_EQ(f[5].FixedBytes(), 0u);
  EXPECT_EQ(f[5].RowBytes(), 4u);
  EXPECT_EQ(f[6].FixedBytes(), 8u);  // 4 float16
  EXPECT_EQ(f[7].RowBytes(), 16u);   // 4 float32 per row
  EXPECT_EQ(f[7].FixedBytes(), 0u);
  EXPECT_EQ(FormatVersionFor(f), 3u);
  const std::vector<FieldSpec> old{f[0], f[8]};
  EXPECT_EQ(FormatVersionFor(old), 2u);

  for (auto [type, want] : std::initializer_list<std::pair<const char*, const char*>>{
           {"uint33[*]", "uint33"}, {"uint32[*", "uint32[*"}, {"uint32[3,*]", "first"},
           {"uint32[0]", "0"}, {"float32[1,2,3,4,5,6,7,8,9]", "8"}, {"words", "words"},
           {"uint8[-2]", "-2"}}) {
    auto r = ParseFieldSpec("x", type);
    EXPECT_TRUE(Fails(r, Code::kInvalidArgument, {"x", want})) << type;
  }
  EXPECT_TRUE(Fails(ParseFieldSpec("bad name", "str"), Code::kInvalidArgument, {"bad name"}));
}

TEST(TypedFields, ShardRoundTripAndLengthChecks) {
  const auto fields = TypedFields();
  ShardBuilder b(fields, TestId(7), 0);
  std::vector<std::string> text{"jpegbytes", "a caption", "{\"k\": [1, 2]}"};
  const uint32_t tokens[3] = {1, 70000, 4000000000u};
  const uint16_t emb[4] = {0x3c00, 0x4000, 0, 0xbc00};
  const float boxes[8] = {0, 0, 1, 1, 0.5f, 0.5f, 2, 2};
  auto bytes = [](const void* p, size_t n) {
    return std::span<const std::byte>(static_cast<const std::byte*>(p), n);
  };
  std::vector<FieldValue> v(fields.size());
  v[0].bytes = bytes(text[0].data(), text[0].size());
  v[1].bytes = bytes(text[1].data(), text[1].size());
  v[2].bytes = bytes(text[2].data(), text[2].size());
  v[3].f64 = 0.25;
  v[4].f64 = 1.0 / 3;
  v[5].bytes = bytes(tokens, sizeof tokens);
  v[6].bytes = bytes(emb, sizeof emb);
  v[7].bytes = bytes(boxes, sizeof boxes);
  v[8].i64 = -5;
  ASSERT_TRUE(b.Add(v).ok());
  v[5].bytes = {};  // zero rows of a variable array are a value
  v[7].bytes = {};
  ASSERT_TRUE(b.Add(v).ok());

  // A length that is no whole number of rows, or not the fixed shape.
  auto bad = v;
  bad[5].bytes = bytes(tokens, 6);
  EXPECT_TRUE(HasError(b.Add(bad), Code::kInvalidArgument, {"tokens", "6", "multiple of 4"}));
  bad = v;
  bad[6].bytes = bytes(emb, 6);
  EXPECT_TRUE(HasError(b.Add(bad), Code::kInvalidArgument, {"emb", "6", "8"}));
  bad = v;
  bad[7].bytes = bytes(boxes, 20);
  EXPECT_TRUE(HasError(b.Add(bad), Code::kInvalidArgument, {"boxes", "20", "16"}));

  uint64_t ih;
  Bytes shard = b.Finish(&ih);
  ShardExpectation e{"k", fields, 0, TestId(7), static_cast<uint32_t>(fields.size()), 2,
                     shard.size(), ih, 0};
  auto view = ShardView::Parse(shard, e);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  auto field = [&](uint32_t i, uint32_t f) {
    auto s = view->Field(i, f);
    return std::string(reinterpret_cast<const char*>(s.data()), s.size());
  };
  EXPECT_EQ(field(0, 1), "a caption");
  EXPECT_EQ(field(0, 2), text[2]);
  float score;
  double weight;
  ASSERT_EQ(view->Field(0, 3).size(), 4u);
  std::memcpy(&score, view->Field(0, 3).data(), 4);
  std::memcpy(&weight, view->Field(0, 4).data(), 8);
  EXPECT_EQ(score, 0.25f);
  EXPECT_EQ(weight, 1.0 / 3);
  EXPECT_EQ(field(0, 5), std::string(reinterpret_cast<const char*>(tokens), sizeof tokens));
  EXPECT_EQ(field(1, 5), "");
  EXPECT_EQ(view->Int64(1, 8), -5);
}

TEST(TypedFields, ManifestV3RoundTripAndV2RefusesTypedFields) {
  Dataset d = MakeDataset(40, 64 << 10, 3);
  d.m.fields = TypedFields();
  d.m.format_version = 3;
  EncodeShardTable(d.m, &d.m.table, 4);
  const std::string text = EncodeManifest(d.m);
  EXPECT_EQ(text.rfind("STOKER-DATASET 3 ", 0), 0u);
  auto m = Decode(text);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->format_version, 3u);
  EXPECT_EQ(m->fields, d.m.fields);
  EXPECT_EQ(EncodeManifest(*m), text);

  auto body = nlohmann::ordered_json::parse(text.substr(text.find('\n') + 1));
  auto field = body["fields"][5];
  EXPECT_EQ(field["type"], "array");
  EXPECT_EQ(field["dtype"], "uint32");
  EXPECT_TRUE(field["shape"][0].is_null());
  auto reseal = [&](const nlohmann::ordered_json& j, uint32_t v) {
    auto copy = j;
    copy["format_version"] = v;
    return Decode(Seal(copy.dump(), v));
  };
  // A typed field under a v2 header is not v2's.
  EXPECT_TRUE(Fails(reseal(body, 2), Code::kCorruption, {kWhere, "fields[1]", "str"}));
  // Bad dtypes and shapes name the field.
  auto edited = body;
  edited["fields"][5]["dtype"] = "uint33";
  EXPECT_TRUE(Fails(reseal(edited, 3), Code::kCorruption, {kWhere, "fields[5]", "uint33"}));
  edited = body;
  edited["fields"][5]["shape"] = nlohmann::ordered_json::array({4, nullptr});
  EXPECT_TRUE(Fails(reseal(edited, 3), Code::kCorruption, {kWhere, "fields[5]"}));
  edited = body;
  edited["fields"][5].erase("dtype");
  EXPECT_TRUE(Fails(reseal(edited, 3), Code::kCorruption, {kWhere, "fields[5]", "dtype"}));
}

}  // namespace
}  // namespace stoker::format
