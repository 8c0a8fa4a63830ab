// How the ranks of one save learn that every part is durable, over MPI
// (SaveOptions::Coordination::kMpi). Internal; mpi_coordinator.cc when
// built with MPI, no_mpi.cc otherwise. The store path needs none of this.
#pragma once

#include <string>
#include <vector>

#include "stoker/checkpoint.h"

namespace stoker::ckpt {

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
