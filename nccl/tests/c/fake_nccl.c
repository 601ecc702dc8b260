/*
 * A test double of the real NCCL, for ringreduce-nccl's fallback test only (it runs no
 * collective): it answers the calls the library hands to NCCL with values no real call would
 * give, and counts them (fake_nccl_calls), so the test can tell that a call reached it.
 */
#include <stddef.h>
#include <stdint.h>

typedef int result;

static int calls = 0;

int fake_nccl_calls(void) { return calls; }

result ncclGetVersion(int *version) { *version = 21903; return 0; }

result ncclCommInitAll(void **comms, int ndev, const int *devlist) {
  (void)devlist;
  for (int i = 0; i < ndev; i++) comms[i] = (void *)(uintptr_t)(0x1000 + i);
  calls++;
  return 0;
}

result ncclCommUserRank(void *comm, int *rank) { *rank = (int)((uintptr_t)comm - 0x1000); return 0; }
result ncclCommCount(void *comm, int *count) { (void)comm; *count = 2; return 0; }
result ncclCommCuDevice(void *comm, int *device) { (void)comm; *device = 5; return 0; }

/* Succeeds for 7 elements only, and says ncclInvalidArgument (4) otherwise. */
result ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, void *comm,
                     void *stream) {
  (void)send; (void)recv; (void)type; (void)op; (void)comm; (void)stream;
  calls++;
  return count == 7 ? 0 : 4;
}

/* The calls NCCL 2.28 added that torch and vLLM import: each only counts. */
result ncclBcast(void *buff, size_t count, int type, int root, void *comm, void *stream) {
  (void)buff; (void)count; (void)type; (void)root; (void)comm; (void)stream;
  calls++;
  return 0;
}
result ncclGather(const void *send, void *recv, size_t count, int type, int root, void *comm,
                  void *stream) {
  (void)send; (void)recv; (void)count; (void)type; (void)root; (void)comm; (void)stream;
  calls++;
  return 0;
}
result ncclCommWindowRegister(void *comm, void *buff, size_t size, void **win, int flags) {
  (void)comm; (void)buff; (void)size; (void)flags;
  *win = (void *)0x77;
  calls++;
  return 0;
}
/* Keeps every rank but the excluded ones: a new handle past the InitAll ones. */
result ncclCommShrink(void *comm, int *exclude, int count, void **newcomm, void *config, int flags) {
  (void)comm; (void)exclude; (void)count; (void)config; (void)flags;
  *newcomm = (void *)(uintptr_t)0x1000;
  calls++;
  return 0;
}

result ncclCommDestroy(void *comm) { (void)comm; calls++; return 0; }
result ncclGroupStart(void) { return 0; }
result ncclGroupEnd(void) { return 0; }
const char *ncclGetLastError(void *comm) { (void)comm; return "fake nccl's last error"; }
