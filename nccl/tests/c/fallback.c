/*
 * ringreduce-nccl handing what it does not run to the real NCCL: here a test double
 * (fake_nccl.c) at RINGREDUCE_NCCL_PATH, whose path is argv[1]. ncclCommInitAll (several ranks
 * in one process) is NCCL's; every later call on those communicators reaches it.
 */
#include "nccl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond, ...)                                                  \
  do {                                                                     \
    if (!(cond)) {                                                         \
      failures++;                                                          \
      fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, "\n");                                               \
    }                                                                      \
  } while (0)

int main(int argc, char **argv) {
  if (argc < 2) return 2;
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
  EXPECT(ncclCommDestroy(comms[0]) == ncclSuccess, "destroy 0");
  EXPECT(ncclCommDestroy(comms[1]) == ncclSuccess, "destroy 1");
  void *fake = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  int (*counted)(void) = fake ? (int (*)(void))dlsym(fake, "fake_nccl_calls") : NULL;
  EXPECT(counted != NULL, "the double's counter: %s", dlerror());
  if (counted) EXPECT(counted() == 5, "calls that reached NCCL: %d, want 5", counted());
  if (failures == 0) printf("fallback: every check passed\n");
  return failures == 0 ? 0 : 1;
}
