/* The MPI peer of `stoker bench comm --backend mpi`: Open MPI's own
 * MPI_Allreduce of float32 in a loop, timed as stoker times it (warm-up, the
 * ranks start together, `iters` back to back, the mean per iteration
 * averaged over ranks, busbw = bytes / time x 2(n-1)/n). Built by
 * bench/comm_bench.py with mpicc.
 *   mpirun -np 4 comm_mpi_peer SIZE_BYTES[,SIZE...] WARMUP ITERS
 * Prints one JSON object on rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int warmup = argc > 2 ? atoi(argv[2]) : 5, iters = argc > 3 ? atoi(argv[3]) : 20;
  char* sizes = strdup(argc > 1 ? argv[1] : "67108864");
  if (rank == 0) printf("{\"peer\": \"MPI_Allreduce loop\", \"world_size\": %d, \"results\": [", n);
  int first = 1;
  for (char* s = strtok(sizes, ","); s != NULL; s = strtok(NULL, ",")) {
    const long bytes = atol(s), count = bytes / 4;
    float* in = malloc(bytes);
    float* out = malloc(bytes);
    for (long i = 0; i < count; ++i) in[i] = (float)(1 + (rank * 5 + i * 3) % 8);
    memset(out, 0, bytes);
    for (int i = 0; i < (warmup > 0 ? warmup : 1); ++i) {
      MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      MPI_Allreduce(in, out, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double us = (MPI_Wtime() - t0) / iters * 1e6, sum = 0;
    MPI_Allreduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    us = sum / n;
    const double algbw = bytes / us / 1e3;
    if (rank == 0) {
      printf("%s{\"op\": \"allreduce\", \"dtype\": \"float32\", \"bytes\": %ld, \"time_us\": %.3f, "
             "\"algbw_gbps\": %.6f, \"busbw_gbps\": %.6f}",
             first ? "" : ", ", bytes, us, algbw, algbw * 2.0 * (n - 1) / n);
    }
    first = 0;
    free(in);
    free(out);
  }
  if (rank == 0) printf("]}\n");
  free(sizes);
  MPI_Finalize();
  return 0;
}
