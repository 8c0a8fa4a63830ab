// The checkpoints under a root, by name and commit order (docs/checkpoint.md
// §1, §5, §7): `latest`, the manifests, the sequence numbers and their index,
// retention, automatic names, listing and removal. Internal.
//
// Costs: a commit reads one small object (the index's head) and creates one
// (its sequence's entry) besides the manifest and `latest`; retention looks
// at the entries from the oldest kept one up; neither lists the root, so
// neither grows with the number of checkpoints under it. List() does list
// (it is the listing).
//
// Thread safety: safe for concurrent use, also by several processes on one
// root: sequence numbers and automatic names are claimed by creating an
// object (Store::Put with if_absent), which exactly one claimant wins.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/parallel.h"
#include "stoker/checkpoint.h"

namespace stoker::ckpt {

class Catalog {
 public:
  // `store` retries what is retryable (WithWriteRetries).
  explicit Catalog(std::shared_ptr<Store> store) : store_(std::move(store)) {}

  const std::string& uri() const { return store_->uri(); }
  std::string KeyUri(std::string_view key) const { return uri() + "/" + std::string(key); }
  std::string Where(std::string_view name) const {
    return "checkpoint " + std::string(name) + " at " + uri();
  }

  // The name `latest` points to; NotFound if there is none.
  Result<std::string> Latest();
  // `name`, or the latest for "" and "latest" (NotFound naming both when
  // `latest` names a checkpoint without a manifest).
  Result<std::string> Resolve(std::string_view name);
  // Reads and checks NAME's manifest.
  Result<CheckpointManifest> ReadManifest(const std::string& name);

  // §1.1 step 3's sequence number for `name`, claimed in the index (§7.1)
  // by a deferred if_absent Put: its durability rides on the store's next
  // Sync(), which the save makes for its chunks before any record
  // names them, so a commit pays for no durable write more than the
  // manifest and `latest`. Release() gives back a claim whose save failed.
  Result<uint64_t> Claim(const std::string& name);
  void Release(const std::string& name, uint64_t sequence);

  // §1.1 steps 3-5 with the claimed `sequence`: writes the manifest of
  // `parts` (the commit), moves `latest`, applies retention (o.keep_last).
  Status Commit(const std::string& name, uint64_t sequence, std::vector<RankPart> parts,
                const SaveOptions& o);

  // Every checkpoint under the root, by sequence (incomplete ones last, by
  // name): a listing of the whole root and a manifest read per commit.
  Result<std::vector<CheckpointListing>> List();

  // Checkpointer::Remove.
  Status Remove(std::string_view name);

  // A new name `prefix` + six or more digits (ckpt-000001), claimed by
  // creating NAME/claim: no other caller, in this process or another, gets
  // it, and a name a checkpoint already has is skipped.
  Result<std::string> ClaimName(std::string_view prefix);

 private:
  struct Entry {
    uint64_t sequence = 0;
    std::string name;
  };
  Result<uint64_t> Head();
  Result<uint64_t> BuildIndex();
  Result<uint64_t> ReadNumber(std::string_view key);
  Status PutNumber(std::string_view key, uint64_t n);
  void PutHint(std::string_view key, uint64_t n);
  Result<std::string> ReadEntry(uint64_t sequence);
  Result<bool> HasManifest(const std::string& name);
  Status Retain(uint64_t sequence, uint32_t keep_last, const std::string& name);
  Status RemoveOne(const std::string& name, bool repoint);
  bool RemovedLeftover(const std::string& name, uint64_t sequence);
  Status RemoveEmptyLeftover(const std::string& name);
  Status RepointLatest(uint64_t below);
  Status PutLatest(const std::string& name);
  Result<std::vector<CheckpointListing>> ListAll();

  std::shared_ptr<Store> store_;
};

}  // namespace stoker::ckpt
