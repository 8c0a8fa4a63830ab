// Resharding at load: docs/checkpoint.md §3.4 (layouts) and §6 (loading on
// another world size or split).
//
// Every region is either a box of the global tensor (offsets and lengths per
// dimension) or a flat range of its row-major elements. Stored pieces of a
// tensor are indexed once: boxes sorted by their offset in dimension 0 (with
// the longest length there, so that the boxes meeting a destination are one
// binary search and a scan of the band they may lie in), flat ranges by
// start. Two boxes meet in a box, copied as runs that are contiguous in both
// (the dimensions past the first one both cover whole are merged into one
// run); a box meets a flat range in the runs of the box that lie in it.
#include "ckpt/reshard.h"

#include <algorithm>
#include <map>
#include <set>

namespace stoker {

std::string LayoutText(const TensorLayout& l, std::span<const int64_t> shape) {
  auto dims = [](std::span<const int64_t> v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  switch (l.kind) {
    case TensorLayout::Kind::kWhole:
      return "whole " + dims(shape);
    case TensorLayout::Kind::kBox:
      return "box " + dims(shape) + " at " + dims(l.offsets) + " of " + dims(l.global_shape);
    case TensorLayout::Kind::kFlat: {
      const uint64_t n = shape.empty() ? 0 : static_cast<uint64_t>(shape[0]);
      return "flat [" + std::to_string(l.flat_start) + ", " + std::to_string(l.flat_start + n) +
             ") of " + dims(l.global_shape);
    }
  }
  return "?";
}

namespace ckpt {
namespace {

using Dims = std::vector<int64_t>;

std::string DimsText(std::span<const int64_t> v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

struct Box {
  Dims off, len;
};

Dims Strides(const Dims& len) {
  Dims s(len.size(), 1);
  for (size_t d = len.size(); d-- > 1;) s[d - 1] = s[d] * len[d];
  return s;
}

// Calls f(pos_a, pos_b, count) for the runs of box `i` (inside both a and b),
// positions as row-major element indices local to a and to b; runs are
// contiguous in both and come in increasing order in each.
template <typename F>
void BoxRuns(const Box& i, const Box& a, const Box& b, F&& f) {
  const size_t n = i.len.size();
  if (n == 0) {
    f(0, 0, 1);
    return;
  }
  for (int64_t l : i.len) {
    if (l == 0) return;
  }
  size_t k = n - 1;
  while (k > 0 && i.len[k] == a.len[k] && i.len[k] == b.len[k]) --k;
  int64_t run = 1;
  for (size_t d = k; d < n; ++d) run *= i.len[d];
  const Dims sa = Strides(a.len), sb = Strides(b.len);
  Dims idx(k, 0);  // over dimensions 0..k-1 of i
  while (true) {
    int64_t pa = (i.off[k] - a.off[k]) * sa[k], pb = (i.off[k] - b.off[k]) * sb[k];
    for (size_t d = 0; d < k; ++d) {
      pa += (i.off[d] + idx[d] - a.off[d]) * sa[d];
      pb += (i.off[d] + idx[d] - b.off[d]) * sb[d];
    }
    f(pa, pb, run);
    size_t d = k;
    while (d > 0) {
      --d;
      if (++idx[d] < i.len[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (k == 0) return;
  }
}

// a ∩ b, or nullopt when they do not meet.
bool Intersect(const Box& a, const Box& b, Box* out) {
  out->off.resize(a.off.size());
  out->len.resize(a.off.size());
  for (size_t d = 0; d < a.off.size(); ++d) {
    const int64_t lo = std::max(a.off[d], b.off[d]);
    const int64_t hi = std::min(a.off[d] + a.len[d], b.off[d] + b.len[d]);
    if (hi <= lo) return false;
    out->off[d] = lo;
    out->len[d] = hi - lo;
  }
  return true;
}

// One stored piece: a box, or a flat range [start, start + count).
struct Stored {
  const TensorInfo* t = nullptr;
  Box box;
  int64_t start = 0, count = 0;
};

// Every stored piece of one global tensor.
struct Global {
  DType dtype = DType::kUInt8;
  Dims shape;
  std::vector<Stored> boxes;  // by box.off[0]
  int64_t max_len0 = 0;
  std::vector<Stored> flats;  // by start, none overlapping
  std::set<uint32_t> ranks;   // that saved a piece
  const TensorInfo* first = nullptr;
};

std::string Pieces(const Global& g) {
  std::string ranks;
  size_t n = 0;
  for (uint32_t r : g.ranks) {
    if (n++ < 8) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (n > 8) ranks += ", ...";
  return std::string(DTypeName(g.dtype)) + " of global shape " + DimsText(g.shape) + " in " +
         std::to_string(g.boxes.size() + g.flats.size()) + " piece(s) saved by rank(s) " + ranks;
}

// The stored pieces of every tensor name, from every rank.
Result<std::map<std::string, Global, std::less<>>> Index(const CheckpointManifest& m,
                                                         const std::string& where) {
  std::map<std::string, Global, std::less<>> by_name;
  std::map<std::string, const TensorInfo*, std::less<>> whole;  // lowest rank's whole copy
  for (const RankPart& p : m.ranks) {
    for (const TensorInfo& t : p.tensors) {
      if (t.layout.kind == TensorLayout::Kind::kWhole) {
        whole.emplace(t.name, &t);
        continue;
      }
      Global& g = by_name[t.name];
      if (g.first == nullptr) {
        g.first = &t;
        g.dtype = t.dtype;
        g.shape = t.layout.global_shape;
      } else if (g.dtype != t.dtype || g.shape != t.layout.global_shape) {
        return Corruption(where + ": tensor '" + t.name + "': rank " + std::to_string(t.rank) +
                          " saved a piece of " + std::string(DTypeName(t.dtype)) + " " +
                          DimsText(t.layout.global_shape) + ", rank " +
                          std::to_string(g.first->rank) + " one of " +
                          std::string(DTypeName(g.dtype)) + " " + DimsText(g.shape));
      }
      Stored s;
      s.t = &t;
      if (t.layout.kind == TensorLayout::Kind::kBox) {
        s.box = {t.layout.offsets, t.shape};
        g.boxes.push_back(std::move(s));
      } else {
        s.start = static_cast<int64_t>(t.layout.flat_start);
        s.count = t.shape.empty() ? 0 : t.shape[0];
        g.flats.push_back(std::move(s));
      }
      g.ranks.insert(t.rank);
    }
  }
  // A tensor saved whole is a box of itself at 0; where other ranks saved
  // pieces of it, a whole copy must have the global shape.
  for (const auto& [name, t] : whole) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      Global& g = by_name[name];
      g.first = t;
      g.dtype = t->dtype;
      g.shape = t->shape;
      g.boxes.push_back({t, {Dims(t->shape.size(), 0), t->shape}, 0, 0});
      g.ranks.insert(t->rank);
      continue;
    }
    Global& g = it->second;
    if (t->dtype != g.dtype || t->shape != g.shape) {
      return Corruption(where + ": tensor '" + name + "': rank " + std::to_string(t->rank) +
                        " saved it whole as " + std::string(DTypeName(t->dtype)) + " " +
                        DimsText(t->shape) + ", rank " + std::to_string(g.first->rank) +
                        " a piece of " + std::string(DTypeName(g.dtype)) + " " + DimsText(g.shape));
    }
    g.boxes.push_back({t, {Dims(t->shape.size(), 0), t->shape}, 0, 0});
    g.ranks.insert(t->rank);
  }
  for (auto& [name, g] : by_name) {
    // Identical pieces (replicated on a mesh dimension) are read from the
    // lowest rank that saved them.
    auto box_key = [](const Stored& s) { return std::tie(s.box.off, s.box.len); };
    std::stable_sort(g.boxes.begin(), g.boxes.end(), [&](const Stored& a, const Stored& b) {
      return std::make_tuple(box_key(a), a.t->rank) < std::make_tuple(box_key(b), b.t->rank);
    });
    g.boxes.erase(
        std::unique(g.boxes.begin(), g.boxes.end(),
                    [&](const Stored& a, const Stored& b) { return box_key(a) == box_key(b); }),
        g.boxes.end());
    for (const Stored& s : g.boxes) {
      if (!s.box.len.empty()) g.max_len0 = std::max(g.max_len0, s.box.len[0]);
    }
    std::stable_sort(g.flats.begin(), g.flats.end(), [](const Stored& a, const Stored& b) {
      return std::make_tuple(a.start, a.count, a.t->rank) <
             std::make_tuple(b.start, b.count, b.t->rank);
    });
    g.flats.erase(std::unique(g.flats.begin(), g.flats.end(),
                              [](const Stored& a, const Stored& b) {
                                return a.start == b.start && a.count == b.count;
                              }),
                  g.flats.end());
    for (size_t i = 1; i < g.flats.size(); ++i) {
      const Stored& a = g.flats[i - 1];
      const Stored& b = g.flats[i];
      if (a.start + a.count > b.start) {
        return Corruption(where + ": tensor '" + name + "': the flat pieces of ranks " +
                          std::to_string(a.t->rank) + " and " + std::to_string(b.t->rank) +
                          " overlap at element " + std::to_string(b.start));
      }
    }
  }
  return by_name;
}

// Collects the copies of one destination, merging a copy into the one
// before it where both continue it.
class Copies {
 public:
  Copies(std::vector<PieceCopy>* out, std::byte* dst, size_t elem, int device)
      : out_(out), dst_(dst), elem_(elem), device_(device), first_(out->size()) {}
  // `count` elements at element `src` of stored tensor t into element `at`
  // of the destination.
  void Add(const TensorInfo& t, int64_t src, int64_t at, int64_t count) {
    const uint64_t so = t.offset + static_cast<uint64_t>(src) * elem_;
    std::byte* d = dst_ + static_cast<uint64_t>(at) * elem_;
    const uint64_t n = static_cast<uint64_t>(count) * elem_;
    bytes_ += n;
    if (out_->size() > first_) {
      PieceCopy& last = out_->back();
      if (last.rank == t.rank && last.stream_offset + last.bytes == so &&
          last.dst + last.bytes == d) {
        last.bytes += n;
        return;
      }
    }
    out_->push_back({t.rank, so, d, n, device_});
  }
  uint64_t bytes() const { return bytes_; }
  size_t first() const { return first_; }

 private:
  std::vector<PieceCopy>* out_;
  std::byte* dst_;
  size_t elem_;
  int device_;
  size_t first_;
  uint64_t bytes_ = 0;
};

// The boxes of g that may meet rows [lo, hi) of dimension 0.
std::pair<size_t, size_t> Band(const Global& g, int64_t lo, int64_t hi) {
  if (g.shape.empty()) return {0, g.boxes.size()};
  auto by_start = [](const Stored& s, int64_t v) { return s.box.off[0] < v; };
  const size_t a = static_cast<size_t>(
      std::lower_bound(g.boxes.begin(), g.boxes.end(), lo - g.max_len0 + 1, by_start) -
      g.boxes.begin());
  const size_t b = static_cast<size_t>(
      std::lower_bound(g.boxes.begin(), g.boxes.end(), hi, by_start) - g.boxes.begin());
  return {a, std::max(a, b)};
}

// The flat pieces of g that meet [lo, hi), as calls of f(piece, lo', hi').
template <typename F>
void FlatsIn(const Global& g, int64_t lo, int64_t hi, F&& f) {
  auto it = std::upper_bound(g.flats.begin(), g.flats.end(), lo,
                             [](int64_t v, const Stored& s) { return v < s.start; });
  if (it != g.flats.begin()) --it;
  for (; it != g.flats.end() && it->start < hi; ++it) {
    const int64_t a = std::max(lo, it->start), b = std::min(hi, it->start + it->count);
    if (a < b) f(*it, a, b);
  }
}

// The global element (as an index per dimension) at row-major `flat`.
Dims Unflatten(int64_t flat, const Dims& shape) {
  Dims out(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    out[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return out;
}

}  // namespace

int64_t Numel(std::span<const int64_t> shape) {
  unsigned __int128 n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    n *= static_cast<uint64_t>(d);
    if (n > (static_cast<unsigned __int128>(1) << 58)) return -1;
  }
  return static_cast<int64_t>(n);
}

std::string LayoutProblem(const TensorLayout& l, std::span<const int64_t> shape) {
  const int64_t global = Numel(l.global_shape);
  switch (l.kind) {
    case TensorLayout::Kind::kWhole:
      return l.global_shape.empty() && l.offsets.empty() ? ""
                                                         : "a whole tensor has no global shape";
    case TensorLayout::Kind::kFlat:
      if (global < 0) return "its global shape has too many elements";
      if (shape.size() != 1) return "a flat piece is 1-D, not of shape " + DimsText(shape);
      if (l.flat_start > static_cast<uint64_t>(global) ||
          static_cast<uint64_t>(shape[0]) > static_cast<uint64_t>(global) - l.flat_start) {
        return "flat [" + std::to_string(l.flat_start) + ", " +
               std::to_string(l.flat_start + shape[0]) + ") runs past the " +
               std::to_string(global) + " elements of " + DimsText(l.global_shape);
      }
      return "";
    case TensorLayout::Kind::kBox:
      if (global < 0) return "its global shape has too many elements";
      if (l.offsets.size() != l.global_shape.size() || shape.size() != l.global_shape.size()) {
        return "offsets " + DimsText(l.offsets) + ", shape " + DimsText(shape) +
               " and global shape " + DimsText(l.global_shape) + " differ in length";
      }
      for (size_t d = 0; d < shape.size(); ++d) {
        if (l.offsets[d] < 0 || shape[d] < 0 || l.offsets[d] + shape[d] > l.global_shape[d]) {
          return "dimension " + std::to_string(d) + ": [" + std::to_string(l.offsets[d]) + ", " +
                 std::to_string(l.offsets[d] + shape[d]) + ") is not inside [0, " +
                 std::to_string(l.global_shape[d]) + ")";
        }
      }
      return "";
  }
  return "unknown layout kind";
}

Result<std::vector<PieceCopy>> PlanReshard(const CheckpointManifest& m,
                                           std::span<const TensorDestination> dst,
                                           const std::string& where) {
  STOKER_ASSIGN_OR_RETURN(auto by_name, Index(m, where));
  std::vector<PieceCopy> out;
  for (const TensorDestination& d : dst) {
    auto it = by_name.find(d.name);
    if (it == by_name.end()) {
      return NotFound(where + ": no rank saved tensor '" + d.name + "'");
    }
    const Global& g = it->second;
    const size_t elem = DTypeSize(g.dtype);
    auto refuse = [&](const std::string& why) {
      return InvalidArgument(where + ": tensor '" + d.name + "': " + why + " (the destination is " +
                             std::string(DTypeName(d.dtype)) + " " + LayoutText(d.layout, d.shape) +
                             "; the checkpoint holds " + Pieces(g) + ")");
    };
    if (std::string why = LayoutProblem(d.layout, d.shape); !why.empty()) return refuse(why);
    if (d.layout.kind == TensorLayout::Kind::kWhole) return refuse("a whole destination");
    if (d.dtype != g.dtype) return refuse("another dtype");
    if (d.layout.global_shape != g.shape) return refuse("another global shape");
    const int64_t numel = Numel(d.shape);
    if (numel < 0 || static_cast<uint64_t>(numel) * elem != d.data.size()) {
      return refuse("its memory is " + std::to_string(d.data.size()) + " bytes, its shape makes " +
                    std::to_string(numel * int64_t(elem)));
    }
    Copies copies(&out, d.data.data(), elem, d.device);
    const Box global{Dims(g.shape.size(), 0), g.shape};
    const Dims gstride = Strides(g.shape);
    if (d.layout.kind == TensorLayout::Kind::kBox) {
      const Box want{d.layout.offsets, d.shape};
      if (!g.boxes.empty() && numel > 0) {
        const int64_t lo = want.off.empty() ? 0 : want.off[0];
        const int64_t hi = want.off.empty() ? 1 : lo + want.len[0];
        auto [a, b] = Band(g, lo, hi);
        for (size_t i = a; i < b; ++i) {
          const Stored& s = g.boxes[i];
          Box meet;
          if (!Intersect(want, s.box, &meet)) continue;
          BoxRuns(meet, s.box, want,
                  [&](int64_t ps, int64_t pd, int64_t n) { copies.Add(*s.t, ps, pd, n); });
        }
      }
      if (!g.flats.empty() && numel > 0) {
        BoxRuns(want, global, want, [&](int64_t pg, int64_t pd, int64_t n) {
          FlatsIn(g, pg, pg + n, [&](const Stored& s, int64_t lo, int64_t hi) {
            copies.Add(*s.t, lo - s.start, pd + (lo - pg), hi - lo);
          });
        });
      }
    } else {
      const int64_t lo = static_cast<int64_t>(d.layout.flat_start), hi = lo + numel;
      if (!g.boxes.empty() && numel > 0) {
        Box band = global;
        if (!band.off.empty()) {
          band.off[0] = lo / gstride[0];
          band.len[0] = (hi - 1) / gstride[0] + 1 - band.off[0];
        }
        auto [a, b] = Band(g, band.off.empty() ? 0 : band.off[0],
                           band.off.empty() ? 1 : band.off[0] + band.len[0]);
        for (size_t i = a; i < b; ++i) {
          const Stored& s = g.boxes[i];
          Box meet;
          if (!Intersect(band, s.box, &meet)) continue;
          BoxRuns(meet, global, s.box, [&](int64_t pg, int64_t ps, int64_t n) {
            const int64_t x = std::max(pg, lo), y = std::min(pg + n, hi);
            if (x < y) copies.Add(*s.t, ps + (x - pg), x - lo, y - x);
          });
        }
      }
      if (!g.flats.empty() && numel > 0) {
        FlatsIn(g, lo, hi, [&](const Stored& s, int64_t x, int64_t y) {
          copies.Add(*s.t, x - s.start, x - lo, y - x);
        });
      }
    }
    if (copies.bytes() > d.data.size()) {
      return Corruption(where + ": tensor '" + d.name + "': saved pieces overlap (" + Pieces(g) +
                        "): the destination " + LayoutText(d.layout, d.shape) + " would get " +
                        std::to_string(copies.bytes()) + " bytes for its " +
                        std::to_string(d.data.size()));
    }
    if (copies.bytes() < d.data.size()) {
      // The first element no piece holds, in the destination's order.
      std::vector<std::pair<uint64_t, uint64_t>> got;
      for (size_t i = copies.first(); i < out.size(); ++i) {
        got.push_back({uint64_t(out[i].dst - d.data.data()), out[i].bytes});
      }
      std::sort(got.begin(), got.end());
      uint64_t hole = 0;
      for (const auto& [at, n] : got) {
        if (at > hole) break;
        hole = std::max(hole, at + n);
      }
      const int64_t e = static_cast<int64_t>(hole / elem);
      Dims element;
      if (d.layout.kind == TensorLayout::Kind::kFlat) {
        element = Unflatten(static_cast<int64_t>(d.layout.flat_start) + e, g.shape);
      } else {
        element = Unflatten(e, d.shape);
        for (size_t k = 0; k < element.size(); ++k) element[k] += d.layout.offsets[k];
      }
      std::string none;
      for (uint32_t r = 0; r < m.world_size; ++r) {
        if (!g.ranks.contains(r)) none += (none.empty() ? "" : ", ") + std::to_string(r);
      }
      return NotFound(where + ": tensor '" + d.name + "': no saved piece holds element " +
                      DimsText(element) + " of " + DimsText(g.shape) + " (" +
                      std::to_string((d.data.size() - copies.bytes()) / elem) + " of the " +
                      std::to_string(numel) + " elements of " + LayoutText(d.layout, d.shape) +
                      " are missing; " +
                      (none.empty()
                           ? "every rank saved pieces of it"
                           : "rank(s) " + none + " saved no piece of it, and should have") +
                      ")");
    }
  }
  return out;
}

}  // namespace ckpt
}  // namespace stoker
