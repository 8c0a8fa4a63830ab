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

void Hash64Avx2Update(void* state, const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}
uint64_t Hash64Avx2Digest(const void* state) {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state));
}

}  // namespace stoker::format::internal
