// The Ceph RADOS store: one object per key in one pool, through librados.
//
// Why the C API (rados/librados.h) and not librados.hpp: it is librados'
// stable ABI, it is all Debian's librados-dev ships (the C++ headers are a
// separate package, libradospp-dev), and it reads straight into caller
// memory: rados_aio_read takes a char* that librados fills (the messenger
// copies a whole reply into it; a short reply is copied by the completion),
// which is the one copy a network read needs.
//
// Reads (ReadQueue) are asynchronous only: each request becomes one
// rados_aio_read (rados_aio_stat for a zero-length read, which still has to
// say whether the object exists) whose completion callback, on librados'
// finisher thread, appends a ReadCompletion to the queue's list and starts
// the next waiting request. A queue keeps at most `depth` operations and
// kMaxQueueBytesInFlight bytes in flight; Submit takes any number and the
// rest wait inside the queue. Destroying a queue cancels its operations
// (rados_aio_cancel) and waits for every callback, so nothing is written
// into caller memory afterwards.
//
// Put is one write_full, which RADOS applies atomically to one object: a
// reader sees the old object or the new one. It is sent with FULL_TRY so that
// a full pool answers ENOSPC/EDQUOT at once instead of blocking the writer
// until the pool has room. Objects larger than osd_max_object_size (128 MiB by
// default) are refused before anything is sent.
//
// List walks the whole pool (RADOS has no prefix index) and filters by name;
// sizes come from concurrent stats, which ListKeys skips. Fine for a
// dataset's few thousand shards, slow on pools with millions of unrelated
// objects: nothing in stoker lists a pool to find names it wrote itself.
//
// One cluster handle (rados_t + rados_ioctx_t) per store, shared by the
// store and its queues (a queue may outlive its store); librados handles are
// thread-safe for these calls.
#include "store/rados_cluster.h"
#include "store/rados_store.h"

#include <rados/librados.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "store/store_internal.h"

namespace stoker {
namespace rados {

namespace {

using store_internal::Quote;

// In-flight bytes per queue. The client's objecter has its own budget,
// objecter_inflight_op_bytes (100 MiB by default), over every queue of the
// process; past it librados blocks the submitter, so one queue stays below.
constexpr uint64_t kMaxQueueBytesInFlight = 64ull << 20;

// ---- reads -----------------------------------------------------------------

class QueueCore;

// One operation in flight. Owned by the queue core (in `ops_`) from issue to
// callback; the callback deletes it.
struct Op {
  QueueCore* core = nullptr;
  rados_completion_t completion = nullptr;
  uint64_t tag = 0;
  std::string object;
  size_t length = 0;       // bytes asked of librados (0: a stat)
  uint64_t stat_size = 0;  // rados_aio_stat's outputs
  time_t stat_mtime = 0;
};

// What a queue shares with librados' callbacks. Everything mutable is
// guarded by mu_. It is kept alive by a shared_ptr that each Op's callback
// holds (see Issue), so a callback finishing after the queue returned from
// its destructor still touches live memory; it never owns the Cluster.
class QueueCore final : public std::enable_shared_from_this<QueueCore> {
 public:
  QueueCore(const Cluster& cluster, uint32_t depth)
      : io_(cluster.io),
        cluster_(cluster),
        depth_(depth),
        max_read_(std::min<uint64_t>(cluster.max_object_bytes, INT_MAX)) {}

  struct Pending {
    std::string object;
    uint64_t offset;
    std::span<std::byte> dst;
    uint64_t tag;
  };

  void Add(std::vector<Pending> requests, std::vector<ReadCompletion> failed) {
    std::lock_guard lock(mu_);
    for (auto& c : failed) ready_.push_back(std::move(c));
    for (auto& r : requests) pending_.push_back(std::move(r));
    PumpLocked();
    cv_.notify_all();  // failed requests, and any that failed to start, are ready
  }

  // Waits until `min` completions are ready or the deadline passes; moves
  // every ready one into `out`.
  size_t Take(size_t min, Deadline deadline, std::vector<ReadCompletion>* out) {
    std::vector<rados_completion_t> finished;
    size_t n;
    {
      std::unique_lock lock(mu_);
      n = store_internal::TakeReady(lock, cv_, ready_, min, deadline, out);
      finished.swap(finished_);
    }
    for (rados_completion_t c : finished) rados_aio_release(c);
    return n;
  }

  // Drops waiting requests, cancels the ones in flight and waits for their
  // callbacks: after this, librados writes into no caller buffer.
  void Close() {
    std::vector<rados_completion_t> in_flight;
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      pending_.clear();
      for (Op* op : ops_) in_flight.push_back(op->completion);
    }
    // Outside the lock: a cancel may complete the op at once. The
    // completions are still ours (released only below), so cancelling one
    // whose callback already ran is harmless (librados answers ENOENT).
    for (rados_completion_t c : in_flight) rados_aio_cancel(io_, c);
    std::vector<rados_completion_t> finished;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return ops_.empty(); });
      finished.swap(finished_);
    }
    for (rados_completion_t c : finished) rados_aio_release(c);
  }

  static void OnComplete(rados_completion_t c, void* arg) {
    Op* op = static_cast<Op*>(arg);
    // Keeps the core alive past the unlock below, whatever the owner does.
    std::shared_ptr<QueueCore> core = op->core->shared_from_this();
    core->Finish(op, rados_aio_get_return_value(c));
  }

 private:
  void Finish(Op* op, int rc) {
    ReadCompletion done;
    done.tag = op->tag;
    if (rc >= 0) {
      // A read returns the bytes it copied into dst; a stat (zero-length
      // read) 0.
      done.bytes = op->length == 0 ? 0 : std::min<size_t>(size_t(rc), op->length);
    } else {
      done.status = cluster_.Error(rc, "read", op->object);
    }
    std::lock_guard lock(mu_);
    in_flight_bytes_ -= op->length;
    ops_.erase(std::find(ops_.begin(), ops_.end(), op));
    finished_.push_back(op->completion);
    delete op;
    if (!closed_) {
      ready_.push_back(std::move(done));
      PumpLocked();
    }
    cv_.notify_all();
  }

  // Issues waiting requests while depth and bytes allow (at least one op is
  // always allowed, so a read larger than the byte bound still runs).
  void PumpLocked() {
    while (!closed_ && !pending_.empty() && ops_.size() < depth_) {
      Pending& p = pending_.front();
      const size_t length = std::min<uint64_t>(p.dst.size(), max_read_);
      if (!ops_.empty() && in_flight_bytes_ + length > kMaxQueueBytesInFlight) return;
      auto op = std::make_unique<Op>();
      op->core = this;
      op->tag = p.tag;
      op->object = std::move(p.object);
      op->length = length;
      const uint64_t offset = p.offset;
      std::byte* dst = p.dst.data();
      pending_.pop_front();
      int rc = rados_aio_create_completion2(op.get(), &QueueCore::OnComplete, &op->completion);
      if (rc == 0) {
        // A zero-length read is a stat: librados reads a whole object when
        // asked for 0 bytes.
        rc = length == 0 ? rados_aio_stat(io_, op->object.c_str(), op->completion, &op->stat_size,
                                          &op->stat_mtime)
                         : rados_aio_read(io_, op->object.c_str(), op->completion,
                                          reinterpret_cast<char*>(dst), length, offset);
        if (rc < 0) rados_aio_release(op->completion);
      }
      if (rc < 0) {
        ReadCompletion failed;
        failed.tag = op->tag;
        failed.status = cluster_.Error(rc, "read", op->object);
        ready_.push_back(std::move(failed));
        continue;
      }
      in_flight_bytes_ += length;
      ops_.push_back(op.release());
    }
  }

  const rados_ioctx_t io_;  // valid while the owning queue holds the Cluster
  const Cluster& cluster_;  // ditto; for messages only
  const uint32_t depth_;
  const uint64_t max_read_;  // no object is larger; librados returns an int
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;               // guarded by mu_
  std::vector<Op*> ops_;                      // guarded by mu_; in flight
  uint64_t in_flight_bytes_ = 0;              // guarded by mu_
  std::vector<ReadCompletion> ready_;         // guarded by mu_
  std::vector<rados_completion_t> finished_;  // guarded by mu_; to release
  bool closed_ = false;                       // guarded by mu_
};

class RadosReadQueue final : public ReadQueue {
 public:
  RadosReadQueue(std::shared_ptr<Cluster> cluster, const ReadQueueOptions& options)
      : cluster_(std::move(cluster)),
        core_(std::make_shared<QueueCore>(*cluster_, options.depth)) {}

  // Cancels and waits for every operation before the Cluster can go.
  ~RadosReadQueue() override { core_->Close(); }

  Status Submit(std::span<const ReadRequest> requests) override {
    std::vector<QueueCore::Pending> ok;
    std::vector<ReadCompletion> failed;
    ok.reserve(requests.size());
    for (const ReadRequest& r : requests) {
      if (Status st = ValidateKey(r.key); !st.ok()) {
        failed.push_back({r.tag, std::move(st), 0});
        continue;
      }
      ok.push_back({cluster_->ObjectName(r.key), r.offset, r.dst, r.tag});
    }
    core_->Add(std::move(ok), std::move(failed));
    outstanding_ += requests.size();
    return Status::Ok();
  }

  Result<size_t> Wait(size_t min_completions, Deadline deadline,
                      std::vector<ReadCompletion>* out) override {
    return store_internal::WaitOn(*core_, min_completions, deadline, out, &outstanding_,
                                  "read queue on rados://" + cluster_->pool);
  }

  size_t Outstanding() const override { return outstanding_; }

 private:
  std::shared_ptr<Cluster> cluster_;
  std::shared_ptr<QueueCore> core_;
  size_t outstanding_ = 0;  // owner thread only
};

// ---- the store ---------------------------------------------------------------

class RadosStore final : public Store {
 public:
  RadosStore(std::shared_ptr<Cluster> cluster, std::string uri)
      : cluster_(std::move(cluster)), uri_(std::move(uri)) {}

  const std::string& uri() const override { return uri_; }
  StoreDescription Describe() const override {
    StoreDescription d;
    d.kind = "rados";
    d.location = cluster_->pool;
    d.prefix = cluster_->prefix.empty()
                   ? ""
                   : cluster_->prefix.substr(0, cluster_->prefix.size() - 1);  // "PREFIX/"
    d.engine = "librados";
    return d;
  }

  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& options) override {
    STOKER_RETURN_IF_ERROR(store_internal::ValidateQueueOptions(options));
    // direct_io has no meaning here: RADOS reads bypass this machine's page
    // cache anyway.
    return std::unique_ptr<ReadQueue>(std::make_unique<RadosReadQueue>(cluster_, options));
  }

  // One operation holding a stat and a read, which the OSD runs atomically
  // on one version of the object; so unlike the default (Stat, then Read) a
  // concurrent Put is never seen half-way. Retried if the object grew
  // between the first Stat and the operation.
  Result<std::vector<std::byte>> ReadAll(std::string_view key) override {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    STOKER_ASSIGN_OR_RETURN(ObjectInfo info, Stat(key));
    const std::string object = cluster_->ObjectName(key);
    uint64_t guess = info.size;
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (guess + 1 > cluster_->max_object_bytes + 1 || guess + 1 > size_t(INT_MAX)) {
        return InvalidArgument(Quote(key) + ": object too large to read whole");
      }
      std::vector<std::byte> data(guess + 1);  // +1: notices growth
      uint64_t size = 0;
      time_t mtime = 0;
      size_t bytes = 0;
      int stat_rval = 0, read_rval = 0;
      rados_read_op_t op = rados_create_read_op();
      rados_read_op_stat(op, &size, &mtime, &stat_rval);
      rados_read_op_read(op, 0, data.size(), reinterpret_cast<char*>(data.data()), &bytes,
                         &read_rval);
      int rc = rados_read_op_operate(op, cluster_->io, object.c_str(), 0);
      rados_release_read_op(op);
      if (rc >= 0) rc = stat_rval < 0 ? stat_rval : read_rval;
      if (rc < 0) return cluster_->Error(rc, "read", object);
      if (bytes == size) {
        data.resize(bytes);
        return data;
      }
      guess = size;  // it grew: try again with room for the new size
    }
    return IoError(
        "read " + Quote(key) + " of " + uri_ + ": the object kept changing size while read",
        /*retryable=*/true);
  }

  // Durable on return whatever options.durability says: an OSD acknowledges
  // a write once every replica has it (so Sync() has nothing to do). If
  // absent: one operation, an exclusive create (EEXIST, AlreadyExists, when
  // the object exists) and the write, applied together by the OSD. The
  // observer sees the data whole before it is sent.
  using Store::Put;
  Status Put(std::string_view key, std::span<const std::byte> data,
             const WriteOptions& options) override {
    return Write(key, data, options.if_absent, options.observer);
  }

  StoreCapabilities capabilities() const override { return {.exclusive_create = true}; }

  Result<ObjectInfo> Stat(std::string_view key) override {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    const std::string object = cluster_->ObjectName(key);
    uint64_t size = 0;
    time_t mtime = 0;
    if (int rc = rados_stat(cluster_->io, object.c_str(), &size, &mtime); rc < 0) {
      return cluster_->Error(rc, "stat", object);
    }
    return ObjectInfo{std::string(key), size};
  }

  Result<std::vector<ObjectInfo>> List(std::string_view prefix) override {
    STOKER_ASSIGN_OR_RETURN(std::vector<std::string> keys, ListKeys(prefix));
    return StatAll(keys);
  }

  // The walk of the pool alone: no stat per object.
  Result<std::vector<std::string>> ListKeys(std::string_view prefix) override {
    STOKER_RETURN_IF_ERROR(store_internal::ValidatePrefix(prefix));
    const std::string full = cluster_->prefix + std::string(prefix);
    std::vector<std::string> keys;
    rados_list_ctx_t ctx = nullptr;
    if (int rc = rados_nobjects_list_open(cluster_->io, &ctx); rc < 0) {
      return cluster_->Error(rc, "list", full);
    }
    while (true) {
      const char* entry = nullptr;
      const char* locator = nullptr;
      const char* nspace = nullptr;
      size_t entry_size = 0, locator_size = 0, nspace_size = 0;
      const int rc = rados_nobjects_list_next2(ctx, &entry, &locator, &nspace, &entry_size,
                                               &locator_size, &nspace_size);
      if (rc == -ENOENT) break;  // the end
      if (rc < 0) {
        rados_nobjects_list_close(ctx);
        return cluster_->Error(rc, "list", full);
      }
      const std::string_view name(entry, entry_size);
      if (nspace_size != 0 || !name.starts_with(full)) continue;
      const std::string_view key = name.substr(cluster_->prefix.size());
      // Objects other tools wrote may have names that are no valid key.
      if (ValidateKey(key).ok()) keys.emplace_back(key);
    }
    rados_nobjects_list_close(ctx);
    std::sort(keys.begin(), keys.end());
    return keys;
  }

  Status Remove(std::string_view key) override {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    const std::string object = cluster_->ObjectName(key);
    rados_write_op_t op = rados_create_write_op();
    rados_write_op_remove(op);
    // FULL_TRY: removing is how a full pool gets room again.
    const int rc = rados_write_op_operate(op, cluster_->io, object.c_str(), nullptr,
                                          LIBRADOS_OPERATION_FULL_TRY);
    rados_release_write_op(op);
    if (rc < 0) return cluster_->Error(rc, "remove", object);
    return Status::Ok();
  }

 private:
  // Sizes of `keys` (sorted), by stats kept kStatsInFlight at a time; an
  // object removed since it was listed is left out.
  Result<std::vector<ObjectInfo>> StatAll(const std::vector<std::string>& keys) {
    constexpr size_t kStatsInFlight = 64;
    struct Stat {
      rados_completion_t c = nullptr;
      uint64_t size = 0;
      time_t mtime = 0;
    };
    std::vector<ObjectInfo> out;
    out.reserve(keys.size());
    std::vector<Stat> stats(std::min(keys.size(), kStatsInFlight));
    Status first_error;
    for (size_t begin = 0; begin < keys.size(); begin += kStatsInFlight) {
      const size_t end = std::min(keys.size(), begin + kStatsInFlight);
      for (size_t i = begin; i < end; ++i) {
        Stat& s = stats[i - begin];
        s = Stat();
        rados_aio_create_completion2(nullptr, nullptr, &s.c);
        const std::string object = cluster_->ObjectName(keys[i]);
        if (int rc = rados_aio_stat(cluster_->io, object.c_str(), s.c, &s.size, &s.mtime); rc < 0) {
          rados_aio_release(s.c);
          s.c = nullptr;
          if (first_error.ok()) first_error = cluster_->Error(rc, "stat", object);
        }
      }
      for (size_t i = begin; i < end; ++i) {
        Stat& s = stats[i - begin];
        if (s.c == nullptr) continue;
        rados_aio_wait_for_complete(s.c);
        const int rc = rados_aio_get_return_value(s.c);
        rados_aio_release(s.c);
        if (rc == -ENOENT) continue;  // removed since it was listed
        if (rc < 0) {
          if (first_error.ok())
            first_error = cluster_->Error(rc, "stat", cluster_->ObjectName(keys[i]));
          continue;
        }
        out.push_back({keys[i], s.size});
      }
    }
    if (!first_error.ok()) return first_error.WithContext("list " + uri_);
    return out;
  }

  Status Write(std::string_view key, std::span<const std::byte> data, bool exclusive,
               const PutObserver* see) {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    const std::string object = cluster_->ObjectName(key);
    if (data.size() > cluster_->max_object_bytes) {
      return InvalidArgument("put rados://" + cluster_->pool + "/" + object + ": " +
                             std::to_string(data.size()) +
                             " bytes is larger than a RADOS object may be (osd_max_object_size " +
                             std::to_string(cluster_->max_object_bytes) + " bytes)");
    }
    if (see != nullptr) (*see)(data);
    rados_write_op_t op = rados_create_write_op();
    if (exclusive) rados_write_op_create(op, LIBRADOS_CREATE_EXCLUSIVE, nullptr);
    rados_write_op_write_full(op, reinterpret_cast<const char*>(data.data()), data.size());
    // FULL_TRY: a full pool answers ENOSPC/EDQUOT instead of holding the
    // write until there is room.
    const int rc = rados_write_op_operate(op, cluster_->io, object.c_str(), nullptr,
                                          LIBRADOS_OPERATION_FULL_TRY);
    rados_release_write_op(op);
    if (rc < 0) return cluster_->Error(rc, exclusive ? "create" : "put", object);
    return Status::Ok();
  }

  std::shared_ptr<Cluster> cluster_;
  const std::string uri_;
};

}  // namespace
}  // namespace rados

Result<std::shared_ptr<Store>> NewRadosStore(std::string_view uri, const StoreOptions& options) {
  STOKER_ASSIGN_OR_RETURN(rados::UriParts parts, rados::ParseUri(uri));
  STOKER_ASSIGN_OR_RETURN(std::shared_ptr<rados::Cluster> cluster, rados::Connect(parts, options));
  return std::shared_ptr<Store>(
      std::make_shared<rados::RadosStore>(std::move(cluster), std::string(uri)));
}

}  // namespace stoker
