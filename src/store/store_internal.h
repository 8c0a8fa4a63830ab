// Private to the store module: what store.cc needs from the backends, and the
// small helpers every backend shares so that they agree on keys and messages.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker::store_internal {

// `key` in double quotes with non-printable bytes as \xNN, for messages (a
// key that failed validation may hold anything, NUL included).
std::string Quote(std::string_view key);

// A List prefix needs no full key, but every complete component in it (all
// before the last '/') must be valid, so that no prefix reaches outside the
// store. InvalidArgument otherwise.
Status ValidatePrefix(std::string_view prefix);

// A folder for Store::RemoveFolder: a valid key followed by '/'.
// InvalidArgument otherwise.
Status ValidateFolder(std::string_view folder);

// What every NewReadQueue checks of its options, the backends' and the
// decorators' that make queues of their own (the node cache): a depth of at
// least 1. InvalidArgument otherwise.
Status ValidateQueueOptions(const ReadQueueOptions& options);

// The end of every backend's ReadQueue::Wait, written once: `n`
// completions were moved out (MoveCompletions); counts them off
// `*outstanding` and returns n, or TimedOut naming `queue` when fewer than
// `min` arrived by the deadline (those that did are in the caller's `out`).
Result<size_t> EndWait(size_t n, size_t min, size_t* outstanding, std::string_view queue);

// A whole ReadQueue::Wait over a completion core that takes (moves into
// `out`) at least `min` completions or what arrived by the deadline:
// `core.Take(min, deadline, out)` returns how many it moved. The thread
// pool's and RADOS's queues.
template <typename Core>
Result<size_t> WaitOn(Core& core, size_t min_completions, Deadline deadline,
                      std::vector<ReadCompletion>* out, size_t* outstanding,
                      std::string_view queue) {
  if (out == nullptr) return InvalidArgument("ReadQueue::Wait: out is null");
  const size_t min = std::min(min_completions, *outstanding);
  return EndWait(core.Take(min, deadline, out), min, outstanding, queue);
}

// Moves every completion of `ready` to the end of `out`; returns how many.
size_t MoveCompletions(std::vector<ReadCompletion>& ready, std::vector<ReadCompletion>* out);

// Waits on `cv`, with `lock` held, until `ready` (guarded by the lock) holds
// `min` completions or the deadline passes; then moves every ready one into
// `out` (MoveCompletions). The Take of the thread pool's and RADOS's cores.
size_t TakeReady(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                 std::vector<ReadCompletion>& ready, size_t min, Deadline deadline,
                 std::vector<ReadCompletion>* out);

// The process-wide memory store called `name` (mem://NAME); created on first
// use and kept for the life of the process.
std::shared_ptr<Store> OpenNamedMemoryStore(std::string_view name);

// NewPosixStore, remembering the URI the caller used (file:///x or a path).
Result<std::shared_ptr<Store>> NewPosixStoreForUri(std::string root, std::string uri,
                                                   const StoreOptions& options);

}  // namespace stoker::store_internal
