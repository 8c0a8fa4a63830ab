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
// sizes come from concurrent stats. Fine for a dataset's few thousand
// shards, slow on pools with millions of unrelated objects.
//
// One cluster handle (rados_t + rados_ioctx_t) per store, shared by the
// store and its queues (a queue may outlive its store); librados handles are
// thread-safe for these calls.
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

// Default of StoreOptions::op_timeout for RADOS: long enough for an OSD to be
// marked down and its PGs to peer elsewhere (heartbeat grace, 20 s by
// default), short enough that a dead cluster is reported in reasonable time.
constexpr std::chrono::milliseconds kDefaultTimeout{30000};

// In-flight bytes per queue. The client's objecter has its own budget,
// objecter_inflight_op_bytes (100 MiB by default), over every queue of the
// process; past it librados blocks the submitter, so one queue stays below.
constexpr uint64_t kMaxQueueBytesInFlight = 64ull << 20;

std::string ErrnoName(int err) {
  switch (err) {
    case ENOENT:
      return "ENOENT";
    case ETIMEDOUT:
      return "ETIMEDOUT";
    case EPERM:
      return "EPERM";
    case EACCES:
      return "EACCES";
    case ENOSPC:
      return "ENOSPC";
    case EDQUOT:
      return "EDQUOT";
    case ESHUTDOWN:
      return "ESHUTDOWN";
    case ENOTCONN:
      return "ENOTCONN";
    case ECANCELED:
      return "ECANCELED";
    case EFBIG:
      return "EFBIG";
    case EIO:
      return "EIO";
    case EAGAIN:
      return "EAGAIN";
    case EBUSY:
      return "EBUSY";
    case EINTR:
      return "EINTR";
    case EINVAL:
      return "EINVAL";
    case ERANGE:
      return "ERANGE";
    default:
      return "errno " + std::to_string(err);
  }
}

}  // namespace

Status ErrorToStatus(int rc, const ErrorContext& ctx) {
  const int err = rc < 0 ? -rc : rc;
  if (err == 0) return Status::Ok();
  std::string where = std::string(ctx.op) + " rados://" + std::string(ctx.pool);
  if (!ctx.object.empty()) where += "/" + std::string(ctx.object);
  const std::string client = ctx.client.empty() ? "the client" : std::string(ctx.client);
  const std::string tail = " (" + ErrnoName(err) + ")";
  switch (err) {
    case ENOENT:
      return NotFound(where + ": no such object" + tail);
    case EEXIST:
      return AlreadyExists(where + ": the object exists" + tail);
    case ETIMEDOUT: {
      std::string m = where + ": timed out";
      if (ctx.timeout_s > 0) m += " after " + std::to_string(ctx.timeout_s) + " s";
      return TimedOut(m + "; are the OSDs serving pool " + std::string(ctx.pool) + " up?" + tail);
    }
    case EPERM:
    case EACCES: {
      const bool writes =
          ctx.op == "put" || ctx.op == "create" || ctx.op == "remove" || ctx.op == "write";
      return PermissionDenied(where + ": " + client + " may not " +
                              (writes ? "write to" : "read from") + " pool " +
                              std::string(ctx.pool) + " (refused by its cephx caps)" + tail);
    }
    case ENOSPC:
      return NoSpace(where + ": pool " + std::string(ctx.pool) +
                     " is full (the cluster is out of space)" + tail);
    case EDQUOT:
      return NoSpace(where + ": pool " + std::string(ctx.pool) + " is full (its quota is reached)" +
                     tail);
    case ESHUTDOWN:
    case ENOTCONN:
      return Unavailable(where + ": " + client +
                         " is not connected to the cluster (shut down or blocklisted)" + tail);
    case ECANCELED:
      return Cancelled(where + ": cancelled" + tail);
    case EFBIG:
      return InvalidArgument(where + ": larger than the cluster's osd_max_object_size" + tail);
    case EAGAIN:
    case EBUSY:
    case EINTR:
      return IoError(where + ": " + std::strerror(err) + tail, /*retryable=*/true);
    default:
      return IoError(where + ": " + std::strerror(err) + tail);
  }
}

Result<UriParts> ParseUri(std::string_view uri) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("store URI " + Quote(uri) + ": " + why +
                           " (expected rados://POOL[/PREFIX][?conf=PATH&id=NAME&keyring=PATH"
                           "&timeout_ms=N])");
  };
  constexpr std::string_view kScheme = "rados://";
  if (uri.size() < kScheme.size()) return bad("not a rados:// URI");
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(uri[i])) != kScheme[i]) {
      return bad("not a rados:// URI");
    }
  }
  std::string_view rest = uri.substr(kScheme.size());
  std::string_view query;
  if (const size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (rest.find('#') != std::string_view::npos) return bad("fragments ('#') are not allowed");

  auto decode = [&](std::string_view s) -> Result<std::string> {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != '%') {
        out += s[i];
        continue;
      }
      auto hex = [](char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
      };
      const int hi = i + 2 < s.size() ? hex(s[i + 1]) : -1;
      const int lo = i + 2 < s.size() ? hex(s[i + 2]) : -1;
      if (hi < 0 || lo < 0) return bad("bad percent escape");
      if (hi == 0 && lo == 0) return bad("contains %00");
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    }
    return out;
  };

  UriParts parts;
  const size_t slash = rest.find('/');
  STOKER_ASSIGN_OR_RETURN(parts.pool, decode(rest.substr(0, slash)));
  if (parts.pool.empty()) return bad("no pool");
  if (slash != std::string_view::npos) {
    std::string_view prefix = rest.substr(slash + 1);
    while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
    STOKER_ASSIGN_OR_RETURN(parts.prefix, decode(prefix));
    if (!parts.prefix.empty()) {
      if (Status st = ValidateKey(parts.prefix); !st.ok()) {
        return bad("prefix " + Quote(parts.prefix) + " is not a valid key: " + st.message());
      }
    }
  }
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view param = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (param.empty()) continue;
    const size_t eq = param.find('=');
    if (eq == std::string_view::npos) return bad("query parameter " + Quote(param) + " has no '='");
    const std::string_view name = param.substr(0, eq);
    STOKER_ASSIGN_OR_RETURN(std::string value, decode(param.substr(eq + 1)));
    if (value.empty()) return bad("query parameter " + Quote(name) + " is empty");
    if (name == "conf") {
      parts.conf = value;
    } else if (name == "id") {
      parts.id = value.starts_with("client.") ? value.substr(7) : value;
      if (parts.id.empty()) return bad("empty client id");
    } else if (name == "keyring") {
      parts.keyring = value;
    } else if (name == "timeout_ms") {
      char* end = nullptr;
      errno = 0;
      const long long ms = std::strtoll(value.c_str(), &end, 10);
      if (errno != 0 || end == value.c_str() || *end != '\0' || ms <= 0) {
        return bad("timeout_ms must be a positive number of milliseconds, not " + Quote(value));
      }
      parts.timeout = std::chrono::milliseconds(ms);
    } else {
      return bad("unknown query parameter " + Quote(name) +
                 " (known: conf, id, keyring, timeout_ms)");
    }
  }
  return parts;
}

namespace {

// The client id named in $CEPH_ARGS (--id X, --user X, --name client.X,
// -n client.X, or the --opt=X forms), as the `rados` command would take it;
// "" if none.
std::string IdFromCephArgs() {
  const char* env = std::getenv("CEPH_ARGS");
  if (env == nullptr) return "";
  std::vector<std::string> args;
  std::string cur;
  for (const char* p = env;; ++p) {
    if (*p == '\0' || *p == ' ' || *p == '\t' || *p == '\n') {
      if (!cur.empty()) args.push_back(std::move(cur));
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  std::string id;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    std::string value;
    bool is_name = false;
    for (std::string_view opt : {"--id", "--user", "--name", "-n"}) {
      if (a == opt && i + 1 < args.size()) {
        value = args[++i];
      } else if (a.starts_with(std::string(opt) + "=")) {
        value = std::string(a.substr(opt.size() + 1));
      } else {
        continue;
      }
      is_name = opt == "--name" || opt == "-n";
      break;
    }
    if (value.empty()) continue;
    if (is_name) {
      if (!value.starts_with("client.")) continue;  // not a client name
      value = value.substr(7);
    }
    id = value;  // the last one wins, as in Ceph's own parsing
  }
  return id;
}

std::string ConfGet(rados_t h, const char* option) {
  char buf[4096];
  if (rados_conf_get(h, option, buf, sizeof(buf)) != 0) return "";
  return buf;
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The conf file the default search (rados_conf_read_file(NULL)) reads, for
// messages: $CEPH_CONF, else the first of Ceph's default paths that exists.
std::string DefaultConfDescription() {
  if (const char* env = std::getenv("CEPH_CONF"); env != nullptr && *env != '\0') return env;
  std::vector<std::string> candidates = {"/etc/ceph/ceph.conf"};
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    candidates.push_back(std::string(home) + "/.ceph/ceph.conf");
  }
  candidates.push_back("ceph.conf");
  for (const std::string& c : candidates) {
    if (FileExists(c)) return c;
  }
  return "";
}

// The cluster handle and the pool's I/O context, shared by a store and its
// queues. Destroyed (rados_shutdown) by whoever drops the last reference,
// which is never a librados callback: queues hold it in their owner-side
// object, not in the state their callbacks touch.
struct Cluster {
  rados_t handle = nullptr;
  rados_ioctx_t io = nullptr;
  std::string pool;
  std::string prefix;  // "" or "PREFIX/"
  std::string client;  // "client.NAME"
  int timeout_s = 0;
  uint64_t max_object_bytes = 128ull << 20;

  Cluster() = default;
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;
  ~Cluster() {
    if (io != nullptr) rados_ioctx_destroy(io);
    if (handle != nullptr) rados_shutdown(handle);
  }

  std::string ObjectName(std::string_view key) const { return prefix + std::string(key); }

  Status Error(int rc, std::string_view op, std::string_view object) const {
    return ErrorToStatus(rc, {op, pool, object, client, timeout_s});
  }
};

Result<std::shared_ptr<Cluster>> Connect(const UriParts& parts, const StoreOptions& options) {
  auto cluster = std::make_shared<Cluster>();
  cluster->pool = parts.pool;
  cluster->prefix = parts.prefix.empty() ? "" : parts.prefix + "/";
  std::string id = parts.id.empty() ? IdFromCephArgs() : parts.id;
  if (id.empty()) id = "admin";
  cluster->client = "client." + id;
  const std::string& client = cluster->client;

  if (int rc = rados_create2(&cluster->handle, "ceph", client.c_str(), 0); rc < 0) {
    cluster->handle = nullptr;
    return ErrnoToStatus(-rc, "creating a Ceph client handle for " + client);
  }
  rados_t h = cluster->handle;

  std::string conf_desc;
  if (!parts.conf.empty()) {
    conf_desc = parts.conf;
    if (!FileExists(parts.conf)) {
      return NotFound("Ceph configuration " + parts.conf +
                      " (from the URI's conf=) does not exist");
    }
    if (int rc = rados_conf_read_file(h, parts.conf.c_str()); rc < 0) {
      return InvalidArgument("cannot read Ceph configuration " + parts.conf + ": " +
                             std::strerror(-rc));
    }
  } else {
    conf_desc = DefaultConfDescription();
    const char* env = std::getenv("CEPH_CONF");
    const int rc = rados_conf_read_file(h, nullptr);
    if (rc == -ENOENT && env != nullptr && *env != '\0') {
      return NotFound("Ceph configuration CEPH_CONF=" + std::string(env) + " does not exist");
    }
    if (rc < 0 && rc != -ENOENT) {
      return InvalidArgument("cannot read Ceph configuration " +
                             (conf_desc.empty() ? std::string("(default search)") : conf_desc) +
                             ": " + std::strerror(-rc));
    }
    if (rc == -ENOENT) conf_desc = "";
  }
  if (int rc = rados_conf_parse_env(h, "CEPH_ARGS"); rc < 0) {
    return InvalidArgument("cannot parse CEPH_ARGS: " + std::string(std::strerror(-rc)));
  }
  if (!parts.keyring.empty()) {
    if (!FileExists(parts.keyring)) {
      return NotFound("keyring " + parts.keyring + " (from the URI's keyring=) does not exist");
    }
    if (int rc = rados_conf_set(h, "keyring", parts.keyring.c_str()); rc < 0) {
      return InvalidArgument("keyring " + parts.keyring + ": " + std::strerror(-rc));
    }
  }

  std::chrono::milliseconds timeout = kDefaultTimeout;
  if (parts.timeout) {
    timeout = *parts.timeout;
  } else if (options.op_timeout.count() > 0) {
    timeout = options.op_timeout;
  }
  cluster->timeout_s = static_cast<int>(std::max<int64_t>(1, (timeout.count() + 999) / 1000));
  const std::string secs = std::to_string(cluster->timeout_s);
  for (const char* option :
       {"client_mount_timeout", "rados_mon_op_timeout", "rados_osd_op_timeout"}) {
    if (int rc = rados_conf_set(h, option, secs.c_str()); rc < 0) {
      return Internal(std::string("setting ") + option + ": " + std::strerror(-rc));
    }
  }

  const std::string mon_host = ConfGet(h, "mon_host");
  const std::string where = "cannot connect to the Ceph cluster (conf " +
                            (conf_desc.empty() ? std::string("none found") : conf_desc) + ", " +
                            client + (mon_host.empty() ? std::string() : ", mon_host " + mon_host) +
                            ")";
  if (mon_host.empty() && conf_desc.empty()) {
    return NotFound(where +
                    ": no Ceph configuration: set CEPH_CONF, add ?conf=PATH to the URI, or "
                    "create /etc/ceph/ceph.conf (or give --mon-host in CEPH_ARGS)");
  }
  if (int rc = rados_connect(h); rc < 0) {
    const std::string keyring = ConfGet(h, "keyring");
    switch (-rc) {
      case ETIMEDOUT:
        return TimedOut(where + ": no monitor answered within " + secs +
                        " s (client_mount_timeout); is the cluster up and mon_host right?");
      case EACCES:
      case EPERM:
        return PermissionDenied(where + ": cephx refused " + client +
                                " (wrong key, or no such client; keyring " + keyring + ")");
      case ENOENT:
        if (mon_host.empty()) {
          return NotFound(where + ": no monitor address (mon_host) in the configuration");
        }
        return NotFound(where + ": no keyring with a key for " + client + " (looked in " + keyring +
                        "; set keyring in the conf, or ?keyring=PATH)");
      default:
        return ErrnoToStatus(-rc, where);
    }
  }
  if (int rc = rados_ioctx_create(h, parts.pool.c_str(), &cluster->io); rc < 0) {
    cluster->io = nullptr;
    if (rc == -ENOENT) {
      return NotFound("pool " + Quote(parts.pool) + " does not exist in the Ceph cluster (conf " +
                      (conf_desc.empty() ? "none found" : conf_desc) + ", " + client + ")");
    }
    return cluster->Error(rc, "open pool", "");
  }
  if (const std::string max = ConfGet(h, "osd_max_object_size"); !max.empty()) {
    const unsigned long long v = std::strtoull(max.c_str(), nullptr, 10);
    if (v > 0) cluster->max_object_bytes = v;
  }
  return cluster;
}

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

  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& options) override {
    if (options.depth == 0) return InvalidArgument("ReadQueueOptions::depth must be at least 1");
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

  Status Put(std::string_view key, std::span<const std::byte> data) override {
    return Write(key, data, /*exclusive=*/false);
  }

  // One operation: an exclusive create (EEXIST, AlreadyExists, when the
  // object exists) and the write, applied together by the OSD.
  Status Create(std::string_view key, std::span<const std::byte> data) override {
    return Write(key, data, /*exclusive=*/true);
  }

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
    return StatAll(keys);
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

  Status Write(std::string_view key, std::span<const std::byte> data, bool exclusive) {
    STOKER_RETURN_IF_ERROR(ValidateKey(key));
    const std::string object = cluster_->ObjectName(key);
    if (data.size() > cluster_->max_object_bytes) {
      return InvalidArgument("put rados://" + cluster_->pool + "/" + object + ": " +
                             std::to_string(data.size()) +
                             " bytes is larger than a RADOS object may be (osd_max_object_size " +
                             std::to_string(cluster_->max_object_bytes) + " bytes)");
    }
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
