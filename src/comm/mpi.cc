// The MPI bootstrap and the mpi backend: host memory through MPI's own
// collectives, so the numbers are what an MPI job of the same shape gets.
#include <mpi.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/backend.h"
#include "comm/bootstrap.h"
#include "comm/mpi_ring.h"
#include "comm/values.h"

namespace stoker::comm {

namespace {

// STOKER_COMM_MPI_ALLREDUCE=auto: the ring from this size up, MPI_Allreduce
// below. Default: 1 MiB, measured from there up (docs/benchmarks.md);
// smaller messages are latency-bound, where Open MPI's own algorithms
// (recursive doubling) take fewer steps than a ring's 2(n-1).
constexpr size_t kMpiRingMinBytes = 1 << 20;
// The ring's message size. Default: 256 KiB, so that a piece received is
// still in L2 when it is added; 64 KiB and 1 MiB measured within the noise
// of it (docs/benchmarks.md, tune comm).
constexpr size_t kMpiRingSegmentBytes = 256 << 10;
// The ring's sleep between polls once a wait outlasts its spin (mpi_ring.h).
// Default: 20 us; nanosleep's timer slack makes it about 70.
constexpr size_t kMpiRingSleepUs = 20;

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

// How the mpi backend runs allreduce (comm.h: STOKER_COMM_MPI_ALLREDUCE).
struct MpiAllreduceChoice {
  bool ring = false;    // stoker's ring (mpi_ring.h); else MPI_Allreduce
  size_t ring_min = 0;  // bytes from which the ring is used
  size_t segment = 0;   // the ring's message size
  int sleep_us = 0;     // the ring's wait: sleep between polls (0: spin)
};

// A whole number from the environment, at least `min`; `fallback` if unset.
Result<size_t> NumberVariable(const char* name, size_t fallback, size_t min) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (*end != '\0' || *v == '-' || x < min || x > INT32_MAX) {
    return InvalidArgument(std::string(name) + "='" + v + "': not a whole number from " +
                           std::to_string(min) + " to 2^31-1");
  }
  return static_cast<size_t>(x);
}

Result<MpiAllreduceChoice> ChooseMpiAllreduce() {
  MpiAllreduceChoice c;
  const char* v = std::getenv("STOKER_COMM_MPI_ALLREDUCE");
  const std::string name = v == nullptr || *v == '\0' ? "auto" : v;
  if (name == "ring") {
    c.ring = true;
  } else if (name == "auto") {
    c.ring = true;
    c.ring_min = kMpiRingMinBytes;
  } else if (name != "mpi") {
    return InvalidArgument("STOKER_COMM_MPI_ALLREDUCE='" + name + "': use auto, ring or mpi");
  }
  STOKER_ASSIGN_OR_RETURN(c.segment,
                          NumberVariable("STOKER_COMM_MPI_SEGMENT", kMpiRingSegmentBytes, 1));
  STOKER_ASSIGN_OR_RETURN(const size_t sleep_us,
                          NumberVariable("STOKER_COMM_MPI_SLEEP_US", kMpiRingSleepUs, 0));
  c.sleep_us = static_cast<int>(sleep_us);
  return c;
}

class MpiBackend final : public CollectiveBackend {
 public:
  MpiBackend(int rank, int size, MpiAllreduceChoice allreduce)
      : rank_(rank), size_(size), allreduce_(allreduce) {}
  ~MpiBackend() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (bf16_sum_ != MPI_OP_NULL) MPI_Op_free(&bf16_sum_);
    if (f16_sum_ != MPI_OP_NULL) MPI_Op_free(&f16_sum_);
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }

  Status Init() {
    STOKER_MPI(MPI_Op_create(SumBf16, 1, &bf16_sum_));
    STOKER_MPI(MPI_Op_create(SumF16, 1, &f16_sum_));
    // The ring's point-to-point messages on a communicator of their own, so
    // that they never match another part's (the checkpointer's) on WORLD.
    STOKER_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
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
        if (UseRing(dtype, count)) {
          STOKER_MPI(RingAllreduce(s, r, count, type, CommDtypeSize(dtype), sum, comm_,
                                   allreduce_.segment, allreduce_.sleep_us));
        } else {
          STOKER_MPI(MPI_Allreduce(s, r, n, type, sum, MPI_COMM_WORLD));
        }
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
  std::string Algorithm(CommOp op, CommDtype dtype, size_t count) const override {
    if (op != CommOp::kAllReduce) return "";
    return UseRing(dtype, count) ? "stoker ring" : "MPI_Allreduce";
  }

 private:
  bool UseRing(CommDtype dtype, size_t count) const {
    return allreduce_.ring && count * CommDtypeSize(dtype) >= allreduce_.ring_min;
  }

  int rank_, size_;
  MpiAllreduceChoice allreduce_;
  std::vector<std::byte> send_, recv_;
  MPI_Op bf16_sum_ = MPI_OP_NULL, f16_sum_ = MPI_OP_NULL;
  MPI_Comm comm_ = MPI_COMM_NULL;
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
  STOKER_ASSIGN_OR_RETURN(MpiAllreduceChoice allreduce, ChooseMpiAllreduce());
  auto b = std::make_unique<MpiBackend>(bootstrap.rank(), bootstrap.size(), allreduce);
  STOKER_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<CollectiveBackend>(std::move(b));
}

}  // namespace stoker::comm
