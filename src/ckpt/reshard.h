// Resharding at load (docs/checkpoint.md §6): which bytes of which stored
// pieces fill a destination that is a piece of a global tensor, found by
// interval intersection over the stored pieces of each tensor (sorted by
// their first dimension, or by flat start), never by trying every pair.
// Internal.
//
// Thread safety: free functions over values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stoker/checkpoint.h"

namespace stoker::ckpt {

// Elements of `shape`, or -1 for a negative entry or more than 2^58 (the
// bound of a tensor's shape, docs/checkpoint.md §3.2).
int64_t Numel(std::span<const int64_t> shape);

// Empty when `l` is a valid layout for a tensor of `shape`, else what is
// wrong with it.
std::string LayoutProblem(const TensorLayout& l, std::span<const int64_t> shape);

// One copy of a resharded restore: `bytes` bytes at `stream_offset` of rank
// `rank`'s stream into `dst`.
struct PieceCopy {
  uint32_t rank = 0;
  uint64_t stream_offset = 0;
  std::byte* dst = nullptr;
  uint64_t bytes = 0;
  int device = -1;  // dst is memory of this CUDA device (-1: host)
};

// The copies that fill every destination of `dst` (each with a layout other
// than kWhole) from the pieces the ranks of `m` saved. Before anything is
// read: InvalidArgument naming the tensor and both layouts for a
// destination whose dtype, global shape or own layout does not fit what was
// saved; NotFound naming the tensor, the elements no piece holds and the
// ranks that saved none of it; Corruption where saved pieces overlap.
Result<std::vector<PieceCopy>> PlanReshard(const CheckpointManifest& m,
                                           std::span<const TensorDestination> dst,
                                           const std::string& where);

}  // namespace stoker::ckpt
