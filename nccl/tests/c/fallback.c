/*
 * ringreduce-nccl handing what it does not run to the real NCCL: here a test double
 * (fake_nccl.c) at RINGREDUCE_NCCL_PATH, whose path is argv[1]. ncclCommInitAll (several ranks
 * in one process) is NCCL's; every later call on those communicators reaches it. With argv[2]
 * "load-first" the program loads the double by its path itself before any NCCL call, as
 * PyTorch loads its wheel's libnccl.so.2, and the library must find it there.
 */
#include "nccl.h"
#include "expect.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>


int main(int argc, char **argv) {
  if (argc < 2) return 2;
  if (argc > 2 && strcmp(argv[2], "load-first") == 0) {
    EXPECT(dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) != NULL, "loading %s: %s", argv[1], dlerror());
  }
  ncclComm_t comms[2] = {NULL, NULL};
  ncclResult_t r = ncclCommInitAll(comms, 2, NULL);
  EXPECT(r == ncclSuccess, "ncclCommInitAll: %d (%s)", (int)r, ncclGetLastError(NULL));
  int value = -1;
  EXPECT(ncclCommCuDevice(comms[0], &value) == ncclSuccess && value == 5, "device %d", value);
  EXPECT(ncclCommUserRank(comms[1], &value) == ncclSuccess && value == 1, "rank %d", value);
  EXPECT(ncclCommCount(comms[1], &value) == ncclSuccess && value == 2, "count %d", value);
  r = ncclAllReduce(NULL, NULL, 7, ncclFloat32, ncclSum, comms[0], NULL);
  EXPECT(r == ncclSuccess, "all-reduce of 7: %d", (int)r);
  r = ncclAllReduce(NULL, NULL, 8, ncclFloat32, ncclSum, comms[0], NULL);
  EXPECT(r == ncclInvalidArgument, "NCCL's own code passes through: %d", (int)r);
  EXPECT(strcmp(ncclGetLastError(comms[0]), "fake nccl's last error") == 0, "last error: %s",
         ncclGetLastError(comms[0]));
  EXPECT(ncclGroupStart() == ncclSuccess && ncclGroupEnd() == ncclSuccess, "a group");
  EXPECT(ncclBcast(NULL, 4, ncclFloat32, 0, comms[0], NULL) == ncclSuccess, "bcast");
  EXPECT(ncclGather(NULL, NULL, 4, ncclFloat32, 0, comms[1], NULL) == ncclSuccess, "gather");
  ncclWindow_t window = NULL;
  EXPECT(ncclCommWindowRegister(comms[0], NULL, 0, &window, NCCL_WIN_COLL_SYMMETRIC) ==
             ncclSuccess && window == (ncclWindow_t)0x77,
         "window %p", (void *)window);
  ncclComm_t shrunk = NULL;
  EXPECT(ncclCommShrink(comms[0], NULL, 0, &shrunk, NULL, NCCL_SHRINK_DEFAULT) == ncclSuccess &&
             shrunk != NULL,
         "shrink");
  EXPECT(shrunk == NULL || (ncclCommUserRank(shrunk, &value) == ncclSuccess && value == 0),
         "the shrunk communicator is NCCL's: rank %d", value);
  EXPECT(ncclCommDestroy(comms[0]) == ncclSuccess, "destroy 0");
  EXPECT(ncclCommDestroy(comms[1]) == ncclSuccess, "destroy 1");
  EXPECT(shrunk == NULL || ncclCommDestroy(shrunk) == ncclSuccess, "destroy the shrunk one");
  void *fake = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  int (*counted)(void) = fake ? (int (*)(void))dlsym(fake, "fake_nccl_calls") : NULL;
  EXPECT(counted != NULL, "the double's counter: %s", dlerror());
  if (counted) EXPECT(counted() == 10, "calls that reached NCCL: %d, want 10", counted());
  if (failures == 0) printf("fallback: every check passed\n");
  return failures == 0 ? 0 : 1;
}
