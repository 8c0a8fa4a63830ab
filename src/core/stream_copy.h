// Copies with streaming (non-temporal) stores (internal).
#pragma once

#include <cstddef>

namespace stoker {

// Copies `n` bytes with streaming stores, which write whole lines to memory
// without first reading the destination into the cache (and evicting what
// the core works on): for a destination read next by another thread, much
// later, or by a device's DMA, never from this core's cache. memcpy at large
// sizes reads each destination line before writing it. The stores are weakly
// ordered: StreamFence() before the memory is handed to anyone else.
void StreamCopy(std::byte* dst, const std::byte* src, size_t n);
void StreamFence();

}  // namespace stoker
