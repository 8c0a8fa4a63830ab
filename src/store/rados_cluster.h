// Private to the RADOS store: the cluster handle a store and its read
// queues share, and Connect (rados_connect.cc), which makes it.
//
// Thread safety: a Cluster's handles are librados', thread-safe for the
// calls the store makes; Connect is reentrant.
#pragma once

#include <rados/librados.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "store/rados_store.h"

namespace stoker::rados {

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

Result<std::shared_ptr<Cluster>> Connect(const UriParts& parts, const StoreOptions& options);

}  // namespace stoker::rados
