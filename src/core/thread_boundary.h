// Where work crosses into a thread of stoker's own (internal): a worker's
// body runs under CatchAsStatus, so that an exception it did not expect (a
// std::bad_alloc from a container, a bug's std::logic_error) comes out as a
// Status like every other error, instead of std::terminate ending the
// process. The parts' own allocations already return NoSpace
// (core/aligned_memory.h); this is the net under everything else.
//
// Thread safety: pure functions.
#pragma once

#include <string_view>
#include <utility>

#include "stoker/status.h"

namespace stoker::internal {

// The Status of the exception being handled (call it in a catch block):
// std::bad_alloc is NoSpace, any other std::exception Internal with its
// what(), anything else Internal; each message starts with `part`, the
// thread that caught it ("loader assembly worker").
Status CurrentExceptionStatus(std::string_view part);

// fn(), or the Status of what it threw. fn returns a Status or a Result<T>.
template <typename F>
auto CatchAsStatus(std::string_view part, F&& fn) -> decltype(std::forward<F>(fn)()) {
  try {
    return std::forward<F>(fn)();
  } catch (...) {
    return CurrentExceptionStatus(part);
  }
}

}  // namespace stoker::internal
