// The io_uring read engine of the POSIX store.
//
// Each ReadQueue owns a ring sized to its depth. Submit queues requests and
// keeps up to `depth` of them in the ring; Wait reaps completions, continues
// short reads, refills the ring from the queue's backlog, and sleeps in
// io_uring_wait_cqes with a timeout taken from the deadline.
//
// Files are opened through the ring too (IORING_OP_OPENAT), so neither Submit
// nor Wait ever blocks on a slow metadata lookup (a network filesystem) or an
// open that never returns (a FIFO). A file is shared by the requests in the
// ring on the same key, so a batch of ranges of one shard costs one open; a
// request arriving while the open is in progress waits for it. A file is
// reused only by requests submitted before it was opened: a request submitted
// after a Put returned must see the new object, which an older descriptor
// (the replaced inode) would not show. A file is closed as soon as no request
// in the ring uses it.
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "core/aligned_memory.h"
#include "store/posix_internal.h"
#include "store/store_internal.h"

namespace stoker::posix {

Status ProbeIoUring() {
  static const Status probe = [] {
    io_uring ring;
    const int rc = io_uring_queue_init(2, &ring, 0);
    if (rc < 0) return ErrnoToStatus(-rc, "io_uring_queue_init");
    Status st;
    if ((ring.features & IORING_FEAT_EXT_ARG) == 0) {
      st = Unsupported("io_uring lacks IORING_FEAT_EXT_ARG (kernel older than 5.11)");
    } else if (io_uring_probe* p = io_uring_get_probe_ring(&ring); p == nullptr) {
      st = Unsupported("io_uring cannot be probed for opcodes (kernel older than 5.6)");
    } else {
      for (int op : {IORING_OP_READ, IORING_OP_OPENAT, IORING_OP_ASYNC_CANCEL}) {
        if (!io_uring_opcode_supported(p, op)) {
          st = Unsupported("io_uring lacks opcode " + std::to_string(op) +
                           " (kernel older than 5.6)");
        }
      }
      io_uring_free_probe(p);
    }
    io_uring_queue_exit(&ring);
    return st;
  }();
  return probe;
}

namespace {

// Rings beyond this many entries buy nothing for file reads and cost locked
// memory; deeper queues keep the rest in their backlog.
constexpr uint32_t kMaxRingEntries = 4096;

// Longest single sleep in the kernel; Wait loops, so any deadline works.
constexpr auto kMaxSleep = std::chrono::hours(1);
// Pause before resubmitting when the kernel is out of resources.
constexpr auto kRetrySleep = std::chrono::milliseconds(1);

// SQE user_data: the slot of the request, with this bit set for its open.
constexpr uint64_t kOpenBit = uint64_t{1} << 32;
// SQE user_data of the cancellations sent by the destructor.
constexpr uint64_t kCancelData = ~uint64_t{0} - 1;

class UringReadQueue final : public ReadQueue {
 public:
  static Result<std::unique_ptr<ReadQueue>> Create(std::string root,
                                                   const ReadQueueOptions& options) {
    std::unique_ptr<UringReadQueue> q(new UringReadQueue(std::move(root), options));
    // The completion queue holds twice the entries, so even with every slot
    // busy and a cancellation per slot (destructor) it cannot overflow.
    // COOP_TASKRUN (5.19) saves an interrupt per completion; older kernels
    // reject it with EINVAL.
    int rc = io_uring_queue_init(q->depth_, &q->ring_, IORING_SETUP_COOP_TASKRUN);
    if (rc == -EINVAL) rc = io_uring_queue_init(q->depth_, &q->ring_, 0);
    if (rc < 0) return ErrnoToStatus(-rc, "io_uring_queue_init(" + std::to_string(q->depth_) + ")");
    q->ring_ready_ = true;
    return std::unique_ptr<ReadQueue>(std::move(q));
  }

  ~UringReadQueue() override {
    if (!ring_ready_) return;
    // The kernel writes into caller memory until a read's completion arrives,
    // so every operation it has must complete before the caller may free dst.
    // Cancel them first: reads finish soon anyway, but an open can block for
    // as long as a FIFO has no writer or a network filesystem hangs.
    pending_.clear();
    closing_ = true;
    SubmitToKernel().ok();
    for (const Op& op : ops_) {
      if (!op.in_kernel) continue;
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      io_uring_prep_cancel64(sqe, op.sqe_data, 0);
      io_uring_sqe_set_data64(sqe, kCancelData);
    }
    while (sqes_ > 0) {
      if (!SubmitToKernel().ok()) break;  // what never reached the kernel is safe
      if (InKernel() == 0) {
        std::this_thread::sleep_for(kRetrySleep);  // all still in the SQ (EAGAIN)
        continue;
      }
      io_uring_cqe* cqe;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) break;  // a broken ring; exiting it cancels what is left
      Reap();
    }
    ops_.clear();
    files_.clear();
    io_uring_queue_exit(&ring_);
  }

  Status Submit(std::span<const ReadRequest> requests) override {
    if (!broken_.ok()) return broken_;
    ++submit_seq_;
    for (const ReadRequest& r : requests) {
      pending_.push_back({r.key, r.offset, r.dst, r.tag, submit_seq_});
    }
    outstanding_ += requests.size();
    return Pump();
  }

  Result<size_t> Wait(size_t min_completions, Deadline deadline,
                      std::vector<ReadCompletion>* out) override {
    if (out == nullptr) return InvalidArgument("ReadQueue::Wait: out is null");
    if (!broken_.ok()) return broken_;
    const size_t min = std::min(min_completions, outstanding_);
    while (true) {
      Reap();
      STOKER_RETURN_IF_ERROR(Pump());
      if (ready_.size() >= min) break;
      const auto now = Clock::now();
      if (now >= deadline) break;
      if (InKernel() == 0) {
        // Everything sits in the submission queue because the kernel said
        // EAGAIN/EBUSY; no completion can wake us, so retry shortly.
        std::this_thread::sleep_for(std::min<Clock::duration>(deadline - now, kRetrySleep));
        continue;
      }
      const auto sleep = std::min<Clock::duration>(deadline - now, kMaxSleep);
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(sleep).count();
      __kernel_timespec ts{};
      ts.tv_sec = ns / 1'000'000'000;
      ts.tv_nsec = ns % 1'000'000'000;
      // Opens and continued reads post more than one completion per request,
      // so this may wake early; the loop then waits again.
      const auto want = static_cast<unsigned>(std::min<size_t>(min - ready_.size(), InKernel()));
      io_uring_cqe* cqe;
      const int rc = io_uring_wait_cqes(&ring_, &cqe, want, &ts, nullptr);
      if (rc < 0 && rc != -ETIME && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        broken_ = ErrnoToStatus(-rc, "io_uring_wait_cqes");
        return broken_;
      }
    }
    const size_t n = store_internal::MoveCompletions(ready_, out);
    return store_internal::EndWait(n, min, &outstanding_, "read queue");
  }

  size_t Outstanding() const override { return outstanding_; }

 private:
  struct Pending {
    std::string key;
    uint64_t offset;
    std::span<std::byte> dst;
    uint64_t tag;
    uint64_t seq;  // the Submit call that queued it
  };

  struct OpenFile {
    OpenFile(std::string p, uint64_t s) : path(std::move(p)), opened_seq(s) {}
    ~OpenFile() {
      if (fd >= 0) ::close(fd);
    }
    OpenFile(const OpenFile&) = delete;
    OpenFile& operator=(const OpenFile&) = delete;

    const std::string path;     // outlives the open SQE that points at it
    const uint64_t opened_seq;  // submit_seq_ when the open was issued
    int fd = -1;                // -1 while opening, or if the open failed
    bool failed = false;
    std::vector<uint32_t> waiters;  // slots waiting for the open
  };

  // One request in the ring. `done` bytes are in dst; the first `main` bytes
  // are read straight into dst, the rest (direct I/O's unaligned tail) via
  // `bounce`.
  struct Op {
    std::shared_ptr<OpenFile> file;
    std::span<std::byte> dst;
    uint64_t offset = 0;
    uint64_t tag = 0;
    size_t main = 0;
    size_t done = 0;
    bool in_tail = false;
    bool in_kernel = false;       // an SQE of this op is in the ring
    uint64_t sqe_data = 0;        // that SQE's user_data, for cancellation
    internal::AlignedPtr bounce;  // allocated on first need, kept
  };

  UringReadQueue(std::string root, const ReadQueueOptions& options)
      : root_(std::move(root)),
        depth_(std::min(options.depth, kMaxRingEntries)),
        direct_(options.direct_io),
        ops_(depth_) {
    free_.reserve(depth_);
    for (uint32_t i = depth_; i > 0; --i) free_.push_back(i - 1);
  }

  // Operations the kernel holds (submitted, completion not reaped yet).
  unsigned InKernel() const {
    const unsigned unsubmitted = io_uring_sq_ready(&ring_);
    return sqes_ > unsubmitted ? sqes_ - unsubmitted : 0;
  }

  // Moves backlog into the ring up to depth and submits.
  Status Pump() {
    while (!free_.empty() && !pending_.empty()) {
      Pending p = std::move(pending_.front());
      pending_.pop_front();
      Start(std::move(p));
    }
    Status st = SubmitToKernel();
    // Close files no request uses any more.
    for (auto it = files_.begin(); it != files_.end();) {
      it = it->second.use_count() == 1 ? files_.erase(it) : std::next(it);
    }
    return st;
  }

  void Start(Pending p) {
    Status st = CheckReadRequest(p.key, p.offset, p.dst, direct_);
    if (!st.ok()) return Complete(p.tag, std::move(st), 0);
    const uint32_t slot = free_.back();
    free_.pop_back();
    Op& op = ops_[slot];
    op.dst = p.dst;
    op.offset = p.offset;
    op.tag = p.tag;
    op.main = DirectMainLength(p.dst.size(), direct_);
    op.done = 0;
    op.in_tail = op.main == 0;

    auto it = files_.find(p.key);
    if (it != files_.end() && !it->second->failed && it->second->opened_seq >= p.seq) {
      op.file = it->second;
      if (op.file->fd >= 0) return BeginRead(slot);
      op.file->waiters.push_back(slot);  // its open is in the ring
      return;
    }
    op.file = std::make_shared<OpenFile>(JoinPath(root_, p.key), submit_seq_);
    // A stale entry still in use stays open until its requests finish.
    if (it != files_.end()) {
      it->second = op.file;
    } else {
      files_.emplace(std::move(p.key), op.file);
    }
    op.file->waiters.push_back(slot);
    PrepOpen(slot);
  }

  io_uring_sqe* GetSqe() {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      // Cannot happen while slots <= ring entries; make room anyway.
      SubmitToKernel().ok();
      sqe = io_uring_get_sqe(&ring_);
    }
    return sqe;
  }

  void Queued(uint32_t slot, io_uring_sqe* sqe, uint64_t data) {
    io_uring_sqe_set_data64(sqe, data);
    ops_[slot].in_kernel = true;
    ops_[slot].sqe_data = data;
    ++sqes_;
  }

  void PrepOpen(uint32_t slot) {
    io_uring_sqe* sqe = GetSqe();
    if (sqe == nullptr) {
      return OpenDone(slot, -EAGAIN, Internal("io_uring submission queue full"));
    }
    io_uring_prep_openat(sqe, AT_FDCWD, ops_[slot].file->path.c_str(), OpenFlags(direct_), 0);
    Queued(slot, sqe, slot | kOpenBit);
  }

  // The open issued by `slot` finished: start or fail every request waiting.
  void OpenDone(uint32_t slot, int res, Status error) {
    std::shared_ptr<OpenFile> file = ops_[slot].file;
    if (res >= 0) file->fd = res;  // also when closing, so that it gets closed
    std::vector<uint32_t> waiters;
    waiters.swap(file->waiters);
    if (closing_) {
      for (uint32_t w : waiters) Finish(w, Cancelled("read queue destroyed"));
      return;
    }
    if (res < 0) {
      file->failed = true;
      if (error.ok()) error = OpenErrorStatus(-res, file->path, direct_);
      for (uint32_t w : waiters) Finish(w, error);
      return;
    }
    for (uint32_t w : waiters) BeginRead(w);
  }

  void BeginRead(uint32_t slot) {
    if (ops_[slot].dst.empty()) return Finish(slot, Status::Ok());  // it exists; nothing to read
    PrepRead(slot);
  }

  // Queues the next read of op `slot`: the rest of its main part, or its tail.
  void PrepRead(uint32_t slot) {
    Op& op = ops_[slot];
    io_uring_sqe* sqe = GetSqe();
    if (sqe == nullptr) return Finish(slot, Internal("io_uring submission queue full"));
    if (!op.in_tail) {
      const size_t n = std::min(op.main - op.done, kMaxReadChunk);
      io_uring_prep_read(sqe, op.file->fd, op.dst.data() + op.done, static_cast<unsigned>(n),
                         op.offset + op.done);
      // A buffered read of cached pages would otherwise be served inline,
      // in this one submitting thread (the loader's reader): the kernel's
      // copies of every hot shard on one core. IOSQE_ASYNC hands each read to
      // io_uring's worker threads, so hot copies run on every core (faster
      // hot, cold unchanged: docs/benchmarks.md, "io_uring with
      // IOSQE_ASYNC"). Direct reads never hit the page cache and stay
      // inline-submitted.
      if (!direct_) io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
    } else {
      if (op.bounce == nullptr) {
        op.bounce = internal::AllocateAligned(kDirectIoAlignment, kDirectIoAlignment);
        if (op.bounce == nullptr) {
          io_uring_prep_nop(sqe);  // the SQE is taken; give it something harmless
          io_uring_sqe_set_data64(sqe, kCancelData);
          return Finish(slot, IoError("out of memory for a direct_io bounce buffer"));
        }
      }
      io_uring_prep_read(sqe, op.file->fd, op.bounce.get(), kDirectIoAlignment,
                         op.offset + op.done);
    }
    Queued(slot, sqe, slot);
  }

  Status SubmitToKernel() {
    while (io_uring_sq_ready(&ring_) > 0) {
      const int rc = io_uring_submit(&ring_);
      if (rc > 0 || rc == -EINTR) continue;
      // Out of kernel resources, or the completion queue is full: what was
      // not taken stays in the ring for the next Submit or Wait.
      if (rc == 0 || rc == -EAGAIN || rc == -EBUSY) return Status::Ok();
      broken_ = ErrnoToStatus(-rc, "io_uring_submit");
      return broken_;
    }
    return Status::Ok();
  }

  // Handles every completion available now, without blocking.
  void Reap() {
    unsigned head;
    unsigned seen = 0;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(&ring_, head, cqe) {
      ++seen;
      const uint64_t data = cqe->user_data;
      if (data == kCancelData || data == LIBURING_UDATA_TIMEOUT) continue;
      const auto slot = static_cast<uint32_t>(data & (kOpenBit - 1));
      ops_[slot].in_kernel = false;
      --sqes_;
      if (data & kOpenBit) {
        OnOpen(slot, cqe->res);
      } else {
        OnRead(slot, cqe->res);
      }
    }
    io_uring_cq_advance(&ring_, seen);
  }

  void OnOpen(uint32_t slot, int res) {
    if (!closing_ && (res == -EINTR || res == -EAGAIN)) return PrepOpen(slot);
    OpenDone(slot, res, Status::Ok());
  }

  void OnRead(uint32_t slot, int res) {
    Op& op = ops_[slot];
    if (closing_) return Finish(slot, Cancelled("read queue destroyed"));
    if (res == -EINTR || res == -EAGAIN) return PrepRead(slot);
    if (res < 0) return Finish(slot, ReadErrorStatus(-res, op.file->path, direct_));
    const auto n = static_cast<size_t>(res);
    if (op.in_tail) {
      const size_t take = std::min(n, op.dst.size() - op.done);
      std::memcpy(op.dst.data() + op.done, op.bounce.get(), take);
      op.done += take;
      return Finish(slot, Status::Ok());
    }
    op.done += n;
    // A direct read returns an unaligned count only at end of file.
    const bool eof = n == 0 || (direct_ && n % kDirectIoAlignment != 0);
    if (eof || op.done == op.dst.size()) return Finish(slot, Status::Ok());
    if (op.done == op.main) op.in_tail = true;  // main part done; tail next
    PrepRead(slot);                             // short read before the end: continue
  }

  void Finish(uint32_t slot, Status status) {
    Op& op = ops_[slot];
    Complete(op.tag, std::move(status), op.done);
    op.file.reset();
    free_.push_back(slot);
  }

  void Complete(uint64_t tag, Status status, size_t bytes) {
    ReadCompletion c;
    c.tag = tag;
    c.bytes = status.ok() ? bytes : 0;
    c.status = std::move(status);
    ready_.push_back(std::move(c));
  }

  const std::string root_;
  const uint32_t depth_;  // ring entries = most requests in the ring
  const bool direct_;
  io_uring ring_{};
  bool ring_ready_ = false;
  bool closing_ = false;
  Status broken_;  // set when the ring itself fails; the queue cannot go on

  std::vector<Op> ops_;          // one per ring entry
  std::vector<uint32_t> free_;   // unused slots of ops_
  unsigned sqes_ = 0;            // SQEs of ops in the SQ or the kernel
  std::deque<Pending> pending_;  // backlog beyond depth
  std::vector<ReadCompletion> ready_;
  std::unordered_map<std::string, std::shared_ptr<OpenFile>> files_;
  size_t outstanding_ = 0;  // submitted, not yet handed out by Wait
  uint64_t submit_seq_ = 0;
};

}  // namespace

Result<std::unique_ptr<ReadQueue>> NewUringReadQueue(std::string root,
                                                     const ReadQueueOptions& options) {
  return UringReadQueue::Create(std::move(root), options);
}

}  // namespace stoker::posix
