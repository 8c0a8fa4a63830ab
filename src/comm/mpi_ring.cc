// The ring allreduce of mpi_ring.h.
#include "comm/mpi_ring.h"

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace stoker::comm {

namespace {

#define STOKER_MPI_RC(call)             \
  do {                                  \
    const int _rc = (call);             \
    if (_rc != MPI_SUCCESS) return _rc; \
  } while (0)

// One tag: the communicator is the backend's own, and messages between two
// ranks match in the order they were posted.
constexpr int kTag = 0x5200;

// Chunk c of n: [begin, end) in elements, sizes differing by at most one.
size_t ChunkBegin(size_t count, int n, int c) {
  return count / n * c + std::min<size_t>(c, count % n);
}

// Waits for `req`. MPI moves the data only inside its calls, so this
// polls; once the request has been pending for `kSpinNs`, it sleeps
// `sleep_us` between polls, giving the core to the ranks that have work
// (gloo's ranks block in the kernel instead). With a core per rank a
// segment lands well within the spin, so it never sleeps; oversubscribed,
// the peer it waits for may not be running at all. `sleep_us` 0: MPI_Wait.
int Wait(MPI_Request& req, int sleep_us) {
  if (sleep_us <= 0) return MPI_Wait(&req, MPI_STATUS_IGNORE);
  // Default: 100 us, several segments' time on a core of its own.
  constexpr double kSpinNs = 100e3;
  const double start = MPI_Wtime();
  int done = 0;
  for (;;) {
    STOKER_MPI_RC(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return MPI_SUCCESS;
    if ((MPI_Wtime() - start) * 1e9 >= kSpinNs) {
      timespec ts{0, sleep_us * 1000L};
      nanosleep(&ts, nullptr);
    }
  }
}

// One step of the ring: sends chunk `send_chunk` of `out` to the right
// neighbour while receiving chunk `recv_chunk` from the left one into
// `recv`, segment by segment; each segment received is reduced with the
// same elements of `in` as soon as it lands (when `in` is set).
int Step(const std::byte* out, std::byte* recv, const std::byte* in, size_t count, size_t elem,
         int n, int send_chunk, int recv_chunk, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
         int left, int right, size_t segment, int sleep_us, std::vector<MPI_Request>& reqs) {
  const size_t sb = ChunkBegin(count, n, send_chunk), se = ChunkBegin(count, n, send_chunk + 1);
  const size_t rb = ChunkBegin(count, n, recv_chunk), re = ChunkBegin(count, n, recv_chunk + 1);
  const size_t send_segs = (se - sb + segment - 1) / segment;
  const size_t recv_segs = (re - rb + segment - 1) / segment;
  reqs.assign(send_segs + recv_segs, MPI_REQUEST_NULL);
  // Every receive is posted before any send, so that each message finds its
  // buffer (no unexpected-message copy).
  for (size_t s = 0; s < recv_segs; ++s) {
    const size_t b = rb + s * segment, len = std::min(segment, re - b);
    STOKER_MPI_RC(
        MPI_Irecv(recv + b * elem, static_cast<int>(len), type, left, kTag, comm, &reqs[s]));
  }
  for (size_t s = 0; s < send_segs; ++s) {
    const size_t b = sb + s * segment, len = std::min(segment, se - b);
    STOKER_MPI_RC(MPI_Isend(out + b * elem, static_cast<int>(len), type, right, kTag, comm,
                            &reqs[recv_segs + s]));
  }
  for (size_t s = 0; s < recv_segs; ++s) {
    STOKER_MPI_RC(Wait(reqs[s], sleep_us));
    if (in == nullptr) continue;
    const size_t b = rb + s * segment, len = std::min(segment, re - b);
    STOKER_MPI_RC(
        MPI_Reduce_local(in + b * elem, recv + b * elem, static_cast<int>(len), type, op));
  }
  for (size_t s = 0; s < send_segs; ++s) STOKER_MPI_RC(Wait(reqs[recv_segs + s], sleep_us));
  return MPI_SUCCESS;
}

}  // namespace

int RingAllreduce(const void* send, void* recv, size_t count, MPI_Datatype type, size_t elem,
                  MPI_Op op, MPI_Comm comm, size_t segment_bytes, int sleep_us) {
  int rank = 0, n = 1;
  STOKER_MPI_RC(MPI_Comm_rank(comm, &rank));
  STOKER_MPI_RC(MPI_Comm_size(comm, &n));
  auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  if (n == 1) {
    std::copy(in, in + count * elem, out);
    return MPI_SUCCESS;
  }
  const size_t segment = std::clamp<size_t>(segment_bytes / elem, 1, INT32_MAX);
  const int left = (rank + n - 1) % n, right = (rank + 1) % n;
  std::vector<MPI_Request> reqs;
  // Reduce-scatter: at step k a rank sends chunk rank-k (its own input at
  // k = 0, then the sum it holds) and receives chunk rank-k-1 into the
  // output, adding its own input there; after n-1 steps it holds the whole
  // sum of chunk rank+1.
  for (int k = 0; k < n - 1; ++k) {
    const int send_chunk = (rank - k + 2 * n) % n, recv_chunk = (rank - k - 1 + 2 * n) % n;
    STOKER_MPI_RC(Step(k == 0 ? in : out, out, in, count, elem, n, send_chunk, recv_chunk, type, op,
                       comm, left, right, segment, sleep_us, reqs));
  }
  // Allgather: pass the finished chunks round the ring into the output.
  for (int k = 0; k < n - 1; ++k) {
    const int send_chunk = (rank + 1 - k + 2 * n) % n, recv_chunk = (rank - k + 2 * n) % n;
    STOKER_MPI_RC(Step(out, out, nullptr, count, elem, n, send_chunk, recv_chunk, type, op, comm,
                       left, right, segment, sleep_us, reqs));
  }
  return MPI_SUCCESS;
}

}  // namespace stoker::comm
