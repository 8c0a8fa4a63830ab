// Retry as a store decorator: reads that fail with a retryable error
// (Status::retryable(): a timeout, an unavailable OSD) are tried again with
// exponential backoff, within a deadline, so that callers (the loader) hold
// no retry loops of their own.
//
// What is retried: Read and ReadAll, each request of a ReadQueue (resubmitted
// by the queue itself: the caller sees one completion per request, after the
// last attempt), OpenReader and every ReadV of the readers it returns; and,
// when the writer says so (RetryOptions::writes), Put, whatever its
// WriteOptions. Sync, Stat, List, Remove and RemoveFolder pass through
// unchanged. A retryable error that remains after retries says how many
// attempts were made ("(after 4 attempts)").
//
// A retried Put with an observer shows it each byte once, in order, over
// all attempts (a later attempt shows only what the earlier ones did not
// reach), so a checksum taken as the bytes are written stays right. A
// retried if_absent Put may fail with AlreadyExists when an earlier attempt
// did create the object before its error: the creator tells that case by
// the object's contents.
//
// Thread safety: as the wrapped store. A ReadQueue from it is used by one
// thread, as any ReadQueue; its ObjectReaders by any number at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "stoker/store.h"

namespace stoker {

struct RetryOptions {
  // Attempts after the first one. Default: 3.
  uint32_t max_retries = 3;
  // Backoff before retry k (1, 2, ...) is first_backoff * 2^(k-1), at most
  // max_backoff. Default: 50 ms (a restarting OSD needs a moment), at most 3.2 s.
  std::chrono::milliseconds first_backoff{50};
  std::chrono::milliseconds max_backoff{3200};
  // No retry starts later than this after the first attempt: the caller's
  // deadline for the read (retries included). Default: 60 s.
  std::chrono::milliseconds deadline{60000};
  // Retry the writes listed above too. Off by default: whether a write may
  // be repeated is the writer's decision (a checkpoint's may: each object
  // is written whole, with the same bytes, and created objects carry who
  // created them). Default: off.
  bool writes = false;
  // Optional: incremented (relaxed) once per retry, for the caller's stats.
  // Must outlive the store and everything it returned.
  std::atomic<uint64_t>* retries = nullptr;
};

class RetryingStore final : public StoreWrapper {
 public:
  RetryingStore(std::shared_ptr<Store> target, RetryOptions options)
      : StoreWrapper(std::move(target)), options_(options) {}

  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& o) override;
  Result<size_t> Read(std::string_view key, uint64_t offset, std::span<std::byte> dst) override;
  Result<std::vector<std::byte>> ReadAll(std::string_view key) override;
  Result<std::unique_ptr<ObjectReader>> OpenReader(std::string_view key) override;
  using StoreWrapper::Put;
  Status Put(std::string_view key, std::span<const std::byte> data,
             const WriteOptions& options) override;
  StoreDescription Describe() const override { return DescribeWithLayer("retry"); }
  // Retrying changes neither where bytes come from nor what a read costs.

  const RetryOptions& options() const { return options_; }

 private:
  const RetryOptions options_;
};

}  // namespace stoker
