// The checkpoint format's limits (docs/checkpoint.md §2, §3.2), each where
// it is enforced: a reader refuses a record past it as Corruption naming
// the field, and a save refuses to write one as InvalidArgument, before
// anything is written. The limits: a manifest body of 1 GiB, 2^58 elements
// per tensor, chunks of 1 GiB, tensor names and chunk keys of 1,024 bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/records.h"
#include "format/framed_json.h"
#include "stoker/checkpoint.h"

namespace stoker {
namespace {

std::span<const std::byte> Bytes(const std::string& s) { return std::as_bytes(std::span(s)); }

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A one-tensor part of checkpoint "c", rank 0 of 1, in one chunk.
ckpt::PartRecord OnePart() {
  ckpt::PartRecord p;
  p.format_version = 1;
  p.name = "c";
  p.world_size = 1;
  p.part.tensors.push_back({"w", DType::kFloat32, {4, 2}, 0, 0, 32, {}});
  p.part.chunks.push_back({"c/rank-00000/000000.chunk", 32, 7, 0, 0, {}});
  return p;
}

// OnePart() encoded, its body changed by `edit`, framed again (valid header).
std::string Edited(const std::function<void(nlohmann::ordered_json&)>& edit) {
  const std::string enc = ckpt::EncodePart(OnePart());
  auto j = nlohmann::ordered_json::parse(enc.substr(enc.find('\n') + 1));
  edit(j);
  const format::internal::FramedFormat frame{.magic = "STOKER-CKPT-PART ",
                                             .what = "stoker checkpoint part record",
                                             .version_name = "checkpoint format",
                                             .max_version = 2};
  return format::internal::EncodeFramed(frame, 1, j.dump());
}

TEST(CkptLimitsTest, TheUneditedPartReads) {
  auto d = ckpt::DecodePart(Bytes(Edited([](auto&) {})), "p", "c");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
}

TEST(CkptLimitsTest, AReaderRefusesEachLimitNamingTheField) {
  const std::string name_1025(1025, 'n');
  const std::string key_1025 = "c/" + std::string(1023, 'k');
  struct Case {
    const char* what;
    std::function<void(nlohmann::ordered_json&)> edit;
    const char* words;
  };
  const std::vector<Case> cases = {
      // 2^29 x 2^30 = 2^59 elements (each entry is within 2^62).
      {"elements",
       [](auto& j) {
         j["tensors"][0]["shape"] = {1ull << 29, 1ull << 30};
       },
       "tensors[0].shape: too many elements"},
      {"chunk", [](auto& j) { j["chunks"][0]["bytes"] = (1ull << 30) + 1; }, "chunks[0].bytes"},
      {"name", [&](auto& j) { j["tensors"][0]["name"] = name_1025; },
       "tensor name longer than 1024 bytes"},
      {"key", [&](auto& j) { j["chunks"][0]["key"] = key_1025; }, "longer than 1024 bytes"},
  };
  for (const Case& c : cases) {
    auto d = ckpt::DecodePart(Bytes(Edited(c.edit)), "p", "c");
    ASSERT_FALSE(d.ok()) << c.what;
    EXPECT_EQ(d.status().code(), Code::kCorruption) << c.what << ": " << d.status().ToString();
    EXPECT_TRUE(Contains(d.status().message(), c.words)) << c.what << ": " << d.status().message();
  }
  // Right at the limits they read: 2^58 elements is refused only for its
  // bytes (it is not a 32-byte tensor), a 1,024-byte name is a name.
  auto at = ckpt::DecodePart(Bytes(Edited([](auto& j) {
                               j["tensors"][0]["shape"] = {1ull << 28, 1ull << 30};
                             })),
                             "p", "c");
  EXPECT_FALSE(Contains(at.status().message(), "too many elements")) << at.status().message();
  auto name_ok = ckpt::DecodePart(
      Bytes(Edited([](auto& j) { j["tensors"][0]["name"] = std::string(1024, 'n'); })), "p", "c");
  EXPECT_TRUE(name_ok.ok()) << name_ok.status().ToString();
}

// A header that says the body is over 1 GiB is refused before the body is
// looked at (a reader never holds more); at 1 GiB it is only truncated.
TEST(CkptLimitsTest, AManifestBodyOver1GiBIsRefusedFromTheHeader) {
  auto header = [](uint64_t length) {
    return "STOKER-CHECKPOINT 2 " + std::to_string(length) + " 0123456789abcdef\n{}";
  };
  auto over = ckpt::DecodeCheckpointManifest(Bytes(header((1ull << 30) + 1)), "m", "c");
  EXPECT_EQ(over.status().code(), Code::kCorruption);
  EXPECT_TRUE(Contains(over.status().message(),
                       "body length 1073741825 is more than a stoker checkpoint manifest may hold "
                       "(1073741824 bytes)"))
      << over.status().message();
  auto at = ckpt::DecodeCheckpointManifest(Bytes(header(1ull << 30)), "m", "c");
  EXPECT_EQ(at.status().code(), Code::kCorruption);
  EXPECT_TRUE(Contains(at.status().message(), "truncated")) << at.status().message();
  // Part records have no such limit of their own (their chunks bound them).
  auto part = ckpt::DecodePart(
      Bytes("STOKER-CKPT-PART 2 " + std::to_string((1ull << 30) + 1) + " 0123456789abcdef\n{}"),
      "p", "c");
  EXPECT_TRUE(Contains(part.status().message(), "truncated")) << part.status().message();
}

// The save side: the same limits are InvalidArgument, and nothing is written.
TEST(CkptLimitsTest, ASaveRefusesEachLimitBeforeWriting) {
  const std::string uri = "mem://ckpt-limits-" + std::to_string(::getpid());
  auto c = OpenCheckpointer(uri);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<std::byte> data(32);
  TensorRef t{"w", DType::kFloat32, {4, 2}, data, {}, -1, nullptr};

  SaveOptions big_chunks;
  big_chunks.chunk_bytes = (1ull << 30) + 1;
  const Status chunk = (*c)->Save("a", {&t, 1}, big_chunks);
  EXPECT_EQ(chunk.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(chunk.message(), "1 GiB")) << chunk.message();

  TensorRef huge = t;
  huge.shape = {1ll << 29, 1ll << 30};
  const Status elements = (*c)->Save("b", {&huge, 1}, {});
  EXPECT_EQ(elements.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(elements.message(), "too many elements")) << elements.message();

  TensorRef long_name = t;
  long_name.name = std::string(1025, 'n');
  const Status name = (*c)->Save("d", {&long_name, 1}, {});
  EXPECT_EQ(name.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(name.message(), "longer than 1024 bytes")) << name.message();

  auto store = OpenStore(uri);
  ASSERT_TRUE(store.ok());
  auto all = (*store)->List("");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty()) << all->front().key;
}

}  // namespace
}  // namespace stoker
