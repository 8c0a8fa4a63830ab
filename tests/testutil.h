// Helpers shared by the test suites: a temporary folder removed on exit,
// deterministic random bytes, and a small packed dataset maker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "stoker/status.h"

// Asserts that a Status is OK, printing it otherwise.
#define ASSERT_OK(expr)                                     \
  do {                                                      \
    const ::stoker::Status _s = (expr);                     \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s.ToString(); \
  } while (0)

namespace stoker::testing {

// A fresh folder under $TMPDIR (or /tmp), removed with everything in it when
// the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// `n` pseudo-random bytes determined by `seed` (splitmix64).
std::vector<std::byte> RandomBytes(size_t n, uint64_t seed);

// Writes `data` to `path`, creating parent folders.
void WriteFile(const std::filesystem::path& path, const std::vector<std::byte>& data);
std::vector<std::byte> ReadFile(const std::filesystem::path& path);

// How many of the 4 KiB pages of the file at `path` are in the page cache
// (mincore), or -1 if it cannot be told (the file cannot be opened or mapped).
long ResidentPages(const std::filesystem::path& path);

// Whether files under `path` can be written and read past the page cache: a
// disk file system, not tmpfs or another memory-backed one. "" if so, else why.
std::string PageCacheBypassUnavailable(const std::filesystem::path& path);

// Runs `body` in a forked child that has dropped to the unprivileged user
// nobody (uid/gid 65534, no supplementary groups) when the test runs as root,
// so that file permissions bind it as they bind a user; as a non-root user
// the child just runs it. `body` returns "" on success or what went wrong.
// Returns the child's verdict: "" or the failure (also when the child could
// not drop its privileges or died). The child starts with only the calling
// thread: `body` must open its own stores.
std::string RunUnprivileged(const std::function<std::string()>& body);

// Lets the unprivileged user of RunUnprivileged reach `path`: every folder
// from `path` up to (not including) `/` gets o+x.
void OpenPathForOthers(const std::filesystem::path& path);

// A small ext4 file system in an image file, mounted through a loop device
// under a TempDir, that can lose power: Cut() shuts it down the way
// xfstests' godown does (EXT4_IOC_SHUTDOWN without a journal flush), so that
// every write not yet made durable (no fsync, syncfs or journal commit
// covering it) is lost, as in a power cut; Remount() then mounts it again
// (replaying the journal) as a machine does after the restart. Mounted with
// a journal commit interval of 10 minutes, so that nothing becomes durable
// by the timer during a test: only what the code under test syncs. Needs root,
// mkfs.ext4 and a loop device: Unavailable() says why not, where not. The
// constructor and Remount() throw std::runtime_error if mounting fails.
// Not thread-safe.
class PowerCutDisk {
 public:
  // Why a PowerCutDisk cannot be made here, or "".
  static std::string Unavailable();
  explicit PowerCutDisk(uint64_t bytes = 1ull << 30);
  ~PowerCutDisk();
  PowerCutDisk(const PowerCutDisk&) = delete;
  PowerCutDisk& operator=(const PowerCutDisk&) = delete;
  // The mount point.
  const std::filesystem::path& path() const { return mount_; }
  std::string str() const { return mount_.string(); }
  // The power cut: from here on every call on the file system fails (EIO)
  // and what was not durable is gone. Returns "" or why it failed.
  std::string Cut();
  // Unmounts and mounts again. Every file on it must be closed first.
  void Remount();

 private:
  TempDir dir_;
  std::filesystem::path image_, mount_;
  bool mounted_ = false;
};

}  // namespace stoker::testing
