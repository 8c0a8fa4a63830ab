// The loader's collation of format 3's typed fields: float32/float64 and
// fixed-shape arrays as dense fixed columns, str/json as typed bytes columns,
// variable arrays padded or back to back with lengths and row offsets. A
// small dataset with one field of every kind (and every array dtype) is
// written with ShardBuilder + EncodeShardTable + EncodeManifest into a local
// folder, loaded with each read unit and both ragged layouts, and every value
// of every column is compared with what was written.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "loader/batch_builder.h"
#include "stoker/format.h"
#include "stoker/loader.h"
#include "stoker/store.h"
#include "testutil.h"

namespace stoker {
namespace {

using format::FieldSpec;
using format::FieldType;
using format::FieldValue;
using testing::RandomBytes;
using testing::TempDir;
using Bytes = std::vector<std::byte>;

// The schema: name and type as `stoker pack` users write them.
const std::vector<std::pair<std::string, std::string>> kSchema = {
    {"img", "bytes"},         {"label", "int64"},        {"score", "float32"},
    {"weight", "float64"},    {"text", "str"},           {"meta", "json"},
    {"emb", "float32[4]"},    {"patch", "uint8[2,3]"},   {"half", "float16[3]"},
    {"bf", "bfloat16[2]"},    {"u16", "uint16[2]"},      {"i64arr", "int64[2]"},
    {"scalar", "float32[]"},  {"tokens", "uint32[*]"},   {"boxes", "float32[*,2,2]"},
    {"i32", "int32[*]"},
};

// One sample's values, each as the bytes the shard holds (scalars too).
struct Sample {
  std::vector<Bytes> values;
  int64_t label = 0;
  double weight = 0;
  float score = 0;
};

template <typename T>
Bytes LE(T v) {
  Bytes b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}

Bytes Text(const std::string& s) {
  Bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

struct TypedDataset {
  TempDir dir;
  std::string uri;
  std::vector<FieldSpec> fields;
  std::vector<Sample> samples;

  int Field(const std::string& name) const {
    for (size_t f = 0; f < fields.size(); ++f) {
      if (fields[f].name == name) return int(f);
    }
    return -1;
  }

  explicit TypedDataset(uint32_t n, uint64_t shard_target = 2048) {
    for (const auto& [name, type] : kSchema) {
      auto f = format::ParseFieldSpec(name, type);
      EXPECT_TRUE(f.ok()) << name << ": " << f.status().ToString();
      fields.push_back(*f);
    }
    EXPECT_TRUE(format::CheckSchema(fields).ok());
    for (uint32_t i = 0; i < n; ++i) {
      Sample s;
      s.label = int64_t(i) * 1000 - 7;
      s.score = float(i) * 0.5f - 3.25f;
      s.weight = double(i) / 3.0 + 1e10;
      for (const FieldSpec& f : fields) {
        Bytes v;
        const uint64_t seed = i * 131 + s.values.size();
        if (f.name == "img") {
          v = RandomBytes(i % 5 == 0 ? 0 : 10 + (i * 37) % 300, seed);
        } else if (f.name == "label") {
          v = LE(s.label);
        } else if (f.name == "score") {
          v = LE(s.score);
        } else if (f.name == "weight") {
          v = LE(s.weight);
        } else if (f.name == "text") {
          v = Text(i % 4 == 0 ? "" : "sample " + std::to_string(i) + " h\xc3\xa9llo");
        } else if (f.name == "meta") {
          v = Text("{\"id\": " + std::to_string(i) + ", \"tags\": [\"a\", " +
                   (i % 2 ? "true" : "null") + "]}");
        } else if (f.FixedBytes() != 0) {
          v = RandomBytes(f.FixedBytes(), seed);
        } else {  // a variable array: some samples with no rows
          const uint64_t rows = i % 3 == 1 ? 0 : (i * 5) % 7 + 1;
          v = RandomBytes(rows * f.RowBytes(), seed);
        }
        s.values.push_back(std::move(v));
      }
      samples.push_back(std::move(s));
    }
    Write(shard_target);
  }

  void Write(uint64_t shard_target) {
    uri = (dir.path() / "ds").string();
    auto opened = OpenStore(uri);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    std::shared_ptr<Store> store = *opened;
    format::Manifest m;
    m.format_version = format::FormatVersionFor(fields);
    ASSERT_EQ(m.format_version, 3u);
    for (size_t b = 0; b < m.dataset_id.size(); ++b) m.dataset_id[b] = uint8_t(b * 7 + 3);
    m.fields = fields;
    m.created_by = "loader_typed_test";
    auto builder = std::make_unique<format::ShardBuilder>(fields, m.dataset_id, 0);
    auto finish = [&] {
      const auto number = uint32_t(m.shards.size());
      format::ShardInfo info;
      info.key = format::ShardKey(number);
      info.samples = builder->sample_count();
      info.first_sample = m.sample_count;
      m.sample_count += info.samples;
      m.payload_bytes += builder->payload_bytes();
      m.max_sample_bytes = std::max(m.max_sample_bytes, builder->max_sample_bytes());
      Bytes shard = builder->Finish(&info.index_hash);
      info.bytes = shard.size();
      ASSERT_TRUE(store->Put(info.key, shard).ok());
      m.shards.push_back(info);
      builder = std::make_unique<format::ShardBuilder>(fields, m.dataset_id, number + 1);
    };
    for (const Sample& s : samples) {
      std::vector<FieldValue> v(fields.size());
      for (size_t f = 0; f < fields.size(); ++f) {
        v[f].bytes = s.values[f];
        if (fields[f].type == FieldType::kInt64) v[f].i64 = s.label;
        if (fields[f].type == FieldType::kFloat32) v[f].f64 = s.score;
        if (fields[f].type == FieldType::kFloat64) v[f].f64 = s.weight;
      }
      if (builder->sample_count() > 0 && builder->SizeWith(v) > shard_target) finish();
      Status st = builder->Add(v);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    if (builder->sample_count() > 0) finish();
    ASSERT_GT(m.shards.size(), 2u) << "several shards, so batches cross them";
    const Bytes table = format::EncodeShardTable(m, &m.table);
    ASSERT_TRUE(store->Put(format::kShardTableKey, table).ok());
    const std::string manifest = format::EncodeManifest(m);
    ASSERT_TRUE(store->Put(format::kManifestKey, Text(manifest)).ok());
  }
};

bool Same(std::span<const std::byte> got, const Bytes& want) {
  return got.size() == want.size() && std::equal(got.begin(), got.end(), want.begin());
}

// Loads one epoch with `o` and checks every value of every column.
void CheckEpoch(const TypedDataset& d, LoaderOptions o) {
  SCOPED_TRACE("read_unit " + o.read_unit + ", ragged " + o.ragged);
  auto opened = Loader::Open(d.uri, o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Loader& loader = **opened;
  const bool padded = o.ragged == "padded";
  std::set<uint64_t> seen;
  for (;;) {
    Result<Batch> r = loader.Next();
    if (!r.ok()) {
      ASSERT_EQ(r.status().code(), Code::kOutOfRange) << r.status().ToString();
      break;
    }
    const Batch& b = *r;
    const size_t n = b.size();
    const auto buffer = b.buffer();
    auto inside = [&](const void* p, size_t bytes) {
      const auto* x = static_cast<const std::byte*>(p);
      return bytes == 0 || (x >= buffer.data() && x + bytes <= buffer.data() + buffer.size());
    };
    // The kinds: 2 bytes-like (img, text, meta) + 1 int64, the rest typed.
    EXPECT_EQ(b.bytes_columns().size(), 3u);
    EXPECT_EQ(b.int64_columns().size(), 1u);
    EXPECT_EQ(b.fixed_columns().size(), 9u);
    EXPECT_EQ(b.ragged_columns().size(), 3u);
    EXPECT_EQ(b.bytes("img")->type, FieldType::kBytes);
    EXPECT_EQ(b.bytes("text")->type, FieldType::kString);
    EXPECT_EQ(b.bytes("meta")->type, FieldType::kJson);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t id = b.sample_ids()[i];
      ASSERT_LT(id, d.samples.size());
      seen.insert(id);
      const Sample& s = d.samples[id];
      for (const auto& c : b.bytes_columns()) {
        const Bytes& want = s.values[size_t(d.Field(c.name))];
        EXPECT_TRUE(Same(c.data.subspan(c.offsets[i], c.offsets[i + 1] - c.offsets[i]), want))
            << c.name << " of sample " << id;
      }
      EXPECT_EQ(b.int64("label")->values[i], s.label);
      for (const auto& c : b.fixed_columns()) {
        const FieldSpec& f = d.fields[size_t(d.Field(c.name))];
        EXPECT_EQ(c.type, f.type) << c.name;
        EXPECT_EQ(c.item_bytes, f.FixedBytes()) << c.name;
        EXPECT_EQ(c.data.size(), n * c.item_bytes) << c.name;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(c.data.data()) % 64, 0u) << c.name;
        EXPECT_TRUE(inside(c.data.data(), c.data.size())) << c.name;
        const Bytes& want = s.values[size_t(d.Field(c.name))];
        EXPECT_TRUE(Same(c.data.subspan(i * c.item_bytes, c.item_bytes), want))
            << c.name << " of sample " << id;
      }
      float score;
      std::memcpy(&score, b.fixed("score")->data.data() + 4 * i, 4);
      EXPECT_EQ(score, s.score);
      double weight;
      std::memcpy(&weight, b.fixed("weight")->data.data() + 8 * i, 8);
      EXPECT_EQ(weight, s.weight);
      for (const auto& c : b.ragged_columns()) {
        const FieldSpec& f = d.fields[size_t(d.Field(c.name))];
        const Bytes& want = s.values[size_t(d.Field(c.name))];
        EXPECT_EQ(c.padded, padded);
        EXPECT_EQ(c.row_bytes, f.RowBytes());
        ASSERT_EQ(c.lengths.size(), n);
        ASSERT_EQ(c.offsets.size(), n + 1);
        EXPECT_EQ(uint64_t(c.lengths[i]) * c.row_bytes, want.size()) << c.name << " " << id;
        EXPECT_EQ(c.offsets[i + 1] - c.offsets[i], c.lengths[i]);
        EXPECT_TRUE(inside(c.data.data(), c.data.size())) << c.name;
        const uint64_t first = padded ? i * c.max_rows : uint64_t(c.offsets[i]);
        EXPECT_TRUE(Same(c.data.subspan(first * c.row_bytes, want.size()), want))
            << c.name << " of sample " << id;
        if (padded) {  // zeros up to the longest
          const auto tail = c.data.subspan(first * c.row_bytes + want.size(),
                                           (c.max_rows - uint64_t(c.lengths[i])) * c.row_bytes);
          EXPECT_TRUE(std::all_of(tail.begin(), tail.end(), [](std::byte x) {
            return x == std::byte{0};
          })) << c.name << " padding of sample " << id;
        }
      }
    }
    for (const auto& c : b.ragged_columns()) {
      const int64_t longest = *std::max_element(c.lengths.begin(), c.lengths.end());
      EXPECT_EQ(c.max_rows, uint64_t(longest)) << c.name;
      EXPECT_EQ(c.offsets[0], 0);
      EXPECT_EQ(c.data.size(), (padded ? n * c.max_rows : uint64_t(c.offsets[n])) * c.row_bytes);
    }
    // Shapes and element types, as the schema says.
    const auto* emb = b.fixed("emb");
    EXPECT_EQ(emb->element, ElementType::kFloat32);
    EXPECT_EQ(emb->item_shape, (std::vector<int64_t>{4}));
    EXPECT_EQ(b.fixed("patch")->element, ElementType::kUInt8);
    EXPECT_EQ(b.fixed("patch")->item_shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(b.fixed("half")->element, ElementType::kFloat16);
    EXPECT_EQ(b.fixed("bf")->element, ElementType::kBFloat16);
    EXPECT_EQ(b.fixed("u16")->element, ElementType::kUInt16);
    EXPECT_EQ(b.fixed("i64arr")->element, ElementType::kInt64);
    EXPECT_EQ(b.fixed("scalar")->item_shape, std::vector<int64_t>{});
    EXPECT_EQ(b.fixed("score")->element, ElementType::kFloat32);
    EXPECT_EQ(b.fixed("score")->item_shape, std::vector<int64_t>{});
    EXPECT_EQ(b.fixed("weight")->element, ElementType::kFloat64);
    EXPECT_EQ(b.ragged("tokens")->element, ElementType::kUInt32);
    EXPECT_EQ(b.ragged("tokens")->row_shape, std::vector<int64_t>{});
    EXPECT_EQ(b.ragged("boxes")->element, ElementType::kFloat32);
    EXPECT_EQ(b.ragged("boxes")->row_shape, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(b.ragged("boxes")->row_bytes, 16u);
    EXPECT_EQ(b.ragged("i32")->element, ElementType::kInt32);
  }
  EXPECT_EQ(seen.size(), d.samples.size());
}

TEST(LoaderTyped, EveryValueOfEveryColumn) {
  TypedDataset d(61);
  for (const char* unit : {"shard", "sample", "map"}) {
    for (const char* ragged : {"padded", "offsets"}) {
      LoaderOptions o;
      o.batch_size = 8;
      o.threads = 2;
      o.seed = 5;
      o.read_unit = unit;
      o.ragged = ragged;
      CheckEpoch(d, o);
    }
  }
}

TEST(LoaderTyped, SelectedFieldsOnly) {
  TypedDataset d(20);
  LoaderOptions o;
  o.batch_size = 20;
  o.shuffle = false;
  o.fields = {"boxes", "weight"};
  auto loader = Loader::Open(d.uri, o);
  ASSERT_TRUE(loader.ok()) << loader.status().ToString();
  auto b = (*loader)->Next();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->size(), 20u);
  EXPECT_TRUE(b->bytes_columns().empty());
  ASSERT_EQ(b->fixed_columns().size(), 1u);
  ASSERT_EQ(b->ragged_columns().size(), 1u);
  EXPECT_EQ(b->ragged_columns()[0].name, "boxes");
  EXPECT_EQ(b->fixed_columns()[0].name, "weight");
}

TEST(LoaderTyped, RaggedOptionIsChecked) {
  TypedDataset d(10);
  LoaderOptions o;
  o.ragged = "jagged";
  auto r = Loader::Open(d.uri, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("ragged must be padded or offsets, not 'jagged'"),
            std::string::npos)
      << r.status().ToString();
}

// A value whose length does not fit its column (a record that passed its
// checksum but not the schema) fails the batch, naming it, instead of being
// copied past its slot.
TEST(LoaderTyped, LengthThatDoesNotFitIsCorruption) {
  auto pool = std::make_shared<BufferPool>(64, 2, false);
  const Bytes twelve = RandomBytes(12, 1), five = RandomBytes(5, 2);
  for (const auto& [type, value, why] :
       {std::tuple{"float32[4]", &twelve, "has 12 bytes, not 16"},
        std::tuple{"uint32[*]", &five, "has 5 bytes, not a whole number of rows of 4"}}) {
    auto f = format::ParseFieldSpec("x", type);
    ASSERT_TRUE(f.ok());
    const std::vector<ColumnSpec> columns = {ColumnSpecFor(*f, false, true)};
    const uint64_t ids[2] = {0, 1};
    const Bytes good = RandomBytes(16, 3);
    BatchSamples s;
    s.count = 2;
    s.sample_ids = ids;
    s.value = [&](size_t i, size_t) -> std::span<const std::byte> {
      return i == 1 ? *value : good;
    };
    s.describe = [](size_t i) { return "sample " + std::to_string(i); };
    auto r = BatchBuilder::Build(*pool, columns, DecodeOptions{}, s, 0, 0, {});
    ASSERT_FALSE(r.ok()) << type;
    EXPECT_EQ(r.status().code(), Code::kCorruption);
    EXPECT_NE(r.status().message().find(std::string("sample 1: field 'x' ") + why),
              std::string::npos)
        << r.status().ToString();
  }
}

TEST(LoaderTyped, ColumnSpecs) {
  auto spec = [](const std::string& type) {
    auto f = format::ParseFieldSpec("x", type);
    EXPECT_TRUE(f.ok());
    return ColumnSpecFor(*f, false, true);
  };
  EXPECT_EQ(spec("bytes").kind, ColumnKind::kBytes);
  EXPECT_EQ(spec("str").kind, ColumnKind::kBytes);
  EXPECT_EQ(spec("json").kind, ColumnKind::kBytes);
  EXPECT_EQ(spec("int64").kind, ColumnKind::kInt64);
  EXPECT_EQ(spec("float64").kind, ColumnKind::kFixed);
  EXPECT_EQ(spec("float64").item_bytes, 8u);
  EXPECT_EQ(spec("float16[3,5]").item_bytes, 30u);
  EXPECT_EQ(spec("float16[3,5]").shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(spec("uint8[*,3]").kind, ColumnKind::kRagged);
  EXPECT_EQ(spec("uint8[*,3]").item_bytes, 3u);
  EXPECT_EQ(spec("uint8[*,3]").shape, std::vector<int64_t>{3});
  EXPECT_EQ(ElementTypeName(ElementType::kBFloat16), "bfloat16");
  EXPECT_EQ(ElementTypeBytes(ElementType::kFloat64), 8u);
  EXPECT_EQ(ElementTypeBytes(ElementType::kBFloat16), 2u);
}

}  // namespace
}  // namespace stoker
