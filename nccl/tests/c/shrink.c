/* ncclCommShrink through NCCL's C API, one process per rank under MPI, every rank on GPU 0:
 * the last rank is excluded (it does not call ncclCommShrink), the others shrink, check the new
 * communicator's size and ranks, all-reduce on it and check the sum; the excluded rank then
 * meets them again at an MPI barrier. With the argument `abort` the excluded rank stands for a
 * hung one: the others first enqueue an all-reduce on the parent that it never joins (their
 * kernels wait for it), then shrink with NCCL_SHRINK_ABORT, which must end those waits, and
 * abort the parent at the end. Run under this library (preloaded) and the real NCCL by
 * nccl/tests/shrink.sh. Prints "rank R: shrink ok" and exits 0, or names what failed. */
#include <string.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                     \
  do {                                                                                  \
    ncclResult_t r_ = (call);                                                           \
    if (r_ != ncclSuccess) {                                                            \
      fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, #call, ncclGetErrorString(r_),    \
              ncclGetLastError(NULL));                                                  \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                     \
    }                                                                                   \
  } while (0)

enum { COUNT = 1024 };

int main(int argc, char** argv) {
  int rank, world;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  cudaSetDevice(0);
  ncclUniqueId id;
  if (rank == 0) CHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, world, id, rank));
  int excluded = world - 1;
  int hung = argc > 1 && strcmp(argv[1], "abort") == 0;
  if (rank != excluded) {
    /* In `abort` mode: an all-reduce the excluded rank never joins, on a stream of its own,
     * left waiting. */
    float* pending = NULL;
    cudaStream_t side = NULL;
    if (hung) {
      cudaMalloc((void**)&pending, COUNT * sizeof(float));
      cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
      CHECK(ncclAllReduce(pending, pending, COUNT, ncclFloat32, ncclSum, comm, side));
    }
    ncclComm_t small = NULL;
    CHECK(ncclCommShrink(comm, &excluded, 1, &small, NULL,
                         hung ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT));
    if (hung) {
      /* The abort ended the waiting all-reduce: its stream drains (its result is lost). */
      cudaStreamSynchronize(side);
      cudaGetLastError();
    }
    int count = -1, me = -1;
    CHECK(ncclCommCount(small, &count));
    CHECK(ncclCommUserRank(small, &me));
    if (count != world - 1 || me != rank) {
      fprintf(stderr, "rank %d: shrunk to %d ranks, rank %d\n", rank, count, me);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    float host[COUNT], *buf;
    for (int i = 0; i < COUNT; i++) host[i] = (float)(rank + 1 + i % 5);
    cudaMalloc((void**)&buf, sizeof host);
    cudaMemcpy(buf, host, sizeof host, cudaMemcpyHostToDevice);
    CHECK(ncclAllReduce(buf, buf, COUNT, ncclFloat32, ncclSum, small, 0));
    cudaStreamSynchronize(0);
    cudaMemcpy(host, buf, sizeof host, cudaMemcpyDeviceToHost);
    for (int i = 0; i < COUNT; i++) {
      float want = (float)((world - 1) * world / 2 + (world - 1) * (i % 5));
      if (host[i] != want) {
        fprintf(stderr, "rank %d: element %d is %f, want %f\n", rank, i, host[i], want);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    cudaFree(buf);
    CHECK(ncclCommDestroy(small));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (hung) {
    CHECK(ncclCommAbort(comm));
  } else {
    CHECK(ncclCommDestroy(comm));
  }
  printf("rank %d: shrink ok\n", rank);
  MPI_Finalize();
  return 0;
}
