// The `stoker` command as a user meets it: exit codes, messages that name
// what and where, JSON that parses.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "stoker/checkpoint.h"
#include "stoker/format.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using testing::RandomBytes;
using testing::TempDir;

struct Ran {
  int code = -1;
  std::string out;  // stdout and stderr together
};

std::string StokerBin() {
  if (const char* b = std::getenv("STOKER_BIN")) return b;
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "stoker").string();
}

Ran Stoker(const std::string& args) {
  Ran r;
  const std::string cmd = StokerBin() + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

void MakeTree(const fs::path& root, uint32_t files) {
  for (uint32_t i = 0; i < files; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "c%u/f%04u.bin", i % 3, i);
    testing::WriteFile(root / name, RandomBytes(500 + i * 37, i));
  }
}

TEST(CliTest, PackInspectVerify) {
  TempDir d;
  MakeTree(d.path() / "src", 90);
  const std::string ds = (d.path() / "ds").string();
  auto pack = Stoker("pack --shard-mib 0.02 " + (d.path() / "src").string() + " " + ds);
  ASSERT_EQ(pack.code, 0) << pack.out;
  EXPECT_NE(pack.out.find("packed 90 samples (3 classes)"), std::string::npos) << pack.out;
  EXPECT_EQ(pack.out.find('\r'), std::string::npos) << "no progress bar when not a terminal";

  auto inspect = Stoker("inspect --json " + ds);
  ASSERT_EQ(inspect.code, 0) << inspect.out;
  auto j = nlohmann::json::parse(inspect.out);
  EXPECT_EQ(j["samples"], 90);
  EXPECT_EQ(j["format_version"], 2);
  EXPECT_EQ(j["shard_table"]["key"], "shards.table");
  EXPECT_EQ(j["classes"], (std::vector<std::string>({"c0", "c1", "c2"})));
  EXPECT_GT(j["shards"].get<int>(), 2);
  auto human = Stoker("inspect file://" + ds);
  ASSERT_EQ(human.code, 0) << human.out;
  EXPECT_NE(human.out.find("samples        90"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("shard table    shards.table: "), std::string::npos) << human.out;

  // --objects: what the store holds, named by what it is to the dataset;
  // sizes only when asked for.
  testing::WriteFile(d.path() / "ds" / "stray.bin", RandomBytes(10, 2));
  auto objects = Stoker("inspect --json --objects " + ds);
  ASSERT_EQ(objects.code, 0) << objects.out;
  auto oj = nlohmann::json::parse(objects.out);
  ASSERT_EQ(oj["objects"].size(), j["shards"].get<size_t>() + 3) << objects.out;
  EXPECT_EQ(oj["shards_missing"], 0);
  std::map<std::string, std::string> role;
  for (const auto& o : oj["objects"]) {
    role[o["key"]] = o["role"];
    EXPECT_FALSE(o.contains("bytes")) << "no sizes unless asked for";
  }
  EXPECT_EQ(role["manifest.stoker"], "manifest");
  EXPECT_EQ(role["shards.table"], "shard table");
  EXPECT_EQ(role["shards/000001.stks"], "shard 1");
  EXPECT_EQ(role["stray.bin"], "not part of the dataset");
  auto sized = Stoker("inspect --json --objects --sizes " + ds);
  ASSERT_EQ(sized.code, 0) << sized.out;
  for (const auto& o : nlohmann::json::parse(sized.out)["objects"]) {
    if (o["key"] == "stray.bin") EXPECT_EQ(o["bytes"], 10);
  }
  EXPECT_EQ(Stoker("inspect --sizes " + ds).code, 2) << "--sizes needs --objects";

  auto ok = Stoker("verify " + ds);
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("90 samples"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find(": OK"), std::string::npos) << ok.out;

  // Flip a byte of the first record of shard 1: verify names shard and sample.
  const std::string shard1 = ds + "/shards/000001.stks";
  auto bytes = testing::ReadFile(shard1);
  bytes[format::kShardHeaderBytes + 3] ^= std::byte{0x10};
  testing::WriteFile(shard1, bytes);
  auto bad = Stoker("verify " + ds);
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("BAD  shards/000001.stks sample"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("checksum mismatch"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("1 problem(s)"), std::string::npos) << bad.out;

  auto again = Stoker("pack " + (d.path() / "src").string() + " " + ds);
  EXPECT_EQ(again.code, 10 + int(Code::kAlreadyExists)) << again.out;
  EXPECT_NE(again.out.find("already holds a stoker dataset"), std::string::npos) << again.out;
}

TEST(CliTest, BenchLoaderReportsTheFiguresAsJson) {
  TempDir d;
  MakeTree(d.path() / "src", 60);
  const std::string ds = (d.path() / "ds").string();
  ASSERT_EQ(Stoker("pack --quiet " + (d.path() / "src").string() + " " + ds).code, 0);
  auto r = Stoker("bench loader --json --batch-size 8 --budget-mib 64 " + ds);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["samples"], 60);
  EXPECT_GT(j["mb_per_s"].get<double>(), 0);
  EXPECT_GT(j["samples_per_s"].get<double>(), 0);
  EXPECT_GE(j["cpu_seconds_per_gb"].get<double>(), 0);
  EXPECT_GT(j["peak_rss_bytes"].get<uint64_t>(), 0u);
  EXPECT_LE(j["kernel_cpu_seconds"].get<double>(), j["cpu_seconds"].get<double>());
  EXPECT_GT(j["page_faults"].get<uint64_t>(), 0u);  // batch memory, touched first
  auto limited = Stoker("bench loader --json --samples 16 --batch-size 8 " + ds);
  ASSERT_EQ(limited.code, 0) << limited.out;
  EXPECT_EQ(nlohmann::json::parse(limited.out)["samples"], 16);
  // Several epochs in one process, the loader and the per-file baseline alike.
  auto epochs = Stoker("bench loader --json --epochs 3 --batch-size 8 " + ds);
  ASSERT_EQ(epochs.code, 0) << epochs.out;
  EXPECT_EQ(nlohmann::json::parse(epochs.out)["samples"], 180);
  // Mapped reads, each shard mapped anew every epoch; a negative limit is refused.
  auto unkept = Stoker(
      "bench loader --json --epochs 3 --batch-size 8 --read-unit map "
      "--keep-mapped-mib 0.001 " +
      ds);
  ASSERT_EQ(unkept.code, 0) << unkept.out;
  EXPECT_EQ(nlohmann::json::parse(unkept.out)["bytes_delivered"],
            nlohmann::json::parse(epochs.out)["bytes_delivered"]);
  EXPECT_NE(Stoker("bench loader --keep-mapped-mib -1 " + ds).code, 0);
  auto files =
      Stoker("bench files --json --epochs 3 --batch-size 8 " + (d.path() / "src").string());
  ASSERT_EQ(files.code, 0) << files.out;
  auto fj = nlohmann::json::parse(files.out);
  EXPECT_EQ(fj["samples"], 180);
  EXPECT_EQ(fj["bytes_delivered"], 3 * j["bytes_delivered"].get<uint64_t>()) << files.out;
}

TEST(CliTest, ErrorsNameWhatAndWhere) {
  TempDir d;
  auto missing = Stoker("inspect " + (d.path() / "nothing").string());
  EXPECT_EQ(missing.code, 10 + int(Code::kNotFound)) << missing.out;
  EXPECT_NE(missing.out.find("no stoker dataset at"), std::string::npos) << missing.out;

  auto scheme = Stoker("inspect bogus://x/y");
  EXPECT_EQ(scheme.code, 10 + int(Code::kInvalidArgument)) << scheme.out;
  EXPECT_NE(scheme.out.find("bogus://x/y"), std::string::npos) << scheme.out;

  auto src =
      Stoker("pack " + (d.path() / "no-such-src").string() + " " + (d.path() / "ds").string());
  EXPECT_EQ(src.code, 10 + int(Code::kNotFound)) << src.out;
  EXPECT_NE(src.out.find("no-such-src"), std::string::npos) << src.out;

  auto usage = Stoker("pack");
  EXPECT_EQ(usage.code, 2) << usage.out;

  MakeTree(d.path() / "src", 10);
  ASSERT_EQ(
      Stoker("pack --quiet " + (d.path() / "src").string() + " " + (d.path() / "ds").string()).code,
      0);
  auto bad_size = Stoker("bench loader --decode --decode-size 12by4 " + (d.path() / "ds").string());
  EXPECT_EQ(bad_size.code, 10 + int(Code::kInvalidArgument)) << bad_size.out;
  EXPECT_NE(bad_size.out.find("--decode-size"), std::string::npos) << bad_size.out;

  // A manifest that is not one.
  testing::WriteFile(d.path() / "ds" / "manifest.stoker", RandomBytes(100, 1));
  auto corrupt = Stoker("inspect " + (d.path() / "ds").string());
  EXPECT_EQ(corrupt.code, 10 + int(Code::kCorruption)) << corrupt.out;
  EXPECT_NE(corrupt.out.find("manifest.stoker"), std::string::npos) << corrupt.out;
}

TEST(CliTest, DemoRunsSmallAndWritesJson) {
  TempDir d;
  const std::string json = (d.path() / "demo.json").string();
  auto r = Stoker(
      "demo --images 40 --batch-size 8 --steps 2 --warmup-steps 1 "
      "--max-accelerators 2 --storage local --no-torch --dir " +
      (d.path() / "work").string() + " --json " + json);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("this node, this storage: per-file keeps"), std::string::npos) << r.out;
  std::ifstream in(json);
  ASSERT_TRUE(in) << json;
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["storage"]["mode"], "local");
  EXPECT_FALSE(j["per_file"]["trials"].empty());
  EXPECT_FALSE(j["stoker"]["trials"].empty());
  EXPECT_GT(j["stoker"]["trials"][0]["samples_per_s"].get<double>(), 0);
  EXPECT_FALSE(fs::exists(d.path() / "work"));  // cleaned up without --keep

  // It refuses to take over a folder that is not its own.
  testing::WriteFile(d.path() / "mine" / "precious.txt", RandomBytes(10, 1));
  auto refused = Stoker("demo --images 10 --dir " + (d.path() / "mine").string());
  EXPECT_NE(refused.code, 0);
  EXPECT_TRUE(fs::exists(d.path() / "mine" / "precious.txt"));
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

// stoker ckpt ls|show|verify|rm over checkpoints saved through the API.
TEST(CliTest, CkptLsShowVerifyRm) {
  TempDir d;
  const std::string root = (d.path() / "ckpt").string();
  auto c = OpenCheckpointer(root);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<std::byte> w = RandomBytes(40000, 1), b = RandomBytes(64, 2);
  std::vector<TensorRef> refs = {{"layer.weight", DType::kFloat32, {100, 100}, w},
                                 {"layer.bias", DType::kBFloat16, {32}, b}};
  SaveOptions o;
  o.chunk_bytes = 8192;
  o.metadata_json = R"({"step":7})";
  ASSERT_TRUE((*c)->Save("step-7", refs, o).ok());
  ASSERT_TRUE((*c)->Save("step-8", refs, o).ok());

  auto ls = Stoker("ckpt ls " + root);
  ASSERT_EQ(ls.code, 0) << ls.out;
  EXPECT_NE(ls.out.find("step-8"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("committed, latest"), std::string::npos) << ls.out;
  auto lsj = Stoker("ckpt ls --json " + root);
  ASSERT_EQ(lsj.code, 0) << lsj.out;
  auto j = nlohmann::json::parse(lsj.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[1]["name"], "step-8");
  EXPECT_EQ(j[1]["latest"], true);
  EXPECT_EQ(j[0]["bytes"], 40064);

  auto show = Stoker("ckpt show --json " + root + " step-7");
  ASSERT_EQ(show.code, 0) << show.out;
  auto sj = nlohmann::json::parse(show.out);
  EXPECT_EQ(sj["metadata"]["step"], 7);
  EXPECT_EQ(sj["tensors"][1]["dtype"], "bfloat16");
  EXPECT_EQ(sj["tensors"][0]["shape"], nlohmann::json::array({100, 100}));
  auto human = Stoker("ckpt show " + root);
  EXPECT_NE(human.out.find("checkpoint  step-8"), std::string::npos) << human.out;

  auto ok = Stoker("ckpt verify " + root);
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find(": OK"), std::string::npos) << ok.out;
  // A flipped byte in a chunk of step-7: verify names chunk and tensor.
  const fs::path chunk = d.path() / "ckpt/step-7/rank-00000/000002.chunk";
  auto bytes = testing::ReadFile(chunk);
  bytes[10] ^= std::byte{1};
  testing::WriteFile(chunk, bytes);
  auto bad = Stoker("ckpt verify " + root + " step-7");
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("BAD  " + root + "/step-7/rank-00000/000002.chunk: checksum mismatch"),
            std::string::npos)
      << bad.out;
  EXPECT_NE(bad.out.find("layer.weight"), std::string::npos) << bad.out;

  auto rm = Stoker("ckpt rm " + root + " step-8");
  EXPECT_EQ(rm.code, 0) << rm.out;
  auto after = Stoker("ckpt ls --json " + root);
  auto aj = nlohmann::json::parse(after.out);
  ASSERT_EQ(aj.size(), 1u);
  EXPECT_EQ(aj[0]["latest"], true);
  auto missing = Stoker("ckpt show " + root + " step-9");
  EXPECT_EQ(missing.code, 10 + int(Code::kNotFound)) << missing.out;
  EXPECT_NE(missing.out.find("no checkpoint step-9 at " + root), std::string::npos) << missing.out;
  auto escape = Stoker("ckpt rm " + root + " ../x");
  EXPECT_EQ(escape.code, 10 + int(Code::kInvalidArgument)) << escape.out;

  // What a save killed after its folder's mkdir leaves (an empty folder): no
  // checkpoint in ls; rm takes it once it is old, and says why it leaves a
  // fresh one.
  const fs::path leftover = d.path() / "ckpt/dead";
  fs::create_directories(leftover / "rank-00000");
  auto with_leftover = Stoker("ckpt ls --json " + root);
  EXPECT_EQ(nlohmann::json::parse(with_leftover.out).size(), 1u) << with_leftover.out;
  auto fresh = Stoker("ckpt rm " + root + " dead");
  EXPECT_EQ(fresh.code, 10 + int(Code::kNotFound)) << fresh.out;
  EXPECT_NE(fresh.out.find("left alone"), std::string::npos) << fresh.out;
  const auto hour_ago = fs::file_time_type::clock::now() - std::chrono::hours(1);
  fs::last_write_time(leftover / "rank-00000", hour_ago);
  fs::last_write_time(leftover, hour_ago);
  auto old = Stoker("ckpt rm " + root + " dead");
  EXPECT_EQ(old.code, 0) << old.out;
  EXPECT_FALSE(fs::exists(leftover));

  // A root folder that does not exist is NotFound, not an empty table; an
  // existing empty one is an empty table.
  auto nowhere = Stoker("ckpt ls " + root + "-typo");
  EXPECT_EQ(nowhere.code, 10 + int(Code::kNotFound)) << nowhere.out;
  EXPECT_NE(nowhere.out.find("no such folder"), std::string::npos) << nowhere.out;
  fs::create_directories(d.path() / "empty");
  auto empty = Stoker("ckpt ls --json " + (d.path() / "empty").string());
  EXPECT_EQ(empty.code, 0) << empty.out;
  EXPECT_EQ(nlohmann::json::parse(empty.out).size(), 0u);
}

}  // namespace
}  // namespace stoker

#include "wds/tar.h"

namespace stoker {
namespace {

// stoker pack a.tar b.tar DST recognises WebDataset tars; stoker export
// gives them back byte for byte; JSONL with --field; bad input named.
TEST(CliTest, PackWebDatasetTarsAndExport) {
  TempDir d;
  std::vector<std::string> tars;
  for (int t = 0; t < 2; ++t) {
    tars.push_back((d.path() / ("00000" + std::to_string(t) + ".tar")).string());
    auto w = wds::TarWriter::Create(tars.back());
    ASSERT_TRUE(w.ok());
    for (int i = 0; i < 40; ++i) {
      const std::string k = "s" + std::to_string(t * 100 + i);
      const std::string txt = "caption " + k;
      ASSERT_OK((*w)->Add(k + ".jpg", RandomBytes(300 + i, i)));
      ASSERT_OK((*w)->Add(k + ".txt", std::as_bytes(std::span(txt))));
    }
    ASSERT_OK((*w)->Close());
  }
  const std::string ds = (d.path() / "ds").string();
  auto pack = Stoker("pack " + tars[0] + " " + tars[1] + " " + ds);
  ASSERT_EQ(pack.code, 0) << pack.out;
  EXPECT_NE(pack.out.find("imported 80 samples from 2 tar files"), std::string::npos) << pack.out;
  EXPECT_EQ(pack.out.find('\r'), std::string::npos) << "no progress bar when not a terminal";
  auto inspect = Stoker("inspect " + ds);
  EXPECT_EQ(inspect.code, 0) << inspect.out;

  const std::string out = (d.path() / "out").string();
  auto ex = Stoker("export " + ds + " --webdataset " + out + " --samples-per-tar 40");
  ASSERT_EQ(ex.code, 0) << ex.out;
  EXPECT_NE(ex.out.find("exported 80 samples into 2 tars"), std::string::npos) << ex.out;
  for (int t = 0; t < 2; ++t) {
    EXPECT_TRUE(testing::ReadFile(fs::path(out) / fs::path(tars[t]).filename()) ==
                testing::ReadFile(tars[t]))
        << "tar " << t;
  }
  // Again into the same folder: refused; a folder of tars is a source too.
  EXPECT_NE(Stoker("export " + ds + " --webdataset " + out).code, 0);
  auto again = Stoker("pack --quiet " + out + " " + (d.path() / "ds2").string());
  EXPECT_EQ(again.code, 0) << again.out;

  // A truncated tar: named, nothing committed; --skip-bad imports the rest.
  fs::resize_file(tars[1], fs::file_size(tars[1]) / 2);
  auto bad = Stoker("pack " + tars[0] + " " + tars[1] + " " + (d.path() / "ds3").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find(tars[1]), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(d.path() / "ds3" / "manifest.stoker"));
  auto skip = Stoker("pack --skip-bad " + tars[0] + " " + tars[1] + " " +
                     (d.path() / "ds4").string());
  EXPECT_EQ(skip.code, 0) << skip.out;
  EXPECT_NE(skip.out.find("bad skipped"), std::string::npos) << skip.out;

  // JSONL with declared fields; a bad token named by file:line.
  const fs::path jl = d.path() / "a.jsonl";
  std::ofstream(jl) << "{\"text\": \"hi\", \"ids\": [1, 2]}\n{\"text\": \"yo\", \"ids\": [70000]}\n";
  auto j = Stoker("pack --field text:str --field ids:uint16[*] " + jl.string() + " " +
                  (d.path() / "ds5").string());
  EXPECT_NE(j.code, 0);
  EXPECT_NE(j.out.find(jl.string() + ":2"), std::string::npos) << j.out;
  auto j2 = Stoker("pack --field text:str --field ids:uint32[*] " + jl.string() + " " +
                   (d.path() / "ds6").string());
  EXPECT_EQ(j2.code, 0) << j2.out;
  EXPECT_NE(j2.out.find("imported 2 samples from 1 JSONL file"), std::string::npos) << j2.out;
  // An ImageFolder tree is one SRC.
  EXPECT_EQ(Stoker("pack " + out + " " + jl.string() + " --from list " +
                   (d.path() / "ds7").string())
                .code,
            2);
}

}  // namespace
}  // namespace stoker
