// Small helpers the checkpointer's parts share (internal): a parallel loop
// over indices and the names that messages about a chunk give.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "stoker/checkpoint.h"

namespace stoker::ckpt {

// The number of workers ParallelFor uses for `n` items and `threads`.
size_t Workers(size_t n, uint32_t threads);

// Runs fn(i, worker) for i in 0..n-1 on Workers(n, threads) threads (worker
// in 0..Workers-1, for per-worker scratch); the first error stops the others
// from taking new indices and is returned. An exception fn throws is its
// item's error (core/thread_boundary.h: std::bad_alloc is NoSpace).
Status ParallelFor(size_t n, uint32_t threads, const std::function<Status(size_t, size_t)>& fn);

// "a, b, c, and 5 more".
std::string JoinNames(const std::vector<std::string>& v, size_t max = 8);

// Names of the tensors of `part` that overlap [offset, offset + bytes) of its
// stream: what a message about a chunk names.
std::vector<std::string> TensorsIn(const RankPart& part, uint64_t offset, uint64_t bytes);

// " (rank R, tensors a, b)" for a chunk's messages.
std::string ChunkContext(const RankPart& part, const ChunkInfo& chunk);

}  // namespace stoker::ckpt

namespace stoker::ckpt {

// `store` with the checkpoint's write retries (CheckpointerOptions::
// write_retries and retry_backoff): a RetryingStore that retries writes and
// reads whose error is retryable, `retries` times, waiting `backoff` and
// doubling it each time, with no deadline beyond that. The chunk writer and
// the catalog write through it; a sync is not retried (Store::Sync).
std::shared_ptr<Store> WithWriteRetries(std::shared_ptr<Store> store, uint32_t retries,
                                        std::chrono::milliseconds backoff);

}  // namespace stoker::ckpt
