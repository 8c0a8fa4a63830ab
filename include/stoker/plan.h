// The epoch plan: which samples, in which order, for which rank.
//
// The plan depends only on (dataset identity, seed, epoch, rank, world size),
// so every machine computes the same order every time, with no coordination.
// The random generator and the permutation are stoker's own code (not
// std::shuffle or std::uniform_int_distribution, whose output differs between
// standard libraries).
//
// The order is global: it is fixed by (dataset, seed, epoch) alone, and its
// memory is that of the shards, not of the samples (order version 2,
// kPlanOrderVersion; docs/architecture.md "The epoch order"):
//   1. The shards are permuted (Fisher-Yates with Rng, one draw per shard).
//   2. Consecutive groups of `shuffle_window_shards` shards (in that order)
//      form windows. The concatenated windows are the epoch's global order:
//      positions 0..N-1, window w covering its shards' sample count.
//   3. Within a window of M samples, offset i holds the window's sample
//      Permutation(M, key)(i): a keyed Feistel bijection on [0, M) (six
//      rounds over the smallest even number of bits that covers M, cycle
//      walking back into range), the key MixSeed(dataset, seed, epoch,
//      window). A window's i-th sample is the sample at offset i of its
//      shards' samples in window order.
// Nothing per sample is stored: SampleAtPosition and RankSample are a binary
// search over the shards and a few rounds of mixing, O(log shards) per call.
// Ranks take their share of it, strided: rank r's j-th sample is at global
// position start + j * world_size + r. A position counts global samples
// consumed, so a resume state (epoch, position) means the same thing for any
// world size. Every rank gets the same number of batches:
//   drop_last: each rank gets floor(remaining / (world * batch)) full batches;
//              the tail of the order is not delivered this epoch.
//   pad:       each rank gets ceil(remaining / world) samples; positions past
//              the end wrap around to the start of the order (those samples
//              are marked as padding). The last batch may be short, equally on
//              every rank.
//
// Node affinity (PlanOptions::node_affinity, off by default): the ranks are
// grouped into nodes of ranks_per_node consecutive ranks, and each shard
// belongs to one node for the whole run (a permutation fixed by (dataset,
// seed), cut into equal parts), so that a node's cache needs only its part
// of the dataset. Each epoch, a node's part is shuffled as above (shards,
// then windows) into the node's order, which its ranks take strided: rank r
// (node k, local rank l) gets node k's positions j * ranks_per_node + l.
// Every rank gets the same count: that of the largest part (the others wrap
// around, marked as padding), or with drop_last full batches of the smallest.
// The global order is the nodes' orders one after another. The trade-off: a
// sample only ever meets the samples of its node's part in a batch, and a
// node only ever trains on its part (the mix across nodes happens in the
// gradient all-reduce only), which is less random than the global shuffle
// (the default); in exchange each node's storage traffic is 1/nodes.
// A position then counts steps: position = steps consumed x world (which
// may pass the sample count, parts being uneven), so it resumes on the same
// world and node count only (Make refuses a position that is not a whole
// step).
//
// Thread safety: an EpochPlan is immutable after Make; share it freely.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "stoker/status.h"

namespace stoker {

// xoshiro256** seeded through splitmix64: small, fast, and specified bit for
// bit, so the same seed gives the same stream on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  // Uniform in [0, n), n > 0: Lemire's multiply-shift with rejection, so
  // there is no modulo bias.
  uint64_t Below(uint64_t n);

 private:
  uint64_t s_[4];
};

// Mixes values into one 64-bit seed (splitmix64 finaliser chain).
uint64_t MixSeed(std::initializer_list<uint64_t> values);

// Fisher–Yates shuffle with Rng::Below; the same on every machine.
template <typename T>
void Permute(std::span<T> items, Rng& rng) {
  for (size_t i = items.size(); i > 1; --i) {
    size_t j = static_cast<size_t>(rng.Below(i));
    std::swap(items[i - 1], items[j]);
  }
}

// The order's version: 1 materialised every sample's position (stoker up to
// the eighth session of 2026-12-05); 2 permutes within a window on demand
// (above). A resume position only means the same samples under one version.
inline constexpr uint32_t kPlanOrderVersion = 2;

// A keyed bijection of [0, n): a Feistel network over 2h bits (h = half the
// bits of n - 1, rounded up), cycle-walked into range (under 4 rounds of the
// network on average, as 2^2h < 4n). O(1) memory; pure function of (n, key).
class Permutation {
 public:
  Permutation(uint64_t n, uint64_t key);
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  static constexpr int kRounds = 6;
  uint64_t Encrypt(uint64_t x) const;
  uint64_t n_ = 0;
  uint32_t half_bits_ = 0;
  uint64_t mask_ = 0;
  uint64_t keys_[kRounds] = {};
};

struct PlanOptions {
  uint64_t seed = 0;
  // Default: on. Off gives the packed order (shards in order, samples in order).
  bool shuffle = true;
  // Samples are shuffled among this many shards at a time; more mixes better
  // and costs that many shards of memory in the loader. Default: 8.
  uint32_t shuffle_window_shards = 8;
  uint32_t batch_size = 1;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // Default: off (pad, so no sample is skipped).
  bool drop_last = false;
  // Node affinity (see above). Default: off, the global shuffle.
  bool node_affinity = false;
  // Ranks per node for node affinity; must divide world_size. Default: 0 =
  // every rank on one node (affinity then changes nothing but positions).
  uint32_t ranks_per_node = 0;
};

// One stretch of this rank's share that reads one window: its steps (indices
// into the rank's share) and the window's shards, as slots (indices into
// EpochPlan::ShardAtSlot): all of the window's when it is shuffled, only
// those holding the visit's steps when not. A rank visits windows in order; padding that wraps
// around visits the first windows again. Every step of the share lies in
// exactly one visit, and visits are in order of step.
struct RankVisit {
  uint64_t first_step = 0;
  uint64_t last_step = 0;  // inclusive
  uint32_t first_slot = 0;
  uint32_t end_slot = 0;
};

class EpochPlan {
 public:
  // `shard_samples[i]` is the sample count of shard i (global sample ids are
  // assigned in shard order). `start_position` resumes mid-epoch: the global
  // position of the first sample not yet consumed (0..N). Costs O(shards)
  // time and memory (O(shards log shards) with node affinity).
  static Result<EpochPlan> Make(uint64_t dataset_id, std::span<const uint32_t> shard_samples,
                                const PlanOptions& options, uint64_t epoch,
                                uint64_t start_position = 0);

  // The same epoch for another rank of the same world: shares the order
  // (O(1) memory), so a node's ranks cost one order, not one each.
  Result<EpochPlan> ForRank(uint32_t rank) const;

  uint64_t epoch() const { return epoch_; }
  uint64_t dataset_samples() const;
  uint64_t start_position() const { return start_; }
  uint32_t rank() const { return rank_; }

  // The global order: the sample id at global position p (p < N).
  // O(log shards).
  uint64_t SampleAtPosition(uint64_t p) const;

  // This rank's share, from the start position on.
  uint64_t rank_samples() const { return rank_samples_; }
  uint64_t num_batches() const { return num_batches_; }
  uint64_t batch_size() const { return batch_; }
  // The j-th sample of this rank (j < rank_samples()). O(log shards).
  uint64_t RankSample(uint64_t j) const;
  // Where the j-th sample of this rank lies: its id, and the slot of its
  // shard (ShardAtSlot(slot) is its shard). O(log shards).
  uint64_t RankSampleSlot(uint64_t j, uint32_t* slot) const;
  // Whether the j-th sample of this rank is padding (a repeat past the end).
  bool IsPadding(uint64_t j) const;
  // Samples [first, first+count) of this rank form batch b.
  void BatchRange(uint64_t b, uint64_t* first, uint64_t* count) const;
  // The global position once every rank has consumed `batches` batches:
  // the resume state's position (never past N).
  uint64_t PositionAfter(uint64_t batches) const;

  // The shard order: slot k holds shard ShardAtSlot(k) (k < num_slots(), the
  // shard count); windows are runs of consecutive slots.
  uint32_t num_slots() const;
  uint32_t ShardAtSlot(uint32_t slot) const;
  // This rank's windows in the order it reads them, from the start position
  // on: O(windows) (per wrap-around of the padding).
  std::vector<RankVisit> RankVisits() const;

 private:
  struct Order;
  // Position p of the global order -> its slot and sample id.
  uint64_t Locate(uint64_t p, uint32_t* slot) const;
  // Visits of an arithmetic walk q = offset + j * stride (j < count) over
  // one segment's positions [0, period), wrapping around.
  void AppendVisits(uint32_t segment, uint64_t offset, uint64_t stride, uint64_t count,
                    std::vector<RankVisit>* out) const;
  Status SetRank(const PlanOptions& o);
  std::shared_ptr<const Order> order_;
  PlanOptions options_;
  uint64_t epoch_ = 0;
  uint64_t start_ = 0;
  uint32_t rank_ = 0;
  uint32_t world_ = 1;
  uint32_t batch_ = 1;
  uint64_t rank_samples_ = 0;
  uint64_t num_batches_ = 0;
  // Node affinity: this rank's node's order is positions [node_begin_,
  // node_begin_ + node_samples_), taken with stride per_node_ from local_
  // after start_step_ steps.
  bool affinity_ = false;
  uint32_t node_ = 0;
  uint64_t node_begin_ = 0, node_samples_ = 0, start_step_ = 0, end_position_ = 0;
  uint32_t per_node_ = 1, local_ = 0;
};

}  // namespace stoker
