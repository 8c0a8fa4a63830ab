// Mappings kept from one open of a file to the next (core/file_mapping.h),
// and the POSIX store's readers that use them.
#include "core/file_mapping.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "stoker/store.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;
using internal::FileIdentity;
using internal::FileMap;
using internal::MappingCache;

std::vector<std::byte> Bytes(size_t n, uint8_t fill) {
  return std::vector<std::byte>(n, std::byte{fill});
}

// An open file and its identity, closed on destruction.
struct Opened {
  int fd = -1;
  std::string path;
  FileIdentity id;
  explicit Opened(const fs::path& p) : path(p.string()) {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0) << path;
    auto i = internal::IdentityOf(fd, path);
    EXPECT_TRUE(i.ok()) << i.status().ToString();
    if (i.ok()) id = *i;
  }
  ~Opened() { close(fd); }
  Opened(const Opened&) = delete;
  Opened& operator=(const Opened&) = delete;
};

std::shared_ptr<const FileMap> MapOf(MappingCache& cache, const fs::path& p) {
  Opened f(p);
  auto m = cache.Get(f.fd, f.path, f.id);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? *m : nullptr;
}

// `m` maps `size` bytes, the last of them `fill`.
void ExpectBytes(const std::shared_ptr<const FileMap>& m, size_t size, uint8_t fill) {
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->bytes().size(), size);
  EXPECT_EQ(m->bytes()[size - 1], std::byte{fill});
}

void ExpectKept(const MappingCache& cache, size_t maps, uint64_t bytes) {
  EXPECT_EQ(cache.kept_maps(), maps);
  EXPECT_EQ(cache.kept_bytes(), bytes);
}

TEST(MappingCache, TheSameFileOpenedAgainGetsTheKeptMapping) {
  testing::TempDir dir;
  testing::WriteFile(dir.path() / "a", Bytes(10000, 1));
  MappingCache cache(1 << 30, 100);
  auto first = MapOf(cache, dir.path() / "a");
  ASSERT_NE(first, nullptr);
  const std::byte* where = first->bytes().data();
  first.reset();  // no reader holds it: the cache still does
  auto again = MapOf(cache, dir.path() / "a");
  ExpectBytes(again, 10000, 1);
  EXPECT_EQ(again->bytes().data(), where);
  ExpectKept(cache, 1, 10000);
}

// File "a" of 8192 bytes of 1, mapped through `cache` (held as `first`).
class OneFileMapped : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteFile(a, Bytes(8192, 1));
    first = MapOf(cache, a);
    ExpectBytes(first, 8192, 1);
  }
  testing::TempDir dir;
  const fs::path a = dir.path() / "a";
  MappingCache cache{1 << 30, 100};
  std::shared_ptr<const FileMap> first;
};

TEST_F(OneFileMapped, ReplacedAtItsPathItIsMappedAnewAndTheOldMappingStaysWithItsHolder) {
  std::shared_ptr<const FileMap> old_map = std::move(first);
  // As a Put or a re-pack replaces it: a new inode renamed over the path.
  testing::WriteFile(dir.path() / "a.new", Bytes(12288, 2));
  fs::rename(dir.path() / "a.new", a);
  auto new_map = MapOf(cache, a);
  ExpectBytes(new_map, 12288, 2);
  EXPECT_NE(new_map->bytes().data(), old_map->bytes().data());
  // The holder of the old mapping still reads the old inode, whole.
  ExpectBytes(old_map, 8192, 1);
  ExpectKept(cache, 1, 12288);
  EXPECT_EQ(cache.evictions(), 0u);
}

TEST_F(OneFileMapped, ChangedInSizeOrWrittenSinceItIsMappedAnew) {
  // Grown in place: the kept mapping would show only the old size.
  {
    const int fd = open(a.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const std::vector<std::byte> more = Bytes(4096, 3);
    ASSERT_EQ(write(fd, more.data(), more.size()), 4096);
    close(fd);
  }
  auto grown = MapOf(cache, a);
  ExpectBytes(grown, 12288, 3);
  // Same size, written since (a modification time of its own).
  const struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 678}};
  ASSERT_EQ(utimensat(AT_FDCWD, a.c_str(), times, 0), 0);
  auto touched = MapOf(cache, a);
  ASSERT_NE(touched, nullptr);
  EXPECT_NE(touched, grown);
  EXPECT_EQ(cache.kept_maps(), 1u);
}

TEST(MappingCache, PastItsLimitsTheLeastRecentlyUsedGoFirstAndHoldersKeepTheirBytes) {
  testing::TempDir dir;
  for (int k = 0; k < 5; ++k) {
    testing::WriteFile(dir.path() / std::to_string(k), Bytes(4096, uint8_t(k)));
  }
  // Room for three files' bytes.
  MappingCache by_bytes(3 * 4096, 100);
  auto held = MapOf(by_bytes, dir.path() / "0");
  MapOf(by_bytes, dir.path() / "1");
  MapOf(by_bytes, dir.path() / "2");
  MapOf(by_bytes, dir.path() / "0");  // used again: "1" is now the oldest
  MapOf(by_bytes, dir.path() / "3");
  ExpectKept(by_bytes, 3, 3 * 4096);
  EXPECT_EQ(by_bytes.evictions(), 1u);
  auto zero = MapOf(by_bytes, dir.path() / "0");
  EXPECT_EQ(zero, held);  // kept: used more recently than "1"
  EXPECT_EQ(by_bytes.evictions(), 1u);
  MapOf(by_bytes, dir.path() / "1");  // dropped before: mapped again
  EXPECT_EQ(by_bytes.evictions(), 2u);
  // Dropped by the cache while held: the holder's bytes stay mapped.
  MapOf(by_bytes, dir.path() / "3");
  MapOf(by_bytes, dir.path() / "4");
  EXPECT_EQ(by_bytes.evictions(), 3u);
  EXPECT_NE(MapOf(by_bytes, dir.path() / "0"), held);
  EXPECT_EQ(held->bytes()[4095], std::byte{0});

  // Room for two mappings, whatever their size.
  MappingCache by_count(1 << 30, 2);
  for (int k = 0; k < 5; ++k) MapOf(by_count, dir.path() / std::to_string(k));
  EXPECT_EQ(by_count.kept_maps(), 2u);
  EXPECT_EQ(by_count.evictions(), 3u);
}

TEST(MappingCache, AFileLargerThanTheWholeLimitIsMappedButNotKeptAndEvictsNothing) {
  testing::TempDir dir;
  testing::WriteFile(dir.path() / "small", Bytes(4096, 1));
  testing::WriteFile(dir.path() / "big", Bytes(4 * 4096, 2));
  MappingCache cache(2 * 4096, 100);
  MapOf(cache, dir.path() / "small");
  auto big = MapOf(cache, dir.path() / "big");
  ExpectBytes(big, 4 * 4096, 2);
  ExpectKept(cache, 1, 4096);
  EXPECT_EQ(cache.evictions(), 0u);
  EXPECT_NE(MapOf(cache, dir.path() / "big"), big);
}

TEST(MappingCache, AnEmptyFileIsAnEmptyMapping) {
  testing::TempDir dir;
  testing::WriteFile(dir.path() / "empty", {});
  MappingCache cache(1 << 30, 100);
  auto m = MapOf(cache, dir.path() / "empty");
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(m->bytes().empty());
}

TEST(MappingCache, ForMachineHasRoomForADataset) {
  auto cache = MappingCache::ForMachine();
  testing::TempDir dir;
  for (int k = 0; k < 64; ++k) {
    testing::WriteFile(dir.path() / std::to_string(k), Bytes(65536, uint8_t(k)));
  }
  for (int k = 0; k < 64; ++k) MapOf(*cache, dir.path() / std::to_string(k));
  EXPECT_EQ(cache->kept_maps(), 64u);
  EXPECT_EQ(cache->evictions(), 0u);
}

// Bytes of address space the process has mapped (VmSize).
uint64_t AddressSpaceBytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;  // kB
  }
  return 0;
}

// In a child process: keeps 8 files of 1 MiB mapped, lowers RLIMIT_AS to
// less than one more, then maps a ninth; exits 0 when it got its bytes and
// the cache dropped 4 of the 8 (half, least recently used first).
[[noreturn]] void MapPastTheAddressSpaceLimit(const fs::path& dir) {
  constexpr size_t kMiB = 1 << 20;
  MappingCache cache(1ull << 40, 1000);
  for (int k = 0; k < 8; ++k) MapOf(cache, dir / std::to_string(k));
  const struct rlimit limit = {AddressSpaceBytes() + kMiB / 2, RLIM_INFINITY};
  if (setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(2);
  Opened f(dir / "8");
  auto m = cache.Get(f.fd, f.path, f.id);
  const bool good = m.ok() && (*m)->bytes().size() == kMiB &&
                    (*m)->bytes()[kMiB - 1] == std::byte{8} && cache.kept_maps() == 5 &&
                    cache.evictions() == 4;
  std::_Exit(good ? 0 : 1);
}

// When the kernel refuses a mapping (here: the address space limit reached;
// on a node, vm.max_map_count), half of the kept mappings go and the new one
// is made: a reader gets its bytes, not ENOMEM.
TEST(MappingCache, AMappingRefusedForWantOfRoomDropsHalfTheKeptOnesAndSucceeds) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' shadow memory does not live within RLIMIT_AS";
#endif
  testing::TempDir dir;
  constexpr size_t kMiB = 1 << 20;
  for (int k = 0; k < 9; ++k) {
    testing::WriteFile(dir.path() / std::to_string(k), Bytes(kMiB, uint8_t(k)));
  }
  EXPECT_EXIT(MapPastTheAddressSpaceLimit(dir.path()), ::testing::ExitedWithCode(0), "");
}

// Through the store's API: a reader opened for a shard read again maps the
// bytes the last reader mapped, and a Put over the object is seen.
TEST(PosixStoreMappings, ReadersOfTheSameObjectShareOneMappingUntilItIsReplaced) {
  testing::TempDir dir;
  auto store = OpenStore(dir.path().string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->Put("k", Bytes(20000, 5)).ok());
  const std::byte* first = nullptr;
  {
    auto r = (*store)->OpenReader("k");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    auto m = (*r)->Map();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    first = m->data();
  }
  {
    auto r = (*store)->OpenReader("k");
    ASSERT_TRUE(r.ok());
    auto m = (*r)->Map();
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->data(), first);
  }
  ASSERT_TRUE((*store)->Put("k", Bytes(30000, 6)).ok());
  auto r = (*store)->OpenReader("k");
  ASSERT_TRUE(r.ok());
  auto m = (*r)->Map();
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 30000u);
  EXPECT_EQ((*m)[29999], std::byte{6});
}

// StoreOptions::keep_mapped_bytes below an object's size: each reader maps
// it for itself (two readers open at once see two mappings).
TEST(PosixStoreMappings, ALimitBelowAnObjectKeepsNoneOfIt) {
  testing::TempDir dir;
  StoreOptions o;
  o.keep_mapped_bytes = 1000;
  auto store = OpenStore(dir.path().string(), o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->Put("k", Bytes(20000, 5)).ok());
  auto one = (*store)->OpenReader("k");
  auto two = (*store)->OpenReader("k");
  ASSERT_TRUE(one.ok() && two.ok());
  auto a = (*one)->Map();
  auto b = (*two)->Map();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->data(), b->data());
  EXPECT_EQ((*b)[19999], std::byte{5});
}

}  // namespace
}  // namespace stoker
