// A checkpoint's test content, determined by a seed: tensors of several
// dtypes and sizes (empty, small ones that share chunks, large ones that span
// chunks). Shared by ckpt_test and the ckpt_writer it kills.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "stoker/checkpoint.h"
#include "stoker/store.h"
#include "testutil.h"

namespace stoker::testing {

struct CkptContent {
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorRef> refs;  // point into data
};

// `scale` multiplies the large tensors' sizes (bytes ~ 200 KiB x scale).
inline CkptContent MakeCkptContent(uint64_t seed, size_t scale = 1) {
  struct Spec {
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  const int64_t big = static_cast<int64_t>(16 * 1024 * scale);
  const std::vector<Spec> specs = {
      {"model.embed.weight", DType::kFloat32, {big / 8, 8}},
      {"model.layer0.bias", DType::kBFloat16, {17}},
      {"model.layer0.norm", DType::kFloat16, {3, 5}},
      {"model.scalar", DType::kFloat64, {}},
      {"model.empty", DType::kInt32, {0, 4}},
      {"model.mask", DType::kBool, {33}},
      {"opt.state.0.step", DType::kInt64, {}},
      {"opt.state.0.exp_avg", DType::kFloat32, {big}},
      {"opt.state.0.exp_avg_sq", DType::kFloat32, {big / 2 + 3}},
      {"extra.u8", DType::kUInt8, {1001}},
      {"extra.i8", DType::kInt8, {7}},
      {"extra.i16", DType::kInt16, {9}},
      {"extra.u16", DType::kUInt16, {9}},
      {"extra.u32", DType::kUInt32, {9}},
      {"extra.u64", DType::kUInt64, {9}},
      {"extra.c64", DType::kComplex64, {5}},
      {"extra.c128", DType::kComplex128, {5}},
      {"extra.f8a", DType::kFloat8E4M3FN, {11}},
      {"extra.f8b", DType::kFloat8E5M2, {11}},
  };
  CkptContent c;
  c.data.reserve(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    size_t n = DTypeSize(specs[i].dtype);
    for (int64_t d : specs[i].shape) n *= static_cast<size_t>(d);
    c.data.push_back(RandomBytes(n, seed * 1000 + i));
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    c.refs.push_back({specs[i].name, specs[i].dtype, specs[i].shape, c.data[i], {}});
  }
  return c;
}

// The seed of the content saved under `name` by ckpt_writer ("w-000007" -> 7).
inline uint64_t SeedOfName(const std::string& name) {
  return std::stoull(name.substr(name.find('-') + 1));
}

// Fails the first `fail_puts` Puts of chunk objects with `error`.
class FlakyStore final : public StoreWrapper {
 public:
  FlakyStore(std::shared_ptr<Store> target, int fail_puts, Status error)
      : StoreWrapper(std::move(target)), left_(fail_puts), error_(std::move(error)) {}
  using StoreWrapper::Put;
  Status Put(std::string_view key, std::span<const std::byte> data,
             const WriteOptions& options) override {
    if (key.ends_with(".chunk") && left_.fetch_sub(1) > 0) return error_;
    return StoreWrapper::Put(key, data, options);
  }
  std::atomic<int> left_;
  Status error_;
};

}  // namespace stoker::testing
