// The offline optimum of a node cache: Belady's MIN, which knows the whole
// read sequence, evicts the shard read again furthest in the future and may
// decline to cache a shard read again later than every cached one. Given the
// node's recorded reads (STOKER_CACHE_ACCESS_LOG, see policy.cc), it is the
// fewest bytes any cache of that size could have fetched for that sequence:
// what `stoker bench node` sets the planned policy's remote bytes against.
// It counts every shard the ranks read while it was not cached; with ranks
// that drift apart, a shard some rank still needs must stay, so this is above
// D * (1 - C / D) by what the drift costs.
//
// Thread safety: functions of their arguments.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stoker/status.h"

namespace stoker::cache_internal {

struct Access {
  uint64_t time_ns = 0;
  uint64_t epoch = 0;
  uint32_t shard = 0;
};

// The lines of an access log, in time order.
Result<std::vector<Access>> ReadAccessLog(const std::string& path);

// Bytes fetched per epoch (index = epoch) by MIN with `capacity` bytes
// (0: unlimited) over `reads`; shard_bytes[s] is shard s's size.
std::vector<uint64_t> OptimalRemoteBytes(std::span<const Access> reads,
                                         std::span<const uint64_t> shard_bytes, uint64_t capacity);

}  // namespace stoker::cache_internal
