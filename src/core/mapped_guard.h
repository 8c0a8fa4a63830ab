// Loads from a file mapping that survive the file shrinking (internal).
//
// A load from a page of a mapped file that no longer has bytes behind it (the
// file was truncated after it was mapped) or whose bytes cannot be read (a
// disk error) raises SIGBUS, which kills the process. GuardedLoads runs the
// loads with a SIGBUS handler armed for this thread and that range only: a
// fault there returns false instead, and the caller reports an error naming
// the object. A SIGBUS anywhere else goes on to the handler that was there
// before (Python's faulthandler, say) or to the default action.
//
// `fn` must be plain loads and stores: no locks, no allocation, no objects
// with destructors of its own, since a fault leaves it part way (siglongjmp).
// Not reentrant on one thread. The handler is installed on first use; one
// installed later in front of it (a SIGBUS handler of the application) is
// noticed by EnsureMappedGuard, which puts it back in front and forwards to
// the newcomer: call that before a series of GuardedLoads (once per mapping).
#pragma once

#include <cstddef>

namespace stoker {

void EnsureMappedGuard();

template <typename Fn>
bool GuardedLoads(const std::byte* begin, size_t length, Fn&& fn);

namespace mapped_guard_internal {
bool Run(const std::byte* begin, size_t length, void (*call)(void*), void* fn);
}  // namespace mapped_guard_internal

template <typename Fn>
bool GuardedLoads(const std::byte* begin, size_t length, Fn&& fn) {
  return mapped_guard_internal::Run(
      begin, length, [](void* f) { (*static_cast<Fn*>(f))(); }, &fn);
}

}  // namespace stoker
