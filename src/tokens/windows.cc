// TokenWindows: one epoch's window index over the documents' token counts
// (include/stoker/tokens.h; docs/architecture.md, "Token windows").
#include <algorithm>

#include "stoker/tokens.h"

namespace stoker {

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
  uint64_t total = 0;
  if (shuffle) {
    for (uint64_t j = 0; j < n; ++j) prefix[j + 1] = total += doc_tokens[w.doc_order_(j)];
  } else {
    for (uint64_t j = 0; j < n; ++j) prefix[j + 1] = total += doc_tokens[j];
  }
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
