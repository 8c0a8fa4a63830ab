// The MPI bootstrap and the mpi backend: host memory through MPI's own
// collectives, so the numbers are what an MPI job of the same shape gets.
#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/backend.h"
#include "comm/bootstrap.h"
#include "comm/values.h"

namespace stoker::comm {

namespace {

Status MpiError(int rc, const char* call) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return IoError(std::string(call) + ": " + std::string(text, len));
}

#define STOKER_MPI(call)                                 \
  do {                                                   \
    const int _rc = (call);                              \
    if (_rc != MPI_SUCCESS) return MpiError(_rc, #call); \
  } while (0)

// MPI is initialised once per process and finalised at exit, after any
// bootstrap is gone (the checkpointer's coordinator may share it).
void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Status InitMpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return Status::Ok();
  int provided = 0;
  // FUNNELED: only the main thread calls MPI; the watchdog never does (it
  // exits the process, which the launcher notices).
  STOKER_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  // Errors come back as return codes, so they reach a Status.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::atexit(FinalizeAtExit);
  return Status::Ok();
}

class MpiBootstrap final : public Bootstrap {
 public:
  MpiBootstrap(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string description() const override { return "mpi"; }
  bool is_mpi() const override { return true; }

  Result<std::vector<std::string>> AllGather(const std::string& mine) override {
    const int len = static_cast<int>(mine.size());
    std::vector<int> lens(size_), offsets(size_);
    STOKER_MPI(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD));
    int total = 0;
    for (int r = 0; r < size_; ++r) {
      offsets[r] = total;
      total += lens[r];
    }
    std::string all(total, '\0');
    STOKER_MPI(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offsets.data(),
                              MPI_CHAR, MPI_COMM_WORLD));
    std::vector<std::string> out(size_);
    for (int r = 0; r < size_; ++r) out[r] = all.substr(offsets[r], lens[r]);
    return out;
  }

 private:
  int rank_, size_;
};

// Sum of 16-bit floats, which MPI does not define: user operations over
// MPI_UINT16_T, converting through float (exact for the benchmark's values,
// rounded to nearest even otherwise).
void SumBf16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FloatToBf16(Bf16ToFloat(a[i]) + Bf16ToFloat(b[i]));
}
void SumF16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = FloatToF16(F16ToFloat(a[i]) + F16ToFloat(b[i]));
}

class MpiBackend final : public CollectiveBackend {
 public:
  MpiBackend(int rank, int size) : rank_(rank), size_(size) {}
  ~MpiBackend() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (bf16_sum_ != MPI_OP_NULL) MPI_Op_free(&bf16_sum_);
    if (f16_sum_ != MPI_OP_NULL) MPI_Op_free(&f16_sum_);
  }

  Status Init() {
    STOKER_MPI(MPI_Op_create(SumBf16, 1, &bf16_sum_));
    STOKER_MPI(MPI_Op_create(SumF16, 1, &f16_sum_));
    return Status::Ok();
  }

  std::string version() const override { return MpiLibraryVersion(); }

  Status Allocate(size_t bytes) override {
    // Touched now, so that no page fault lands in a timed run.
    send_.assign(bytes, std::byte{0});
    recv_.assign(bytes, std::byte{0});
    return Status::Ok();
  }
  Status Upload(const void* host, size_t bytes) override {
    std::memcpy(send_.data(), host, bytes);
    return Status::Ok();
  }
  Status Download(void* host, size_t bytes) override {
    std::memcpy(host, recv_.data(), bytes);
    return Status::Ok();
  }
  Status Poke(size_t offset, const void* host, size_t bytes) override {
    std::memcpy(recv_.data() + offset, host, bytes);
    return Status::Ok();
  }
  Status ClearOutput(size_t bytes) override {
    std::memset(recv_.data(), 0xff, bytes);
    return Status::Ok();
  }

  Status Run(CommOp op, CommDtype dtype, size_t count) override {
    MPI_Datatype type = MPI_FLOAT;
    MPI_Op sum = MPI_SUM;
    switch (dtype) {
      case CommDtype::kFloat32:
        break;
      case CommDtype::kInt32:
        type = MPI_INT32_T;
        break;
      case CommDtype::kBFloat16:
        type = MPI_UINT16_T;
        sum = bf16_sum_;
        break;
      case CommDtype::kFloat16:
        type = MPI_UINT16_T;
        sum = f16_sum_;
        break;
    }
    // MPI counts are ints.
    if (count > static_cast<size_t>(INT32_MAX)) {
      return InvalidArgument("the mpi backend takes at most 2^31-1 elements per call, not " +
                             std::to_string(count));
    }
    const int n = static_cast<int>(count);
    void* s = send_.data();
    void* r = recv_.data();
    switch (op) {
      case CommOp::kAllReduce:
        STOKER_MPI(MPI_Allreduce(s, r, n, type, sum, MPI_COMM_WORLD));
        break;
      case CommOp::kAllGather:
        STOKER_MPI(MPI_Allgather(s, n, type, r, n, type, MPI_COMM_WORLD));
        break;
      case CommOp::kReduceScatter:
        STOKER_MPI(MPI_Reduce_scatter_block(s, r, n, type, sum, MPI_COMM_WORLD));
        break;
      case CommOp::kBroadcast:
        // Out of place, as ncclBroadcast: the root's input lands in every
        // rank's output.
        if (rank_ == 0) std::memcpy(r, s, count * CommDtypeSize(dtype));
        STOKER_MPI(MPI_Bcast(r, n, type, 0, MPI_COMM_WORLD));
        break;
      case CommOp::kAllToAll:
        STOKER_MPI(MPI_Alltoall(s, n, type, r, n, type, MPI_COMM_WORLD));
        break;
      case CommOp::kSendRecv:
        STOKER_MPI(MPI_Sendrecv(s, n, type, (rank_ + 1) % size_, 0, r, n, type,
                                (rank_ + size_ - 1) % size_, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        break;
    }
    return Status::Ok();
  }
  Status Wait() override { return Status::Ok(); }

 private:
  int rank_, size_;
  std::vector<std::byte> send_, recv_;
  MPI_Op bf16_sum_ = MPI_OP_NULL, f16_sum_ = MPI_OP_NULL;
};

}  // namespace

std::string MpiLibraryVersion() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(text, &len);
  std::string v(text, len);
  // Open MPI's string runs on with its repository and date: the first line.
  if (auto nl = v.find_first_of("\n,"); nl != std::string::npos) v.resize(nl);
  return v;
}

Result<std::unique_ptr<Bootstrap>> MakeMpiBootstrap(const RankInfo& info) {
  STOKER_RETURN_IF_ERROR(InitMpi());
  int rank = 0, size = 0;
  STOKER_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  STOKER_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
  if (rank != info.rank || size != info.world_size) {
    return InvalidArgument("MPI says rank " + std::to_string(rank) + " of " + std::to_string(size) +
                           " but the launcher's variables say " + info.ToString());
  }
  return std::unique_ptr<Bootstrap>(new MpiBootstrap(rank, size));
}

Result<std::unique_ptr<CollectiveBackend>> MakeMpiBackend(Bootstrap& bootstrap) {
  if (!bootstrap.is_mpi()) {
    return Unsupported("the mpi backend needs an MPI launcher (mpirun, srun with PMI); " +
                       bootstrap.description() + " is not one");
  }
  auto b = std::make_unique<MpiBackend>(bootstrap.rank(), bootstrap.size());
  STOKER_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<CollectiveBackend>(std::move(b));
}

}  // namespace stoker::comm
