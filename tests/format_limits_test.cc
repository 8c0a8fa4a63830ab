// The dataset format's field counts where a writer enforces them
// (docs/format.md §4, §5.1): every writer's schema goes through CheckSchema
// (pack, stoker::Writer, the importers) and a ShardBuilder refuses a schema
// outside 1..kMaxFields too, so nothing writes what a reader would refuse.
// The readers' side is tests/format_test.cc (manifest "fields: 65 fields",
// shard header field_count 0 and 65).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "stoker/format.h"

namespace stoker::format {
namespace {

std::vector<FieldSpec> Fields(size_t n) {
  std::vector<FieldSpec> fields(n);
  for (size_t i = 0; i < n; ++i) {
    fields[i].name = "f" + std::to_string(i);
    fields[i].type = FieldType::kInt64;
  }
  return fields;
}

TEST(FormatLimitsTest, ASchemaHas1To64Fields) {
  EXPECT_TRUE(CheckSchema(Fields(1)).ok());
  EXPECT_TRUE(CheckSchema(Fields(kMaxFields)).ok());
  for (size_t n : {size_t{0}, size_t{kMaxFields + 1}}) {
    const Status st = CheckSchema(Fields(n));
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << n;
    EXPECT_EQ(st.message(), std::to_string(n) + " fields, expected 1..64");
  }
}

TEST(FormatLimitsTest, AShardBuilderRefusesMoreThan64Fields) {
  ShardBuilder wide(Fields(kMaxFields + 1), DatasetId{}, 3);
  std::vector<FieldValue> values(kMaxFields + 1);
  const Status st = wide.Add(values);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "shard 3: schema has 65 fields, expected 1..64");
  ShardBuilder widest(Fields(kMaxFields), DatasetId{}, 0);
  EXPECT_TRUE(widest.Add(std::vector<FieldValue>(kMaxFields)).ok());
}

TEST(FormatLimitsTest, AnArrayHasAtMost8Dimensions) {
  std::vector<FieldSpec> fields = Fields(1);
  fields[0].type = FieldType::kArray;
  fields[0].dtype = DType::kUInt8;
  fields[0].shape.assign(kMaxArrayDims, 2);
  EXPECT_TRUE(CheckSchema(fields).ok());
  fields[0].shape.push_back(2);
  const Status st = CheckSchema(fields);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("shape has 9 dimensions, at most 8"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace stoker::format
