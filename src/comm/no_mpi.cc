// Built without MPI: the mpi backend and bootstrap say so.
#include "comm/backend.h"
#include "comm/bootstrap.h"

namespace stoker::comm {

std::string MpiLibraryVersion() { return ""; }

Result<std::unique_ptr<Bootstrap>> MakeMpiBootstrap(const RankInfo&) {
  return Unsupported("built without MPI (configure with -DSTOKER_WITH_MPI=ON)");
}

Result<std::unique_ptr<CollectiveBackend>> MakeMpiBackend(Bootstrap&) {
  return Unsupported("the mpi backend: built without MPI (configure with -DSTOKER_WITH_MPI=ON)");
}

}  // namespace stoker::comm
