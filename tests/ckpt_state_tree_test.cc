// Saved states as trees (EncodeState, LoadState in stoker/checkpoint.h): the
// C++ side of stoker.save/stoker.load, round-tripped through a real
// checkpoint on local disk.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "stoker/checkpoint.h"
#include "testutil.h"

namespace stoker {
namespace {

using Kind = StateValue::Kind;
using testing::RandomBytes;
using testing::TempDir;

StateValue Scalar(Kind kind, std::string text = "") {
  StateValue v;
  v.kind = kind;
  v.text = std::move(text);
  return v;
}

StateValue Tensor(const std::vector<std::byte>& bytes, std::string tie = "") {
  StateValue v;
  v.kind = Kind::kTensor;
  v.dtype = DType::kFloat32;
  v.shape = {int64_t(bytes.size() / 4)};
  v.data = bytes;
  v.tie = std::move(tie);
  return v;
}

StateValue Dict(std::vector<std::pair<std::string, StateValue>> items) {
  StateValue d;
  d.kind = Kind::kDict;
  for (auto& [k, v] : items) {
    StateValue key = Scalar(Kind::kStr, k);
    key.component = k;
    d.items.push_back(std::move(key));
    d.items.push_back(std::move(v));
  }
  return d;
}

// The tensors of a tree by name, and its scalars, for comparisons.
void Flatten(const StateValue& v, std::vector<std::string>* out) {
  std::string s = std::to_string(int(v.kind)) + ":" + v.text;
  if (v.kind == Kind::kFloat || v.kind == Kind::kComplex) {
    s += std::isnan(v.real) ? "nan" : std::to_string(v.real);
    s += ":" + std::to_string(v.imag);
  }
  if (v.kind == Kind::kBool) s += v.flag ? "T" : "F";
  if (v.kind >= Kind::kTensor) {
    s += ":" + std::string(reinterpret_cast<const char*>(v.data.data()), v.data.size());
  }
  out->push_back(s);
  for (const StateValue& x : v.items) Flatten(x, out);
}

class StateTree : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = OpenCheckpointer(dir_.str() + "/ckpt");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    c_ = std::move(*c);
  }
  TempDir dir_;
  std::unique_ptr<Checkpointer> c_;
};

TEST_F(StateTree, RoundTripsNamesTiesAndExactValues) {
  const auto w = RandomBytes(64, 1), b = RandomBytes(16, 2);
  StateValue nan = Scalar(Kind::kFloat), big = Scalar(Kind::kInt, "-1180591620717411303424");
  nan.real = std::nan("");
  StateValue list = Scalar(Kind::kList), tuple = Scalar(Kind::kTuple);
  list.items = {Tensor(b), big, Scalar(Kind::kBytes, std::string("\0\xff raw", 6))};
  tuple.items = {Scalar(Kind::kNone), nan, Scalar(Kind::kStr, "ünï\n")};
  StateValue root = Dict({{"a.b", Tensor(w, "w")},
                          {"a", Dict({{"b", Tensor(b)}, {"tied", Tensor(w, "w")}})},
                          {"list", std::move(list)},
                          {"tuple", std::move(tuple)}});
  auto enc = EncodeState(root);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  std::vector<std::string> names;
  for (const TensorRef& t : enc->tensors) names.push_back(t.name);
  // The tie is stored once; "a.b" twice over is made unique.
  EXPECT_EQ(names, (std::vector<std::string>{"a.b", "a.b~2", "list.0", "stoker:structure"}));
  EXPECT_EQ(enc->tensor_bytes, w.size() + 2 * b.size());
  ASSERT_OK(c_->Save("s", enc->tensors, {}));

  auto loaded = LoadState(*c_, "", {});
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->manifest.name, "s");
  ASSERT_EQ(loaded->roots.size(), 1u);
  std::vector<std::string> want, got;
  Flatten(root, &want);
  Flatten(loaded->roots[0], &got);
  EXPECT_EQ(got, want);
  // `stoker ckpt show`'s reader agrees with what was written.
  auto st = ReadStateStructure(*c_, "s");
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_EQ(st->Find("a.b")->tensor, "a.b");
  EXPECT_EQ(st->Find("list.1")->value, "-1180591620717411303424");
}

TEST_F(StateTree, APlanReadsChosenTensorsIntoCallerMemory) {
  const auto w = RandomBytes(4096, 3), b = RandomBytes(8, 4);
  StateValue root = Dict({{"w", Tensor(w)}, {"b", Tensor(b)}});
  auto enc = EncodeState(root);
  ASSERT_TRUE(enc.ok());
  ASSERT_OK(c_->Save("p", enc->tensors, {}));
  std::vector<std::byte> mine(w.size());
  auto plan = [&](const StateValue& r, const CheckpointManifest& m,
                  std::vector<TensorDestination>* dst) {
    EXPECT_EQ(m.name, "p");
    EXPECT_TRUE(r.items[1].data.empty()) << "nothing is read before the plan";
    dst->push_back({r.items[1].text, mine, {}, {}, {}});
    return Status::Ok();
  };
  auto loaded = LoadState(*c_, "p", {}, plan);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const StateValue& r = loaded->roots[0];
  EXPECT_EQ(mine, w);
  EXPECT_EQ(r.items[1].destination, 0);
  EXPECT_EQ(r.items[1].data.data(), mine.data());
  EXPECT_EQ(r.items[3].destination, -1);
  EXPECT_EQ(std::memcmp(r.items[3].data.data(), b.data(), b.size()), 0);
  // A refused plan stops the load with its status.
  auto refused = LoadState(*c_, "p", {}, [](auto&, auto&, auto*) { return Cancelled("no"); });
  EXPECT_EQ(refused.status().code(), Code::kCancelled);
}

TEST_F(StateTree, WorldSizeRulesAndFlatCheckpoints) {
  const auto t = RandomBytes(32, 5);
  const std::vector<std::byte> parts[] = {RandomBytes(16, 0), RandomBytes(16, 1)};
  for (uint32_t rank : {1u, 0u}) {  // rank 0 commits once rank 1's part is there
    StateValue root = Dict({{"r", Tensor(parts[rank])}});
    auto enc = EncodeState(root);
    ASSERT_TRUE(enc.ok());
    SaveOptions o;
    o.rank = rank;
    o.world_size = 2;
    o.wait_for_commit = false;
    ASSERT_OK(c_->Save("two", enc->tensors, o));
  }
  StateLoadOptions o;
  o.world_size = 3;
  auto wrong = LoadState(*c_, "two", o);
  EXPECT_EQ(wrong.status().code(), Code::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("written by 2 rank(s), this job has 3"),
            std::string::npos)
      << wrong.status().ToString();
  o.world_size = 0;
  o.all_ranks = true;
  auto all = LoadState(*c_, "two", o);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->ranks, (std::vector<uint32_t>{0, 1}));
  for (uint32_t rank = 0; rank < 2; ++rank) {  // names repeat across ranks: each its own
    EXPECT_EQ(std::memcmp(all->roots[rank].items[1].data.data(), parts[rank].data(), 16), 0);
  }

  // A checkpoint of one rank without a structure: a flat dict, in a job of
  // any size when asked.
  ASSERT_OK(c_->Save("flat", std::vector<TensorRef>{{"x.y", DType::kFloat32, {8}, t, {}}}, {}));
  StateLoadOptions any;
  any.rank = 3;
  any.world_size = 4;
  EXPECT_EQ(LoadState(*c_, "flat", any).status().code(), Code::kInvalidArgument);
  any.any_world_if_single = true;
  auto flat = LoadState(*c_, "flat", any);
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  ASSERT_EQ(flat->roots[0].items.size(), 2u);
  EXPECT_EQ(flat->roots[0].items[0].text, "x.y");
  EXPECT_EQ(flat->roots[0].items[1].data.size(), t.size());
}

TEST_F(StateTree, BadTreesAndDocumentsAreRefused) {
  StateValue odd = Scalar(Kind::kDict);
  odd.items.push_back(Scalar(Kind::kNone));
  EXPECT_EQ(EncodeState(odd).status().code(), Code::kInvalidArgument);
  StateValue notint = Scalar(Kind::kInt, "12a");
  EXPECT_EQ(EncodeState(notint).status().code(), Code::kInvalidArgument);
  // A document naming a tensor the checkpoint lacks.
  const std::string doc =
      R"({"format":"stoker.python.state","version":1,"root":{"tensor":"gone"}})";
  ASSERT_OK(c_->Save("bad",
                     std::vector<TensorRef>{{"stoker:structure",
                                             DType::kUInt8,
                                             {int64_t(doc.size())},
                                             std::as_bytes(std::span(doc)), {}}},
                     {}));
  auto bad = LoadState(*c_, "bad", {});
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("names tensor 'gone'"), std::string::npos);
}

}  // namespace
}  // namespace stoker
