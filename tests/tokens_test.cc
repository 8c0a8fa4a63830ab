// Token datasets (issue 36): Megatron .bin/.idx pairs written by the test
// itself and imported byte for byte, every bad .idx named by file and
// offset, JSONL token lists, the window index, and the loader's
// sequence_length windows: Megatron's layout with shuffling off, every
// token once per epoch with it on, resume on another world size.
#include "stoker/tokens.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "stoker/dataset.h"
#include "stoker/import.h"
#include "stoker/loader.h"
#include "stoker/writer.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

template <typename T>
void Put(std::vector<std::byte>* out, T v) {
  const size_t at = out->size();
  out->resize(at + sizeof v);
  std::memcpy(out->data() + at, &v, sizeof v);
}

void WriteBytes(const fs::path& p, const std::vector<std::byte>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// A Megatron indexed dataset as megatron/core/datasets/indexed_dataset.py
// writes it: `docs[d]` is document d's sequences, each a list of tokens of
// dtype code `code` (8 uint16, 4 int32). Returns the .bin's bytes.
std::vector<std::byte> WriteMegatron(const fs::path& prefix,
                                     const std::vector<std::vector<std::vector<int64_t>>>& docs,
                                     uint8_t code = 8) {
  const size_t eb = code == 8 ? 2 : code == 4 ? 4 : code == 1 ? 1 : 8;
  std::vector<std::byte> bin, idx;
  std::vector<int32_t> lengths;
  std::vector<int64_t> pointers, doc_index{0};
  for (const auto& doc : docs) {
    for (const auto& seq : doc) {
      pointers.push_back(int64_t(bin.size()));
      lengths.push_back(int32_t(seq.size()));
      for (int64_t t : seq) {
        if (eb == 2) Put(&bin, uint16_t(t));
        if (eb == 4) Put(&bin, int32_t(t));
        if (eb == 1) Put(&bin, uint8_t(t));
        if (eb == 8) Put(&bin, int64_t(t));
      }
    }
    doc_index.push_back(int64_t(lengths.size()));
  }
  for (char c : std::string_view("MMIDIDX\0\0", 9)) Put(&idx, c);
  Put(&idx, uint64_t{1});
  Put(&idx, code);
  Put(&idx, uint64_t(lengths.size()));
  Put(&idx, uint64_t(doc_index.size()));
  for (int32_t l : lengths) Put(&idx, l);
  for (int64_t p : pointers) Put(&idx, p);
  for (int64_t d : doc_index) Put(&idx, d);
  WriteBytes(prefix.string() + ".bin", bin);
  WriteBytes(prefix.string() + ".idx", idx);
  return bin;
}

// Documents of one sequence each, token t of document d being a value that
// names both (d * 1000 + t, d < 60, t < 1000), lengths 1 .. 300.
std::vector<std::vector<std::vector<int64_t>>> NamedDocs(uint32_t n, uint64_t seed = 1) {
  std::vector<std::vector<std::vector<int64_t>>> docs;
  uint64_t x = seed;
  for (uint32_t d = 0; d < n; ++d) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t len = 1 + uint32_t((x >> 33) % 300);
    std::vector<int64_t> seq;
    for (uint32_t t = 0; t < len; ++t) seq.push_back(int64_t(d) * 1000 + t);
    docs.push_back({seq});
  }
  return docs;
}

std::vector<int64_t> Concatenated(const std::vector<std::vector<std::vector<int64_t>>>& docs) {
  std::vector<int64_t> all;
  for (const auto& d : docs)
    for (const auto& s : d) all.insert(all.end(), s.begin(), s.end());
  return all;
}

Result<ImportResult> Import(const fs::path& prefix, const std::string& dst,
                            uint64_t shard_bytes = 4096,
                            uint32_t block_bytes = format::kDefaultTokenBlockBytes) {
  ImportOptions o;
  o.writer.shard_bytes = shard_bytes;  // many small shards: windows cross shards
  o.writer.token_block_bytes = block_bytes;
  const std::string p = prefix.string();
  return ImportMegatron(std::span(&p, 1), dst, o);
}

// Every record's field `f`, by global sample id.
std::vector<std::vector<std::byte>> Records(const std::string& uri, const std::string& field,
                                            std::vector<int64_t>* ints = nullptr,
                                            const std::string& int_field = "") {
  LoaderOptions o;
  o.shuffle = false;
  o.batch_size = 64;
  auto l = Loader::Open(uri, o);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  std::vector<std::vector<std::byte>> out;
  if (!l.ok()) return out;
  while (true) {
    auto b = (*l)->Next();
    if (!b.ok()) break;
    const Batch::RaggedColumn* c = b->ragged(field);
    EXPECT_NE(c, nullptr);
    for (size_t i = 0; i < b->size(); ++i) {
      const auto* p = c->data.data() + i * c->max_rows * c->row_bytes;
      out.emplace_back(p, p + c->lengths[i] * c->row_bytes);
      if (ints) ints->push_back(b->int64(int_field)->values[i]);
    }
  }
  return out;
}

TEST(Megatron, ImportsEverySequenceByteForByte) {
  TempDir dir;
  auto docs = NamedDocs(40);
  const std::vector<std::byte> bin = WriteMegatron(dir.path() / "corpus_text_document", docs);
  auto r = Import(dir.path() / "corpus_text_document", (dir.path() / "ds").string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->samples, 40u);
  // One sequence a document: no document field; the tokens' block sums last.
  ASSERT_EQ(r->manifest.fields.size(), 2u);
  EXPECT_EQ(r->manifest.fields[0].Describe(), "'tokens' (array uint16[*])");
  EXPECT_EQ(r->manifest.fields[1].block_sums_of, "tokens");
  auto recs = Records((dir.path() / "ds").string(), "tokens");
  std::vector<std::byte> joined;
  for (const auto& rec : recs) joined.insert(joined.end(), rec.begin(), rec.end());
  EXPECT_EQ(joined, bin);  // tokens, in order, byte for byte
}

TEST(Megatron, KeepsDocumentsOfSeveralSequences) {
  TempDir dir;
  // int32 tokens; document 1 has three sequences, document 2 one empty one.
  std::vector<std::vector<std::vector<int64_t>>> docs = {
      {{1, 2, 3}}, {{70000, 5}, {6}, {-7, 8, 9}}, {{}}, {{10}}};
  WriteMegatron(dir.path() / "a", docs, 4);
  WriteMegatron(dir.path() / "b", {{{11, 12}}, {{13}, {14}}}, 4);
  ImportOptions o;
  const std::vector<std::string> paths = {(dir.path() / "a.idx").string(),
                                          (dir.path() / "b.bin").string()};
  auto r = ImportMegatron(paths, (dir.path() / "ds").string(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->manifest.fields.size(), 3u);
  EXPECT_EQ(r->manifest.fields[1].name, "document");
  EXPECT_EQ(r->manifest.fields[2].name, "tokens_sums");
  std::vector<int64_t> doc_of;
  auto recs = Records((dir.path() / "ds").string(), "tokens", &doc_of, "document");
  ASSERT_EQ(recs.size(), 9u);
  EXPECT_EQ(doc_of, (std::vector<int64_t>{0, 1, 1, 1, 2, 3, 4, 5, 5}));  // b's documents go on
  int32_t v[3];
  ASSERT_EQ(recs[3].size(), 12u);
  std::memcpy(v, recs[3].data(), 12);
  EXPECT_EQ(v[0], -7);
  EXPECT_EQ(recs[4].size(), 0u);  // the empty sequence is a record too
}

// Each way an .idx can be wrong, and what the error says.
TEST(Megatron, BadIndexNamesFileOffsetAndField) {
  TempDir dir;
  const fs::path prefix = dir.path() / "c";
  WriteMegatron(prefix, NamedDocs(5));
  const std::string idx_path = prefix.string() + ".idx";
  const std::vector<std::byte> good = testing::ReadFile(idx_path);
  struct Case {
    const char* what;
    std::function<void(std::vector<std::byte>*)> damage;
    std::vector<std::string> expect;
  };
  const std::vector<Case> cases = {
      {"magic", [](auto* b) { (*b)[2] = std::byte{'X'}; }, {"offset 0", "magic"}},
      {"version", [](auto* b) { (*b)[9] = std::byte{2}; }, {"offset 9", "version 2"}},
      {"dtype", [](auto* b) { (*b)[17] = std::byte{9}; }, {"offset 17", "dtype code 9"}},
      {"dtype int16", [](auto* b) { (*b)[17] = std::byte{3}; }, {"offset 17", "int16"}},
      {"truncated header", [](auto* b) { b->resize(20); }, {"offset 20", "truncated"}},
      {"counts", [](auto* b) { (*b)[18] = std::byte{6}; }, {"offset 18", "sequence count 6"}},
      {"short arrays", [](auto* b) { b->resize(b->size() - 8); }, {"offset 18", "document count"}},
      {"document index",
       [](auto* b) { (*b)[b->size() - 8] = std::byte{4}; },
       {"document index 5 is 4"}},
      {"pointer",
       [](auto* b) { (*b)[34 + 4 * 5 + 8 * 4 + 1] = std::byte{0x7f}; },
       {"sequence 4", "lies outside", ".bin"}},
  };
  for (const Case& c : cases) {
    std::vector<std::byte> bad = good;
    c.damage(&bad);
    WriteBytes(idx_path, bad);
    auto r = Import(prefix, (dir.path() / ("ds_" + std::to_string(&c - cases.data()))).string());
    ASSERT_FALSE(r.ok()) << c.what;
    const std::string msg = r.status().ToString();
    EXPECT_NE(msg.find(idx_path), std::string::npos) << c.what << ": " << msg;
    for (const std::string& e : c.expect) {
      EXPECT_NE(msg.find(e), std::string::npos) << c.what << ": " << msg;
    }
  }
  // The .bin's size against the lengths.
  WriteBytes(idx_path, good);
  std::vector<std::byte> bin = testing::ReadFile(prefix.string() + ".bin");
  bin.push_back(std::byte{0});
  bin.push_back(std::byte{0});
  WriteBytes(prefix.string() + ".bin", bin);
  auto r = Import(prefix, (dir.path() / "ds_bin").string());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("add up to"), std::string::npos) << r.status().ToString();
  // A missing half.
  fs::remove(prefix.string() + ".bin");
  r = Import(prefix, (dir.path() / "ds_none").string());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
}

TEST(Megatron, CancelledImportCommitsNothing) {
  TempDir dir;
  WriteMegatron(dir.path() / "m", NamedDocs(30));
  ImportOptions o;
  o.cancelled = [] { return true; };
  const std::string p = (dir.path() / "m").string();
  auto r = ImportMegatron(std::span(&p, 1), (dir.path() / "ds").string(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kCancelled) << r.status().ToString();
  EXPECT_FALSE(fs::exists(dir.path() / "ds" / std::string(format::kManifestKey)));
}

TEST(JsonlTokens, TokenListsAndOutOfRangeNamesTheLine) {
  TempDir dir;
  const fs::path p = dir.path() / "t.jsonl";
  {
    std::ofstream f(p);
    f << "{\"tokens\": [1, 2, 3]}\n{\"tokens\": []}\n{\"tokens\": [65535, 4]}\n";
  }
  ImportOptions o;
  auto spec = format::ParseFieldSpec("tokens", "uint16[*]");
  ASSERT_TRUE(spec.ok());
  o.fields = {*spec};
  const std::string path = p.string();
  auto r = ImportJsonl(std::span(&path, 1), (dir.path() / "ds").string(), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto ds = TokenDataset::Open(
      OpenStore((dir.path() / "ds").string()).value(),
      ReadManifest(*OpenStore((dir.path() / "ds").string()).value()).value(), {});
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ((*ds)->documents(), 3u);
  EXPECT_EQ(std::vector<uint32_t>((*ds)->doc_tokens().begin(), (*ds)->doc_tokens().end()),
            (std::vector<uint32_t>{3, 0, 2}));
  {
    std::ofstream f(p, std::ios::app);
    f << "{\"tokens\": [70000]}\n";
  }
  r = ImportJsonl(std::span(&path, 1), (dir.path() / "ds2").string(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kOutOfRange);
  EXPECT_NE(r.status().ToString().find(path + ":4"), std::string::npos) << r.status().ToString();
}

// ---- the window index ----

TEST(TokenWindows, UnshuffledWindowsAreConsecutiveSlices) {
  const std::vector<uint32_t> lens = {5, 0, 3, 7, 1, 0, 4};  // 20 tokens
  auto w = TokenWindows::Build(lens, 4, 99, false, 0, 0);
  EXPECT_EQ(w.size(), 4u);  // floor(19 / 4)
  std::vector<uint64_t> starts = {0};
  for (uint32_t l : lens) starts.push_back(starts.back() + l);
  for (uint64_t k = 0; k < w.size(); ++k) {
    std::vector<TokenPiece> pieces;
    w.Pieces(k, &pieces);
    uint64_t at = k * 4, total = 0;
    for (const TokenPiece& p : pieces) {
      EXPECT_GT(p.count, 0u);
      EXPECT_EQ(starts[p.doc] + p.begin, at) << "window " << k;
      at += p.count;
      total += p.count;
    }
    EXPECT_EQ(total, 5u);
  }
  EXPECT_EQ(TokenWindows::Build(lens, 19, 0, false, 0, 0).size(), 1u);
  EXPECT_EQ(TokenWindows::Build(lens, 20, 0, false, 0, 0).size(), 0u);
}

TEST(TokenWindows, ShuffledOrderIsAPureFunctionOfDatasetSeedEpoch) {
  std::vector<uint32_t> lens(1000);
  for (size_t i = 0; i < lens.size(); ++i) lens[i] = 1 + uint32_t(i * 7919 % 50);
  auto a = TokenWindows::Build(lens, 16, 5, true, 1, 0);
  auto b = TokenWindows::Build(lens, 16, 5, true, 1, 0);
  auto c = TokenWindows::Build(lens, 16, 5, true, 1, 1);
  auto d = TokenWindows::Build(lens, 16, 6, true, 1, 0);
  std::vector<uint64_t> da, db, dc, dd;
  for (uint64_t j = 0; j < lens.size(); ++j) {
    da.push_back(a.DocAt(j)), db.push_back(b.DocAt(j)), dc.push_back(c.DocAt(j)),
        dd.push_back(d.DocAt(j));
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
  EXPECT_NE(da, dd);
  std::vector<uint64_t> sorted = da;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t j = 0; j < sorted.size(); ++j) ASSERT_EQ(sorted[j], j);  // a permutation
  // The windows' visiting order: a permutation too, not the identity.
  std::vector<uint64_t> order;
  for (uint64_t p = 0; p < a.size(); ++p) order.push_back(a.WindowAt(p));
  std::vector<uint64_t> ids = order;
  std::sort(ids.begin(), ids.end());
  for (uint64_t k = 0; k < ids.size(); ++k) ASSERT_EQ(ids[k], k);
  EXPECT_NE(order, ids);
}

// Past TokenWindows::kFullShuffleDocuments the documents are shuffled in
// blocks: the same contract at any block size (every document once, the
// index equal to summing the epoch's order one by one, a pure function of
// the key), the last, shorter block anywhere in the order.
TEST(TokenWindows, BlockedOrderKeepsTheContract) {
  EXPECT_EQ(TokenWindows::DocumentsPerBlock(1000), 1u);
  EXPECT_EQ(TokenWindows::DocumentsPerBlock(TokenWindows::kFullShuffleDocuments), 1u);
  EXPECT_EQ(TokenWindows::DocumentsPerBlock(TokenWindows::kFullShuffleDocuments + 1), 2u);
  EXPECT_EQ(TokenWindows::DocumentsPerBlock(1000000000), 64u);
  EXPECT_EQ(TokenWindows::DocumentsPerBlock(10000000000), 1024u);
  std::vector<uint32_t> lens(5003);
  for (size_t i = 0; i < lens.size(); ++i) lens[i] = uint32_t(i * 2654435761u % 61);
  for (uint32_t per : {2u, 7u, 64u, 8192u}) {
    for (bool shuffle : {false, true}) {
      for (uint64_t epoch : {0u, 1u}) {
        const uint32_t L = 37;
        auto w = TokenWindows::Build(lens, L, 11, shuffle, 2, epoch, per);
        ASSERT_EQ(w.documents_per_block(), per);
        std::vector<uint64_t> docs, prefix{0};
        for (uint64_t j = 0; j < lens.size(); ++j) {
          docs.push_back(w.DocAt(j));
          prefix.push_back(prefix.back() + lens[docs.back()]);
        }
        std::vector<uint64_t> sorted = docs;
        std::sort(sorted.begin(), sorted.end());
        for (uint64_t j = 0; j < sorted.size(); ++j) ASSERT_EQ(sorted[j], j) << per;
        if (!shuffle) EXPECT_EQ(docs, sorted);
        if (shuffle) EXPECT_NE(docs, sorted);
        // A block's documents are one stretch of the order: as many runs
        // of one block as there are blocks.
        uint64_t runs = 0;
        for (uint64_t j = 0; j < docs.size(); ++j) runs += j == 0 || docs[j] / per != docs[j - 1] / per;
        ASSERT_EQ(runs, (lens.size() + per - 1) / per) << per;
        ASSERT_EQ(w.total_tokens(), prefix.back());
        ASSERT_EQ(w.size(), (prefix.back() - 1) / L);
        for (uint64_t k = 0; k < w.size(); ++k) {
          std::vector<TokenPiece> pieces;
          w.Pieces(k, &pieces);
          uint64_t j =
              uint64_t(std::upper_bound(prefix.begin(), prefix.end(), k * L) - prefix.begin()) - 1;
          uint64_t at = k * L, n = 0;
          for (const TokenPiece& p : pieces) {
            while (prefix[j + 1] <= at) ++j;  // past empty documents
            ASSERT_EQ(p.doc, docs[j]) << "per " << per << " window " << k;
            ASSERT_EQ(p.begin, at - prefix[j]) << "per " << per << " window " << k;
            ASSERT_GT(p.count, 0u);
            at += p.count, n += p.count;
          }
          ASSERT_EQ(n, L + 1u);
        }
        auto again = TokenWindows::Build(lens, L, 11, shuffle, 2, epoch, per);
        for (uint64_t j = 0; j < lens.size(); j += 101) ASSERT_EQ(again.DocAt(j), docs[j]);
      }
    }
  }
}

// Past 2^20 documents the prefix sums are built by several threads, in
// chunks: the same index as summing the epoch's order one by one.
TEST(TokenWindows, ChunkedBuildEqualsTheSequentialSums) {
  std::vector<uint32_t> lens((3u << 20) + 4321);
  for (size_t i = 0; i < lens.size(); ++i) lens[i] = uint32_t(i * 2654435761u % 97);
  for (auto [shuffle, per] : {std::pair{false, 1u}, {true, 1u}, {false, 3u}, {true, 3u}}) {
    const uint32_t L = 333;
    auto w = TokenWindows::Build(lens, L, 11, shuffle, 2, 3, per);
    std::vector<uint64_t> prefix{0};
    for (uint64_t j = 0; j < lens.size(); ++j) prefix.push_back(prefix.back() + lens[w.DocAt(j)]);
    ASSERT_EQ(w.total_tokens(), prefix.back());
    ASSERT_EQ(w.size(), (prefix.back() - 1) / L);
    for (uint64_t k = 0; k < w.size(); k += 997) {
      std::vector<TokenPiece> pieces;
      w.Pieces(k, &pieces);
      const uint64_t j =
          uint64_t(std::upper_bound(prefix.begin(), prefix.end(), k * L) - prefix.begin()) - 1;
      ASSERT_EQ(pieces[0].doc, w.DocAt(j)) << k;
      ASSERT_EQ(pieces[0].begin, k * L - prefix[j]) << k;
      uint64_t n = 0;
      for (const TokenPiece& p : pieces) n += p.count;
      ASSERT_EQ(n, L + 1u);
    }
  }
}

// ---- the loader ----

struct Delivered {
  std::vector<uint64_t> ids;               // window numbers, in delivery order
  std::vector<std::vector<int64_t>> rows;  // their tokens
  std::vector<uint64_t> positions;         // their global positions
  LoaderState last;
};

// Batches of rank `rank` of `world`, from `start` on, at most `max_batches`.
Delivered RunWindows(const std::string& uri, LoaderOptions o, uint32_t rank, uint32_t world,
                     LoaderState start = {}, uint64_t max_batches = ~0ull) {
  o.rank = rank;
  o.world_size = world;
  o.start = start;
  auto l = Loader::Open(uri, o);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  Delivered d;
  if (!l.ok()) return d;
  for (uint64_t b = 0; b < max_batches; ++b) {
    auto batch = (*l)->Next();
    if (!batch.ok()) {
      EXPECT_EQ(batch.status().code(), Code::kOutOfRange) << batch.status().ToString();
      break;
    }
    const Batch::FixedColumn* t = batch->fixed("tokens");
    EXPECT_NE(t, nullptr);
    EXPECT_EQ(t->item_shape, std::vector<int64_t>{int64_t(o.sequence_length) + 1});
    for (size_t i = 0; i < batch->size(); ++i) {
      d.ids.push_back(batch->sample_ids()[i]);
      std::vector<int64_t> row(o.sequence_length + 1);
      if (t->element == ElementType::kInt64) {
        std::memcpy(row.data(), t->data.data() + i * t->item_bytes, t->item_bytes);
      } else {
        for (size_t j = 0; j < row.size(); ++j) {
          int32_t v;
          std::memcpy(&v, t->data.data() + i * t->item_bytes + 4 * j, 4);
          row[j] = v;
        }
      }
      d.rows.push_back(row);
      const uint64_t j = b * o.batch_size + i;  // this rank's j-th window since `start`
      d.positions.push_back(start.position + j * world + rank);
    }
    d.last = batch->state_after();
  }
  return d;
}

class TokenLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    docs_ = NamedDocs(57);
    WriteMegatron(dir_.path() / "m", docs_);
    auto r = Import(dir_.path() / "m", uri());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_GT(r->manifest.shards.size(), 3u);
    all_ = Concatenated(docs_);
  }
  std::string uri() const { return (dir_.path() / "ds").string(); }
  LoaderOptions Options(uint32_t L, uint32_t batch, bool shuffle) const {
    LoaderOptions o;
    o.sequence_length = L;
    o.batch_size = batch;
    o.shuffle = shuffle;
    o.seed = 7;
    return o;
  }
  TempDir dir_;
  std::vector<std::vector<std::vector<int64_t>>> docs_;
  std::vector<int64_t> all_;
};

// Megatron's sample layout with its document shuffle off: window k is
// tokens [kL, kL + L + 1) of the documents in dataset order.
TEST_F(TokenLoaderTest, UnshuffledWindowKIsTokensKLToKLPlusLPlus1) {
  for (uint32_t L : {1u, 16u, 255u, 1000u}) {
    Delivered d = RunWindows(uri(), Options(L, 3, false), 0, 1);
    ASSERT_EQ(d.ids.size(), (all_.size() - 1) / L) << "L " << L;
    for (size_t i = 0; i < d.ids.size(); ++i) {
      ASSERT_EQ(d.ids[i], i);
      const std::vector<int64_t> want(all_.begin() + i * L, all_.begin() + i * L + L + 1);
      ASSERT_EQ(d.rows[i], want) << "L " << L << " window " << i;
    }
  }
}

TEST_F(TokenLoaderTest, Int32AndPositionsAndDocuments) {
  LoaderOptions o = Options(64, 4, false);
  o.sequence_dtype = "int32";
  o.sequence_positions = true;
  auto l = Loader::Open(uri(), o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto b = (*l)->Next();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(b->size(), 4u);
  const auto* t = b->fixed("tokens");
  const auto* pos = b->fixed("positions");
  const auto* doc = b->fixed("documents");
  ASSERT_TRUE(t && pos && doc);
  EXPECT_EQ(t->element, ElementType::kInt32);
  for (size_t i = 0; i < 4; ++i) {
    int32_t prev_doc = -1, prev_index = -1;
    for (size_t j = 0; j < 65; ++j) {
      int32_t tok, p, dd;
      std::memcpy(&tok, t->data.data() + (i * 65 + j) * 4, 4);
      std::memcpy(&p, pos->data.data() + (i * 65 + j) * 4, 4);
      std::memcpy(&dd, doc->data.data() + (i * 65 + j) * 4, 4);
      EXPECT_EQ(p, tok % 1000);  // token t of a document is d * 1000 + t
      // The document's index within the window goes up where the document changes.
      EXPECT_EQ(dd, j == 0 ? 0 : prev_index + (tok / 1000 != prev_doc ? 1 : 0));
      prev_doc = tok / 1000;
      prev_index = dd;
    }
  }
}

// With shuffling on: each epoch's windows, over every rank, put together in
// window order, are the documents in one order (each once, whole) whose
// tokens run on, plus the one-token overlaps; the order is the same for the
// same (dataset, seed, epoch) and another for another epoch.
TEST_F(TokenLoaderTest, ShuffledEpochCoversEveryTokenOnce) {
  const uint32_t L = 50, world = 3;
  std::vector<std::vector<uint64_t>> orders;
  for (uint64_t epoch : {0, 1, 0}) {
    std::map<uint64_t, std::vector<int64_t>> by_window;
    for (uint32_t r = 0; r < world; ++r) {
      Delivered d = RunWindows(uri(), Options(L, 4, true), r, world, LoaderState(epoch, 0));
      for (size_t i = 0; i < d.ids.size(); ++i) {
        ASSERT_TRUE(by_window.emplace(d.ids[i], d.rows[i]).second) << "window twice";
      }
    }
    const uint64_t windows = (all_.size() - 1) / L;
    ASSERT_EQ(by_window.size(), windows / world * world);
    // The windows a rank count short of a full share (windows % world) are
    // left out; the first ones form the documents' order, overlapping by one.
    std::vector<int64_t> stream;
    uint64_t expect_k = 0;
    for (const auto& [k, row] : by_window) {
      if (k != expect_k) break;
      if (!stream.empty()) {
        ASSERT_EQ(stream.back(), row[0]) << "overlap of window " << k;
      }
      stream.insert(stream.end(), row.begin() + (stream.empty() ? 0 : 1), row.end());
      ++expect_k;
    }
    ASSERT_GT(stream.size(), all_.size() / 2);
    std::vector<uint64_t> order;
    std::set<uint64_t> seen;
    for (size_t i = 0; i < stream.size(); ++i) {
      const int64_t doc = stream[i] / 1000, t = stream[i] % 1000;
      if (t == 0) {
        ASSERT_TRUE(seen.insert(doc).second) << "document " << doc << " twice";
        if (i > 0) {  // the one before ended whole
          const int64_t prev = stream[i - 1] / 1000;
          ASSERT_EQ(stream[i - 1] % 1000 + 1, int64_t(docs_[prev][0].size()));
        }
        order.push_back(doc);
      } else {
        ASSERT_GT(i, 0u);
        ASSERT_EQ(stream[i - 1], stream[i] - 1) << "a document's tokens run on";
      }
    }
    orders.push_back(order);
  }
  EXPECT_EQ(orders[0], orders[2]);
  EXPECT_NE(orders[0], orders[1]);
  std::vector<uint64_t> dataset_order(orders[0].size());
  for (size_t i = 0; i < dataset_order.size(); ++i) dataset_order[i] = i;
  EXPECT_NE(orders[0], dataset_order);
}

// A run saved on 4 ranks resumes on 2 (and on 3) and yields the same global
// stream as an uninterrupted run on 1.
TEST_F(TokenLoaderTest, ResumesOnAnotherWorldSize) {
  const LoaderOptions o = Options(40, 2, true);
  Delivered whole = RunWindows(uri(), o, 0, 1);
  std::map<uint64_t, uint64_t> expect;  // position -> window
  for (size_t i = 0; i < whole.ids.size(); ++i) expect[whole.positions[i]] = whole.ids[i];
  for (uint32_t after : {2u, 3u}) {
    std::map<uint64_t, uint64_t> got;
    LoaderState saved;
    for (uint32_t r = 0; r < 4; ++r) {
      Delivered d = RunWindows(uri(), o, r, 4, {}, 3);
      for (size_t i = 0; i < d.ids.size(); ++i) got[d.positions[i]] = d.ids[i];
      saved = d.last;
    }
    EXPECT_EQ(saved.position, 3u * 2 * 4);
    EXPECT_EQ(saved.sequence_length, 40u);
    EXPECT_EQ(saved.world_size, 4u);
    for (uint32_t r = 0; r < after; ++r) {
      Delivered d = RunWindows(uri(), o, r, after, saved);
      for (size_t i = 0; i < d.ids.size(); ++i) {
        ASSERT_TRUE(got.emplace(d.positions[i], d.ids[i]).second) << "position twice";
      }
    }
    for (const auto& [p, k] : got) {
      ASSERT_TRUE(expect.count(p)) << p;
      EXPECT_EQ(expect[p], k) << "position " << p;
    }
    EXPECT_GE(got.size() + after, expect.size());
  }
}

TEST_F(TokenLoaderTest, BadOptionsAndStatesAreRefused) {
  LoaderOptions o = Options(16, 2, true);
  o.sequence_dtype = "float32";
  auto l = Loader::Open(uri(), o);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().ToString().find("sequence_dtype"), std::string::npos);
  o = Options(16, 2, true);
  o.decode.field = "tokens";
  l = Loader::Open(uri(), o);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().ToString().find("decode"), std::string::npos);
  o = Options(16, 2, true);
  o.sequence_field = "nope";
  l = Loader::Open(uri(), o);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().ToString().find("nope"), std::string::npos);
  // A state saved with another sequence length.
  o = Options(16, 2, true);
  auto opened = Loader::Open(uri(), o);
  ASSERT_TRUE(opened.ok());
  LoaderState s = IdentifiedState(0, 4, (*opened)->manifest(), o);
  s.sequence_length = 32;
  o.start = s;
  l = Loader::Open(uri(), o);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().ToString().find("sequence_length"), std::string::npos)
      << l.status().ToString();
  // A position past the epoch's windows.
  o = Options(16, 2, true);
  o.start = LoaderState(0, 1u << 30);
  l = Loader::Open(uri(), o);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().ToString().find("windows"), std::string::npos) << l.status().ToString();
}

// A StartEpoch refused (a position past the epoch) leaves Next() failing,
// not waiting; the next good StartEpoch reads that epoch's own windows.
TEST_F(TokenLoaderTest, RefusedStartEpochThenAnother) {
  const LoaderOptions o = Options(20, 4, true);
  auto l = Loader::Open(uri(), o);
  ASSERT_TRUE(l.ok());
  ASSERT_TRUE((*l)->Next().ok());
  EXPECT_FALSE((*l)->StartEpoch(3, 1u << 30).ok());
  auto b = (*l)->Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kInvalidArgument);
  ASSERT_OK((*l)->StartEpoch(0, 0));
  b = (*l)->Next();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  Delivered fresh = RunWindows(uri(), o, 0, 1, LoaderState(0, 0), 1);
  EXPECT_EQ(std::vector<uint64_t>(b->sample_ids().begin(), b->sample_ids().end()), fresh.ids);
}

TEST(TokenLoader, NoTokenFieldIsNamed) {
  TempDir dir;
  const fs::path p = dir.path() / "t.jsonl";
  {
    std::ofstream f(p);
    f << "{\"text\": \"hello\"}\n";
  }
  const std::string path = p.string();
  ASSERT_TRUE(ImportJsonl(std::span(&path, 1), (dir.path() / "ds").string(), {}).ok());
  LoaderOptions o;
  o.sequence_length = 8;
  auto l = Loader::Open((dir.path() / "ds").string(), o);
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.status().code(), Code::kInvalidArgument);
  EXPECT_NE(l.status().ToString().find("no token field"), std::string::npos);
}

// Only the windows' documents are read: with verify off, the tokens
// themselves (each overlap token twice) and the shards' indexes.
TEST_F(TokenLoaderTest, ReadsOnlyTheWindowsBytes) {
  LoaderOptions o = Options(32, 4, true);
  o.sequence_verify = false;
  auto l = Loader::Open(uri(), o);
  ASSERT_TRUE(l.ok());
  const uint64_t index = (*l)->stats().bytes_read;
  uint64_t windows = 0;
  while (true) {
    auto b = (*l)->Next();
    if (!b.ok()) break;
    windows += b->size();
  }
  const uint64_t read = (*l)->stats().bytes_read - index;
  EXPECT_EQ(read, windows * 33 * 2);  // uint16 tokens
}

// Bytes a verified loader of `uri` (uint16 tokens, one field and its block
// sums after it, or none: `block` 0) reads past the open for an epoch of
// windows of L, shuffled; and what that reading should be: with block sums
// the blocks each piece touches and their checksums, one range where less
// than 512 bytes lie between them (TokenReader's rule), else two; without,
// the whole records of the documents each window touches.
void VerifiedEpochBytes(const std::string& uri, const std::vector<uint32_t>& lens, uint32_t L,
                        uint32_t block, uint64_t* read, uint64_t* expect) {
  LoaderOptions o;
  o.sequence_length = L;
  o.batch_size = 4;
  o.seed = 7;
  auto v = Loader::Open(uri, o);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const uint64_t index = (*v)->stats().bytes_read;
  const TokenWindows w = TokenWindows::Build(lens, L, (*v)->manifest().Id64(), true, o.seed, 0);
  *expect = 0;
  while (true) {
    auto b = (*v)->Next();
    if (!b.ok()) {
      ASSERT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
      break;
    }
    for (uint64_t k : b->sample_ids()) {
      std::vector<TokenPiece> pieces;
      w.Pieces(k, &pieces);
      for (const TokenPiece& p : pieces) {
        const uint64_t F = 2 * lens[p.doc];
        if (block == 0) {
          *expect += F;
          continue;
        }
        const uint64_t b0 = 2 * p.begin / block, b1 = (2 * (p.begin + p.count) + block - 1) / block;
        const uint64_t tokens = std::min(b1 * block, F) - b0 * block, sums = 8 * (b1 - b0);
        const uint64_t span = F + 8 * b1 - b0 * block;  // sums right after the tokens
        *expect += span <= tokens + sums + 512 ? span : tokens + sums;
      }
    }
  }
  *read = (*v)->stats().bytes_read - index;
}

// Documents of 1..2000 uint16 tokens, as the RADOS benchmark's (1..2047).
std::vector<std::vector<std::vector<int64_t>>> LongDocs(uint32_t n) {
  std::vector<std::vector<std::vector<int64_t>>> docs;
  uint64_t x = 3;
  for (uint32_t d = 0; d < n; ++d) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t len = 1 + uint32_t((x >> 33) % 2000);
    std::vector<int64_t> seq(len);
    for (uint32_t t = 0; t < len; ++t) seq[t] = int64_t((x >> 7) + t) % 60000;
    docs.push_back({seq});
  }
  return docs;
}

// Verified windows read the blocks they touch and those blocks' checksums
// (docs/format.md §3.5), not the documents whole: for documents of
// 1..2000 tokens and L = 2048 (the benchmark's shape) at most 1.2x the
// tokens with 512-byte blocks, where whole documents are ~1.66x.
TEST(TokenBlockSums, VerifiedWindowsReadOnlyTheirBlocks) {
  TempDir dir;
  const auto docs = LongDocs(600);
  WriteMegatron(dir.path() / "m", docs);
  std::vector<uint32_t> lens;
  for (const auto& d : docs) lens.push_back(uint32_t(d[0].size()));
  for (uint32_t block : {64u, 512u, 0u}) {
    const std::string uri = (dir.path() / ("ds" + std::to_string(block))).string();
    auto r = Import(dir.path() / "m", uri, 1 << 20, block);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const auto& fields = r->manifest.fields;
    if (block == 0) {
      ASSERT_EQ(fields.size(), 1u);  // as packed before block sums
    } else {
      ASSERT_EQ(fields.size(), 2u);
      EXPECT_EQ(fields[1].name, "tokens_sums");
      EXPECT_EQ(fields[1].type, format::FieldType::kBytes);
      EXPECT_EQ(fields[1].block_sums_of, "tokens");
      EXPECT_EQ(fields[1].block_bytes, block);
    }
    for (uint32_t L : {100u, 2048u}) {
      uint64_t read = 0, expect = 0;
      VerifiedEpochBytes(uri, lens, L, block, &read, &expect);
      EXPECT_EQ(read, expect) << "block " << block << " L " << L;
      const uint64_t windows = (r->manifest.payload_bytes / 2) / L;  // about
      if (L == 2048 && block == 512) EXPECT_LT(read, 1.2 * windows * 2 * L) << read;
      if (L == 2048 && block == 0) EXPECT_GT(read, 1.5 * windows * 2 * L) << read;
    }
  }
}

// Every block's checksum is checked: a byte flipped anywhere in a
// document's tokens is Corruption naming the dataset, the shard, the
// document and the block; one in a dataset without block sums names the
// shard and sample (whole-record check).
TEST(TokenBlockSums, FlippedByteNamesDatasetShardDocumentAndBlock) {
  TempDir dir;
  const auto docs = LongDocs(40);
  WriteMegatron(dir.path() / "m", docs);
  for (uint32_t block : {512u, 0u}) {
    const std::string uri = (dir.path() / ("ds" + std::to_string(block))).string();
    ASSERT_TRUE(Import(dir.path() / "m", uri, 1 << 20, block).ok());
    const fs::path shard = fs::path(uri) / "shards" / "000000.stks";
    const std::vector<std::byte> good = testing::ReadFile(shard);
    // Token byte 1100 (block 2 of 512) of the first document that has one.
    uint64_t at = format::kShardHeaderBytes;
    size_t doc = 0;
    for (; 2 * docs[doc][0].size() <= 1100; ++doc) {
      const uint64_t bytes = 2 * docs[doc][0].size();
      at += bytes + (block ? format::BlockSumsBytes(bytes, block) : 0);
    }
    std::vector<std::byte> bad = good;
    bad[at + 1100] ^= std::byte{0x01};
    WriteBytes(shard, bad);
    LoaderOptions o;
    o.sequence_length = 64;
    o.batch_size = 4;
    o.shuffle = false;
    auto l = Loader::Open(uri, o);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    Status st;
    while (st.ok()) {
      auto b = (*l)->Next();
      if (!b.ok()) st = b.status();
    }
    ASSERT_EQ(st.code(), Code::kCorruption) << st.ToString();
    const std::string msg = st.ToString();
    EXPECT_NE(msg.find(uri), std::string::npos) << msg;
    EXPECT_NE(msg.find("shards/000000.stks"), std::string::npos) << msg;
    if (block) {
      EXPECT_NE(msg.find("document " + std::to_string(doc) + " "), std::string::npos) << msg;
      EXPECT_NE(msg.find("block 2 of field 'tokens'"), std::string::npos) << msg;
    } else {
      EXPECT_NE(msg.find("sample " + std::to_string(doc) + " "), std::string::npos) << msg;
    }
    // Verification off reads no checksum: the flipped token is delivered.
    o.sequence_verify = false;
    auto u = Loader::Open(uri, o);
    ASSERT_TRUE(u.ok());
    while (true) {
      auto b = (*u)->Next();
      if (!b.ok()) {
        EXPECT_EQ(b.status().code(), Code::kOutOfRange) << b.status().ToString();
        break;
      }
    }
  }
}

// The block sums' metadata is checked when the dataset opens: a manifest
// whose block-sums keys are wrong names the manifest and the field; a
// record whose block-sums field has the wrong length for its tokens names
// the shard, the sample and the field.
TEST(TokenBlockSums, BadMetadataIsNamedAtOpen) {
  TempDir dir;
  WriteMegatron(dir.path() / "m", LongDocs(20));
  const std::string uri = (dir.path() / "ds").string();
  ASSERT_TRUE(Import(dir.path() / "m", uri, 1 << 20).ok());
  const fs::path mpath = fs::path(uri) / "manifest.stoker";
  const std::vector<std::byte> good = testing::ReadFile(mpath);
  auto m = format::DecodeManifest(good, "m");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto open_with = [&](const std::function<void(format::Manifest*)>& edit) {
    format::Manifest e = *m;
    edit(&e);
    const std::string text = format::EncodeManifest(e);
    WriteBytes(mpath, std::vector<std::byte>(reinterpret_cast<const std::byte*>(text.data()),
                                             reinterpret_cast<const std::byte*>(text.data()) +
                                                 text.size()));
    LoaderOptions o;
    o.sequence_length = 16;
    auto l = Loader::Open(uri, o);
    return l.ok() ? Status::Ok() : l.status();
  };
  Status st = open_with([](format::Manifest* e) { e->fields[1].block_bytes = 100; });
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.ToString().find("manifest.stoker: fields[1].block_bytes: block_bytes 100"),
            std::string::npos)
      << st.ToString();
  st = open_with([](format::Manifest* e) { e->fields[1].block_sums_of = "nope"; });
  EXPECT_NE(st.ToString().find("fields[1].block_sums_of: block_sums_of 'nope' names no field"),
            std::string::npos)
      << st.ToString();
  // Blocks of 256 where the records hold sums of 512-byte blocks: each
  // record of more than 256 token bytes has too few.
  st = open_with([](format::Manifest* e) { e->fields[1].block_bytes = 256; });
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.ToString().find("shards/000000.stks: sample 0 (global 0): field 'tokens_sums' has"),
            std::string::npos)
      << st.ToString();
  EXPECT_NE(st.ToString().find("(8 per block of 256 of the"), std::string::npos) << st.ToString();
  // `stoker verify` checks each record's block sums too: here their count.
  auto store = OpenStore(uri);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto bad = VerifyDataset(**store);
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  ASSERT_FALSE(bad->problems.empty());
  EXPECT_EQ(bad->problems[0].status.code(), Code::kCorruption);
  EXPECT_NE(bad->problems[0].status.message().find(
                "sample 0 of the shard: field 'tokens': "),
            std::string::npos)
      << bad->problems[0].status.ToString();
  EXPECT_NE(bad->problems[0].status.message().find("token bytes in blocks of 256"),
            std::string::npos)
      << bad->problems[0].status.ToString();
  ASSERT_OK(open_with([](format::Manifest*) {}));
  // And with the right manifest, every block of every record matches.
  auto good_report = VerifyDataset(**store);
  ASSERT_TRUE(good_report.ok()) << good_report.status().ToString();
  EXPECT_TRUE(good_report->problems.empty());
  EXPECT_EQ(good_report->samples_checked, 20u);
}

// The writer fills the block sums itself: a schema that holds a block-sums
// field, or a field of its name, is refused; a bad block size too.
TEST(TokenBlockSums, WriterRefusesWhatItWouldWriteItself) {
  TempDir dir;
  auto tokens = format::ParseFieldSpec("tokens", "uint16[*]");
  ASSERT_TRUE(tokens.ok());
  WriterOptions wo;
  auto w = DatasetWriter::Create((dir.path() / "a").string(),
                                 {*tokens, format::BlockSumsFieldFor(*tokens, 512)}, wo);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().ToString().find("is a block-sums field"), std::string::npos);
  auto named = format::ParseFieldSpec("tokens_sums", "bytes");
  w = DatasetWriter::Create((dir.path() / "b").string(), {*tokens, *named}, wo);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().ToString().find("'tokens_sums' is the name of the block sums"),
            std::string::npos);
  wo.token_block_bytes = 0;  // no block sums: the name is the user's
  ASSERT_TRUE(DatasetWriter::Create((dir.path() / "c").string(), {*tokens, *named}, wo).ok());
  wo.token_block_bytes = 1000;
  w = DatasetWriter::Create((dir.path() / "d").string(), {*tokens}, wo);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().ToString().find("token_block_bytes 1000"), std::string::npos);
  // The writer's fields() are the user's: Write takes one value a field.
  wo.token_block_bytes = 64;
  auto ok = DatasetWriter::Create((dir.path() / "e").string(), {*tokens}, wo);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ((*ok)->fields().size(), 1u);
  std::vector<std::byte> t(300);
  format::FieldValue v{t};
  ASSERT_OK((*ok)->Write(std::span(&v, 1)));
  auto m = (*ok)->Close();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->fields.size(), 2u);
  EXPECT_EQ(m->payload_bytes, 300u + 8 * 5);
}

TEST_F(TokenLoaderTest, CorruptRecordIsNamed) {
  // Flip a byte of the first shard's first record.
  const fs::path shard = dir_.path() / "ds" / "shards" / "000000.stks";
  std::vector<std::byte> bytes = testing::ReadFile(shard);
  bytes[format::kShardHeaderBytes + 1] ^= std::byte{0x40};
  WriteBytes(shard, bytes);
  LoaderOptions o = Options(16, 8, false);
  auto l = Loader::Open(uri(), o);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto b = (*l)->Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::kCorruption);
  EXPECT_NE(b.status().ToString().find("000000.stks"), std::string::npos) << b.status().ToString();
}

}  // namespace
}  // namespace stoker
