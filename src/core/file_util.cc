#include "core/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace stoker::internal {

Status ReadWholeFile(const std::string& path, std::vector<std::byte>* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open " + path);
  Status st;
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    st = ErrnoToStatus(errno, "stat " + path);
  } else if (!S_ISREG(info.st_mode)) {
    st = InvalidArgument(path + ": not a regular file");
  } else {
    out->resize(static_cast<size_t>(info.st_size));
    size_t got = 0;
    while (got < out->size()) {
      const ssize_t n = ::read(fd, out->data() + got, out->size() - got);
      if (n < 0) {
        if (errno == EINTR) continue;
        st = ErrnoToStatus(errno, "read " + path);
        break;
      }
      if (n == 0) break;  // shrank while we read: keep what is there
      got += static_cast<size_t>(n);
    }
    out->resize(got);
  }
  ::close(fd);
  return st;
}

std::vector<std::string_view> SplitPath(std::string_view key) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('/', start);
    if (end == std::string_view::npos) end = key.size();
    parts.push_back(key.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

}  // namespace stoker::internal
