// Private to the doctor module: running a command with a time limit and
// capturing what it prints (the `ceph` CLI for tune ceph).
//
// Thread safety: reentrant.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "stoker/status.h"

namespace stoker::doctor {

struct ProcessResult {
  int exit_code = 0;  // 128 + signal when killed
  std::string out, err;
};

// Runs argv[0] (found on PATH) with stdin from /dev/null. NotFound when it
// cannot be started; TimedOut (it is killed) past `timeout`.
Result<ProcessResult> RunProcess(const std::vector<std::string>& argv,
                                 std::chrono::milliseconds timeout);

}  // namespace stoker::doctor
