// Private to the store module: what store.cc needs from the backends, and the
// small helpers every backend shares so that they agree on keys and messages.
#pragma once

#include <memory>
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

// The end of every backend's ReadQueue::Wait, written once: `n`
// completions were moved out (MoveCompletions); counts them off
// `*outstanding` and returns n, or TimedOut naming `queue` when fewer than
// `min` arrived by the deadline (those that did are in the caller's `out`).
Result<size_t> EndWait(size_t n, size_t min, size_t* outstanding, std::string_view queue);

// Moves every completion of `ready` to the end of `out`; returns how many.
size_t MoveCompletions(std::vector<ReadCompletion>& ready, std::vector<ReadCompletion>* out);

// The process-wide memory store called `name` (mem://NAME); created on first
// use and kept for the life of the process.
std::shared_ptr<Store> OpenNamedMemoryStore(std::string_view name);

// NewPosixStore, remembering the URI the caller used (file:///x or a path).
Result<std::shared_ptr<Store>> NewPosixStoreForUri(std::string root, std::string uri,
                                                   const StoreOptions& options);

}  // namespace stoker::store_internal
