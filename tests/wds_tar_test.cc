// WebDataset tars (src/wds/tar.h): the writer's deterministic bytes and
// atomic rename; the reader's grouping of members into samples on tars from
// the writer, GNU tar and hand-built ustar bytes; and every bad input, each
// with its code and a message naming the tar and the member, strict and
// with skip_bad.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "testutil.h"
#include "wds/tar.h"

namespace stoker::wds {
namespace {

using stoker::testing::RandomBytes;
using stoker::testing::ReadFile;
using stoker::testing::TempDir;
using stoker::testing::WriteFile;

std::vector<std::byte> Bytes(std::string_view s) {
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  return {p, p + s.size()};
}

// Expects `st` to have `code` and a message holding each of `parts`.
void ExpectError(const Status& st, Code code, const std::vector<std::string>& parts) {
  EXPECT_EQ(st.code(), code) << st.ToString();
  for (const std::string& part : parts) {
    EXPECT_NE(st.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << st.message();
  }
}

// Tars the writer cannot make (links, devices, folders, damaged fields), as
// POSIX 1003.1-1988 ustar bytes made field by field.
class HandTar {
 public:
  HandTar& Add(std::string_view name, std::string_view data, char type = '0',
               std::string_view link = "") {
    Header(name, data.size(), type, link);
    Append(Bytes(data));
    Pad();
    return *this;
  }
  // A header claiming `size` bytes, with no data after it.
  HandTar& HeaderOnly(std::string_view name, uint64_t size) {
    Header(name, size, '0', "");
    return *this;
  }
  // The end-of-archive marker: two zero blocks.
  HandTar& End() {
    bytes_.resize(bytes_.size() + 1024);
    return *this;
  }
  std::vector<std::byte>& bytes() { return bytes_; }
  void Write(const std::string& path) { WriteFile(path, bytes_); }

 private:
  void Header(std::string_view name, uint64_t size, char type, std::string_view link) {
    std::array<char, 512> h{};
    std::memcpy(&h[0], name.data(), std::min<size_t>(name.size(), 100));
    std::snprintf(&h[100], 8, "%07o", 0644);
    std::snprintf(&h[108], 8, "%07o", 0);
    std::snprintf(&h[116], 8, "%07o", 0);
    std::snprintf(&h[124], 12, "%011llo", static_cast<unsigned long long>(size));
    std::snprintf(&h[136], 12, "%011o", 0);
    h[156] = type;
    std::memcpy(&h[157], link.data(), std::min<size_t>(link.size(), 100));
    std::memcpy(&h[257], "ustar", 6);
    std::memcpy(&h[263], "00", 2);
    std::memset(&h[148], ' ', 8);  // the checksum counts its own field as spaces
    unsigned sum = 0;
    for (char c : h) sum += static_cast<unsigned char>(c);
    std::snprintf(&h[148], 8, "%06o", sum);
    const auto* p = reinterpret_cast<const std::byte*>(h.data());
    Append({p, p + h.size()});
  }
  void Append(const std::vector<std::byte>& b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  void Pad() { bytes_.resize((bytes_.size() + 511) / 512 * 512); }

  std::vector<std::byte> bytes_;
};

struct Outcome {
  std::vector<Sample> samples;
  Status status;  // the error that ended the reading, or OK at the end
  uint64_t skipped = 0;
  std::string reason;
};

Outcome ReadAll(const std::string& path, const TarReadOptions& options = {}) {
  Outcome o;
  auto reader = TarSampleReader::Open(path, options);
  if (!reader.ok()) {
    o.status = reader.status();
    return o;
  }
  for (;;) {
    Sample s;
    Result<bool> more = (*reader)->Next(&s);
    if (!more.ok()) {
      o.status = more.status();
      break;
    }
    if (!*more) break;
    o.samples.push_back(std::move(s));
  }
  o.skipped = (*reader)->skipped();
  o.reason = (*reader)->last_skip_reason();
  return o;
}

std::vector<std::string> Keys(const Outcome& o) {
  std::vector<std::string> keys;
  for (const Sample& s : o.samples) keys.push_back(s.key);
  return keys;
}

// With skip_bad the tar reads to its end: `keys` come out, and `skipped`
// bad members or samples are counted.
void ExpectSkipped(const std::string& path, const std::vector<std::string>& keys,
                   uint64_t skipped) {
  const Outcome o = ReadAll(path, {.skip_bad = true});
  EXPECT_TRUE(o.status.ok()) << o.status.ToString();
  EXPECT_EQ(Keys(o), keys);
  EXPECT_EQ(o.skipped, skipped);
}

struct NamedData {
  std::string name;
  std::vector<std::byte> data;
};

Status WriteTar(const std::string& path, const std::vector<NamedData>& members) {
  STOKER_ASSIGN_OR_RETURN(auto writer, TarWriter::Create(path));
  for (const NamedData& m : members) STOKER_RETURN_IF_ERROR(writer->Add(m.name, m.data));
  return writer->Close();
}

class WdsTarTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_.str() + "/" + name; }
  TempDir dir_;
};

// ---- the writer, read back ------------------------------------------------

TEST_F(WdsTarTest, RoundTripKeepsKeysFieldsBytesAndOrder) {
  const std::vector<NamedData> members = {
      {"a/b/000001.seg.png", RandomBytes(3000, 1)},
      {"a/b/000001.jpg", RandomBytes((3u << 20) + 7, 2)},  // several read blocks
      {"a/b/000002.seg.png", {}},                          // 0 bytes
      {"a/b/000002.cls", Bytes("7")},
      {"000003.txt", Bytes("hello")},
  };
  const std::string tar = Path("rt.tar");
  ASSERT_OK(WriteTar(tar, members));
  const Outcome o = ReadAll(tar);
  ASSERT_OK(o.status);
  ASSERT_EQ(Keys(o), (std::vector<std::string>{"a/b/000001", "a/b/000002", "000003"}));
  const std::vector<std::vector<std::string>> exts = {
      {"seg.png", "jpg"}, {"seg.png", "cls"}, {"txt"}};
  size_t next = 0;
  for (size_t i = 0; i < o.samples.size(); ++i) {
    const Sample& s = o.samples[i];
    EXPECT_EQ(s.tar, tar);
    EXPECT_EQ(s.first_member, next);
    ASSERT_EQ(s.members.size(), exts[i].size());
    for (size_t j = 0; j < s.members.size(); ++j, ++next) {
      EXPECT_EQ(s.members[j].ext, exts[i][j]);
      EXPECT_EQ(s.members[j].data, members[next].data) << members[next].name;
    }
  }
  EXPECT_EQ(o.skipped, 0u);
}

TEST_F(WdsTarTest, SameContentGivesTheSameBytes) {
  const std::vector<NamedData> members = {
      {"x/000001.jpg", RandomBytes(1000, 3)},
      {"x/000001.json", Bytes("{}")},
      {std::string(150, 'n') + ".long.bin", RandomBytes(10, 4)},        // pax path
      {std::string(120, 'd') + "/" + std::string(90, 'f') + ".b", {}},  // ustar prefix
      {"\xc3\xbc/000002.txt", Bytes("non-ASCII")},
  };
  ASSERT_OK(WriteTar(Path("one.tar"), members));
  ::sleep(1);  // a clock in the bytes would show now
  ASSERT_OK(WriteTar(Path("two.tar"), members));
  const std::vector<std::byte> one = ReadFile(Path("one.tar"));
  EXPECT_EQ(one, ReadFile(Path("two.tar")));
  EXPECT_EQ(one.size() % 512, 0u) << "blocks of 512, nothing after the end marker's";

  // Fixed metadata in the first (ustar) header: mode 0644, uid/gid 0, no
  // names, mtime 0, magic "ustar".
  const auto field = [&](size_t off, size_t len) {
    return std::string(reinterpret_cast<const char*>(one.data()) + off, len);
  };
  const auto octal = [&](size_t off, size_t len) {
    return std::stoull(field(off, len), nullptr, 8);
  };
  EXPECT_EQ(field(0, 13), std::string("x/000001.jpg\0", 13));
  EXPECT_EQ(octal(100, 8), 0644u);
  EXPECT_EQ(octal(108, 8), 0u);
  EXPECT_EQ(octal(116, 8), 0u);
  EXPECT_EQ(octal(136, 12), 0u);
  EXPECT_EQ(field(257, 5), "ustar");
  EXPECT_EQ(field(265, 32), std::string(32, '\0'));
  EXPECT_EQ(field(297, 32), std::string(32, '\0'));

  const Outcome o = ReadAll(Path("one.tar"));
  ASSERT_OK(o.status);
  ASSERT_EQ(o.samples.size(), 4u);
  EXPECT_EQ(o.samples[1].key, std::string(150, 'n'));
  EXPECT_EQ(o.samples[1].members[0].ext, "long.bin");
  EXPECT_EQ(o.samples[2].key, std::string(120, 'd') + "/" + std::string(90, 'f'));
  EXPECT_EQ(o.samples[3].key, "\xc3\xbc/000002");
  EXPECT_EQ(o.samples[3].members[0].data, Bytes("non-ASCII"));
}

TEST_F(WdsTarTest, SystemTarReadsTheWritersTar) {
  ASSERT_OK(WriteTar(Path("w.tar"), {{"k/000001.jpg", Bytes("abc")},
                                     {std::string(150, 'n') + ".bin", Bytes("de")}}));
  const std::string cmd = "tar -tvf " + Path("w.tar") + " > " + Path("list.txt") + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const std::vector<std::byte> list = ReadFile(Path("list.txt"));
  const std::string text(reinterpret_cast<const char*>(list.data()), list.size());
  EXPECT_NE(text.find("-rw-r--r-- 0/0"), std::string::npos) << text;
  EXPECT_NE(text.find("1970-01-01 00:00 k/000001.jpg"), std::string::npos) << text;
  EXPECT_NE(text.find(std::string(150, 'n') + ".bin"), std::string::npos) << text;
}

TEST_F(WdsTarTest, EmptyTarHasNoSamples) {
  ASSERT_OK(WriteTar(Path("empty.tar"), {}));
  EXPECT_EQ(ReadFile(Path("empty.tar")).size(), 1024u) << "just the end marker";
  Outcome o = ReadAll(Path("empty.tar"));
  ASSERT_OK(o.status);
  EXPECT_TRUE(o.samples.empty());
  // GNU tar's empty archive: one 10 KiB record of zeros.
  const std::string cmd = "tar -cf " + Path("gnu-empty.tar") + " --files-from /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  o = ReadAll(Path("gnu-empty.tar"));
  ASSERT_OK(o.status);
  EXPECT_TRUE(o.samples.empty());
}

TEST_F(WdsTarTest, ZeroByteMemberAloneIsASample) {
  ASSERT_OK(WriteTar(Path("z.tar"), {{"000001.cls", {}}}));
  const Outcome o = ReadAll(Path("z.tar"));
  ASSERT_OK(o.status);
  ASSERT_EQ(o.samples.size(), 1u);
  ASSERT_EQ(o.samples[0].members.size(), 1u);
  EXPECT_EQ(o.samples[0].members[0].ext, "cls");
  EXPECT_TRUE(o.samples[0].members[0].data.empty());
}

// ---- tars from elsewhere --------------------------------------------------

TEST_F(WdsTarTest, GnuTarPlainAndGzippedGnuAndPax) {
  const std::filesystem::path src = dir_.path() / "src";
  const std::string long_key = "shard/" + std::string(150, 'k');  // GNU longname, pax path
  WriteFile(src / "shard/000001.jpg", RandomBytes(5000, 5));
  WriteFile(src / "shard/000001.seg.png", RandomBytes(700, 6));
  WriteFile(src / "shard/000002.jpg", Bytes("j"));
  WriteFile(src / "shard/000002.seg.png", {});
  WriteFile(src / (long_key + ".txt"), Bytes("long"));
  for (const std::string format : {"gnu", "pax"}) {
    for (const std::string flags : {"-cf", "-czf"}) {
      SCOPED_TRACE(format + " " + flags);
      const std::string tar = Path(format + flags + ".tar");
      const std::string cmd = "tar --sort=name --format=" + format + " -C " + src.string() + " " +
                              flags + " " + tar + " shard";
      ASSERT_EQ(std::system(cmd.c_str()), 0);
      const Outcome o = ReadAll(tar);
      ASSERT_OK(o.status);
      ASSERT_EQ(Keys(o), (std::vector<std::string>{"shard/000001", "shard/000002", long_key}));
      EXPECT_EQ(o.samples[0].first_member, 1u) << "entry 0 is the folder";
      EXPECT_EQ(o.samples[1].first_member, 3u);
      ASSERT_EQ(o.samples[0].members.size(), 2u);
      EXPECT_EQ(o.samples[0].members[0].ext, "jpg");
      EXPECT_EQ(o.samples[0].members[0].data, RandomBytes(5000, 5));
      EXPECT_EQ(o.samples[0].members[1].ext, "seg.png");
      EXPECT_EQ(o.samples[0].members[1].data, RandomBytes(700, 6));
      EXPECT_TRUE(o.samples[1].members[1].data.empty());
      EXPECT_EQ(o.samples[2].members[0].data, Bytes("long"));
    }
  }
}

TEST_F(WdsTarTest, HandBuiltUstarWithFoldersAndMetadata) {
  HandTar()
      .Add("__info__", "ignored, as WebDataset does")
      .Add("d/", "", '5')
      .Add("d/e.f/000001.a.b", "x")  // a dot in a folder is not the extension's
      .Add("d/e.f/000001.c", "yz")
      .End()
      .Write(Path("hand.tar"));
  const Outcome o = ReadAll(Path("hand.tar"));
  ASSERT_OK(o.status);
  ASSERT_EQ(Keys(o), (std::vector<std::string>{"d/e.f/000001"}));
  EXPECT_EQ(o.samples[0].first_member, 2u);
  EXPECT_EQ(o.samples[0].members[0].ext, "a.b");
  EXPECT_EQ(o.samples[0].members[1].data, Bytes("yz"));
}

// ---- bad inputs -----------------------------------------------------------

TEST_F(WdsTarTest, NotATarIsCorruption) {
  WriteFile(Path("random.tar"), RandomBytes(20000, 7));
  WriteFile(Path("zero.tar"), {});
  WriteFile(Path("text"), Bytes(std::string(3000, 't')));
  ASSERT_EQ(std::system(("gzip -c " + Path("text") + " > " + Path("text.gz")).c_str()), 0);
  for (const char* name : {"random.tar", "zero.tar", "text.gz"}) {
    const std::string path = Path(name);
    ExpectError(TarSampleReader::Open(path).status(), Code::kCorruption,
                {path + ": not a tar archive"});
  }
  ExpectError(TarSampleReader::Open(Path("missing.tar")).status(), Code::kNotFound,
              {Path("missing.tar")});
}

// A valid three-sample tar to cut: a.bin's data is 2000 bytes at 512..2512,
// b.bin's header at 2560.
class WdsTruncatedTest : public WdsTarTest {
 protected:
  void SetUp() override {
    HandTar()
        .Add("a.bin", std::string(2000, 'a'))
        .Add("b.bin", std::string(2000, 'b'))
        .Add("c.bin", "c")
        .End()
        .Write(Path("full.tar"));
    full_ = ReadFile(Path("full.tar"));
  }
  std::string Cut(size_t size) {
    const std::string path = Path("cut" + std::to_string(size) + ".tar");
    WriteFile(path, {full_.begin(), full_.begin() + size});
    return path;
  }
  std::vector<std::byte> full_;
};

TEST_F(WdsTruncatedTest, MidMemberNamesTheMember) {
  const std::string path = Cut(1500);
  Outcome o = ReadAll(path);
  ExpectError(o.status, Code::kCorruption, {path + ": truncated in member 'a.bin'"});
  EXPECT_TRUE(o.samples.empty());

  const std::string later = Cut(3500);  // inside b.bin's data
  o = ReadAll(later);
  ExpectError(o.status, Code::kCorruption, {later + ": truncated in member 'b.bin'"});
  EXPECT_EQ(Keys(o), std::vector<std::string>{"a"}) << "whole samples before the cut come out";

  o = ReadAll(later, {.skip_bad = true});
  ASSERT_OK(o.status);
  EXPECT_EQ(Keys(o), std::vector<std::string>{"a"});
  EXPECT_EQ(o.skipped, 1u);
  EXPECT_NE(o.reason.find("truncated in member 'b.bin'"), std::string::npos) << o.reason;
}

TEST_F(WdsTruncatedTest, MidHeaderNamesTheMemberBefore) {
  const std::string path = Cut(2560 + 100);
  Outcome o = ReadAll(path);
  ExpectError(o.status, Code::kCorruption,
              {path + ": truncated in the header after member 'a.bin'"});
  ExpectSkipped(path, {}, 1);  // 'a' goes too: it may have had members after the cut
}

TEST_F(WdsTruncatedTest, DamagedHeaderIsCorruption) {
  full_[2560 + 10] ^= std::byte{0xff};  // b.bin's name: the checksum fails
  WriteFile(Path("damaged.tar"), full_);
  const Outcome o = ReadAll(Path("damaged.tar"));
  ExpectError(o.status, Code::kCorruption,
              {Path("damaged.tar") + ": damaged tar in the header after member 'a.bin'"});
  ExpectSkipped(Path("damaged.tar"), {}, 1);  // the tar ends there, 'a' with it
}

TEST_F(WdsTarTest, TruncatedGzipIsCorruption) {
  const std::string tar = Path("random.tar");
  ASSERT_OK(
      WriteTar(tar, {{"a.bin", RandomBytes(100000, 11)}, {"b.bin", RandomBytes(100000, 12)}}));
  ASSERT_EQ(std::system(("gzip -c " + tar + " > " + tar + ".gz").c_str()), 0);
  ASSERT_EQ(Keys(ReadAll(tar + ".gz")), (std::vector<std::string>{"a", "b"}));
  const std::vector<std::byte> gz = ReadFile(tar + ".gz");
  const std::string cut = Path("cut.tar.gz");
  WriteFile(cut, {gz.begin(), gz.begin() + gz.size() * 3 / 4});  // inside b.bin
  const Outcome o = ReadAll(cut);
  ExpectError(o.status, Code::kCorruption, {cut + ": truncated in member 'b.bin'"});
  EXPECT_EQ(Keys(o), std::vector<std::string>{"a"});
}

TEST_F(WdsTarTest, MemberWithoutExtension) {
  for (const char* name : {"README", "dir.d/file", "k/000001.", "k/.jpg"}) {
    SCOPED_TRACE(name);
    const std::string path = Path("noext.tar");
    HandTar().Add(name, "x").Add("000001.jpg", "j").End().Write(path);
    const Outcome o = ReadAll(path);
    ExpectError(o.status, Code::kCorruption,
                {path + ": member '" + name + "' has no", "WebDataset keys are NAME.EXT"});
    ExpectSkipped(path, {"000001"}, 1);
  }
}

TEST_F(WdsTarTest, DuplicateField) {
  const std::string path = Path("dup.tar");
  ASSERT_OK(WriteTar(path, {{"KEY.jpg", Bytes("1")},
                            {"KEY.cls", Bytes("2")},
                            {"KEY.jpg", Bytes("3")},
                            {"next.jpg", Bytes("4")}}));
  const Outcome o = ReadAll(path);
  ExpectError(o.status, Code::kCorruption,
              {path + ": duplicate field 'jpg' in sample 'KEY' (member 'KEY.jpg')"});
  ExpectSkipped(path, {"next"}, 1);
}

TEST_F(WdsTarTest, MembersOfASampleMustBeAdjacent) {
  const std::string path = Path("order.tar");
  ASSERT_OK(WriteTar(path, {{"a.jpg", Bytes("1")},
                            {"b.jpg", Bytes("2")},
                            {"a.cls", Bytes("3")},
                            {"c.jpg", Bytes("4")}}));
  const Outcome o = ReadAll(path);
  EXPECT_EQ(Keys(o), (std::vector<std::string>{"a", "b"})) << "the good samples first";
  ExpectError(o.status, Code::kCorruption,
              {path + ": sample 'a' appears again at member 'a.cls' after other samples: "
                      "members of a sample must be adjacent"});
  ExpectSkipped(path, {"a", "b", "c"}, 1);
}

TEST_F(WdsTarTest, LinksAndDevicesAreRefusedOrIgnored) {
  struct Case {
    char type;
    const char* link;
    const char* kind;
  };
  for (const Case& c : {Case{'2', "000001.jpg", "a symlink"},
                        Case{'1', "000001.jpg", "a hard link"}, Case{'3', "", "a character device"},
                        Case{'4', "", "a block device"}, Case{'6', "", "a FIFO"}}) {
    SCOPED_TRACE(c.kind);
    const std::string path = Path("special.tar");
    HandTar()
        .Add("000001.jpg", "j")
        .Add("000002.jpg", "j2")
        .Add("000002.lnk", "", c.type, c.link)
        .Add("000003.jpg", "j3")
        .End()
        .Write(path);
    Outcome o = ReadAll(path);
    ExpectError(o.status, Code::kInvalidArgument,
                {path + ": member '000002.lnk' is " + c.kind, "regular files"});
    ExpectSkipped(path, {"000001", "000003"}, 1);  // its whole sample goes
    o = ReadAll(path, {.skip_non_regular = true});
    ASSERT_OK(o.status);
    EXPECT_EQ(Keys(o), (std::vector<std::string>{"000001", "000002", "000003"}));
    EXPECT_EQ(o.samples[1].members.size(), 1u);
    EXPECT_EQ(o.skipped, 0u);
  }
}

TEST_F(WdsTarTest, MemberOver4GiBIsUnsupported) {
  const std::string path = Path("huge.tar");
  HandTar().HeaderOnly("000001.bin", 5ull << 30).Write(path);
  const Outcome o = ReadAll(path);
  ExpectError(o.status, Code::kUnsupported, {path + ": member '000001.bin' is 5368709120 bytes"});
}

TEST_F(WdsTarTest, SkipBadCountsEachBadSampleOnce) {
  const std::string path = Path("mixed.tar");
  HandTar()
      .Add("a.jpg", "1")
      .Add("README", "no extension")  // 1
      .Add("b.jpg", "2")
      .Add("b.jpg", "dup")  // 2 (sample b)
      .Add("b.cls", "still b")
      .Add("c.lnk", "", '2', "a.jpg")  // 3 (sample c)
      .Add("c.jpg", "3")
      .Add("d.jpg", "4")
      .Add("a.cls", "again")  // 4
      .End()
      .Write(path);
  const Outcome o = ReadAll(path, {.skip_bad = true});
  ASSERT_OK(o.status);
  EXPECT_EQ(Keys(o), (std::vector<std::string>{"a", "d"}));
  EXPECT_EQ(o.skipped, 4u);
  EXPECT_NE(o.reason.find("sample 'a' appears again at member 'a.cls'"), std::string::npos)
      << o.reason;
}

TEST_F(WdsTarTest, AnErrorIsSticky) {
  const std::string path = Path("sticky.tar");
  HandTar().Add("README", "x").Add("a.jpg", "1").End().Write(path);
  auto reader = TarSampleReader::Open(path);
  ASSERT_OK(reader.status());
  Sample s;
  const Status first = (*reader)->Next(&s).status();
  EXPECT_EQ(first.code(), Code::kCorruption);
  EXPECT_EQ((*reader)->Next(&s).status(), first);
}

// ---- the writer's failures ------------------------------------------------

TEST_F(WdsTarTest, UnclosedWriterLeavesNothing) {
  const std::string path = Path("unclosed.tar");
  {
    auto writer = TarWriter::Create(path);
    ASSERT_OK(writer.status());
    ASSERT_OK((*writer)->Add("000001.jpg", RandomBytes(50000, 8)));
    EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_F(WdsTarTest, KilledWriterLeavesNoTarUnderTheName) {
  const std::string path = Path("killed.tar");
  ASSERT_OK(WriteTar(path, {{"old.txt", Bytes("old")}}));
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto writer = TarWriter::Create(path);
    if (writer.ok() && (*writer)->Add("new.txt", RandomBytes(100000, 9)).ok()) ::_exit(0);
    ::_exit(1);  // no destructor, no Close: as if killed
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const Outcome o = ReadAll(path);
  ASSERT_OK(o.status);
  EXPECT_EQ(Keys(o), std::vector<std::string>{"old"}) << "the old tar, whole";
}

TEST_F(WdsTarTest, CloseReplacesAnExistingTar) {
  const std::string path = Path("replace.tar");
  ASSERT_OK(WriteTar(path, {{"old.txt", Bytes("old")}}));
  ASSERT_OK(WriteTar(path, {{"new.txt", Bytes("new")}}));
  EXPECT_EQ(Keys(ReadAll(path)), std::vector<std::string>{"new"});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST_F(WdsTarTest, BadNamesAndMissingFolder) {
  auto writer = TarWriter::Create(Path("names.tar"));
  ASSERT_OK(writer.status());
  for (std::string_view name :
       {std::string_view(""), std::string_view("a/"), std::string_view("a\0b.c", 5)}) {
    ExpectError((*writer)->Add(name, {}), Code::kInvalidArgument, {Path("names.tar")});
  }
  ASSERT_OK((*writer)->Add("ok.txt", {}));  // a refused name wrote nothing
  ASSERT_OK((*writer)->Close());
  EXPECT_EQ(Keys(ReadAll(Path("names.tar"))), std::vector<std::string>{"ok"});
  ExpectError((*writer)->Add("late.txt", {}), Code::kInvalidArgument, {"after Close"});

  const std::string nowhere = Path("no/such/folder.tar");
  ExpectError(TarWriter::Create(nowhere).status(), Code::kNotFound, {nowhere + ".tmp"});
}

// A full disk, played by a file size limit (EFBIG from write(2)): the error
// names the file and the member, and no tar appears.
TEST_F(WdsTarTest, WriteFailureNamesThePathAndRemovesTheTemp) {
  const std::string path = Path("full.tar");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{64 << 10, 64 << 10};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(10);
    auto writer = TarWriter::Create(path);
    if (!writer.ok()) ::_exit(11);
    Status st = (*writer)->Add("000001.bin", RandomBytes(1 << 20, 10));
    if (st.ok()) st = (*writer)->Close();
    if (st.ok()) ::_exit(12);
    if (st.message().find("write " + path + ".tmp") == std::string::npos) ::_exit(13);
    if (st.message().find("File too large") == std::string::npos) ::_exit(14);
    if ((*writer)->Close().ok()) ::_exit(15);
    if (std::filesystem::exists(path + ".tmp") || std::filesystem::exists(path)) ::_exit(16);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the check that exits with this code";
}

}  // namespace
}  // namespace stoker::wds
