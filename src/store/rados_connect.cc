// The Ceph RADOS store's connection (rados_cluster.h): the URI's grammar,
// the one mapping of librados return codes to Status, and Connect, which
// reads the configuration the way the `rados` command does and names the
// conf, the client and the monitors when it cannot connect.
#include <rados/librados.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "store/rados_cluster.h"
#include "store/store_internal.h"

namespace stoker::rados {

namespace {

using store_internal::Quote;

// Default of StoreOptions::op_timeout for RADOS: long enough for an OSD to be
// marked down and its PGs to peer elsewhere (heartbeat grace, 20 s by
// default), short enough that a dead cluster is reported in reasonable time.
constexpr std::chrono::milliseconds kDefaultTimeout{30000};


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


}  // namespace

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

}  // namespace stoker::rados
