#include "cache/shard_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace stoker::cache_internal {

std::string ShardFiles::Path(uint32_t s) const {
  char name[32];
  std::snprintf(name, sizeof(name), "/%08u.stks", s);
  return dir_ + name;
}

std::string ShardFiles::TmpPath(uint32_t s, uint32_t pid) const {
  return dir_ + "/.tmp-" + std::to_string(s) + "-" + std::to_string(pid);
}

Status ShardFiles::Write(uint32_t s, std::span<const std::byte> data) const {
  const std::string tmp = TmpPath(s, uint32_t(getpid()));
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "create " + tmp);
  uint64_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      close(fd);
      unlink(tmp.c_str());
      return ErrnoToStatus(err, "write " + tmp);
    }
    done += uint64_t(n);
  }
  // No fsync: a cache file lost or cut short by a power cut fails its check
  // on the next hit and is fetched again.
  close(fd);
  if (rename(tmp.c_str(), Path(s).c_str()) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return ErrnoToStatus(err, "rename " + tmp);
  }
  return Status::Ok();
}

bool ShardFiles::ReadAll(int fd, std::span<std::byte> dst) {
  uint64_t done = 0;
  while (done < dst.size()) {
    const ssize_t n = pread(fd, dst.data() + done, dst.size() - done, off_t(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += uint64_t(n);
  }
  return true;
}

Status ShardFiles::Probe() const {
  const std::string probe = dir_ + "/.probe-" + std::to_string(getpid());
  int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "create " + probe);
  const char byte = 0;
  const bool wrote = write(fd, &byte, 1) == 1;
  const int err = errno;
  close(fd);
  unlink(probe.c_str());
  if (!wrote) return ErrnoToStatus(err, "write " + probe);
  return Status::Ok();
}

Status ShardFiles::RemoveOrphans(const std::function<bool(uint32_t)>& orphan) const {
  DIR* d = opendir(dir_.c_str());
  if (!d) return ErrnoToStatus(errno, "list " + dir_);
  while (dirent* e = readdir(d)) {
    unsigned s;
    int pid;
    if (std::sscanf(e->d_name, ".order-%d-%u", &pid, &s) == 2) {
      // A need order being written (shared_orders.h) by a process now gone.
      if (pid != getpid() && kill(pid, 0) != 0 && errno == ESRCH) {
        unlink((dir_ + "/" + e->d_name).c_str());
      }
      continue;
    }
    if (std::sscanf(e->d_name, ".tmp-%u-%d", &s, &pid) != 2) continue;
    if (orphan(s)) unlink((dir_ + "/" + e->d_name).c_str());
  }
  closedir(d);
  return Status::Ok();
}

}  // namespace stoker::cache_internal
