// The decode enums' names (stoker/decode.h, ParseCropMode and the others):
// one set of spellings for the CLI's flags and Python's decode={...}, each
// name read back by its *Name, the rest InvalidArgument naming the option
// and every accepted value. tests/python/test_decode_names.py checks that
// the CLI (`stoker bench loader --crop ...`, through src/cli/loader_flags.h)
// and Python accept and refuse the same words with this message.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "stoker/decode.h"

namespace stoker {
namespace {

// Each (spelling, value) of `table` parses to its value, and the value's
// name parses back to it.
template <typename E, size_t N>
void ExpectParses(Result<E> (*parse)(std::string_view), std::string_view (*name)(E),
                  const std::pair<const char*, E> (&table)[N]) {
  for (const auto& [spelling, value] : table) {
    auto r = parse(spelling);
    ASSERT_TRUE(r.ok()) << spelling << ": " << r.status().ToString();
    EXPECT_EQ(*r, value) << spelling;
    auto back = parse(name(value));
    ASSERT_TRUE(back.ok()) << name(value);
    EXPECT_EQ(*back, value) << name(value);
  }
}

TEST(DecodeNamesTest, EachNameParsesToItsValueInAnySpellingAndBack) {
  const std::pair<const char*, CropMode> crops[] = {
      {"resize", CropMode::kResize},
      {"center", CropMode::kCenter},
      {"random-resized", CropMode::kRandomResized},
      {"random_resized", CropMode::kRandomResized},  // Python's spelling
      {"Random-Resized", CropMode::kRandomResized},
      {"CENTER", CropMode::kCenter},
  };
  ExpectParses(ParseCropMode, CropModeName, crops);
  const std::pair<const char*, ImageDType> dtypes[] = {
      {"uint8", ImageDType::kUInt8},     {"float32", ImageDType::kFloat32},
      {"float16", ImageDType::kFloat16}, {"bfloat16", ImageDType::kBFloat16},
      {"Float32", ImageDType::kFloat32}, {"BFLOAT16", ImageDType::kBFloat16},
  };
  ExpectParses(ParseImageDType, ImageDTypeName, dtypes);
  const std::pair<const char*, ImageLayout> layouts[] = {
      {"nhwc", ImageLayout::kNHWC}, {"NHWC", ImageLayout::kNHWC},  // Python's spelling
      {"nchw", ImageLayout::kNCHW}, {"NCHW", ImageLayout::kNCHW}, {"nChW", ImageLayout::kNCHW},
  };
  ExpectParses(ParseImageLayout, ImageLayoutName, layouts);
}

TEST(DecodeNamesTest, NamesAreTheCanonicalSpellingsAndOutOfRangeIsUnknown) {
  EXPECT_EQ(CropModeName(CropMode::kRandomResized), "random-resized");
  EXPECT_EQ(ImageLayoutName(ImageLayout::kNCHW), "nchw");
  EXPECT_EQ(CropModeName(CropMode(7)), "unknown");
  EXPECT_EQ(ImageDTypeName(ImageDType(9)), "unknown");
  EXPECT_EQ(ImageLayoutName(ImageLayout(2)), "unknown");
}

TEST(DecodeNamesTest, OtherWordsAreInvalidArgumentListingTheAcceptedOnes) {
  const std::pair<Status, std::string> bad[] = {
      {ParseCropMode("random").status(),
       "crop must be resize, center or random-resized, not 'random'"},
      {ParseCropMode("").status(), "crop must be resize, center or random-resized, not ''"},
      {ParseCropMode("resize ").status(),
       "crop must be resize, center or random-resized, not 'resize '"},
      {ParseImageDType("int32").status(),
       "dtype must be uint8, float32, float16 or bfloat16, not 'int32'"},
      {ParseImageDType("float").status(),
       "dtype must be uint8, float32, float16 or bfloat16, not 'float'"},
      {ParseImageLayout("hwc").status(), "layout must be nhwc or nchw, not 'hwc'"},
      {ParseImageLayout("n-hwc").status(), "layout must be nhwc or nchw, not 'n-hwc'"},
  };
  for (const auto& [st, message] : bad) {
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
    EXPECT_EQ(st.message(), message);
  }
  // A doubled separator is no name; only ASCII letters fold.
  EXPECT_FALSE(ParseCropMode("random--resized").ok());
  EXPECT_FALSE(ParseImageDType("uint8\xc3\xa9").ok());
}

}  // namespace
}  // namespace stoker
