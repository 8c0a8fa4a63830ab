// The two coordinators (coordinator.h): through the store, and over MPI.
#include "ckpt/coordinator.h"

#include <map>
#include <optional>
#include <thread>

#include "ckpt/parallel.h"

namespace stoker::ckpt {

namespace {

std::string Where(const std::string& uri, const std::string& name) {
  return "checkpoint " + name + " at " + uri;
}

class StoreCoordinator final : public Coordinator {
 public:
  StoreCoordinator(std::shared_ptr<Store> store, std::chrono::milliseconds poll)
      : store_(std::move(store)), poll_(poll) {}

  Status Finish(const std::string& name, Status mine, PartRecord rec, const std::string&,
                const SaveOptions& o, const CommitFn& commit) override {
    if (!mine.ok()) return mine;
    if (o.rank == 0) {
      STOKER_ASSIGN_OR_RETURN(std::vector<RankPart> parts, Gather(name, std::move(rec), o));
      return commit(std::move(parts));
    }
    if (o.wait_for_commit) return WaitForCommit(name, o);
    return Status::Ok();
  }

 private:
  // §1.1 step 2 on rank 0: every rank's part record of this attempt.
  Result<std::vector<RankPart>> Gather(const std::string& name, PartRecord mine,
                                       const SaveOptions& o) {
    std::vector<std::optional<RankPart>> parts(o.world_size);
    parts[0] = std::move(mine.part);
    size_t have = 1;
    std::map<uint32_t, std::string> stale;
    const Deadline deadline = Clock::now() + o.commit_timeout;
    while (have < o.world_size) {
      for (uint32_t r = 1; r < o.world_size; ++r) {
        if (parts[r]) continue;
        auto raw = store_->ReadAll(PartKey(name, r));
        if (!raw.ok()) {
          if (raw.status().code() != Code::kNotFound) return raw.status();
          continue;
        }
        // A part being replaced cannot be half-written (Put is atomic), so
        // a bad one is damage, not a race.
        STOKER_ASSIGN_OR_RETURN(PartRecord rec,
                                DecodePart(*raw, store_->uri() + "/" + PartKey(name, r), name));
        if (rec.world_size != o.world_size || rec.attempt != o.attempt || rec.part.rank != r) {
          stale[r] = "its part says world_size " + std::to_string(rec.world_size) + ", attempt '" +
                     rec.attempt + "'";
          continue;
        }
        stale.erase(r);
        parts[r] = std::move(rec.part);
        ++have;
      }
      if (have == o.world_size) break;
      if (Clock::now() >= deadline) return Missing(name, parts, stale, o);
      std::this_thread::sleep_for(poll_);
    }
    std::vector<RankPart> out;
    for (auto& p : parts) out.push_back(std::move(*p));
    return out;
  }

  Status Missing(const std::string& name, const std::vector<std::optional<RankPart>>& parts,
                 std::map<uint32_t, std::string>& stale, const SaveOptions& o) const {
    std::vector<std::string> missing;
    for (uint32_t r = 0; r < o.world_size; ++r) {
      if (parts[r]) continue;
      missing.push_back(std::to_string(r) +
                        (stale.count(r) ? " (" + stale[r] + ")" : std::string()));
    }
    return TimedOut("commit of " + Where(store_->uri(), name) + ": rank(s) " +
                    JoinNames(missing, 16) + " did not write their part within " +
                    std::to_string(o.commit_timeout.count()) + " ms");
  }

  // §1.1 step 6 on the other ranks.
  Status WaitForCommit(const std::string& name, const SaveOptions& o) {
    const Deadline deadline = Clock::now() + o.commit_timeout;
    for (;;) {
      auto st = store_->Stat(ManifestKey(name));
      if (st.ok()) return Status::Ok();
      if (st.status().code() != Code::kNotFound) return st.status();
      if (Clock::now() >= deadline) {
        return TimedOut("save of " + Where(store_->uri(), name) + ": rank " +
                        std::to_string(o.rank) +
                        "'s part is durable, but rank 0 did not commit within " +
                        std::to_string(o.commit_timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(poll_);
    }
  }

  std::shared_ptr<Store> store_;
  std::chrono::milliseconds poll_;
};

// Over MPI every rank sends rank 0 its outcome and part record (a failure
// included, so that rank 0 learns of it at once and nobody waits for the
// timeout); rank 0 commits and sends every rank the outcome.
class MpiCoordinator final : public Coordinator {
 public:
  explicit MpiCoordinator(std::string uri) : uri_(std::move(uri)) {}

  Status Finish(const std::string& name, Status mine, PartRecord rec, const std::string& encoded,
                const SaveOptions& o, const CommitFn& commit) override {
    const MpiSaveId id{name, o.attempt};
    const Deadline deadline = Clock::now() + o.commit_timeout;
    if (o.rank != 0) {
      Status sent = MpiSendPart(id, mine, encoded);
      if (!mine.ok()) return mine;
      if (!sent.ok()) return sent.WithContext("save of " + Where(uri_, name));
      if (!o.wait_for_commit) return Status::Ok();
      Status outcome = MpiReceiveOutcome(id, deadline);
      if (outcome.ok()) return outcome;
      return outcome.WithContext("save of " + Where(uri_, name) + ": not committed by rank 0");
    }
    std::vector<std::string> raw;
    Status gathered = MpiGatherParts(id, o.world_size, deadline, &raw);
    Status outcome = !mine.ok()      ? mine
                     : gathered.ok() ? Status::Ok()
                                     : gathered.WithContext("commit of " + Where(uri_, name));
    std::vector<RankPart> parts;
    if (outcome.ok()) outcome = Decode(name, std::move(rec), raw, o, &parts);
    if (outcome.ok()) outcome = commit(std::move(parts));
    Status sent = MpiSendOutcome(id, o.world_size, outcome);
    if (outcome.ok() && !sent.ok())
      return sent.WithContext(Where(uri_, name) + " is committed, but");
    return outcome;
  }

 private:
  Status Decode(const std::string& name, PartRecord mine, const std::vector<std::string>& raw,
                const SaveOptions& o, std::vector<RankPart>* parts) const {
    parts->push_back(std::move(mine.part));
    for (uint32_t r = 1; r < o.world_size; ++r) {
      STOKER_ASSIGN_OR_RETURN(
          PartRecord part,
          DecodePart(std::as_bytes(std::span(raw[r])),
                     "the part record rank " + std::to_string(r) + " sent over MPI", name));
      if (part.part.rank != r || part.world_size != o.world_size) {
        return Corruption("commit of " + Where(uri_, name) + ": rank " + std::to_string(r) +
                          " sent the part of rank " + std::to_string(part.part.rank) + " of " +
                          std::to_string(part.world_size));
      }
      parts->push_back(std::move(part.part));
    }
    return Status::Ok();
  }

  std::string uri_;
};

}  // namespace

std::unique_ptr<Coordinator> NewStoreCoordinator(std::shared_ptr<Store> store,
                                                 std::chrono::milliseconds poll) {
  return std::make_unique<StoreCoordinator>(std::move(store), poll);
}

std::unique_ptr<Coordinator> NewMpiCoordinator(std::string uri) {
  return std::make_unique<MpiCoordinator>(std::move(uri));
}

Result<std::unique_ptr<Coordinator>> ChooseCoordinator(std::shared_ptr<Store> store,
                                                       std::chrono::milliseconds poll,
                                                       std::string_view name, const SaveOptions& o,
                                                       bool background) {
  const std::string uri = store->uri();
  if (o.coordination != SaveOptions::Coordination::kStore && o.world_size > 1) {
    std::string why;
    if (MpiUsable(o.rank, o.world_size, background, &why)) return NewMpiCoordinator(uri);
    if (o.coordination == SaveOptions::Coordination::kMpi) {
      return InvalidArgument("save of checkpoint " + std::string(name) + " at " + uri +
                             ": coordination over MPI asked for, but " + why);
    }
  }
  return NewStoreCoordinator(std::move(store), poll);
}

}  // namespace stoker::ckpt
