#include "testutil.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/magic.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace stoker::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/stoker-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ec);
  std::filesystem::remove_all(path_, ec);
}

std::vector<std::byte> RandomBytes(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  uint64_t x = seed;
  for (size_t i = 0; i < n; i += 8) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    for (size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = std::byte((z >> (8 * j)) & 0xff);
  }
  return out;
}

void WriteFile(const std::filesystem::path& path, const std::vector<std::byte>& data) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
  if (!f) throw std::runtime_error("write failed: " + path.string());
}

long ResidentPages(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size == 0) {
    ::close(fd);
    return st.st_size == 0 ? 0 : -1;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return -1;
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> vec((size + page - 1) / page);
  long resident = -1;
  if (::mincore(p, size, vec.data()) == 0) {
    resident = 0;
    for (unsigned char v : vec) resident += v & 1;
  }
  ::munmap(p, size);
  return resident;
}

std::string PageCacheBypassUnavailable(const std::filesystem::path& path) {
  struct statfs fs;
  if (::statfs(path.c_str(), &fs) != 0)
    return "statfs " + path.string() + ": " + std::strerror(errno);
  if (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC) {
    return path.string() + " is on a memory file system (tmpfs/ramfs): no page cache to bypass";
  }
  return "";
}

std::vector<std::byte> ReadFile(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("open failed: " + path.string());
  std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = std::byte(raw[i]);
  return out;
}

std::string RunUnprivileged(const std::function<std::string()>& body) {
  if (::geteuid() != 0) return body();
  int fds[2];
  if (::pipe(fds) != 0) return std::string("pipe: ") + std::strerror(errno);
  const pid_t pid = ::fork();
  if (pid < 0) return std::string("fork: ") + std::strerror(errno);
  if (pid == 0) {
    ::close(fds[0]);
    constexpr uid_t kNobody = 65534;
    std::string verdict;
    if (::setgroups(0, nullptr) != 0 || ::setresgid(kNobody, kNobody, kNobody) != 0 ||
        ::setresuid(kNobody, kNobody, kNobody) != 0) {
      verdict = std::string("dropping to uid 65534: ") + std::strerror(errno);
    } else if (::geteuid() == 0) {
      verdict = "still root after setresuid";
    } else {
      try {
        verdict = body();
      } catch (const std::exception& e) {
        verdict = std::string("exception: ") + e.what();
      }
    }
    size_t done = 0;
    while (done < verdict.size()) {
      const ssize_t n = ::write(fds[1], verdict.data() + done, verdict.size() - done);
      if (n <= 0) break;
      done += size_t(n);
    }
    ::_exit(verdict.empty() ? 0 : 1);
  }
  ::close(fds[1]);
  std::string verdict;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    verdict.append(buf, size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    return "the unprivileged child died of signal " + std::to_string(WTERMSIG(status)) + " " +
           verdict;
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && verdict.empty()) {
    return "the unprivileged child exited " + std::to_string(WEXITSTATUS(status));
  }
  return verdict;
}

void OpenPathForOthers(const std::filesystem::path& path) {
  for (auto p = std::filesystem::absolute(path); p.has_relative_path(); p = p.parent_path()) {
    struct stat st {};
    if (::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      ::chmod(p.c_str(), st.st_mode | S_IXOTH);
  }
}

namespace {

// Runs a command line through the shell; "" or what it printed and its exit
// status.
std::string Shell(const std::string& cmd) {
  const std::string full = cmd + " 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  if (p == nullptr) return "popen: " + std::string(std::strerror(errno));
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = ::pclose(p);
  if (status == 0) return "";
  return "`" + cmd + "` failed (status " + std::to_string(status) + "): " + out;
}

// The ioctl and flag of linux/ext4.h's EXT4_IOC_SHUTDOWN (not in the uapi
// headers of every distribution): _IOR('X', 125, __u32), and
// EXT4_GOING_FLAGS_NOLOGFLUSH: stop at once, without committing the journal.
constexpr unsigned long kExt4IocShutdown = 0x8004587d;
constexpr uint32_t kExt4GoingFlagsNoLogFlush = 2;

}  // namespace

std::string PowerCutDisk::Unavailable() {
  if (::geteuid() != 0) return "mounting a loop device needs root";
  if (std::string why = Shell("command -v mkfs.ext4 && command -v mount && command -v flock");
      !why.empty()) {
    return "mkfs.ext4, mount or flock is missing (packages e2fsprogs, mount, util-linux): " + why;
  }
  if (::access("/dev/loop-control", R_OK | W_OK) != 0) {
    return "no /dev/loop-control (no loop device support here): " +
           std::string(std::strerror(errno));
  }
  return "";
}

PowerCutDisk::PowerCutDisk(uint64_t bytes)
    : image_(dir_.path() / "disk.img"), mount_(dir_.path() / "mnt") {
  std::filesystem::create_directories(mount_);
  // A sparse image: only what the file system writes takes space.
  const int fd = ::open(image_.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("making the image " + image_.string() + ": " + why);
  }
  ::close(fd);
  if (std::string e = Shell("mkfs.ext4 -q -F -E nodiscard '" + image_.string() + "'"); !e.empty()) {
    throw std::runtime_error(e);
  }
  Remount();
}

PowerCutDisk::~PowerCutDisk() {
  // A lazy unmount if a file is still open: never leave it mounted under
  // the folder TempDir removes.
  if (mounted_ && !Shell("umount '" + mount_.string() + "'").empty()) {
    (void)Shell("umount -l '" + mount_.string() + "'");
  }
}

std::string PowerCutDisk::Cut() {
  const int fd = ::open(mount_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return "open " + mount_.string() + ": " + std::strerror(errno);
  uint32_t flags = kExt4GoingFlagsNoLogFlush;
  const int rc = ::ioctl(fd, kExt4IocShutdown, &flags);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return "EXT4_IOC_SHUTDOWN on " + mount_.string() + ": " + std::strerror(err);
  return "";
}

void PowerCutDisk::Remount() {
  if (mounted_) {
    if (std::string e = Shell("umount '" + mount_.string() + "'"); !e.empty()) {
      throw std::runtime_error(e);
    }
    mounted_ = false;
  }
  // mount -o loop attaches a free loop device and detaches it at umount;
  // flock keeps two tests (ctest -j) from racing for the same free device.
  if (std::string e = Shell("flock /tmp/stoker-test-loop.lock mount -t ext4 -o loop,commit=600 '" +
                            image_.string() + "' '" + mount_.string() + "'");
      !e.empty()) {
    throw std::runtime_error(e);
  }
  mounted_ = true;
}

}  // namespace stoker::testing
