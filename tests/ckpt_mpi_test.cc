// Checkpoints coordinated over MPI (SaveOptions::Coordination::kMpi), run by
// ctest under `mpirun -np 3`: every rank of this program runs the same tests
// in the same order on one shared root. A rank that fails is known to rank 0
// at once, not at the commit timeout.
#include <gtest/gtest.h>
#include <mpi.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>

#include "ckpt_testdata.h"
#include "stoker/checkpoint.h"

namespace stoker {
namespace {

using namespace std::chrono_literals;
using testing::FlakyStore;
using testing::MakeCkptContent;

int Rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int World() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

std::string g_root;  // shared by every rank, made by rank 0

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

SaveOptions Mpi() {
  SaveOptions o;
  o.rank = Rank();
  o.world_size = World();
  o.chunk_bytes = 16 << 10;
  o.coordination = SaveOptions::Coordination::kMpi;
  o.commit_timeout = 60s;
  return o;
}

void ExpectMine(const std::string& name, uint64_t seed) {
  auto c = OpenCheckpointer(g_root);
  ASSERT_TRUE(c.ok());
  RestoreOptions ro;
  ro.rank = Rank();
  ro.world_size = World();
  auto r = (*c)->Restore(name, ro);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto want = MakeCkptContent(seed);
  ASSERT_EQ(r->tensors.size(), want.refs.size());
  for (size_t i = 0; i < want.refs.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(r->tensors[i].data.data(), want.refs[i].data.data(),
                             want.refs[i].data.size()));
  }
}

TEST(CkptMpi, EveryRankSavesAndRankZeroCommits) {
  auto c = OpenCheckpointer(g_root);
  ASSERT_TRUE(c.ok());
  auto content = MakeCkptContent(40 + Rank());
  ASSERT_OK((*c)->Save("step-1", content.refs, Mpi()));
  // Every rank's save returned after the commit: the manifest is there.
  auto m = (*c)->ReadManifest("step-1");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->world_size, static_cast<uint32_t>(World()));
  ExpectMine("step-1", 40 + Rank());
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(CkptMpi, AsynchronousSavesToo) {
  auto c = OpenCheckpointer(g_root);
  ASSERT_TRUE(c.ok());
  auto content = MakeCkptContent(50 + Rank());
  auto h = (*c)->SaveAsync("step-2", content.refs, Mpi());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  for (auto& d : content.data) std::fill(d.begin(), d.end(), std::byte{7});
  ASSERT_OK(h->Wait());
  ExpectMine("step-2", 50 + Rank());
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(CkptMpi, AFailedRankIsKnownAtOnceAndNothingCommits) {
  auto store = OpenStore(g_root);
  ASSERT_TRUE(store.ok());
  const bool failing = Rank() == World() - 1;
  std::shared_ptr<Store> s = *store;
  if (failing) s = std::make_shared<FlakyStore>(s, 1 << 30, PermissionDenied("refused by test"));
  auto c = NewCheckpointer(s);
  const auto t0 = std::chrono::steady_clock::now();
  Status st = c->Save("step-3", MakeCkptContent(60 + Rank()).refs, Mpi());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(st.ok());
  EXPECT_LT(secs, 20.0) << "the failure waited for the 60 s commit timeout";
  if (failing) {
    EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.ToString();
  } else if (Rank() == 0) {
    EXPECT_TRUE(Contains(st.message(), "rank " + std::to_string(World() - 1) + " failed"))
        << st.ToString();
    EXPECT_TRUE(Contains(st.message(), "refused by test")) << st.ToString();
  } else {
    EXPECT_TRUE(Contains(st.message(), "not committed by rank 0")) << st.ToString();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto latest = c->Latest();
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, "step-2");
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST(CkptMpi, AWorldThatIsNotMpisIsRefusedBeforeWriting) {
  auto c = OpenCheckpointer(g_root);
  ASSERT_TRUE(c.ok());
  SaveOptions o = Mpi();
  o.world_size = World() + 1;
  Status st = (*c)->Save("step-4", MakeCkptContent(1).refs, o);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(st.message(), "MPI_COMM_WORLD is rank")) << st.message();
  // kStore still works under mpirun.
  o = Mpi();
  o.coordination = SaveOptions::Coordination::kStore;
  ASSERT_OK((*c)->Save("step-5", MakeCkptContent(70 + Rank()).refs, o));
  ExpectMine("step-5", 70 + Rank());
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  ::testing::InitGoogleTest(&argc, argv);
  if (provided < MPI_THREAD_MULTIPLE) {
    std::fprintf(stderr, "ckpt_mpi_test: MPI gives thread level %d, not MULTIPLE\n", provided);
  }
  char path[4096] = {0};
  if (stoker::Rank() == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "stoker-ckpt-mpi.XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
    std::snprintf(path, sizeof path, "%s", tmpl.c_str());
  }
  MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
  stoker::g_root = std::string(path) + "/ckpt";
  // Only rank 0 prints gtest's report; the others only their failures.
  if (stoker::Rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (stoker::Rank() == 0) std::filesystem::remove_all(path);
  MPI_Finalize();
  return any;
}
