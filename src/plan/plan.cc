#include "stoker/plan.h"

#include <algorithm>
#include <numeric>
#include <utility>
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

uint64_t Mix64(uint64_t v) {
  uint64_t z = v * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
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

Permutation::Permutation(uint64_t n, uint64_t key) : n_(n) {
  const uint32_t bits = n <= 1 ? 0 : 64 - uint32_t(__builtin_clzll(n - 1));
  half_bits_ = (bits + 1) / 2;
  mask_ = half_bits_ == 0 ? 0 : (uint64_t(1) << half_bits_) - 1;
  uint64_t x = key;
  for (auto& k : keys_) k = SplitMix64(x);
}

uint64_t Permutation::Encrypt(uint64_t x) const {
  uint64_t l = x >> half_bits_, r = x & mask_;
  for (uint64_t k : keys_) {
    const uint64_t f = Mix64(r ^ k) & mask_;
    const uint64_t next_l = r;
    r = l ^ f;
    l = next_l;
  }
  return (l << half_bits_) | r;
}

uint64_t Permutation::operator()(uint64_t i) const {
  if (n_ <= 1) return i;
  // Cycle walking: the network permutes [0, 2^2h); its cycle through i comes
  // back into [0, n) at i at the latest.
  uint64_t x = i;
  do {
    x = Encrypt(x);
  } while (x >= n_);
  return x;
}

// The rank-independent part of a plan: the shard order and where each
// shard's samples lie in the epoch's positions. O(shards) memory.
struct EpochPlan::Order {
  uint64_t dataset_id = 0, seed = 0, epoch = 0;
  bool shuffle = true;
  uint32_t window = 8;
  bool affinity = false;
  std::vector<uint32_t> shard_at;  // slot -> shard
  std::vector<uint64_t> position;  // slot -> its first position; size slots + 1
  std::vector<uint64_t> first;     // shard -> its first sample id
  // Segments: the global order (one) or each node's order (node affinity),
  // slots [segment_slot[k], segment_slot[k + 1]); windows start afresh in
  // each, and each has its own window stream.
  std::vector<uint32_t> segment_slot;
  uint64_t samples() const { return position.back(); }
  uint64_t SegmentBegin(uint32_t k) const { return position[segment_slot[k]]; }
  uint64_t SegmentSamples(uint32_t k) const {
    return position[segment_slot[k + 1]] - position[segment_slot[k]];
  }
  uint64_t WindowKey(uint32_t segment, uint64_t w) const {
    return affinity ? MixSeed({dataset_id, seed, epoch, kWindowStream, kNodeStream + segment, w})
                    : MixSeed({dataset_id, seed, epoch, kWindowStream, w});
  }
};

Result<EpochPlan> EpochPlan::Make(uint64_t dataset_id, std::span<const uint32_t> shard_samples,
                                  const PlanOptions& o, uint64_t epoch, uint64_t start_position) {
  if (o.batch_size == 0) return InvalidArgument("batch_size must be at least 1");
  if (o.world_size == 0) return InvalidArgument("world_size must be at least 1");
  if (o.rank >= o.world_size) {
    return InvalidArgument("rank " + std::to_string(o.rank) + " is not below world_size " +
                           std::to_string(o.world_size));
  }
  if (o.shuffle_window_shards == 0) return InvalidArgument("shuffle_window_shards must be >= 1");
  if (shard_samples.size() >= UINT32_MAX) {
    return InvalidArgument("a plan holds at most 2^32 - 2 shards, the dataset has " +
                           std::to_string(shard_samples.size()));
  }
  const uint32_t per_node =
      o.ranks_per_node == 0 || !o.node_affinity ? o.world_size : o.ranks_per_node;
  if (o.node_affinity) {
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
  }

  auto order = std::make_shared<Order>();
  Order& ord = *order;
  ord.dataset_id = dataset_id;
  ord.seed = o.seed;
  ord.epoch = epoch;
  ord.shuffle = o.shuffle;
  ord.window = o.shuffle_window_shards;
  ord.affinity = o.node_affinity;
  const size_t num_shards = shard_samples.size();
  ord.first.resize(num_shards + 1);
  ord.first[0] = 0;
  for (size_t i = 0; i < num_shards; ++i) ord.first[i + 1] = ord.first[i] + shard_samples[i];
  const uint64_t n = ord.first[num_shards];
  if (start_position > n && !o.node_affinity) {
    return InvalidArgument("resume position " + std::to_string(start_position) +
                           " is past the end of the epoch (" + std::to_string(n) + " samples)");
  }

  ord.shard_at.resize(num_shards);
  std::iota(ord.shard_at.begin(), ord.shard_at.end(), 0u);
  if (!o.node_affinity) {
    if (o.shuffle) {
      Rng rng(MixSeed({dataset_id, o.seed, epoch, kShardStream}));
      Permute(std::span<uint32_t>(ord.shard_at), rng);
    }
    ord.segment_slot = {0, uint32_t(num_shards)};
  } else {
    const uint32_t nodes = o.world_size / per_node;
    // Which node owns which shard: fixed for the run (no epoch in the seed).
    Rng owner_rng(MixSeed({dataset_id, o.seed, kNodeStream}));
    Permute(std::span<uint32_t>(ord.shard_at), owner_rng);
    for (uint32_t k = 0; k < nodes; ++k) {
      const size_t begin = num_shards * k / nodes, end = num_shards * (k + 1) / nodes;
      std::span<uint32_t> part(ord.shard_at.data() + begin, end - begin);
      std::sort(part.begin(), part.end());
      if (o.shuffle) {
        Rng rng(MixSeed({dataset_id, o.seed, epoch, kShardStream, kNodeStream, k}));
        Permute(part, rng);
      }
      ord.segment_slot.push_back(uint32_t(begin));
    }
    ord.segment_slot.push_back(uint32_t(num_shards));
  }
  ord.position.resize(num_shards + 1);
  ord.position[0] = 0;
  for (size_t k = 0; k < num_shards; ++k) {
    ord.position[k + 1] = ord.position[k] + shard_samples[ord.shard_at[k]];
  }

  EpochPlan p;
  p.order_ = std::move(order);
  p.epoch_ = epoch;
  p.start_ = start_position;
  STOKER_RETURN_IF_ERROR(p.SetRank(o));
  return p;
}

Result<EpochPlan> EpochPlan::ForRank(uint32_t rank) const {
  PlanOptions o = options_;
  o.rank = rank;
  EpochPlan p = *this;
  STOKER_RETURN_IF_ERROR(p.SetRank(o));
  return p;
}

Status EpochPlan::SetRank(const PlanOptions& o) {
  if (o.rank >= o.world_size) {
    return InvalidArgument("rank " + std::to_string(o.rank) + " is not below world_size " +
                           std::to_string(o.world_size));
  }
  options_ = o;
  rank_ = o.rank;
  world_ = o.world_size;
  batch_ = o.batch_size;
  const Order& ord = *order_;
  const uint64_t n = ord.samples();
  const uint64_t world = o.world_size;
  if (!o.node_affinity) {
    const uint64_t remaining = n - start_;
    if (o.drop_last) {
      const uint64_t per_step = world * o.batch_size;
      num_batches_ = remaining / per_step;
      rank_samples_ = num_batches_ * o.batch_size;
    } else {
      rank_samples_ = (remaining + world - 1) / world;
      num_batches_ = (rank_samples_ + o.batch_size - 1) / o.batch_size;
    }
    return Status::Ok();
  }

  const uint32_t per_node = o.ranks_per_node == 0 ? o.world_size : o.ranks_per_node;
  const uint32_t nodes = o.world_size / per_node;
  node_ = o.rank / per_node;
  uint64_t largest = 0, smallest = UINT64_MAX;
  for (uint32_t k = 0; k < nodes; ++k) {
    largest = std::max(largest, ord.SegmentSamples(k));
    smallest = std::min(smallest, ord.SegmentSamples(k));
  }
  node_begin_ = ord.SegmentBegin(node_);
  node_samples_ = ord.SegmentSamples(node_);
  const size_t num_shards = ord.shard_at.size();
  if (smallest == 0 && n > 0) {
    return InvalidArgument("node affinity: " + std::to_string(num_shards) + " shards cannot give " +
                           "each of " + std::to_string(nodes) + " nodes a part");
  }
  affinity_ = true;
  per_node_ = per_node;
  local_ = o.rank % per_node;
  start_step_ = start_ / o.world_size;
  // Steps every rank takes: the largest part's (others pad), or with
  // drop_last the full batches of the smallest.
  const uint64_t steps = (largest + per_node - 1) / per_node;
  end_position_ = steps * o.world_size;
  if (start_ > end_position_) {
    return InvalidArgument("resume position " + std::to_string(start_) +
                           " is past the end of the epoch (" + std::to_string(end_position_) +
                           " = " + std::to_string(steps) + " steps x world " +
                           std::to_string(o.world_size) + ", node affinity)");
  }
  const uint64_t left = steps > start_step_ ? steps - start_step_ : 0;
  if (o.drop_last) {
    const uint64_t min_steps = smallest / per_node;
    const uint64_t min_left = min_steps > start_step_ ? min_steps - start_step_ : 0;
    num_batches_ = min_left / o.batch_size;
    rank_samples_ = num_batches_ * o.batch_size;
  } else {
    rank_samples_ = node_samples_ == 0 ? 0 : left;
    num_batches_ = (rank_samples_ + o.batch_size - 1) / o.batch_size;
  }
  return Status::Ok();
}

uint64_t EpochPlan::dataset_samples() const { return order_->samples(); }
uint32_t EpochPlan::num_slots() const { return uint32_t(order_->shard_at.size()); }
uint32_t EpochPlan::ShardAtSlot(uint32_t slot) const { return order_->shard_at[slot]; }

uint64_t EpochPlan::Locate(uint64_t p, uint32_t* slot) const {
  const Order& o = *order_;
  // The slot whose positions hold p (empty shards share a position with the
  // next: upper_bound skips them).
  const auto& pos = o.position;
  const uint32_t k = uint32_t(std::upper_bound(pos.begin(), pos.end(), p) - pos.begin() - 1);
  const uint32_t segment = uint32_t(
      std::upper_bound(o.segment_slot.begin(), o.segment_slot.end(), k) - o.segment_slot.begin() -
      1);
  const uint32_t seg_begin = o.segment_slot[segment], seg_end = o.segment_slot[segment + 1];
  const uint64_t w = (k - seg_begin) / o.window;
  const uint32_t ws = seg_begin + uint32_t(w * o.window);
  const uint32_t we = uint32_t(std::min<uint64_t>(uint64_t(ws) + o.window, seg_end));
  uint64_t t = p;
  uint32_t k2 = k;
  if (o.shuffle) {
    const uint64_t a = pos[ws];
    t = a + Permutation(pos[we] - a, o.WindowKey(segment, w))(p - a);
    k2 = uint32_t(std::upper_bound(pos.begin() + ws, pos.begin() + we + 1, t) - pos.begin() - 1);
  }
  *slot = k2;
  return o.first[o.shard_at[k2]] + (t - pos[k2]);
}

uint64_t EpochPlan::SampleAtPosition(uint64_t p) const {
  uint32_t slot;
  return Locate(p, &slot);
}

uint64_t EpochPlan::RankSampleSlot(uint64_t j, uint32_t* slot) const {
  if (affinity_) {
    const uint64_t q = (start_step_ + j) * per_node_ + local_;
    return Locate(node_begin_ + (q < node_samples_ ? q : (q - node_samples_) % node_samples_),
                  slot);
  }
  const uint64_t q = start_ + j * world_ + rank_;
  const uint64_t n = order_->samples();
  return Locate(q < n ? q : (q - n) % n, slot);
}

uint64_t EpochPlan::RankSample(uint64_t j) const {
  uint32_t slot;
  return RankSampleSlot(j, &slot);
}

bool EpochPlan::IsPadding(uint64_t j) const {
  if (affinity_) return (start_step_ + j) * per_node_ + local_ >= node_samples_;
  return start_ + j * world_ + rank_ >= order_->samples();
}

void EpochPlan::BatchRange(uint64_t b, uint64_t* first, uint64_t* count) const {
  *first = b * batch_;
  *count = b < num_batches_ ? std::min<uint64_t>(batch_, rank_samples_ - *first) : 0;
}

uint64_t EpochPlan::PositionAfter(uint64_t batches) const {
  const uint64_t consumed = std::min<uint64_t>(batches * batch_, rank_samples_);
  const uint64_t n = order_->samples();
  if (batches >= num_batches_ && n > 0) {
    // The epoch is over for every rank; with drop_last the dropped tail is
    // not "pending", so the position is the end.
    return affinity_ ? end_position_ : n;
  }
  if (affinity_) return std::min<uint64_t>((start_step_ + consumed) * world_, end_position_);
  return std::min<uint64_t>(start_ + consumed * world_, n);
}

void EpochPlan::AppendVisits(uint32_t segment, uint64_t offset, uint64_t stride, uint64_t count,
                             std::vector<RankVisit>* out) const {
  const Order& o = *order_;
  const uint64_t period = o.SegmentSamples(segment);
  if (count == 0 || period == 0) return;
  const uint64_t base = o.SegmentBegin(segment);
  const uint32_t seg_begin = o.segment_slot[segment], seg_end = o.segment_slot[segment + 1];
  const uint64_t last_q = offset + (count - 1) * stride;
  for (uint64_t pass = offset / period; pass <= last_q / period; ++pass) {
    // Windows of this pass, from the one holding the walk's first position.
    const uint64_t lo = std::max(offset, pass * period);
    uint32_t k = uint32_t(std::upper_bound(o.position.begin() + seg_begin,
                                           o.position.begin() + seg_end + 1, base + lo - pass * period) -
                          o.position.begin() - 1);
    uint64_t w = (std::min(k, seg_end - 1) - seg_begin) / o.window;
    for (;; ++w) {
      const uint64_t ws64 = uint64_t(seg_begin) + w * o.window;
      if (ws64 >= seg_end) break;
      const uint32_t ws = uint32_t(ws64);
      const uint32_t we = uint32_t(std::min<uint64_t>(ws64 + o.window, seg_end));
      // The window's positions as walk values of this pass: [qa, qb).
      const uint64_t qa = pass * period + (o.position[ws] - base);
      const uint64_t qb = pass * period + (o.position[we] - base);
      if (qa > last_q) break;
      if (qb <= offset || qa == qb) continue;
      const uint64_t from = std::max(qa, offset);
      const uint64_t j_lo = (from - offset + stride - 1) / stride;
      const uint64_t to = std::min(qb - 1, last_q);
      if (offset + j_lo * stride > to) continue;  // no step of this rank here
      const uint64_t j_hi = (to - offset) / stride;
      uint32_t first = ws, end = we;
      if (!o.shuffle) {
        // Unshuffled, a window's positions are its shards' samples in slot
        // order: only the slots holding this rank's steps are read (a resume
        // mid-window skips the shards before it).
        auto slot_of = [&](uint64_t q) {
          const uint64_t pos = base + (q - pass * period);
          return uint32_t(std::upper_bound(o.position.begin() + ws, o.position.begin() + we, pos) -
                          o.position.begin() - 1);
        };
        first = slot_of(offset + j_lo * stride);
        end = slot_of(offset + j_hi * stride) + 1;
      }
      out->push_back({j_lo, j_hi, first, end});
    }
  }
}

std::vector<RankVisit> EpochPlan::RankVisits() const {
  std::vector<RankVisit> out;
  if (affinity_) {
    AppendVisits(node_, start_step_ * per_node_ + local_, per_node_, rank_samples_, &out);
  } else {
    AppendVisits(0, start_ + rank_, world_, rank_samples_, &out);
  }
  return out;
}

}  // namespace stoker
