// Private to the store module: the Ceph RADOS backend (rados://POOL/PREFIX),
// built when STOKER_WITH_RADOS is on.
//
// What the rest of stoker sees is only the Store interface (stoker/store.h),
// reached through OpenStore. This header exists so that store.cc can dispatch
// to the backend and tests/rados_test.cc can check the two pieces that have
// rules of their own: the URI's grammar and the one mapping of librados
// return codes to Status.
//
// Thread safety: the functions are reentrant.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker {

// Opens the pool named by a rados:// URI:
//
//   rados://POOL[/PREFIX][?conf=PATH&id=NAME&keyring=PATH&timeout_ms=N]
//
// The configuration comes from the usual places, later ones overriding
// earlier ones: the conf file (?conf=, else $CEPH_CONF, else
// /etc/ceph/ceph.conf, ~/.ceph/ceph.conf, ./ceph.conf), then $CEPH_ARGS
// (e.g. "--id stoker-train --keyring /k"), then the URI's query. The client
// is ?id=, else --id/--user/--name in $CEPH_ARGS, else "admin", as with the
// `rados` command. Object keys become RADOS object names PREFIX + "/" + key
// (just key without a PREFIX).
//
// Timeouts: ?timeout_ms=, else StoreOptions::op_timeout, else 30 s, sets
// client_mount_timeout (connecting), rados_mon_op_timeout and
// rados_osd_op_timeout (every object operation), so that a dead or
// unreachable cluster is an error (TimedOut, retryable), never a hang. Ceph
// takes these in whole seconds: the value is rounded up, 1 s at least.
//
// Errors name the conf, the client and the monitors for connection
// failures, and the pool for a missing pool (NotFound).
Result<std::shared_ptr<Store>> NewRadosStore(std::string_view uri, const StoreOptions& options);

namespace rados {

// The parts of a rados:// URI (percent-decoded).
struct UriParts {
  std::string pool;
  std::string prefix;   // "" or a valid key (no leading or trailing '/')
  std::string conf;     // ?conf=; "" = the default search
  std::string id;       // ?id=, without "client."; "" = from CEPH_ARGS, else admin
  std::string keyring;  // ?keyring=; "" = from the conf
  std::optional<std::chrono::milliseconds> timeout;  // ?timeout_ms=
};

// InvalidArgument naming the URI and what is wrong with it (no pool, an
// unknown query parameter, a prefix that is not a valid key, ...).
Result<UriParts> ParseUri(std::string_view uri);

// Where a librados call failed, for the message.
struct ErrorContext {
  std::string_view op;  // "read", "put", "stat", "list", "remove", "open pool", ...
  std::string_view pool;
  std::string_view object;  // RADOS object name; may be empty
  std::string_view client;  // "client.stoker-train"
  int timeout_s = 0;        // the configured operation timeout, for ETIMEDOUT
};

// The one mapping of librados return codes (negative errno values; a
// positive value is taken as its negation) to Status:
//   -ENOENT                NotFound
//   -ETIMEDOUT             TimedOut (retryable)
//   -EPERM, -EACCES        PermissionDenied, naming the pool and the client
//   -ENOSPC, -EDQUOT       NoSpace ("pool full")
//   -ESHUTDOWN, -ENOTCONN  Unavailable (retryable); ESHUTDOWN is also what
//                          a blocklisted client gets
//   -ECANCELED             Cancelled
//   -EFBIG                 InvalidArgument (larger than osd_max_object_size)
//   anything else          IoError (retryable for EAGAIN, EBUSY, EINTR, EIO)
// The message reads "OP rados://POOL/OBJECT: what happened (ERRNO_NAME)".
Status ErrorToStatus(int rc, const ErrorContext& context);

}  // namespace rados
}  // namespace stoker
