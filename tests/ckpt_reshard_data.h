// Sharded test state for resharding at load: global tensors whose bytes are
// a function of (tensor, byte), cut into pieces one way at save (on W ranks)
// and another way at load (on W' ranks), so that any rank can compute what
// any piece must hold. Shared by ckpt_reshard_test (one process) and
// ckpt_reshard_mpi (real ranks under mpirun).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "stoker/checkpoint.h"
#include "stoker/store.h"

namespace stoker::testing {

// [lo, hi) of part i of n cut into `parts` nearly equal parts (the first ones
// one longer), as FSDP and tensor parallel cut.
inline std::pair<int64_t, int64_t> EvenSplit(int64_t n, int64_t parts, int64_t i) {
  const int64_t base = n / parts, extra = n % parts;
  const int64_t lo = i * base + std::min(i, extra);
  return {lo, lo + base + (i < extra ? 1 : 0)};
}

struct GlobalTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;  // row-major
};

inline uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

inline GlobalTensor MakeGlobal(std::string name, DType dtype, std::vector<int64_t> shape,
                               uint64_t seed) {
  GlobalTensor g{std::move(name), dtype, std::move(shape), {}};
  uint64_t n = DTypeSize(dtype);
  for (int64_t d : g.shape) n *= static_cast<uint64_t>(d);
  g.bytes.resize(n);
  for (uint64_t i = 0; i < n; i += 8) {
    const uint64_t v = Mix(seed * 0x9e3779b97f4a7c15ull + i);
    std::memcpy(g.bytes.data() + i, &v, std::min<uint64_t>(8, n - i));
  }
  return g;
}

// A piece: its layout, shape and bytes (cut from the global tensor).
struct Piece {
  TensorLayout layout;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

inline Piece BoxPiece(const GlobalTensor& g, std::vector<int64_t> off, std::vector<int64_t> len) {
  Piece p;
  p.layout.kind = TensorLayout::Kind::kBox;
  p.layout.global_shape = g.shape;
  p.layout.offsets = off;
  p.shape = len;
  const size_t e = DTypeSize(g.dtype), n = g.shape.size();
  uint64_t count = 1;
  for (int64_t l : len) count *= static_cast<uint64_t>(l);
  p.bytes.resize(count * e);
  std::vector<int64_t> idx(n, 0);
  for (uint64_t k = 0; k < count; ++k) {
    uint64_t at = 0;
    for (size_t d = 0; d < n; ++d) at = at * g.shape[d] + (off[d] + idx[d]);
    std::memcpy(p.bytes.data() + k * e, g.bytes.data() + at * e, e);
    for (size_t d = n; d-- > 0;) {
      if (++idx[d] < len[d]) break;
      idx[d] = 0;
    }
  }
  return p;
}

inline Piece FlatPiece(const GlobalTensor& g, int64_t lo, int64_t hi) {
  Piece p;
  p.layout.kind = TensorLayout::Kind::kFlat;
  p.layout.global_shape = g.shape;
  p.layout.flat_start = static_cast<uint64_t>(lo);
  p.shape = {hi - lo};
  const size_t e = DTypeSize(g.dtype);
  p.bytes.assign(g.bytes.begin() + lo * e, g.bytes.begin() + hi * e);
  return p;
}

// A box split of dimension `dim` into `parts`; part i.
inline Piece DimPiece(const GlobalTensor& g, size_t dim, int64_t parts, int64_t i) {
  std::vector<int64_t> off(g.shape.size(), 0), len = g.shape;
  auto [lo, hi] = EvenSplit(g.shape[dim], parts, i);
  off[dim] = lo;
  len[dim] = hi - lo;
  return BoxPiece(g, off, len);
}

inline Piece FlatSplit(const GlobalTensor& g, int64_t parts, int64_t i) {
  int64_t n = 1;
  for (int64_t d : g.shape) n *= d;
  auto [lo, hi] = EvenSplit(n, parts, i);
  return FlatPiece(g, lo, hi);
}

// A 2 x (parts / 2) grid of a 2-D tensor (parts even), or dimension 0 when
// parts is odd.
inline Piece GridPiece(const GlobalTensor& g, int64_t parts, int64_t i) {
  if (parts % 2 != 0) return DimPiece(g, 0, parts, i);
  auto [r0, r1] = EvenSplit(g.shape[0], 2, i % 2);
  auto [c0, c1] = EvenSplit(g.shape[1], parts / 2, i / 2);
  return BoxPiece(g, {r0, c0}, {r1 - r0, c1 - c0});
}

// The test's global state. `rows` sets the size of the large tensor "w"
// ([rows, 1024] float32).
inline std::vector<GlobalTensor> ShardedState(int64_t rows) {
  return {
      MakeGlobal("model.w", DType::kFloat32, {rows, 1024}, 1),
      MakeGlobal("model.v", DType::kBFloat16, {24, 50, 8}, 2),
      MakeGlobal("optim.z", DType::kFloat32, {1000, 37}, 3),
      MakeGlobal("model.g", DType::kInt64, {12, 10}, 4),
      MakeGlobal("model.bias", DType::kFloat32, {33}, 5),
      MakeGlobal("step", DType::kFloat64, {}, 6),
  };
}

// How rank `rank` of `world` holds tensor i of ShardedState at save.
inline Piece SavedPiece(const GlobalTensor& g, size_t i, int64_t world, int64_t rank) {
  switch (i) {
    case 0:
      return DimPiece(g, 0, world, rank);  // FSDP-like rows
    case 1:
      return DimPiece(g, 1, world, rank);  // tensor parallel columns
    case 2:
      return FlatSplit(g, world, rank);  // ZeRO flat shards
    case 3:
      return GridPiece(g, world, rank);  // a 2-D mesh
    default: {                           // replicated, saved whole
      Piece p;
      p.shape = g.shape;
      p.bytes = g.bytes;
      return p;
    }
  }
}

// How rank `rank` of `world` wants tensor i at load: another split.
inline Piece WantedPiece(const GlobalTensor& g, size_t i, int64_t world, int64_t rank) {
  switch (i) {
    case 0:
      return DimPiece(g, 0, world, rank);
    case 1:
      return DimPiece(g, 0, world, rank);  // rows where columns were saved
    case 2:
      return DimPiece(g, 0, world, rank);  // a box of a flat-saved tensor
    case 3:
      return FlatSplit(g, world, rank);  // flat of a box-saved tensor
    default:
      return BoxPiece(g, std::vector<int64_t>(g.shape.size(), 0), g.shape);
  }
}

// What rank `rank` of `world` saves of `state`: its pieces ("step" on rank 0
// alone) and the refs over them. `skip` leaves out {tensor index, rank}.
struct SavedRank {
  std::vector<Piece> pieces;
  std::vector<TensorRef> refs;
};
inline SavedRank SaveRank(const std::vector<GlobalTensor>& state, int64_t world, int64_t rank,
                          std::pair<int, int64_t> skip = {-1, -1}) {
  SavedRank out;
  out.pieces.reserve(state.size() + 1);
  for (size_t i = 0; i < state.size(); ++i) {
    if (i + 1 == state.size() && rank != 0) continue;
    if (skip.first == int(i) && skip.second == rank) continue;
    out.pieces.push_back(SavedPiece(state[i], i, world, rank));
    const Piece& p = out.pieces.back();
    out.refs.push_back({state[i].name, state[i].dtype, p.shape, p.bytes, p.layout});
  }
  return out;
}

// What rank `rank` of `world` loads of `state` (WantedPiece's split): the
// expected pieces and destinations over buffers filled with 0x5a.
struct LoadedRank {
  std::vector<Piece> want;
  std::vector<std::vector<std::byte>> got;
  std::vector<TensorDestination> dst;
  uint64_t received = 0;
  // "" when every destination holds what it should, else which does not.
  std::string Difference(const std::vector<GlobalTensor>& state) const {
    for (size_t i = 0; i < state.size(); ++i) {
      if (got[i] != want[i].bytes) {
        return state[i].name + " (" + LayoutText(want[i].layout, want[i].shape) + ")";
      }
    }
    return "";
  }
};
inline LoadedRank WantRank(const std::vector<GlobalTensor>& state, int64_t world, int64_t rank) {
  LoadedRank out;
  for (size_t i = 0; i < state.size(); ++i) {
    out.want.push_back(WantedPiece(state[i], i, world, rank));
    out.got.emplace_back(out.want.back().bytes.size(), std::byte{0x5a});
    out.received += out.got.back().size();
  }
  for (size_t i = 0; i < state.size(); ++i) {
    out.dst.push_back(
        {state[i].name, out.got[i], out.want[i].layout, state[i].dtype, out.want[i].shape});
  }
  return out;
}

// Counts the bytes read from chunk objects (ReadQueue completions, Read).
class CountingStore final : public StoreWrapper {
 public:
  explicit CountingStore(std::shared_ptr<Store> target) : StoreWrapper(std::move(target)) {}
  Result<std::unique_ptr<ReadQueue>> NewReadQueue(const ReadQueueOptions& o) override {
    auto q = StoreWrapper::NewReadQueue(o);
    if (!q.ok()) return q.status();
    return std::unique_ptr<ReadQueue>(new Queue(std::move(*q), this));
  }
  Result<size_t> Read(std::string_view k, uint64_t off, std::span<std::byte> dst) override {
    auto r = StoreWrapper::Read(k, off, dst);
    if (r.ok() && k.ends_with(".chunk")) chunk_bytes_read += *r;
    return r;
  }
  std::atomic<uint64_t> chunk_bytes_read{0};

 private:
  class Queue final : public ReadQueueWrapper {
   public:
    Queue(std::unique_ptr<ReadQueue> q, CountingStore* s) : ReadQueueWrapper(std::move(q)), s_(s) {}
    // Tags are swapped for our own, to tell chunk reads from the rest.
    Status Submit(std::span<const ReadRequest> r) override {
      std::vector<ReadRequest> mine(r.begin(), r.end());
      for (ReadRequest& x : mine) {
        inflight_.emplace(next_, std::make_pair(x.tag, x.key.ends_with(".chunk")));
        x.tag = next_++;
      }
      return target()->Submit(mine);
    }
    Result<size_t> Wait(size_t min, Deadline d, std::vector<ReadCompletion>* out) override {
      const size_t before = out->size();
      auto r = target()->Wait(min, d, out);
      for (size_t i = before; i < out->size(); ++i) {
        ReadCompletion& c = (*out)[i];
        auto it = inflight_.find(c.tag);
        if (it == inflight_.end()) continue;
        if (c.status.ok() && it->second.second) s_->chunk_bytes_read += c.bytes;
        c.tag = it->second.first;
        inflight_.erase(it);
      }
      return r;
    }

   private:
    CountingStore* s_;
    std::unordered_map<uint64_t, std::pair<uint64_t, bool>> inflight_;  // ours -> (theirs, chunk)
    uint64_t next_ = 0;
  };
};

}  // namespace stoker::testing
