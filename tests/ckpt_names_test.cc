// Checkpoint names and the manifest's metadata envelope (docs/checkpoint.md
// §1, §2.1), which C++ owns for every caller (stoker.save included): the
// step's name and its parse, CheckpointNameFor's choice, and the envelope
// {"step", "user"} written, read back, and read from manifests written by
// stoker.save and by the C++ API before it existed.
#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/records.h"
#include "format/framed_json.h"
#include "stoker/checkpoint.h"

namespace stoker {
namespace {

std::span<const std::byte> Bytes(const std::string& s) { return std::as_bytes(std::span(s)); }

TEST(CkptStepNames, FormatAndParseAreInverses) {
  EXPECT_EQ(StepCheckpointName(0), "step-000000000000");
  EXPECT_EQ(StepCheckpointName(1200), "step-000000001200");
  EXPECT_EQ(StepCheckpointName(1234567890123), "step-1234567890123");
  EXPECT_EQ(StepCheckpointName(UINT64_MAX), "step-18446744073709551615");
  for (uint64_t step : {uint64_t{0}, uint64_t{5}, uint64_t{999999999999},
                        uint64_t{1000000000000}, UINT64_MAX}) {
    const std::string name = StepCheckpointName(step);
    EXPECT_TRUE(ValidateCheckpointName(name).ok()) << name;
    ASSERT_EQ(ParseStepCheckpointName(name), step) << name;
  }
  for (const char* other :
       {"step-12", "step-0000000012x", "ckpt-000001", "step-", "Step-000000000001",
        "step-0000000000001",  // a zero beyond the padding
        "step-18446744073709551616", "step-000000000001 ", "xstep-000000000001"}) {
    EXPECT_FALSE(ParseStepCheckpointName(other).has_value()) << other;
  }
}

TEST(CkptStepNames, ANameIsGivenOrTheStepsOrClaimedForOneRank) {
  auto c = NewCheckpointer(NewMemoryStore());
  SaveOptions o;
  auto given = CheckpointNameFor(*c, "mine", o);
  ASSERT_TRUE(given.ok()) << given.status().ToString();
  EXPECT_EQ(*given, "mine");
  EXPECT_EQ(CheckpointNameFor(*c, "a/b", o).status().code(), Code::kInvalidArgument);
  o.step = 7;
  EXPECT_EQ(*CheckpointNameFor(*c, "mine", o), "mine");  // a name wins over the step
  EXPECT_EQ(*CheckpointNameFor(*c, "", o), "step-000000000007");
  o.step.reset();
  auto claimed = CheckpointNameFor(*c, "", o);
  ASSERT_TRUE(claimed.ok()) << claimed.status().ToString();
  EXPECT_EQ(claimed->rfind("ckpt-", 0), 0u) << *claimed;
  EXPECT_NE(*CheckpointNameFor(*c, "", o), *claimed);  // each claim is new
  o.world_size = 2;
  auto many = CheckpointNameFor(*c, "", o);
  EXPECT_EQ(many.status().code(), Code::kInvalidArgument);
  EXPECT_NE(many.status().message().find("a save by 2 ranks needs a name or a step"),
            std::string::npos)
      << many.status().ToString();
}

TEST(CkptStepNames, ASaveWithAStepAndNoNameGoesUnderTheStepsName) {
  auto c = NewCheckpointer(NewMemoryStore());
  std::vector<std::byte> data(64, std::byte{3});
  TensorRef w;
  w.name = "w";
  w.shape = {64};
  w.data = data;
  const std::vector<TensorRef> refs = {w};
  SaveOptions o;
  o.step = 42;
  o.metadata_json = R"({"loss":0.5})";
  ASSERT_TRUE(c->Save("", refs, o).ok());
  auto h = c->SaveAsync("", refs, [&] {
    SaveOptions a = o;
    a.step = 43;
    return a;
  }());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->name(), "step-000000000043");
  ASSERT_TRUE(h->Wait().ok());
  auto m = c->ReadManifest("step-000000000042");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->step, 42u);
  EXPECT_EQ(m->metadata_json, o.metadata_json);
  SaveOptions none;  // an empty name and no step: still refused by Save
  EXPECT_EQ(c->Save("", refs, none).code(), Code::kInvalidArgument);
}

// A manifest around `metadata` as the manifest's "metadata" value.
CheckpointManifest Manifest(std::optional<uint64_t> step, std::string user) {
  CheckpointManifest m;
  m.name = "c";
  m.sequence = 1;
  m.created_by = "t";
  m.world_size = 1;
  m.step = step;
  m.metadata_json = std::move(user);
  m.ranks.emplace_back();
  return m;
}

// The manifest's "metadata" value as written.
nlohmann::ordered_json WrittenMetadata(const std::string& encoded) {
  return nlohmann::ordered_json::parse(encoded.substr(encoded.find('\n') + 1))["metadata"];
}

TEST(CkptMetadataEnvelope, WrittenAsStepAndUserAndReadBack) {
  for (std::optional<uint64_t> step : {std::optional<uint64_t>{}, std::optional<uint64_t>{0},
                                       std::optional<uint64_t>{UINT64_MAX}}) {
    const CheckpointManifest m = Manifest(step, R"({"zeta":1,"alpha":{"b":[1,{"c":null}]}})");
    const std::string enc = ckpt::EncodeCheckpointManifest(m);
    // The bytes stoker.save wrote (json.dumps({"step": s, "user": u})).
    const std::string want = std::string(R"({"step":)") +
                             (step ? std::to_string(*step) : "null") +
                             R"(,"user":{"zeta":1,"alpha":{"b":[1,{"c":null}]}}})";
    EXPECT_EQ(WrittenMetadata(enc).dump(), want);
    auto d = ckpt::DecodeCheckpointManifest(Bytes(enc), "x", "c");
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->step, step);
    EXPECT_EQ(d->metadata_json, m.metadata_json);  // key order kept
  }
}

// A manifest whose written "metadata" is `raw` (older writers: stoker.save
// before the envelope moved into C++, the C++ API before it had one),
// framed again with a valid header, and read.
CheckpointManifest ReadWith(const std::string& raw) {
  const std::string enc = ckpt::EncodeCheckpointManifest(Manifest(std::nullopt, "{}"));
  auto body = nlohmann::ordered_json::parse(enc.substr(enc.find('\n') + 1));
  body["metadata"] = nlohmann::ordered_json::parse(raw);
  const format::internal::FramedFormat frame{.magic = "STOKER-CHECKPOINT ",
                                             .what = "stoker checkpoint manifest",
                                             .version_name = "checkpoint format",
                                             .max_version = kCheckpointFormat};
  const std::string framed =
      format::internal::EncodeFramed(frame, body["format_version"].get<uint32_t>(), body.dump());
  auto d = ckpt::DecodeCheckpointManifest(Bytes(framed), "x", "c");
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : CheckpointManifest{};
}

TEST(CkptMetadataEnvelope, OlderManifestsReadAsTheyWereWritten) {
  struct Case {
    const char* raw;
    std::optional<uint64_t> step;
    const char* user;
  };
  const Case cases[] = {
      // stoker.save's own envelope (Python, before C++ wrote it).
      {R"({"step":5,"user":{"loss":0.5,"note":"after 5 steps"}})", 5,
       R"({"loss":0.5,"note":"after 5 steps"})"},
      {R"({"step":null,"user":{}})", std::nullopt, "{}"},
      {R"({"user":{"a":1}})", std::nullopt, R"({"a":1})"},
      // The C++ API's metadata before the envelope: all of it is the user's.
      {"{}", std::nullopt, "{}"},
      {R"({"step":100,"note":"x"})", 100, R"({"step":100,"note":"x"})"},
      {R"({"step":-1})", std::nullopt, R"({"step":-1})"},
      {R"({"step":"7","user":{}})", std::nullopt, R"({"step":"7","user":{}})"},
      {R"({"user":3})", std::nullopt, R"({"user":3})"},
      {R"({"step":1,"user":{},"more":true})", 1, R"({"step":1,"user":{},"more":true})"},
  };
  for (const Case& c : cases) {
    const CheckpointManifest m = ReadWith(c.raw);
    EXPECT_EQ(m.step, c.step) << c.raw;
    EXPECT_EQ(m.metadata_json, c.user) << c.raw;
  }
}

}  // namespace
}  // namespace stoker
