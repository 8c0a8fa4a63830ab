// The importers (WebDataset tars, JSONL) and the exporter back to
// WebDataset: round trips byte for byte, keys kept, and every bad input
// named by its tar and member, or its file and line.
#include "stoker/import.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "testutil.h"
#include "wds/tar.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using format::FieldSpec;
using format::FieldType;
using testing::RandomBytes;
using testing::TempDir;

// DataComp's shape: 10,000 samples per tar. 3 tars x 10,000 samples of
// random "jpg" bytes (16..1039 bytes, to keep the suite quick on 2 cores),
// a caption and JSON metadata.
constexpr uint32_t kTars = 3;
constexpr uint32_t kPerTar = 10000;

std::span<const std::byte> B(std::string_view s) { return std::as_bytes(std::span(s)); }

std::string Key(uint64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%09llu", static_cast<unsigned long long>(i));
  return buf;
}

struct Member {
  std::string name;
  std::vector<std::byte> data;
};

void WriteTar(const fs::path& path, const std::vector<Member>& members) {
  auto w = wds::TarWriter::Create(path.string());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (const Member& m : members) ASSERT_OK((*w)->Add(m.name, m.data));
  ASSERT_OK((*w)->Close());
}

std::vector<std::byte> Bytes(std::string_view s) {
  auto b = B(s);
  return {b.begin(), b.end()};
}

// Sample i's three members.
std::vector<Member> DataCompSample(uint64_t i) {
  const std::string k = Key(i);
  return {{k + ".jpg", RandomBytes(16 + i * 7919 % 1024, i)},
          {k + ".txt", Bytes("a photo of thing " + std::to_string(i) + " – ünïcode")},
          {k + ".json", Bytes("{\"key\": \"" + k + "\", \"width\": " + std::to_string(i % 640) +
                              ", \"similarity\": 0.3" + std::to_string(i % 10) + "}")}};
}

std::vector<std::string> WriteDataComp(const fs::path& dir, uint32_t tars, uint32_t per_tar) {
  std::vector<std::string> paths;
  fs::create_directories(dir);
  for (uint32_t t = 0; t < tars; ++t) {
    std::vector<Member> members;
    for (uint32_t i = 0; i < per_tar; ++i) {
      for (Member& m : DataCompSample(uint64_t{t} * per_tar + i)) members.push_back(std::move(m));
    }
    char name[32];
    std::snprintf(name, sizeof name, "%06u.tar", t);
    paths.push_back((dir / name).string());
    WriteTar(paths.back(), members);
  }
  return paths;
}

// Every record of the dataset at `uri`, field by field, as strings.
std::vector<std::vector<std::string>> ReadRecords(const std::string& uri, format::Manifest* out) {
  std::vector<std::vector<std::string>> recs;
  auto store = OpenStore(uri);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  auto m = ReadManifest(**store);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  if (!m.ok()) return recs;
  for (uint32_t s = 0; s < m->shards.size(); ++s) {
    auto e = format::ExpectationFor(*m, s);
    auto bytes = (*store)->ReadAll(e.key);
    EXPECT_TRUE(bytes.ok());
    auto view = format::ShardView::Parse(*bytes, e);
    EXPECT_TRUE(view.ok()) << view.status().ToString();
    for (uint32_t k = 0; k < view->sample_count(); ++k) {
      EXPECT_TRUE(view->VerifySample(k).ok());
      std::vector<std::string> r;
      for (uint32_t f = 0; f < view->field_count(); ++f) {
        auto d = view->Field(k, f);
        r.emplace_back(reinterpret_cast<const char*>(d.data()), d.size());
      }
      recs.push_back(std::move(r));
    }
  }
  if (out != nullptr) *out = *m;
  return recs;
}

std::vector<std::byte> FileBytes(const std::string& p) { return testing::ReadFile(p); }

TEST(ImportWebDataset, DataCompSetImportsAndExportsByteIdenticalKeysKept) {
  TempDir d;
  const auto t0 = std::chrono::steady_clock::now();
  const auto tars = WriteDataComp(d.path() / "wds", kTars, kPerTar);
  const std::string ds = (d.path() / "ds").string();
  ImportOptions o;
  o.writer.shard_bytes = 1 << 20;
  std::vector<ImportProgress> seen;
  o.progress = [&](const ImportProgress& p) { seen.push_back(p); };
  // A folder of tars: taken in name order.
  const std::vector<std::string> src = {(d.path() / "wds").string()};
  auto r = ImportWebDataset(src, ds, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples, uint64_t{kTars} * kPerTar);
  EXPECT_EQ(r->skipped, 0u);
  EXPECT_EQ(r->sources, tars);
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().bytes_read, seen.back().bytes_total);
  EXPECT_EQ(seen.back().samples, r->samples);

  format::Manifest m;
  const auto recs = ReadRecords(ds, &m);
  ASSERT_EQ(m.fields.size(), 4u);
  EXPECT_EQ(m.fields[0].name, "__key__");
  EXPECT_EQ(m.fields[0].type, FieldType::kString);
  EXPECT_EQ(m.fields[1].name, "jpg");
  EXPECT_EQ(m.fields[1].type, FieldType::kBytes);
  EXPECT_EQ(m.fields[2].type, FieldType::kString);
  EXPECT_EQ(m.fields[3].type, FieldType::kJson);
  ASSERT_EQ(recs.size(), uint64_t{kTars} * kPerTar);
  for (uint64_t i = 0; i < recs.size(); i += 997) {
    ASSERT_EQ(recs[i][0], Key(i)) << "keys kept, in tar then sample order";
    const auto want = DataCompSample(i);
    for (int f = 0; f < 3; ++f) {
      EXPECT_EQ(recs[i][f + 1], std::string(reinterpret_cast<const char*>(want[f].data.data()),
                                            want[f].data.size()));
    }
  }

  ExportOptions eo;
  eo.samples_per_tar = kPerTar;
  const std::string out = (d.path() / "out").string();
  auto e = ExportWebDataset(ds, out, eo);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->samples, r->samples);
  ASSERT_EQ(e->tars, kTars);
  for (uint32_t t = 0; t < kTars; ++t) {
    EXPECT_EQ(fs::path(e->paths[t]).filename(), fs::path(tars[t]).filename());
    EXPECT_TRUE(FileBytes(e->paths[t]) == FileBytes(tars[t])) << "tar " << t << " differs";
  }
  // An export into a folder holding files is refused.
  EXPECT_EQ(ExportWebDataset(ds, out, eo).status().code(), Code::kAlreadyExists);
  // So is an import into a dataset that exists.
  EXPECT_EQ(ImportWebDataset(src, ds, o).status().code(), Code::kAlreadyExists);
  std::printf("DataComp-style %u x %u: %.2f s in all\n", kTars, kPerTar,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

TEST(ImportWebDataset, ExtensionsWithDotsAndTypeOverrides) {
  TempDir d;
  std::vector<Member> members;
  for (int i = 0; i < 20; ++i) {
    const std::string k = "sub/dir/s" + std::to_string(i);
    members.push_back({k + ".seg.png", RandomBytes(100 + i, i)});
    members.push_back({k + ".cls", Bytes(std::to_string(i % 4) + "\n")});
    members.push_back({k + ".txt", Bytes(i == 3 ? "" : "caption")});
  }
  const std::string tar = (d.path() / "a.tar").string();
  WriteTar(tar, members);
  // cls kept as bytes by default: the round trip is byte-identical.
  const std::string ds = (d.path() / "ds").string();
  auto r = ImportWebDataset(std::vector<std::string>{tar}, ds, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  format::Manifest m;
  auto recs = ReadRecords(ds, &m);
  ASSERT_EQ(m.fields.size(), 4u);
  EXPECT_EQ(m.fields[1].name, "seg_png");
  EXPECT_EQ(m.fields[1].ext, "seg.png");
  EXPECT_EQ(m.fields[2].name, "cls");
  EXPECT_EQ(m.fields[2].type, FieldType::kBytes);
  EXPECT_EQ(recs[7][0], "sub/dir/s7");
  auto e = ExportWebDataset(ds, (d.path() / "out").string(), {});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  ASSERT_EQ(e->tars, 1u);
  EXPECT_TRUE(FileBytes(e->paths[0]) == FileBytes(tar));

  // cls as int64: parsed from its text, exported as decimal text.
  ImportOptions o;
  o.fields.push_back(*ParseFieldArg("cls:int64"));
  const std::string ds2 = (d.path() / "ds2").string();
  ASSERT_TRUE(ImportWebDataset(std::vector<std::string>{tar}, ds2, o).ok());
  auto store = OpenStore(ds2);
  auto m2 = ReadManifest(**store);
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->fields[2].type, FieldType::kInt64);
  auto bytes = (*store)->ReadAll(m2->shards[0].key);
  auto view = format::ShardView::Parse(*bytes, format::ExpectationFor(*m2, 0));
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(view->Int64(7, 2), 3);
  auto e2 = ExportWebDataset(ds2, (d.path() / "out2").string(), {});
  ASSERT_TRUE(e2.ok()) << e2.status().ToString();

  // An override naming no field.
  ImportOptions bad;
  bad.fields.push_back(*ParseFieldArg("label:int64"));
  auto nf = ImportWebDataset(std::vector<std::string>{tar}, (d.path() / "ds3").string(), bad);
  EXPECT_EQ(nf.status().code(), Code::kInvalidArgument);
  EXPECT_NE(nf.status().message().find("label"), std::string::npos) << nf.status().ToString();
  EXPECT_EQ(ParseFieldArg("nocolon").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseFieldArg("x:nosuchtype").status().code(), Code::kInvalidArgument);
}

// The good samples 0..n-1 of a three-field set, keyed "k%09d".
std::vector<Member> Good(int from, int n) {
  std::vector<Member> out;
  for (int i = from; i < from + n; ++i) {
    for (Member& m : DataCompSample(i)) out.push_back(std::move(m));
  }
  return out;
}

Status ImportOne(const TempDir& d, const std::vector<std::string>& tars, const std::string& ds,
                 bool skip, ImportResult* out = nullptr) {
  ImportOptions o;
  o.skip_bad = skip;
  auto r = ImportWebDataset(tars, (d.path() / ds).string(), o);
  if (r.ok() && out != nullptr) *out = *r;
  return r.status();
}

void ExpectNames(const Status& st, std::initializer_list<std::string> parts) {
  EXPECT_FALSE(st.ok());
  for (const std::string& p : parts) {
    EXPECT_NE(st.message().find(p), std::string::npos) << "'" << p << "' not in " << st.ToString();
  }
}

TEST(ImportWebDataset, BadInputIsNamedByTarAndMember) {
  TempDir d;
  // A duplicate field in one sample.
  auto dup = Good(0, 5);
  dup.insert(dup.begin() + 7, {Key(2) + ".jpg", RandomBytes(10, 1)});
  const std::string dup_tar = (d.path() / "dup.tar").string();
  WriteTar(dup_tar, dup);
  Status st = ImportOne(d, {dup_tar}, "ds1", false);
  ExpectNames(st, {dup_tar, "duplicate field 'jpg'", Key(2)});
  EXPECT_FALSE(fs::exists(d.path() / "ds1" / "manifest.stoker"));

  // A truncated tar: cut in the middle of a member.
  const std::string trunc_tar = (d.path() / "trunc.tar").string();
  WriteTar(trunc_tar, Good(0, 50));
  fs::resize_file(trunc_tar, fs::file_size(trunc_tar) / 2 + 100);
  st = ImportOne(d, {trunc_tar}, "ds2", false);
  ExpectNames(st, {trunc_tar, "truncated"});

  // A sample missing a field of the schema.
  auto missing = Good(0, 5);
  missing.erase(missing.begin() + 3 * 3 + 1);  // sample 3's txt
  const std::string missing_tar = (d.path() / "missing.tar").string();
  WriteTar(missing_tar, missing);
  st = ImportOne(d, {missing_tar}, "ds3", false);
  ExpectNames(st, {missing_tar, "'" + Key(3) + "'", Key(3) + ".txt"});

  // A member whose extension the schema lacks.
  auto extra = Good(0, 5);
  extra.insert(extra.begin() + 3 * 2 + 1, {Key(2) + ".cls", Bytes("1")});
  const std::string extra_tar = (d.path() / "extra.tar").string();
  WriteTar(extra_tar, extra);
  st = ImportOne(d, {extra_tar}, "ds4", false);
  ExpectNames(st, {extra_tar, Key(2) + ".cls", "schema lacks"});

  // Not a tar at all.
  const std::string junk = (d.path() / "junk.tar").string();
  testing::WriteFile(junk, RandomBytes(5000, 9));
  st = ImportOne(d, {junk}, "ds5", false);
  ExpectNames(st, {junk});

  // Bad JSON in a json member: the writer's check, with the tar and key.
  auto badjson = Good(0, 3);
  badjson[2 * 3 + 2].data = Bytes("{not json");
  const std::string badjson_tar = (d.path() / "badjson.tar").string();
  WriteTar(badjson_tar, badjson);
  st = ImportOne(d, {badjson_tar}, "ds6", false);
  ExpectNames(st, {badjson_tar, "'" + Key(2) + "'", "json"});

  // skip_bad: the bad samples are counted, the rest imported, in order.
  const std::string good_tar = (d.path() / "good.tar").string();
  WriteTar(good_tar, Good(100, 10));
  ImportResult r;
  ASSERT_OK(ImportOne(d, {dup_tar, missing_tar, trunc_tar, good_tar}, "ds7", true, &r));
  // dup: 1 sample; missing: 1; trunc: its tail (the sample in progress).
  EXPECT_EQ(r.skipped, 3u) << r.last_skip_reason;
  format::Manifest m;
  auto recs = ReadRecords((d.path() / "ds7").string(), &m);
  ASSERT_EQ(recs.size(), r.samples);
  // dup.tar and missing.tar give 4 each, good.tar 10, trunc.tar the samples
  // before its cut (some, not all 50).
  EXPECT_GT(recs.size(), 18u);
  EXPECT_LT(recs.size(), 68u);
  EXPECT_EQ(recs[0][0], Key(0));
  EXPECT_EQ(recs[2][0], Key(3)) << "sample 2 of dup.tar skipped";
  EXPECT_EQ(recs[4][0], Key(0)) << "missing.tar starts";
  EXPECT_EQ(recs.back()[0], Key(109));

  // Paths: a missing one, a file that is no tar, a folder without tars.
  EXPECT_EQ(ListTars(std::vector<std::string>{(d.path() / "nope.tar").string()}).status().code(),
            Code::kNotFound);
  testing::WriteFile(d.path() / "x.txt", RandomBytes(3, 1));
  EXPECT_EQ(ListTars(std::vector<std::string>{(d.path() / "x.txt").string()}).status().code(),
            Code::kInvalidArgument);
  fs::create_directories(d.path() / "empty");
  EXPECT_EQ(ListTars(std::vector<std::string>{(d.path() / "empty").string()}).status().code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(LooksLikeWebDataset(std::vector<std::string>{good_tar, dup_tar}));
  EXPECT_FALSE(LooksLikeWebDataset(std::vector<std::string>{(d.path() / "empty").string()}));
}

// ---- JSONL -----------------------------------------------------------------

void WriteText(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
}

TEST(ImportJsonl, EveryTypeRoundTrips) {
  TempDir d;
  const fs::path src = d.path() / "a.jsonl";
  std::string text;
  for (int i = 0; i < 300; ++i) {
    text += "{\"s\": \"text " + std::to_string(i) + " é\", \"j\": {\"a\": [1, 2], \"i\": " +
            std::to_string(i) + "}, \"i\": " + std::to_string(-i * 1000000007LL) +
            ", \"f\": " + std::to_string(i) + ".5, \"d\": 1e-" + std::to_string(i % 300) +
            ", \"b\": \"raw" + std::to_string(i) + "\", \"t\": [" + std::to_string(i) + ", 65535" +
            (i % 2 ? ", 0" : "") + "], \"h\": [0.5, -2], \"m\": [[1, 2], [3, " +
            std::to_string(i) + "]], \"extra\": null}\n";
    if (i == 10) text += "\n";  // a blank line is skipped
  }
  WriteText(src, text);
  ImportOptions o;
  for (const char* f : {"s:str", "j:json", "i:int64", "f:float32", "d:float64", "b:bytes",
                        "t:uint16[*]", "h:float16[*]", "m:int32[*,2]"}) {
    o.fields.push_back(*ParseFieldArg(f));
  }
  const std::string ds = (d.path() / "ds").string();
  auto r = ImportJsonl(std::vector<std::string>{src.string()}, ds, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples, 300u);
  format::Manifest m;
  auto recs = ReadRecords(ds, &m);
  ASSERT_EQ(recs.size(), 300u);
  for (int i : {0, 1, 299}) {
    const auto& rec = recs[i];
    EXPECT_EQ(rec[0], "text " + std::to_string(i) + " é");
    EXPECT_EQ(rec[1], "{\"a\":[1,2],\"i\":" + std::to_string(i) + "}");
    int64_t iv;
    std::memcpy(&iv, rec[2].data(), 8);
    EXPECT_EQ(iv, -i * 1000000007LL);
    float fv;
    std::memcpy(&fv, rec[3].data(), 4);
    EXPECT_EQ(fv, i + 0.5f);
    double dv;
    std::memcpy(&dv, rec[4].data(), 8);
    EXPECT_EQ(dv, std::stod("1e-" + std::to_string(i % 300)));
    EXPECT_EQ(rec[5], "raw" + std::to_string(i));
    std::vector<uint16_t> t(rec[6].size() / 2);
    std::memcpy(t.data(), rec[6].data(), rec[6].size());
    std::vector<uint16_t> want_t = {uint16_t(i), 65535};
    if (i % 2) want_t.push_back(0);
    EXPECT_EQ(t, want_t);
    ASSERT_EQ(rec[7].size(), 4u);
    uint16_t h[2];
    std::memcpy(h, rec[7].data(), 4);
    EXPECT_EQ(h[0], 0x3800);  // 0.5
    EXPECT_EQ(h[1], 0xc000);  // -2
    int32_t mm[4];
    ASSERT_EQ(rec[8].size(), 16u);
    std::memcpy(mm, rec[8].data(), 16);
    EXPECT_EQ(mm[3], i);
  }

  // Exported: no __key__, so the keys are sample ids; scalars as text.
  auto e = ExportWebDataset(ds, (d.path() / "out").string(), {});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  wds::TarReadOptions ro;
  auto reader = wds::TarSampleReader::Open(e->paths[0], ro);
  ASSERT_TRUE(reader.ok());
  wds::Sample s;
  ASSERT_TRUE(*(*reader)->Next(&s));
  ASSERT_TRUE(*(*reader)->Next(&s));
  EXPECT_EQ(s.key, "000000001");
  ASSERT_EQ(s.members.size(), 9u);
  EXPECT_EQ(s.members[2].ext, "i");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(s.members[2].data.data()),
                        s.members[2].data.size()),
            "-1000000007");
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(s.members[3].data.data()),
                        s.members[3].data.size()),
            "1.5");
}

TEST(ImportJsonl, FieldsInferredFromTheFirstLine) {
  TempDir d;
  const fs::path src = d.path() / "a.jsonl";
  WriteText(src,
            "{\"text\": \"hi\", \"n\": 3, \"x\": 0.25, \"ids\": [1, 2, 3], \"v\": [0.5, 1], "
            "\"meta\": {\"k\": true}}\n"
            "{\"text\": \"\", \"n\": -1, \"x\": 2, \"ids\": [], \"v\": [], \"meta\": [1]}\n");
  auto r = ImportJsonl(std::vector<std::string>{src.string()}, (d.path() / "ds").string(), {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  format::Manifest m;
  auto recs = ReadRecords((d.path() / "ds").string(), &m);
  // The six, and the block sums of 'ids', the only integer array of shape
  // [*]: the field token windows would read (docs/format.md §3.5).
  ASSERT_EQ(m.fields.size(), 7u);
  EXPECT_EQ(m.fields[6].block_sums_of, "ids");
  EXPECT_EQ(m.fields[0].Describe(), format::ParseFieldSpec("text", "str")->Describe());
  EXPECT_EQ(m.fields[1].type, FieldType::kInt64);
  EXPECT_EQ(m.fields[2].type, FieldType::kFloat64);
  EXPECT_EQ(m.fields[3], *format::ParseFieldSpec("ids", "int64[*]"));
  EXPECT_EQ(m.fields[4], *format::ParseFieldSpec("v", "float32[*]"));
  EXPECT_EQ(m.fields[5].type, FieldType::kJson);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[1][0], "");
  EXPECT_EQ(recs[1][3], "");
  EXPECT_EQ(recs[1][5], "[1]");
}

TEST(ImportJsonl, BadLinesAreNamedByFileAndLine) {
  TempDir d;
  const std::string good = "{\"s\": \"a\", \"t\": [1, 2]}\n";
  ImportOptions o;
  o.fields = {*ParseFieldArg("s:str"), *ParseFieldArg("t:uint16[*]")};
  struct Case {
    std::string line;
    Code code;
    std::vector<std::string> names;
  };
  const std::vector<Case> cases = {
      {"{\"s\": \"a\", \"t\": [1, 70000]}", Code::kOutOfRange, {":3:", "'t'", "70000", "uint16"}},
      {"{\"s\": \"a\"}", Code::kInvalidArgument, {":3:", "no key 't'"}},
      {"{\"s\": \"a\", \"t\": [1, ", Code::kInvalidArgument, {":3:", "not one JSON value"}},
      {"[1, 2]", Code::kInvalidArgument, {":3:", "not a JSON object"}},
      {"{\"s\": 5, \"t\": []}", Code::kInvalidArgument, {":3:", "'s'", "not a string"}},
      {"{\"s\": \"a\", \"t\": [1.5]}", Code::kInvalidArgument, {":3:", "'t'", "not an integer"}},
      {"{\"s\": \"a\", \"t\": [-1]}", Code::kOutOfRange, {":3:", "'t'", "-1"}},
  };
  int n = 0;
  for (const Case& c : cases) {
    const fs::path src = d.path() / ("bad" + std::to_string(n) + ".jsonl");
    WriteText(src, good + good + c.line + "\n" + good);
    const std::string ds = (d.path() / ("ds" + std::to_string(n++))).string();
    auto r = ImportJsonl(std::vector<std::string>{src.string()}, ds, o);
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    ExpectNames(r.status(), {src.string()});
    for (const std::string& p : c.names) {
      EXPECT_NE(r.status().message().find(p), std::string::npos)
          << "'" << p << "' not in " << r.status().ToString();
    }
    EXPECT_FALSE(fs::exists(fs::path(ds) / "manifest.stoker"));
    // skip_bad: the line is counted, the other three imported.
    ImportOptions skip = o;
    skip.skip_bad = true;
    auto s = ImportJsonl(std::vector<std::string>{src.string()}, ds + "-skip", skip);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(s->samples, 3u);
    EXPECT_EQ(s->skipped, 1u);
  }
  // An int64 out of range, a key that is no field name (inferred).
  const fs::path big = d.path() / "big.jsonl";
  WriteText(big, "{\"n\": 1}\n{\"n\": 18446744073709551615}\n");
  auto r = ImportJsonl(std::vector<std::string>{big.string()}, (d.path() / "dsb").string(), {});
  EXPECT_EQ(r.status().code(), Code::kOutOfRange) << r.status().ToString();
  ExpectNames(r.status(), {big.string() + ":2", "'n'"});
  const fs::path badkey = d.path() / "badkey.jsonl";
  WriteText(badkey, "{\"a b\": 1}\n");
  r = ImportJsonl(std::vector<std::string>{badkey.string()}, (d.path() / "dsk").string(), {});
  ExpectNames(r.status(), {badkey.string() + ":1", "'a b'", "--field"});
}

// Cancelled (a Python progress callback that raised, Ctrl-C): the import
// stops where it is asked, commits nothing, and a re-run goes through.
TEST(ImportWebDataset, CancelledCommitsNothing) {
  TempDir d;
  // 3 tars of ~8 MiB each: progress (and the question) about every 16 MiB.
  std::vector<std::string> tars;
  fs::create_directories(d.path() / "wds");
  for (uint32_t t = 0; t < 3; ++t) {
    std::vector<Member> members;
    for (uint32_t i = 0; i < 64; ++i) {
      members.push_back({Key(t * 64 + i) + ".bin", RandomBytes(128 << 10, t * 64 + i)});
    }
    tars.push_back((d.path() / "wds" / (std::to_string(t) + ".tar")).string());
    WriteTar(tars.back(), members);
  }
  const std::string ds = (d.path() / "ds").string();
  ImportOptions o;
  o.writer.shard_bytes = 1 << 20;
  int asked = 0;
  o.cancelled = [&] { return ++asked == 2; };
  auto r = ImportWebDataset(tars, ds, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCancelled) << r.status().ToString();
  EXPECT_NE(r.status().message().find("nothing was committed"), std::string::npos);
  EXPECT_EQ(asked, 2);
  EXPECT_FALSE(fs::exists(fs::path(ds) / "manifest.stoker"));
  o.cancelled = nullptr;
  auto again = ImportWebDataset(tars, ds, o);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->samples, 3u * 64);

  // The exporter stops after a shard: the tars finished stay, none half.
  ExportOptions e;
  e.samples_per_tar = 16;
  e.cancelled = [] { return true; };
  const std::string out = (d.path() / "out").string();
  auto x = ExportWebDataset(ds, out, e);
  ASSERT_FALSE(x.ok());
  EXPECT_EQ(x.status().code(), Code::kCancelled) << x.status().ToString();
  for (const auto& f : fs::directory_iterator(out)) {
    EXPECT_EQ(f.path().extension(), ".tar") << f.path();  // no .tmp left visible as a tar
  }
}

}  // namespace
}  // namespace stoker
