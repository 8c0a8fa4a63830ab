// stoker's own allreduce for the mpi backend: a ring (reduce-scatter, then
// allgather) over nonblocking point-to-point, segmented so that each piece is
// reduced while it is still in cache.
//
// Why it exists: Open MPI 4.1's allreduce algorithms copy the input into the
// output first and receive each block into a scratch buffer they malloc on
// every call, adding it from there; above glibc's largest mmap threshold
// (32 MiB) that buffer is a fresh mmap each time, faulted in and zeroed
// again. This ring receives straight into the output and adds the input
// there (MPI_Reduce_local): no copy, no scratch, nothing allocated per
// call, about two thirds of the memory traffic (docs/benchmarks.md, with
// the measurements). Moved between ranks: 2(n-1)/n of the message, as any
// ring.
//
// Thread safety: as MPI's collectives: one call at a time per communicator.
#pragma once

#include <mpi.h>

#include <cstddef>

namespace stoker::comm {

// MPI_Allreduce(send, recv, count, type, op, comm) for a commutative `op`,
// `elem` bytes per element, out of place (send != recv). Messages are at
// most `segment_bytes` (rounded down to whole elements, at least one). A
// wait that has spun 100 us sleeps `sleep_us` between polls (0: MPI_Wait),
// so that oversubscribed ranks give their core to the peer they wait for.
// Returns an MPI error code (MPI_SUCCESS).
int RingAllreduce(const void* send, void* recv, size_t count, MPI_Datatype type, size_t elem,
                  MPI_Op op, MPI_Comm comm, size_t segment_bytes, int sleep_us);

}  // namespace stoker::comm
