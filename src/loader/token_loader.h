// The loader of token windows (LoaderOptions::sequence_length > 0;
// internal): Loader::Open hands over to it once the manifest is read.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loader/batch_memory.h"
#include "loader/counters.h"
#include "stoker/loader.h"
#include "stoker/tokens.h"

namespace stoker {

// `store` is the (retrying) store the manifest was read from.
Result<std::unique_ptr<Loader>> OpenTokenLoader(std::shared_ptr<Store> store,
                                                format::Manifest manifest,
                                                const LoaderOptions& options,
                                                std::shared_ptr<LoaderCounters> counters);

// Checks the options that token windows do not combine with: InvalidArgument
// naming the option.
Status CheckTokenOptions(const LoaderOptions& options);

// ---- batches of windows, shared with the mixture (stoker/mix.h) ----

struct TokenBatchSpec {
  uint32_t sequence_length = 0;
  format::DType dtype = format::DType::kInt64;  // kInt64 or kInt32
  bool positions = false;                       // "positions" and "documents" columns
  bool sources = false;                         // an int64 "source" column (the mixture's)
};

// Parses LoaderOptions::sequence_dtype: "int64" or "int32".
Result<format::DType> TokenDType(std::string_view name);

// Builds a batch of n windows: `tokens` holds their tokens, n x (L + 1) of
// spec.dtype, window w's pieces are pieces[first[w], first[w + 1]) (first
// has n + 1 entries), `ids` their sample ids (window numbers), `sources`
// (spec.sources) each window's source.
Result<Batch> BuildTokenBatch(BufferPool& pool, const TokenBatchSpec& spec,
                              std::span<const std::byte> tokens, std::span<const TokenPiece> pieces,
                              std::span<const size_t> first, std::span<const uint64_t> ids,
                              std::span<const int64_t> sources, uint64_t epoch, uint64_t index,
                              LoaderState state_after);

}  // namespace stoker
