#include "loader/shard_source.h"

#include <algorithm>
#include <cstring>

#include "core/thread_boundary.h"

namespace stoker {

using format::ShardView;

ShardSource::ShardSource(ShardSourceConfig config, const Schedule& schedule)
    : config_(std::move(config)),
      schedule_(schedule),
      state_(schedule.uses.size()),
      batches_left_(new std::atomic<uint32_t>[schedule.uses.size()]) {
  for (size_t u = 0; u < state_.size(); ++u) batches_left_[u] = schedule_.uses[u].batches;
  slots_free_ = config_.slots;
}

void ShardSource::Start() {
  thread_ = std::thread([this] {
    // What the loop does not expect fails the epoch's reads, not the process.
    Status st = internal::CatchAsStatus("loader shard reader", [this] {
      config_.sample_reads ? IndexLoop() : ReaderLoop();
      return Status::Ok();
    });
    if (!st.ok()) FailAll(st);
  });
}

void ShardSource::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status ShardSource::WaitForBatch(uint64_t b, bool* stopped) {
  const UseRange uses = schedule_.BatchUses(b);
  std::unique_lock lock(mu_);
  // A use not started yet has no state: it is pending, or failed with
  // FailAll's error.
  cv_.wait(lock, [&] {
    if (stop_) return true;
    for (uint32_t u : uses) {
      const UseState* s = state_[u].get();
      if (s == nullptr ? failed_all_.ok()
                       : s->state != State::kReady && s->state != State::kFailed) {
        return false;
      }
    }
    return true;
  });
  *stopped = stop_;
  if (stop_) return Cancelled("the epoch was stopped");
  for (uint32_t u : uses) {
    const UseState* s = state_[u].get();
    if (s == nullptr) return failed_all_;
    if (s->state == State::kFailed) return s->error;
  }
  return Status::Ok();
}

void ShardSource::BatchBuilt(uint64_t b) {
  bool freed = false;
  for (uint32_t u : schedule_.BatchUses(b)) {
    if (batches_left_[u].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
    std::lock_guard lock(mu_);
    // Only a landed read may give its buffer back: a failed-over read may
    // still be in flight into it.
    if (state_[u] != nullptr && state_[u]->state == State::kReady) {
      state_[u].reset();
      slots_free_++;
      freed = true;
    }
  }
  if (freed) cv_.notify_all();
}

void ShardSource::AllowBuildUpTo(uint64_t limit) {
  {
    std::lock_guard lock(mu_);
    if (limit <= build_limit_) return;
    build_limit_ = limit;
  }
  cv_.notify_all();
}

void ShardSource::Finish(UseState& u, Status st) {
  {
    std::lock_guard lock(mu_);
    u.state = st.ok() ? State::kReady : State::kFailed;
    u.error = std::move(st);
  }
  cv_.notify_all();
}

void ShardSource::FailAll(const Status& st) {
  {
    std::lock_guard lock(mu_);
    if (failed_all_.ok()) failed_all_ = st;
    for (auto& u : state_) {
      if (u != nullptr && (u->state == State::kPending || u->state == State::kReading)) {
        u->state = State::kFailed;
        u->error = st;
      }
    }
  }
  cv_.notify_all();
}

// ---- whole shards -------------------------------------------------------------

void ShardSource::ReaderLoop() {
  const LoaderOptions& o = *config_.options;
  ReadQueueOptions qo;
  qo.depth = std::max(1u, o.reads_in_flight);
  qo.direct_io = o.direct_io;
  auto queue_or = config_.store->NewReadQueue(qo);
  if (!queue_or.ok()) return FailAll(queue_or.status());
  std::unique_ptr<ReadQueue> queue = std::move(queue_or).value();
  std::vector<ReadCompletion> done;
  // Use -> its deadline: read_timeout from the first attempt (the store's
  // retries stop by then too), so a dead cluster fails the epoch in time.
  std::vector<std::pair<uint64_t, Deadline>> started;
  while (true) {
    std::vector<ReadRequest> batch;
    Status no_buffer;
    {
      std::unique_lock lock(mu_);
      if (stop_) break;
      while (next_read_ < state_.size() && slots_free_ > 0 &&
             queue->Outstanding() + batch.size() < qo.depth) {
        auto buffer = config_.pool->Get(config_.slot_bytes, "loader shard buffer");
        if (!buffer.ok()) {
          no_buffer = buffer.status().WithContext(
              "reading shard " + config_.manifest->shards[schedule_.uses[next_read_].shard].key +
              " of " + config_.store->uri());
          break;
        }
        state_[next_read_] = std::make_unique<UseState>();
        UseState& u = *state_[next_read_];
        u.buffer = std::move(buffer).value();
        u.state = State::kReading;
        slots_free_--;
        batch.push_back(RequestFor(next_read_++));
      }
      if (!no_buffer.ok()) {
        // Handled below, without the lock.
      } else if (batch.empty() && queue->Outstanding() == 0) {
        if (next_read_ >= state_.size()) break;  // every shard read
        cv_.wait(lock, [&] { return stop_ || slots_free_ > 0; });
        continue;
      }
    }
    // Every read not landed fails with it; the queue's destructor waits for
    // the reads in flight.
    if (!no_buffer.ok()) return FailAll(no_buffer);
    for (const auto& r : batch) started.emplace_back(r.tag, Clock::now() + o.read_timeout);
    if (!batch.empty()) {
      if (Status st = queue->Submit(batch); !st.ok()) return FailAll(st);
    }
    done.clear();
    // Wake up now and then to notice stop and overdue reads; TimedOut just
    // means nothing landed in this slice.
    (void)queue->Wait(1, Clock::now() + std::chrono::milliseconds(50), &done);
    for (const auto& c : done) {
      OnRead(c);
      std::erase_if(started, [&](const auto& s) { return s.first == c.tag; });
    }
    // The queue still owns the buffers of outstanding reads; its destructor
    // waits for them before the buffers can be reused.
    if (FailOverdue(started)) return;
  }
}

bool ShardSource::FailOverdue(const std::vector<std::pair<uint64_t, Deadline>>& started) {
  const auto now = Clock::now();
  for (const auto& [use, deadline] : started) {
    if (deadline >= now) continue;
    const auto& key = config_.manifest->shards[schedule_.uses[use].shard].key;
    FailAll(TimedOut(config_.store->uri() + "/" + key + ": read did not complete within " +
                     std::to_string(config_.options->read_timeout.count()) + " ms"));
    return true;
  }
  return false;
}

ReadRequest ShardSource::RequestFor(uint64_t use) {
  const auto& info = config_.manifest->shards[schedule_.uses[use].shard];
  ReadRequest r;
  r.key = info.key;
  r.offset = 0;
  r.dst = {state_[use]->buffer->data(), info.bytes};
  r.tag = use;
  return r;
}

void ShardSource::OnRead(const ReadCompletion& c) {
  UseState& u = *state_[c.tag];
  const uint32_t shard = schedule_.uses[c.tag].shard;
  const auto& info = config_.manifest->shards[shard];
  const std::string& uri = config_.store->uri();
  Status st = c.status;
  if (st.ok() && c.bytes != info.bytes) {
    st = Corruption(uri + "/" + info.key + ": truncated: read " + std::to_string(c.bytes) +
                    " bytes, the manifest says " + std::to_string(info.bytes));
  }
  if (st.ok()) {
    auto view = ShardView::Parse({u.buffer->data(), info.bytes},
                                 format::ExpectationFor(*config_.manifest, shard));
    if (view.ok()) {
      u.view = std::move(view).value();
    } else {
      st = view.status().WithContext(uri);
    }
  } else if (st.code() != Code::kCorruption) {
    st = st.WithContext("reading shard " + info.key + " of " + uri);
  }
  if (st.ok()) {
    LoaderCounters::Add(config_.counters->shards_read, 1);
    LoaderCounters::Add(config_.counters->bytes_read, c.bytes);
  }
  Finish(u, std::move(st));
}

}  // namespace stoker
