// TokenWindows: one epoch's window index over the documents' token counts
// (include/stoker/tokens.h; docs/architecture.md, "Token windows").
#include <algorithm>
#include <thread>
#include <vector>

#include "stoker/tokens.h"

namespace stoker {

namespace {

// Documents [begin, end) of the epoch's order: their lengths summed into
// prefix[j + 1] from 0 (the chunk's own running sum). The permuted lengths
// are random loads, each a cache miss on a large dataset: a block's
// document numbers are computed and their lengths prefetched first, so
// that the misses overlap.
uint64_t SumChunk(std::span<const uint32_t> lens, const Permutation* order, uint64_t begin,
                  uint64_t end, uint64_t* prefix) {
  uint64_t total = 0;
  if (order == nullptr) {
    for (uint64_t j = begin; j < end; ++j) prefix[j + 1] = total += lens[j];
    return total;
  }
  constexpr uint64_t kBlock = 64;
  uint64_t docs[kBlock];
  for (uint64_t j0 = begin; j0 < end; j0 += kBlock) {
    const uint64_t m = std::min(kBlock, end - j0);
    for (uint64_t i = 0; i < m; ++i) {
      docs[i] = (*order)(j0 + i);
      __builtin_prefetch(&lens[docs[i]]);
    }
    for (uint64_t i = 0; i < m; ++i) prefix[j0 + i + 1] = total += lens[docs[i]];
  }
  return total;
}

}  // namespace

TokenWindows TokenWindows::Build(std::span<const uint32_t> doc_tokens, uint32_t sequence_length,
                                 uint64_t dataset_id, bool shuffle, uint64_t seed, uint64_t epoch) {
  TokenWindows w;
  w.length_ = sequence_length;
  w.shuffle_ = shuffle;
  const uint64_t n = doc_tokens.size();
  if (shuffle) w.doc_order_ = Permutation(n, MixSeed({dataset_id, seed, epoch, 1}));
  w.prefix_.resize(n + 1);
  uint64_t* prefix = w.prefix_.data();
  prefix[0] = 0;
  const Permutation* order = shuffle ? &w.doc_order_ : nullptr;
  // Chunks of the order summed by the machine's cores (each permuted
  // document costs a few rounds of the Feistel network and a cache miss),
  // then each chunk's sums offset by the chunks before it.
  const uint64_t threads = n < (uint64_t{1} << 20)
                               ? 1
                               : std::clamp<uint64_t>(std::thread::hardware_concurrency(), 1, 64);
  std::vector<uint64_t> chunk_total(threads, 0);
  auto bounds = [&](uint64_t t) { return n * t / threads; };
  if (threads == 1) {
    chunk_total[0] = SumChunk(doc_tokens, order, 0, n, prefix);
  } else {
    std::vector<std::thread> pool;
    for (uint64_t t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        chunk_total[t] = SumChunk(doc_tokens, order, bounds(t), bounds(t + 1), prefix);
      });
    }
    for (auto& th : pool) th.join();
    pool.clear();
    uint64_t offset = 0;
    std::vector<uint64_t> offsets(threads);
    for (uint64_t t = 0; t < threads; ++t) offsets[t] = offset, offset += chunk_total[t];
    for (uint64_t t = 1; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (uint64_t j = bounds(t); j < bounds(t + 1); ++j) prefix[j + 1] += offsets[t];
      });
    }
    for (auto& th : pool) th.join();
  }
  uint64_t total = 0;
  for (uint64_t c : chunk_total) total += c;
  // Window k needs tokens [kL, kL + L + 1): the last one starts at most at
  // T - L - 1.
  w.windows_ =
      (sequence_length == 0 || total <= sequence_length) ? 0 : (total - 1) / sequence_length;
  if (shuffle) w.window_order_ = Permutation(w.windows_, MixSeed({dataset_id, seed, epoch, 2}));
  return w;
}

void TokenWindows::Pieces(uint64_t k, std::vector<TokenPiece>* out) const {
  const uint64_t begin = k * length_, end = begin + length_ + 1;
  // The document holding token `begin`: the last j with prefix[j] <= begin
  // (an empty document's j shares its prefix with the next, so upper_bound
  // lands past them).
  uint64_t j =
      uint64_t(std::upper_bound(prefix_.begin(), prefix_.end(), begin) - prefix_.begin()) - 1;
  uint64_t at = begin;
  while (at < end && j + 1 < prefix_.size()) {
    const uint64_t doc_end = prefix_[j + 1];
    if (doc_end > at) {
      const uint64_t stop = std::min(end, doc_end);
      out->push_back({DocAt(j), at - prefix_[j], static_cast<uint32_t>(stop - at)});
      at = stop;
    }
    ++j;
  }
}

}  // namespace stoker
