// Mixtures: token windows drawn from several token datasets by weight,
// exact in every global batch and resumable on any world size
// (docs/architecture.md, "Mixtures").
//
// The stream is a function of (sources, weights, seed, global batch size)
// alone, step by step: at step s, each source i's share of the global batch
// of B windows is floor(w_i B) or floor(w_i B) + 1 (w normalised to sum 1),
// the sources that get the extra one being drawn by systematic sampling
// from (seed, s), so that each share is within ±1 of w_i B in every batch
// and exactly w_i B on average. Source i's windows are its own stream: its
// position p_i counts the windows it has given, across its own epochs
// (epoch p_i / W_i, where W_i is its windows per epoch, each epoch in the
// order TokenWindows gives it): a small source repeats, a large one does
// not, and no source's window is given twice within one of its epochs. The
// B windows of a step are put in an order drawn from (seed, s) and cut into
// world_size equal parts: rank r gets part r (B / world_size windows).
//
// The state is the step and one position per source. A weight schedule
// (MixOptions::schedule) changes the weights from a given step on: the
// positions go on from where they are, so nothing consumed repeats early
// and nothing is skipped.
//
// Thread safety: a Mix is used by one thread at a time; it reads ahead on a
// thread of its own. MixCounts is a pure function.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/loader.h"
#include "stoker/status.h"
#include "stoker/store.h"

namespace stoker {

struct MixSource {
  std::string uri;
  double weight = 1;  // > 0 and finite; the weights need not sum to 1
  // Must equal the mixture's (MixOptions::sequence_length) when set.
  // Default: 0 = the mixture's.
  uint32_t sequence_length = 0;
  // The token field. Default: "" (TokenDatasetOptions::field).
  std::string field;
};

// From step `step` on, the weights are `weights` (one per source, each > 0).
struct MixSchedulePoint {
  uint64_t step = 0;
  std::vector<double> weights;
};

inline constexpr uint32_t kMixStateVersion = 1;

// Where a mixture stands: the next step and each source's position (its
// windows given, across its epochs), with the identity it was saved under.
struct MixState {
  uint32_t version = kMixStateVersion;
  uint64_t step = 0;
  std::vector<uint64_t> positions;  // one per source
  // The identity (checked on resume): each source's dataset id, the weights
  // of the last step taken (the first step's at step 0), seed, shuffle,
  // sequence length and global batch size.
  std::vector<std::string> dataset_ids;
  std::vector<double> weights;
  uint64_t seed = 0;
  bool shuffle = true;
  uint32_t sequence_length = 0;
  uint32_t batch_size = 0;
};

struct MixOptions {
  // The global batch: windows per step over all ranks, a multiple of
  // world_size. Default: 256.
  uint32_t batch_size = 256;
  // L: each window is L + 1 tokens. Required (>= 1).
  uint32_t sequence_length = 0;
  // As LoaderOptions' sequence_dtype, sequence_positions and sequence_verify.
  std::string sequence_dtype = "int64";
  bool sequence_positions = false;
  bool sequence_verify = true;
  // Default: on: each source's documents and windows shuffled per its epoch
  // (TokenWindows), and each step's windows put in a drawn order.
  bool shuffle = true;
  uint64_t seed = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // Weight changes, by increasing step >= 1. Default: none.
  std::vector<MixSchedulePoint> schedule;
  // Where Open starts. Default: step 0, every position 0. A state saved by
  // another mixture (other sources, weights, seed, shuffle, sequence length
  // or batch size) is refused.
  MixState start;
  // Steps built ahead of the consumer. Default: 4.
  uint32_t prefetch_batches = 4;
  // Sources opened at once. Default: 0 = 8.
  uint32_t open_threads = 0;
  StoreOptions store;
};

// Each source's share of a global batch of `batch` windows at `step`:
// floor(q_i) or floor(q_i) + 1 with q_i = w_i / sum(w) x batch, summing to
// `batch`, the extra ones drawn by systematic sampling from (seed, step).
std::vector<uint32_t> MixCounts(std::span<const double> weights, uint32_t batch, uint64_t seed,
                                uint64_t step);

struct MixStats {
  uint64_t steps = 0;                   // steps delivered
  uint64_t bytes_read = 0;              // indexes at open, then windows
  std::vector<uint64_t> windows;        // per source: windows this rank delivered
  std::vector<uint64_t> epoch_windows;  // per source: W_i
  double open_seconds = 0;
};

class Mix {
 public:
  // Opens every source (as a TokenDataset: its manifest and the shards'
  // indexes). InvalidArgument naming the source (its number and URI): a
  // weight <= 0 or not finite, another sequence length, a source without
  // windows of L + 1 tokens, a schedule point of the wrong size or order;
  // and batch_size not a multiple of world_size.
  static Result<std::unique_ptr<Mix>> Open(std::vector<MixSource> sources,
                                           const MixOptions& options);
  virtual ~Mix() = default;

  // This rank's part of the next step: a Batch of batch_size / world_size
  // windows ("tokens", as the loader's; "source": each window's source
  // number; sample_ids: the window's number within its source's epoch).
  // A mixture never ends: sources start their next epochs as they run out.
  virtual Result<Batch> Next() = 0;
  // The state after the last batch Next() returned (the start state before).
  virtual MixState state() const = 0;
  // Whether this mixture may resume from `s`: InvalidArgument naming what
  // differs.
  virtual Status CheckState(const MixState& s) const = 0;
  virtual MixStats stats() const = 0;
  virtual const std::vector<MixSource>& sources() const = 0;
  // The weights in effect at `step` (the schedule applied).
  virtual std::vector<double> WeightsAt(uint64_t step) const = 0;
};

}  // namespace stoker
