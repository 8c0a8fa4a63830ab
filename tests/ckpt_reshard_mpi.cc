// Resharding at load on real ranks (ckpt_reshard_mpi.sh runs it under
// mpirun with several world sizes):
//
//   ckpt_reshard_mpi save ROOT NAME ROWS          every rank saves its pieces
//   ckpt_reshard_mpi load ROOT NAME ROWS [RATIO]  every rank loads its pieces
//                                                 of another split, checks
//                                                 each byte, and (RATIO) that
//                                                 it read at most RATIO x the
//                                                 bytes it received
//
// The state and both splits are tests/ckpt_reshard_data.h's. Exit status 0
// when every rank passed; each rank prints one line.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "ckpt_reshard_data.h"

namespace stoker {
namespace {

using testing::GlobalTensor;

int Fail(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  return 1;
}

int Save(const std::string& root, const std::string& name, int64_t rows, int rank, int world) {
  auto c = OpenCheckpointer(root);
  if (!c.ok()) return Fail(rank, c.status().ToString());
  const std::vector<GlobalTensor> state = testing::ShardedState(rows);
  const testing::SavedRank mine = testing::SaveRank(state, world, rank);
  SaveOptions o;
  o.rank = static_cast<uint32_t>(rank);
  o.world_size = static_cast<uint32_t>(world);
  o.coordination = SaveOptions::Coordination::kMpi;
  if (Status s = (*c)->Save(name, mine.refs, o); !s.ok()) return Fail(rank, s.ToString());
  std::printf("rank %d of %d: saved\n", rank, world);
  return 0;
}

int Load(const std::string& root, const std::string& name, int64_t rows, double ratio, int rank,
         int world) {
  auto store = OpenStore(root);
  if (!store.ok()) return Fail(rank, store.status().ToString());
  auto counting = std::make_shared<testing::CountingStore>(*store);
  auto c = NewCheckpointer(counting);
  const std::vector<GlobalTensor> state = testing::ShardedState(rows);
  testing::LoadedRank l = testing::WantRank(state, world, rank);
  RestoreOptions ro;
  ro.rank = static_cast<uint32_t>(rank);
  ro.world_size = static_cast<uint32_t>(world);
  auto m = c->RestoreInto(name, l.dst, ro);
  if (!m.ok()) return Fail(rank, m.status().ToString());
  if (std::string bad = l.Difference(state); !bad.empty()) {
    return Fail(rank, bad + " differs from the original");
  }
  const uint64_t received = l.received;
  const uint64_t read = counting->chunk_bytes_read;
  std::printf("rank %d of %d (saved by %u): equal; read %llu bytes for %llu received (%.3fx)\n",
              rank, world, m->world_size, static_cast<unsigned long long>(read),
              static_cast<unsigned long long>(received), double(read) / double(received));
  if (ratio > 0 && double(read) > ratio * double(received)) {
    return Fail(rank, "read more than " + std::to_string(ratio) + "x what it received");
  }
  return 0;
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int rc = 2;
  if (argc >= 5) {
    const std::string mode = argv[1];
    const int64_t rows = std::atoll(argv[4]);
    if (mode == "save") rc = stoker::Save(argv[2], argv[3], rows, rank, world);
    if (mode == "load") {
      rc = stoker::Load(argv[2], argv[3], rows, argc > 5 ? std::atof(argv[5]) : 0, rank, world);
    }
  } else if (rank == 0) {
    std::fprintf(stderr, "usage: ckpt_reshard_mpi save|load ROOT NAME ROWS [RATIO]\n");
  }
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
