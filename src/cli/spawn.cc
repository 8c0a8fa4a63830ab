// SpawnSelf (cli.h): this program again, as a child on pipes.
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "cli/cli.h"

namespace stoker::cli {

Result<SelfChild> SpawnSelf(std::vector<std::string> argv) {
  int out[2], in[2];
  if (pipe(out) != 0) return ErrnoToStatus(errno, "pipe");
  if (pipe(in) != 0) {
    const int err = errno;
    close(out[0]);
    close(out[1]);
    return ErrnoToStatus(err, "pipe");
  }
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    for (int fd : {out[0], out[1], in[0], in[1]}) close(fd);
    return ErrnoToStatus(err, "fork");
  }
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    for (int fd : {out[0], out[1], in[0], in[1]}) close(fd);
    std::vector<char*> args;
    for (auto& s : argv) args.push_back(s.data());
    args.push_back(nullptr);
    execv("/proc/self/exe", args.data());
    std::perror("stoker: exec /proc/self/exe");
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  return SelfChild{pid, in[1], out[0]};
}

}  // namespace stoker::cli
