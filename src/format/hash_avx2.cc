// xxh3-64 compiled for AVX2, called only where the CPU has it (see hash.cc).
// XXH3 gives the same value on every code path; only the speed differs:
// Debian's libxxhash is built for the SSE2 baseline, and the checksum is on
// the loader's hot path (every delivered byte is hashed once).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstddef>
#include <cstdint>

namespace stoker::format::internal {

uint64_t Hash64Avx2(const void* data, size_t size) { return XXH3_64bits(data, size); }

}  // namespace stoker::format::internal
