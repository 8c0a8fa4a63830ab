// Loads from a mapped file that shrank: an error where stoker guards them,
// the usual SIGBUS everywhere else (core/mapped_guard.h).
#include "core/mapped_guard.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <thread>
#include <vector>

#include "core/file_mapping.h"
#include "testutil.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

// A file of `pages` pages, mapped whole, then cut to its first page: loads
// past the first page fault with SIGBUS.
struct ShrunkMapping {
  testing::TempDir dir;
  int fd = -1;
  internal::FileMapping mapping;
  std::span<const std::byte> bytes;

  explicit ShrunkMapping(size_t pages) {
    const fs::path path = dir.path() / "f";
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    testing::WriteFile(path, std::vector<std::byte>(pages * page, std::byte{7}));
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    auto m = mapping.Get(fd, path.string());
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    bytes = *m;
    fs::resize_file(path, page);
  }
  ~ShrunkMapping() { close(fd); }
  const std::byte* Page(size_t k) const { return bytes.data() + k * size_t(sysconf(_SC_PAGESIZE)); }
};

uint64_t Sum(const std::byte* p, size_t n) {
  uint64_t s = 0;
  for (size_t i = 0; i < n; ++i) s += uint64_t(static_cast<const volatile std::byte*>(p)[i]);
  return s;
}

TEST(MappedGuard, LoadsPastTheNewEndAreAnErrorAgainAndAgainOnEveryThread) {
  ShrunkMapping m(4);
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  std::vector<std::thread> threads;
  std::atomic<int> caught{0}, whole{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < 50; ++k) {
        uint64_t sum = 0;
        // The first page is still there.
        if (GuardedLoads(m.bytes.data(), m.bytes.size(), [&] { sum = Sum(m.Page(0), page); })) {
          if (sum == 7 * page) whole++;
        }
        // The rest is not: the guard catches the fault, every time.
        if (!GuardedLoads(m.bytes.data(), m.bytes.size(), [&] { sum = Sum(m.Page(2), page); })) {
          caught++;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(whole.load(), 200);
  EXPECT_EQ(caught.load(), 200);
}

// Death tests run in a child of their own: each installs what it needs.
class MappedGuardDeath : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// The death tests start from the default action for SIGBUS, whatever was
// there before (a sanitizer installs a handler of its own, which reports and
// exits), then put the guard in front of it.
void FromTheDefaultAction() {
  signal(SIGBUS, SIG_DFL);
  EnsureMappedGuard();
}

void FaultOutsideTheGuardedRange() {
  FromTheDefaultAction();
  ShrunkMapping guarded(2);
  ShrunkMapping other(2);
  (void)GuardedLoads(guarded.bytes.data(), guarded.bytes.size(),
                     [&] { (void)Sum(other.Page(1), 64); });
}

void UnguardedFault() {
  FromTheDefaultAction();
  ShrunkMapping m(2);
  (void)Sum(m.Page(1), 64);
}

void ExitWith42(int) { _exit(42); }
void ExitWith43(int) { _exit(43); }

// The guarded fault is caught (else exit 1), then an unguarded one.
void GuardedThenUnguardedFault(const ShrunkMapping& m) {
  if (GuardedLoads(m.bytes.data(), m.bytes.size(), [&] { (void)Sum(m.Page(1), 64); })) _exit(1);
  (void)Sum(m.Page(1), 64);
}

void HandlerBefore() {
  signal(SIGBUS, ExitWith42);
  ShrunkMapping m(2);
  EnsureMappedGuard();
  GuardedThenUnguardedFault(m);
}

void HandlerInstalledLater() {
  FromTheDefaultAction();
  ShrunkMapping m(2);
  signal(SIGBUS, ExitWith43);  // an application's, in front of ours
  EnsureMappedGuard();         // the loader's, once per shard
  GuardedThenUnguardedFault(m);
}

TEST_F(MappedGuardDeath, AFaultOutsideTheGuardedRangeStillKills) {
  EXPECT_EXIT(FaultOutsideTheGuardedRange(), ::testing::KilledBySignal(SIGBUS), "");
}

TEST_F(MappedGuardDeath, AnUnguardedFaultKillsAsWithoutTheGuard) {
  EXPECT_EXIT(UnguardedFault(), ::testing::KilledBySignal(SIGBUS), "");
}

TEST_F(MappedGuardDeath, AnUnguardedFaultGoesToTheHandlerThatWasThereBefore) {
  EXPECT_EXIT(HandlerBefore(), ::testing::ExitedWithCode(42), "");
}

TEST_F(MappedGuardDeath, AHandlerInstalledLaterIsForwardedToAndTheGuardStillWorks) {
  EXPECT_EXIT(HandlerInstalledLater(), ::testing::ExitedWithCode(43), "");
}

}  // namespace
}  // namespace stoker
