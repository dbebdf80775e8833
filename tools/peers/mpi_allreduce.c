/* Peer for the communication benchmark: times MPI_Allreduce(MPI_IN_PLACE, float, MPI_SUM)
 * the same way tools/bench_peers.py times torch.distributed gloo: one warm-up, then per rep
 * barrier, start, all-reduce, barrier, stop; rank 0 prints the median in seconds.
 * Every rep's result is checked (every element equals the expected sum); a wrong result
 * makes the program exit non-zero.
 *
 * Built and run by tools/bench_native_peers.sh (plain mpicc, not Bazel):
 *   mpirun -np N --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo \
 *     mpi_allreduce MIB [REPS]
 * Output (rank 0): "check ok" then "seconds S".
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Rank r holds (i % 13) + r, so the sum is N * (i % 13) + N(N-1)/2: exact in fp32. */
static void fill(float* buf, size_t n, int rank) {
  for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 13 + rank);
}

static size_t count_wrong(const float* buf, size_t n, int world) {
  size_t wrong = 0;
  for (size_t i = 0; i < n; i++) {
    float want = (float)(world * (int)(i % 13) + world * (world - 1) / 2);
    if (buf[i] != want) wrong++;
  }
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (argc < 2) {
    if (rank == 0) fprintf(stderr, "usage: mpi_allreduce MIB [REPS]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  long mib = atol(argv[1]);
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  if (mib <= 0 || reps <= 0) MPI_Abort(MPI_COMM_WORLD, 2);
  size_t n = (size_t)mib << 18; /* fp32 elements in MIB MiB */
  float* buf = malloc(n * sizeof(float));
  double* times = malloc(reps * sizeof(double));
  if (buf == NULL || times == NULL) MPI_Abort(MPI_COMM_WORLD, 3);

  unsigned long long wrong = 0;
  for (int i = 0; i <= reps; i++) { /* i == 0 is the warm-up */
    fill(buf, n, rank);
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime() - start;
    if (i > 0) times[i - 1] = t;
    wrong += count_wrong(buf, n, world);
  }
  unsigned long long wrong_all = 0;
  MPI_Reduce(&wrong, &wrong_all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  int rc = 0;
  if (rank == 0) {
    qsort(times, reps, sizeof(double), cmp_double);
    double median = reps % 2 ? times[reps / 2] : (times[reps / 2 - 1] + times[reps / 2]) / 2;
    if (wrong_all == 0) {
      printf("check ok: %d ranks x %d reps, every element equals the expected sum\n", world,
             reps + 1);
      printf("seconds %.9f\n", median);
    } else {
      printf("check FAILED: %llu wrong elements\n", wrong_all);
      rc = 1;
    }
    fflush(stdout);
  }
  free(times);
  free(buf);
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return rc;
}
