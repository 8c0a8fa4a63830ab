// Restoring and verifying a committed checkpoint (docs/checkpoint.md §4,
// §6): which tensors, which chunks, which reads into which memory. Internal.
//
// Thread safety: a Restorer is safe for concurrent use (each call has its
// own queues and buffers).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckpt/reshard.h"
#include "stoker/checkpoint.h"

namespace stoker::ckpt {

class DeviceCopier;

class Restorer {
 public:
  // `copier` serves destinations in device memory (none: they are refused).
  Restorer(std::shared_ptr<Store> store, const CheckpointerOptions& options,
           std::shared_ptr<DeviceCopier> copier = nullptr)
      : store_(std::move(store)), opt_(options), copier_(std::move(copier)) {}

  // The tensors a restore of `m` reads, in manifest order (or in `names`
  // order when given; else RestoreOptions::only). Checks rank and world size.
  Result<std::vector<const TensorInfo*>> Select(const CheckpointManifest& m,
                                                const RestoreOptions& o,
                                                const std::vector<std::string>& names) const;

  // Checkpointer::Restore of manifest `m`: one new block for every tensor.
  Result<Restored> Restore(CheckpointManifest m, const RestoreOptions& o);

  // Checkpointer::RestoreInto of manifest `m`.
  Status RestoreInto(const CheckpointManifest& m, std::span<const TensorDestination> dst,
                     const RestoreOptions& o);

  // Checkpointer::Verify of manifest `m`.
  Status Verify(const CheckpointManifest& m, CheckpointVerifyReport* report);

  // Fills destinations with a layout (§6) from the pieces that intersect
  // them, reading only the checksum blocks that hold their bytes, each
  // block verified before any of its bytes is copied.
  Status RestoreResharded(const CheckpointManifest& m, std::span<const TensorDestination> dst);

  // Reads `copies` (host or device destinations) through the blocks that
  // hold them; device ones through pinned buffers, copied in once verified.
  Status ReadCopies(const CheckpointManifest& m, std::vector<PieceCopy> copies);

  // Reads the chunks under `wanted` into `dst` (one span per tensor), every
  // chunk checked before its bytes count.
  Status ReadTensors(const CheckpointManifest& m, const std::vector<const TensorInfo*>& wanted,
                     const std::vector<std::span<std::byte>>& dst);

 private:
  std::string KeyUri(std::string_view key) const { return store_->uri() + "/" + std::string(key); }

  std::shared_ptr<Store> store_;
  CheckpointerOptions opt_;
  std::shared_ptr<DeviceCopier> copier_;
};

}  // namespace stoker::ckpt
