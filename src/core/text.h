// Text for people (internal): what messages, tables and reports share.
#pragma once

#include <string>

namespace stoker::internal {

// A byte count with a binary unit, one decimal past bytes ("512 B",
// "3.2 GiB"), up to TiB.
std::string HumanBytes(double bytes);

}  // namespace stoker::internal
