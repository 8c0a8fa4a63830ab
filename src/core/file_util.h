// Small file helpers shared by modules (internal).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::internal {

// Reads a whole regular file into `out` with open + fstat + read + close
// (what Python's open(path, "rb").read() does). A file that shrinks while
// read keeps what was there. Errors name the call and the path; a
// non-regular file is InvalidArgument.
Status ReadWholeFile(const std::string& path, std::vector<std::byte>* out);

// The '/'-separated components of `key`, empty ones included ("a//b" gives
// "a", "", "b"), for the checks of object keys and names.
std::vector<std::string_view> SplitPath(std::string_view key);

}  // namespace stoker::internal
