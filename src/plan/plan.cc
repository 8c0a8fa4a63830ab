#include "stoker/plan.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace stoker {
namespace {

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// Stream labels, so the shard permutation and each window's permutation draw
// from independent generators.
constexpr uint64_t kShardStream = 0x5348415244ull;     // "SHARD"
constexpr uint64_t kWindowStream = 0x57494e444f57ull;  // "WINDOW"
constexpr uint64_t kNodeStream = 0x4e4f4445ull;        // "NODE"

// Shards in `shard_order` (in that order) cut into windows whose samples are
// permuted together, appended to `order` (see plan.h). `stream` keeps each
// node's windows apart from the others'.
void AppendWindows(std::span<const uint32_t> shard_order, std::span<const uint64_t> first,
                   const PlanOptions& o, uint64_t dataset_id, uint64_t epoch, uint64_t stream,
                   std::vector<uint64_t>* order) {
  for (size_t w = 0; w * o.shuffle_window_shards < shard_order.size(); ++w) {
    const size_t begin = order->size();
    const size_t end_shard =
        std::min<size_t>(shard_order.size(), (w + 1) * o.shuffle_window_shards);
    for (size_t k = w * o.shuffle_window_shards; k < end_shard; ++k) {
      const uint32_t s = shard_order[k];
      for (uint64_t id = first[s]; id < first[s + 1]; ++id) order->push_back(id);
    }
    if (o.shuffle) {
      Rng rng(stream == 0 ? MixSeed({dataset_id, o.seed, epoch, kWindowStream, w})
                          : MixSeed({dataset_id, o.seed, epoch, kWindowStream, stream, w}));
      Permute(std::span<uint64_t>(order->data() + begin, order->size() - begin), rng);
    }
  }
}

}  // namespace

Rng::Rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_) s = SplitMix64(x);
}

uint64_t Rng::Next() {
  // xoshiro256** (Blackman and Vigna, 2018).
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

uint64_t Rng::Below(uint64_t n) {
  // Lemire, "Fast Random Integer Generation in an Interval" (2019).
  unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(Next()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

uint64_t MixSeed(std::initializer_list<uint64_t> values) {
  uint64_t h = 0x243f6a8885a308d3ull;  // pi's fraction: any fixed start will do
  for (uint64_t v : values) {
    uint64_t x = h ^ v;
    h = SplitMix64(x);
  }
  return h;
}

Result<EpochPlan> EpochPlan::Make(uint64_t dataset_id, std::span<const uint32_t> shard_samples,
                                  const PlanOptions& o, uint64_t epoch, uint64_t start_position) {
  if (o.batch_size == 0) return InvalidArgument("batch_size must be at least 1");
  if (o.world_size == 0) return InvalidArgument("world_size must be at least 1");
  if (o.rank >= o.world_size) {
    return InvalidArgument("rank " + std::to_string(o.rank) + " is not below world_size " +
                           std::to_string(o.world_size));
  }
  if (o.shuffle_window_shards == 0) return InvalidArgument("shuffle_window_shards must be >= 1");

  EpochPlan p;
  p.epoch_ = epoch;
  p.rank_ = o.rank;
  p.world_ = o.world_size;
  p.batch_ = o.batch_size;

  const size_t num_shards = shard_samples.size();
  std::vector<uint64_t> first(num_shards + 1, 0);
  for (size_t i = 0; i < num_shards; ++i) first[i + 1] = first[i] + shard_samples[i];
  const uint64_t n = first[num_shards];
  if (start_position > n && !o.node_affinity) {
    return InvalidArgument("resume position " + std::to_string(start_position) +
                           " is past the end of the epoch (" + std::to_string(n) + " samples)");
  }
  p.start_ = start_position;

  if (o.node_affinity) return MakeNodeAffine(dataset_id, first, o, epoch, start_position, p);

  std::vector<uint32_t> shard_order(num_shards);
  std::iota(shard_order.begin(), shard_order.end(), 0u);
  if (o.shuffle) {
    Rng rng(MixSeed({dataset_id, o.seed, epoch, kShardStream}));
    Permute(std::span<uint32_t>(shard_order), rng);
  }
  p.order_.reserve(n);
  AppendWindows(shard_order, first, o, dataset_id, epoch, 0, &p.order_);

  const uint64_t remaining = n - start_position;
  const uint64_t world = o.world_size;
  if (o.drop_last) {
    const uint64_t per_step = world * o.batch_size;
    p.num_batches_ = remaining / per_step;
    p.rank_samples_ = p.num_batches_ * o.batch_size;
  } else {
    p.rank_samples_ = (remaining + world - 1) / world;
    p.num_batches_ = (p.rank_samples_ + o.batch_size - 1) / o.batch_size;
  }
  return p;
}

Result<EpochPlan> EpochPlan::MakeNodeAffine(uint64_t dataset_id, std::span<const uint64_t> first,
                                            const PlanOptions& o, uint64_t epoch,
                                            uint64_t start_position, EpochPlan p) {
  const uint32_t per_node = o.ranks_per_node == 0 ? o.world_size : o.ranks_per_node;
  if (o.world_size % per_node != 0) {
    return InvalidArgument("node affinity: ranks_per_node " + std::to_string(per_node) +
                           " does not divide world_size " + std::to_string(o.world_size));
  }
  if (start_position % o.world_size != 0) {
    // A position of a node-affine plan counts whole steps (see plan.h).
    return InvalidArgument("node affinity: resume position " + std::to_string(start_position) +
                           " is not a whole step of world_size " + std::to_string(o.world_size) +
                           " (a node-affine plan resumes on the same world only)");
  }
  const uint32_t nodes = o.world_size / per_node;
  const size_t num_shards = first.size() - 1;
  // Which node owns which shard: fixed for the run (no epoch in the seed).
  std::vector<uint32_t> owner_order(num_shards);
  std::iota(owner_order.begin(), owner_order.end(), 0u);
  Rng owner_rng(MixSeed({dataset_id, o.seed, kNodeStream}));
  Permute(std::span<uint32_t>(owner_order), owner_rng);
  const uint32_t node = o.rank / per_node;
  uint64_t largest = 0, smallest = UINT64_MAX;
  p.order_.reserve(first[num_shards]);
  for (uint32_t k = 0; k < nodes; ++k) {
    std::vector<uint32_t> part(owner_order.begin() + num_shards * k / nodes,
                               owner_order.begin() + num_shards * (k + 1) / nodes);
    std::sort(part.begin(), part.end());
    if (o.shuffle) {
      Rng rng(MixSeed({dataset_id, o.seed, epoch, kShardStream, kNodeStream, k}));
      Permute(std::span<uint32_t>(part), rng);
    }
    const uint64_t begin = p.order_.size();
    AppendWindows(part, first, o, dataset_id, epoch, kNodeStream + k, &p.order_);
    const uint64_t samples = p.order_.size() - begin;
    if (k == node) {
      p.node_begin_ = begin;
      p.node_samples_ = samples;
    }
    largest = std::max(largest, samples);
    smallest = std::min(smallest, samples);
  }
  if (smallest == 0 && first[num_shards] > 0) {
    return InvalidArgument("node affinity: " + std::to_string(num_shards) + " shards cannot give " +
                           "each of " + std::to_string(nodes) + " nodes a part");
  }
  p.affinity_ = true;
  p.per_node_ = per_node;
  p.local_ = o.rank % per_node;
  p.start_step_ = start_position / o.world_size;
  // Steps every rank takes: the largest part's (others pad), or with
  // drop_last the full batches of the smallest.
  const uint64_t steps = (largest + per_node - 1) / per_node;
  p.end_position_ = steps * o.world_size;
  if (start_position > p.end_position_) {
    return InvalidArgument("resume position " + std::to_string(start_position) +
                           " is past the end of the epoch (" + std::to_string(p.end_position_) +
                           " = " + std::to_string(steps) + " steps x world " +
                           std::to_string(o.world_size) + ", node affinity)");
  }
  const uint64_t left = steps > p.start_step_ ? steps - p.start_step_ : 0;
  if (o.drop_last) {
    const uint64_t min_steps = smallest / per_node;
    const uint64_t min_left = min_steps > p.start_step_ ? min_steps - p.start_step_ : 0;
    p.num_batches_ = min_left / o.batch_size;
    p.rank_samples_ = p.num_batches_ * o.batch_size;
  } else {
    p.rank_samples_ = p.node_samples_ == 0 ? 0 : left;
    p.num_batches_ = (p.rank_samples_ + o.batch_size - 1) / o.batch_size;
  }
  return p;
}

uint64_t EpochPlan::RankSample(uint64_t j) const {
  if (affinity_) {
    const uint64_t q = (start_step_ + j) * per_node_ + local_;
    return order_[node_begin_ + (q < node_samples_ ? q : (q - node_samples_) % node_samples_)];
  }
  const uint64_t q = start_ + j * world_ + rank_;
  const uint64_t n = order_.size();
  return q < n ? order_[q] : order_[(q - n) % n];
}

bool EpochPlan::IsPadding(uint64_t j) const {
  if (affinity_) return (start_step_ + j) * per_node_ + local_ >= node_samples_;
  return start_ + j * world_ + rank_ >= order_.size();
}

void EpochPlan::BatchRange(uint64_t b, uint64_t* first, uint64_t* count) const {
  *first = b * batch_;
  *count = b < num_batches_ ? std::min<uint64_t>(batch_, rank_samples_ - *first) : 0;
}

uint64_t EpochPlan::PositionAfter(uint64_t batches) const {
  const uint64_t consumed = std::min<uint64_t>(batches * batch_, rank_samples_);
  if (batches >= num_batches_ && !order_.empty()) {
    // The epoch is over for every rank; with drop_last the dropped tail is
    // not "pending", so the position is the end.
    return affinity_ ? end_position_ : order_.size();
  }
  if (affinity_) return std::min<uint64_t>((start_step_ + consumed) * world_, end_position_);
  return std::min<uint64_t>(start_ + consumed * world_, order_.size());
}

}  // namespace stoker
