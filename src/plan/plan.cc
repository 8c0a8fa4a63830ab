#include "stoker/plan.h"

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
  if (start_position > n) {
    return InvalidArgument("resume position " + std::to_string(start_position) +
                           " is past the end of the epoch (" + std::to_string(n) + " samples)");
  }
  p.start_ = start_position;

  std::vector<uint32_t> shard_order(num_shards);
  std::iota(shard_order.begin(), shard_order.end(), 0u);
  if (o.shuffle) {
    Rng rng(MixSeed({dataset_id, o.seed, epoch, kShardStream}));
    Permute(std::span<uint32_t>(shard_order), rng);
  }
  p.order_.reserve(n);
  for (size_t w = 0; w * o.shuffle_window_shards < num_shards; ++w) {
    const size_t begin = p.order_.size();
    const size_t end_shard = std::min<size_t>(num_shards, (w + 1) * o.shuffle_window_shards);
    for (size_t k = w * o.shuffle_window_shards; k < end_shard; ++k) {
      const uint32_t s = shard_order[k];
      for (uint64_t id = first[s]; id < first[s + 1]; ++id) p.order_.push_back(id);
    }
    if (o.shuffle) {
      Rng rng(MixSeed({dataset_id, o.seed, epoch, kWindowStream, w}));
      Permute(std::span<uint64_t>(p.order_.data() + begin, p.order_.size() - begin), rng);
    }
  }

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

uint64_t EpochPlan::RankSample(uint64_t j) const {
  const uint64_t q = start_ + j * world_ + rank_;
  const uint64_t n = order_.size();
  return q < n ? order_[q] : order_[(q - n) % n];
}

bool EpochPlan::IsPadding(uint64_t j) const { return start_ + j * world_ + rank_ >= order_.size(); }

void EpochPlan::BatchRange(uint64_t b, uint64_t* first, uint64_t* count) const {
  *first = b * batch_;
  *count = b < num_batches_ ? std::min<uint64_t>(batch_, rank_samples_ - *first) : 0;
}

uint64_t EpochPlan::PositionAfter(uint64_t batches) const {
  const uint64_t consumed = std::min<uint64_t>(batches * batch_, rank_samples_);
  if (batches >= num_batches_ && !order_.empty()) {
    // The epoch is over for every rank; with drop_last the dropped tail is
    // not "pending", so the position is the end.
    return order_.size();
  }
  return std::min<uint64_t>(start_ + consumed * world_, order_.size());
}

}  // namespace stoker
