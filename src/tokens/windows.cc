// TokenWindows: one epoch's window index over the documents' token counts
// (include/stoker/tokens.h; docs/architecture.md, "Token windows").
#include <algorithm>
#include <thread>
#include <vector>

#include "stoker/tokens.h"

namespace stoker {

namespace {

// Threads for a pass over `n` items: the machine's cores from 2^20 on.
uint64_t ThreadsFor(uint64_t n) {
  return n < (uint64_t{1} << 20) ? 1
                                 : std::clamp<uint64_t>(std::thread::hardware_concurrency(), 1, 64);
}

// Runs body(begin, end, t) over [0, n) split into `threads` chunks, one
// thread each.
template <typename Body>
void ForChunks(uint64_t n, uint64_t threads, Body body) {
  auto bound = [&](uint64_t t) { return n * t / threads; };
  if (threads == 1) return body(uint64_t{0}, n, uint64_t{0});
  std::vector<std::thread> pool;
  for (uint64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] { body(bound(t), bound(t + 1), t); });
  }
  for (auto& th : pool) th.join();
}

// Blocks [begin, end) of the epoch's order: their token counts `count(b)`
// summed into prefix[q + 1] from 0 (the chunk's own running sum); the index
// of block `last` in the order, where this chunk holds it, into *last_at.
// The permuted counts are random loads, each a cache miss on a large
// dataset: a run of block numbers is computed and their counts prefetched
// first, so that the misses overlap.
template <typename Count, typename Address>
uint64_t SumChunk(const Permutation* order, uint64_t begin, uint64_t end, uint64_t last,
                  uint64_t* prefix, uint64_t* last_at, Count count, Address address) {
  uint64_t total = 0;
  if (order == nullptr) {
    for (uint64_t q = begin; q < end; ++q) prefix[q + 1] = total += count(q);
    if (last >= begin && last < end) *last_at = last;
    return total;
  }
  constexpr uint64_t kRun = 64;
  uint64_t blocks[kRun];
  for (uint64_t q0 = begin; q0 < end; q0 += kRun) {
    const uint64_t m = std::min(kRun, end - q0);
    for (uint64_t i = 0; i < m; ++i) {
      blocks[i] = (*order)(q0 + i);
      __builtin_prefetch(address(blocks[i]));
    }
    for (uint64_t i = 0; i < m; ++i) {
      if (blocks[i] == last) *last_at = q0 + i;
      prefix[q0 + i + 1] = total += count(blocks[i]);
    }
  }
  return total;
}

}  // namespace

uint32_t TokenWindows::DocumentsPerBlock(uint64_t documents) {
  if (documents <= kFullShuffleDocuments) return 1;
  const uint64_t least = (documents + kFullShuffleDocuments - 1) / kFullShuffleDocuments;
  return uint32_t{1} << (64 - __builtin_clzll(least - 1));
}

TokenWindows TokenWindows::Build(std::span<const uint32_t> doc_tokens, uint32_t sequence_length,
                                 uint64_t dataset_id, bool shuffle, uint64_t seed, uint64_t epoch,
                                 uint32_t documents_per_block) {
  TokenWindows w;
  w.length_ = sequence_length;
  w.shuffle_ = shuffle;
  const uint64_t n = doc_tokens.size();
  const uint64_t per = documents_per_block != 0 ? documents_per_block : DocumentsPerBlock(n);
  w.block_ = uint32_t(per);
  w.documents_ = n;
  w.blocks_ = (n + per - 1) / per;
  const uint64_t nb = w.blocks_;
  if (per > 1) w.doc_tokens_ = doc_tokens;
  const uint64_t block_key = MixSeed({dataset_id, seed, epoch, 1});
  w.block_key_ = block_key;
  if (shuffle) w.block_order_ = Permutation(nb, block_key);
  // Blocks of several documents: their token counts first, in dataset order
  // (one sequential pass over the counts, by the machine's cores).
  std::vector<uint64_t> block_tokens;
  if (per > 1) {
    block_tokens.resize(nb);
    ForChunks(nb, ThreadsFor(n), [&](uint64_t begin, uint64_t end, uint64_t) {
      for (uint64_t b = begin; b < end; ++b) {
        const uint64_t d0 = b * per, d1 = std::min(n, d0 + per);
        uint64_t sum = 0;
        for (uint64_t d = d0; d < d1; ++d) sum += doc_tokens[d];
        block_tokens[b] = sum;
      }
    });
  }
  auto count = [&](uint64_t b) -> uint64_t {
    return per > 1 ? block_tokens[b] : doc_tokens[b];
  };
  auto address = [&](uint64_t b) -> const void* {
    return per > 1 ? static_cast<const void*>(&block_tokens[b]) : &doc_tokens[b];
  };
  w.prefix_.resize(nb + 1);
  uint64_t* prefix = w.prefix_.data();
  prefix[0] = 0;
  const Permutation* order = shuffle ? &w.block_order_ : nullptr;
  // Chunks of the order summed by the machine's cores (each permuted block
  // costs a few rounds of the Feistel network and a cache miss), then each
  // chunk's sums offset by the chunks before it.
  const uint64_t threads = ThreadsFor(nb);
  std::vector<uint64_t> chunk_total(threads, 0);
  const uint64_t last = nb == 0 ? 0 : nb - 1;
  ForChunks(nb, threads, [&](uint64_t begin, uint64_t end, uint64_t t) {
    chunk_total[t] = SumChunk(order, begin, end, last, prefix, &w.short_at_, count, address);
  });
  if (threads > 1) {
    std::vector<uint64_t> offsets(threads);
    uint64_t offset = 0;
    for (uint64_t t = 0; t < threads; ++t) offsets[t] = offset, offset += chunk_total[t];
    ForChunks(nb, threads, [&](uint64_t begin, uint64_t end, uint64_t t) {
      if (t == 0) return;
      for (uint64_t q = begin; q < end; ++q) prefix[q + 1] += offsets[t];
    });
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

uint64_t TokenWindows::BlockSize(uint64_t b) const {
  return b + 1 < blocks_ ? block_ : documents_ - b * block_;
}

uint64_t TokenWindows::DocOfBlock(uint64_t b, uint64_t r) const {
  if (!shuffle_ || block_ == 1) return b * block_ + r;
  return b * block_ + Permutation(BlockSize(b), MixSeed({block_key_, b}))(r);
}

uint64_t TokenWindows::DocAt(uint64_t j) const {
  // Every block of the order holds block_ documents but the last block of
  // the dataset (index short_at_ in the order), which holds `tail`.
  const uint64_t tail = documents_ - (blocks_ - 1) * block_;
  const uint64_t before_short = short_at_ * block_;
  uint64_t q, r;
  if (j < before_short) {
    q = j / block_, r = j % block_;
  } else if (j < before_short + tail) {
    q = short_at_, r = j - before_short;
  } else {
    q = (j - tail) / block_ + 1, r = (j - tail) % block_;
  }
  return DocOfBlock(BlockAt(q), r);
}

void TokenWindows::Pieces(uint64_t k, std::vector<TokenPiece>* out) const {
  const uint64_t begin = k * length_, end = begin + length_ + 1;
  // The block holding token `begin`: the last q with prefix[q] <= begin (an
  // empty block's q shares its prefix with the next, so upper_bound lands
  // past them).
  uint64_t q =
      uint64_t(std::upper_bound(prefix_.begin(), prefix_.end(), begin) - prefix_.begin()) - 1;
  uint64_t at = begin;
  for (; at < end && q < blocks_; ++q) {
    if (prefix_[q + 1] <= at) continue;
    const uint64_t b = BlockAt(q);
    if (block_ == 1) {
      const uint64_t stop = std::min(end, prefix_[q + 1]);
      out->push_back({b, at - prefix_[q], static_cast<uint32_t>(stop - at)});
      at = stop;
      continue;
    }
    // The block's documents in its order, each document's tokens after the
    // ones before it in the block.
    const uint64_t size = BlockSize(b);
    const Permutation inner(shuffle_ ? size : 0, MixSeed({block_key_, b}));
    uint64_t doc_begin = prefix_[q];
    for (uint64_t r = 0; r < size && at < end; ++r) {
      const uint64_t d = b * block_ + (shuffle_ ? inner(r) : r);
      const uint64_t doc_end = doc_begin + doc_tokens_[d];
      if (doc_end > at) {
        const uint64_t stop = std::min(end, doc_end);
        out->push_back({d, at - doc_begin, static_cast<uint32_t>(stop - at)});
        at = stop;
      }
      doc_begin = doc_end;
    }
  }
}

}  // namespace stoker
