// Small file helpers shared by modules (internal).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "stoker/status.h"

namespace stoker::internal {

// Reads a whole regular file into `out` with open + fstat + read + close
// (what Python's open(path, "rb").read() does). A file that shrinks while
// read keeps what was there. Errors name the call and the path; a
// non-regular file is InvalidArgument.
Status ReadWholeFile(const std::string& path, std::vector<std::byte>* out);

}  // namespace stoker::internal
