// How the ranks of one save learn that every part is durable, and how rank 0
// commits (docs/checkpoint.md §1.1 steps 2-6). Internal.
//
// Two implementations of one interface: through the store (rank 0 polls the
// part records, the others the manifest) and over MPI (each rank sends its
// outcome and part record to rank 0, which sends back the commit's outcome).
// SaveOptions::coordination picks one (ChooseCoordinator).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/records.h"
#include "stoker/checkpoint.h"

namespace stoker::ckpt {

// Rank 0's commit of every rank's part, in rank order.
using CommitFn = std::function<Status(std::vector<RankPart>)>;

class Coordinator {
 public:
  virtual ~Coordinator() = default;
  // After this rank wrote its part (`mine` ok; `rec` and its encoding
  // `encoded` are the durable part record) or failed (`mine` is the error):
  // rank 0 gathers every part and commits through `commit`; other ranks
  // wait for the commit when SaveOptions::wait_for_commit asks them to.
  // Returns this rank's outcome of the save.
  virtual Status Finish(const std::string& name, Status mine, PartRecord rec,
                        const std::string& encoded, const SaveOptions& o,
                        const CommitFn& commit) = 0;
};

// Coordination through the store: part records and the manifest, polled
// every `poll`. `uri` names the root in messages.
std::unique_ptr<Coordinator> NewStoreCoordinator(std::shared_ptr<Store> store,
                                                 std::chrono::milliseconds poll);

// Coordination over MPI (the messages below).
std::unique_ptr<Coordinator> NewMpiCoordinator(std::string uri);

// The coordinator for a save (SaveOptions::coordination): MPI when asked for
// or (kAuto) usable, else the store. `background`: the save runs on
// stoker's writer thread. InvalidArgument when MPI is asked for and cannot
// be used, saying why.
Result<std::unique_ptr<Coordinator>> ChooseCoordinator(std::shared_ptr<Store> store,
                                                       std::chrono::milliseconds poll,
                                                       std::string_view name, const SaveOptions& o,
                                                       bool background);

// ---- the MPI messages (mpi_coordinator.cc, or no_mpi.cc without MPI) ------

// Whether MPI can carry a save of `rank` of `world_size` from this thread
// (`background`: from stoker's writer thread); if not, why not.
bool MpiUsable(uint32_t rank, uint32_t world_size, bool background, std::string* why);

// The message's identity: messages of another save (a late one of an
// earlier, timed-out save) are dropped.
struct MpiSaveId {
  std::string name;
  std::string attempt;
};

// Rank != 0: sends this rank's outcome and, when ok, its encoded part record.
Status MpiSendPart(const MpiSaveId& id, const Status& outcome, const std::string& part);

// Rank 0: receives every other rank's outcome. Returns the first failure
// (naming the rank) or TimedOut at `deadline` naming the missing ranks;
// on success parts[r] holds rank r's encoded part (parts[0] untouched).
Status MpiGatherParts(const MpiSaveId& id, uint32_t world_size, Deadline deadline,
                      std::vector<std::string>* parts);

// Rank 0: sends the commit's outcome to every other rank.
Status MpiSendOutcome(const MpiSaveId& id, uint32_t world_size, const Status& outcome);

// Rank != 0: waits for rank 0's outcome until `deadline`.
Status MpiReceiveOutcome(const MpiSaveId& id, Deadline deadline);

}  // namespace stoker::ckpt
