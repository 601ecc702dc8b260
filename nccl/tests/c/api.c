/*
 * The C face of ringreduce-nccl, as a C program meets it: built against include/nccl.h with the
 * system compiler and linked to the library under NCCL's name (libnccl.so.2). Every call this
 * program makes needs no GPU; argv[1] says whether the machine has one ("gpu" or "nogpu"), which
 * decides what communicator creation must answer.
 *
 * The signature table assigns every exported function to a pointer of the type NCCL's user guide
 * documents for it: a declaration in nccl.h that differs from the documented one fails the build.
 */
#include "nccl.h"
#include "expect.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* NCCL's documented signatures. */
typedef ncclResult_t (*GetVersion)(int *);
typedef ncclResult_t (*GetUniqueId)(ncclUniqueId *);
typedef const char *(*GetErrorString)(ncclResult_t);
typedef const char *(*GetLastError)(ncclComm_t);
typedef ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
typedef ncclResult_t (*CommInitRankConfig)(ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *);
typedef ncclResult_t (*CommInitAll)(ncclComm_t *, int, const int *);
typedef ncclResult_t (*CommSplit)(ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *);
typedef ncclResult_t (*CommOne)(ncclComm_t);
typedef ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t *);
typedef ncclResult_t (*CommNumber)(const ncclComm_t, int *);
typedef ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                  ncclComm_t, cudaStream_t);
typedef ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                                  cudaStream_t);
typedef ncclResult_t (*Reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
                               ncclComm_t, cudaStream_t);
typedef ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                                  cudaStream_t);
typedef ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
                                      ncclComm_t, cudaStream_t);
typedef ncclResult_t (*AlltoAll)(const void *, void *, size_t, ncclDataType_t, ncclComm_t,
                                 cudaStream_t);
typedef ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*Group)(void);
typedef ncclResult_t (*RedOpCreatePreMulSum)(ncclRedOp_t *, void *, ncclDataType_t,
                                             ncclScalarResidence_t, ncclComm_t);
typedef ncclResult_t (*RedOpDestroy)(ncclRedOp_t, ncclComm_t);
typedef ncclResult_t (*MemAlloc)(void **, size_t);
typedef ncclResult_t (*MemFree)(void *);
typedef ncclResult_t (*CommRegister)(const ncclComm_t, void *, size_t, void **);
typedef ncclResult_t (*CommDeregister)(const ncclComm_t, void *);
typedef ncclResult_t (*Bcast)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*Rooted)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
                               cudaStream_t);
typedef ncclResult_t (*CommInitRankScalable)(ncclComm_t *, int, int, int, ncclUniqueId *,
                                             ncclConfig_t *);
typedef ncclResult_t (*CommShrink)(ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int);
typedef ncclResult_t (*GroupSimulateEnd)(ncclSimInfo_t *);
typedef ncclResult_t (*CommWindowRegister)(ncclComm_t, void *, size_t, ncclWindow_t *, int);
typedef ncclResult_t (*CommWindowDeregister)(ncclComm_t, ncclWindow_t);
typedef ncclResult_t (*DevCommCreate)(ncclComm_t, const ncclDevCommRequirements *, ncclDevComm *);
typedef ncclResult_t (*DevCommDestroy)(ncclComm_t, const ncclDevComm *);
typedef ncclResult_t (*CommRevoke)(ncclComm_t, int);
typedef void (*ResetDebugInit)(void);
typedef ncclResult_t (*CommGetUniqueId)(ncclComm_t, ncclUniqueId *);
typedef ncclResult_t (*CommGrow)(ncclComm_t, int, const ncclUniqueId *, int, ncclComm_t *,
                                 ncclConfig_t *);
typedef ncclResult_t (*CommSuspend)(ncclComm_t, int);
typedef ncclResult_t (*CommMemStats)(ncclComm_t, ncclCommMemStat_t, uint64_t *);
typedef ncclResult_t (*WinGetUserPtr)(ncclComm_t, ncclWindow_t, void **);
typedef ncclResult_t (*PutSignal)(const void *, size_t, ncclDataType_t, int, ncclWindow_t, size_t,
                                  int, int, unsigned int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*Signal)(int, int, int, unsigned int, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*WaitSignal)(int, ncclWaitSignalDesc_t *, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*GetLsaMultimemDevicePointer)(ncclWindow_t, size_t, void **);
typedef ncclResult_t (*GetPeerDevicePointer)(ncclWindow_t, size_t, int, void **);

struct Signatures {
  GetVersion get_version; GetUniqueId get_unique_id; GetErrorString get_error_string;
  GetLastError get_last_error; CommInitRank init_rank; CommInitRankConfig init_rank_config;
  CommInitAll init_all; CommSplit split; CommOne finalize, destroy, abort_;
  CommGetAsyncError async_error; CommNumber count, cu_device, user_rank;
  AllReduce all_reduce; Broadcast broadcast; Reduce reduce; AllGather all_gather;
  ReduceScatter reduce_scatter; AlltoAll all_to_all; Send send; Recv recv;
  Group group_start, group_end; RedOpCreatePreMulSum pre_mul_sum; RedOpDestroy op_destroy;
  MemAlloc mem_alloc; MemFree mem_free; CommRegister reg; CommDeregister dereg;
  Bcast bcast; Rooted gather, scatter; CommInitRankScalable init_scalable; CommShrink shrink;
  GroupSimulateEnd simulate_end; CommWindowRegister window_reg; CommWindowDeregister window_dereg;
  DevCommCreate dev_comm_create; DevCommDestroy dev_comm_destroy;
  CommRevoke revoke; ResetDebugInit reset_debug_init; CommGetUniqueId comm_get_unique_id;
  CommGrow grow; CommSuspend suspend; CommOne resume; CommMemStats mem_stats;
  WinGetUserPtr win_get_user_ptr; PutSignal put_signal; Signal signal; WaitSignal wait_signal;
  GetLsaMultimemDevicePointer lsa_multimem_pointer; GetPeerDevicePointer peer_pointer;
};

static const struct Signatures signatures = {
  ncclGetVersion, ncclGetUniqueId, ncclGetErrorString, ncclGetLastError, ncclCommInitRank,
  ncclCommInitRankConfig, ncclCommInitAll, ncclCommSplit, ncclCommFinalize, ncclCommDestroy,
  ncclCommAbort, ncclCommGetAsyncError, ncclCommCount, ncclCommCuDevice, ncclCommUserRank,
  ncclAllReduce, ncclBroadcast, ncclReduce, ncclAllGather, ncclReduceScatter, ncclAlltoAll,
  ncclSend, ncclRecv, ncclGroupStart, ncclGroupEnd, ncclRedOpCreatePreMulSum, ncclRedOpDestroy,
  ncclMemAlloc, ncclMemFree, ncclCommRegister, ncclCommDeregister, ncclBcast, ncclGather,
  ncclScatter, ncclCommInitRankScalable, ncclCommShrink, ncclGroupSimulateEnd,
  ncclCommWindowRegister, ncclCommWindowDeregister, ncclDevCommCreate, ncclDevCommDestroy,
  ncclCommRevoke, ncclResetDebugInit, ncclCommGetUniqueId, ncclCommGrow, ncclCommSuspend,
  ncclCommResume, ncclCommMemStats, ncclWinGetUserPtr, ncclPutSignal, ncclSignal, ncclWaitSignal,
  ncclGetLsaMultimemDevicePointer, ncclGetPeerDevicePointer,
};


/* The call returned `want`, and when it failed, the last error says `says`. */
static void expect_result(const char *what, ncclResult_t got, ncclResult_t want, const char *says) {
  const char *last = ncclGetLastError(NULL);
  EXPECT(got == want, "%s: got %d (%s), want %d; last error: %s", what, (int)got,
         ncclGetErrorString(got), (int)want, last);
  if (want != ncclSuccess && says != NULL) {
    EXPECT(strstr(last, says) != NULL, "%s: last error \"%s\" lacks \"%s\"", what, last, says);
  }
}

int main(int argc, char **argv) {
  int has_gpu = argc > 1 && strcmp(argv[1], "gpu") == 0;

  int version = 0;
  expect_result("ncclGetVersion", signatures.get_version(&version), ncclSuccess, NULL);
  EXPECT(version == NCCL_VERSION_CODE, "version %d, header %d", version, NCCL_VERSION_CODE);
  expect_result("ncclGetVersion(NULL)", ncclGetVersion(NULL), ncclInvalidArgument, "null");

  ncclUniqueId a, b;
  expect_result("ncclGetUniqueId", ncclGetUniqueId(&a), ncclSuccess, NULL);
  expect_result("ncclGetUniqueId", ncclGetUniqueId(&b), ncclSuccess, NULL);
  EXPECT(memcmp(&a, &b, sizeof a) != 0, "two unique ids are equal");
  expect_result("ncclGetUniqueId(NULL)", ncclGetUniqueId(NULL), ncclInvalidArgument, "null");

  for (int r = 0; r < ncclNumResults; r++) {
    for (int s = 0; s < r; s++) {
      EXPECT(strcmp(ncclGetErrorString(r), ncclGetErrorString(s)) != 0,
             "codes %d and %d share a text", r, s);
    }
  }
  EXPECT(ncclGetErrorString((ncclResult_t)99) != NULL, "unknown code without a text");

  ncclComm_t comm = NULL;
  expect_result("init with a null comm", ncclCommInitRank(NULL, 2, a, 0), ncclInvalidArgument,
                "null");
  expect_result("init of 0 ranks", ncclCommInitRank(&comm, 0, a, 0), ncclInvalidArgument, "rank");
  expect_result("init of rank 2 of 2", ncclCommInitRank(&comm, 2, a, 2), ncclInvalidArgument,
                "rank 2 of 2");
  ncclUniqueId junk;
  memset(&junk, 7, sizeof junk);
  expect_result("init with a foreign id", ncclCommInitRank(&comm, 1, junk, 0),
                ncclInvalidArgument, "unique id");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.magic = 0;
  expect_result("init with an uninitialized config", ncclCommInitRankConfig(&comm, 1, a, 0, &config),
                ncclInvalidArgument, "NCCL_CONFIG_INITIALIZER");
  expect_result("ncclCommInitAll", ncclCommInitAll(&comm, 2, NULL), ncclInvalidUsage,
                "one process per GPU");

  if (has_gpu) {
    /* One rank on this thread's GPU: the calls succeed end to end (their results are checked
     * by the GPU tests in Rust and by the PyTorch run). */
    int value = -1;
    expect_result("init of one rank", ncclCommInitRank(&comm, 1, a, 0), ncclSuccess, NULL);
    expect_result("ncclCommCount", ncclCommCount(comm, &value), ncclSuccess, NULL);
    EXPECT(value == 1, "count %d", value);
    expect_result("ncclCommUserRank", ncclCommUserRank(comm, &value), ncclSuccess, NULL);
    EXPECT(value == 0, "rank %d", value);
    void *buf = NULL;
    expect_result("ncclMemAlloc", ncclMemAlloc(&buf, 4096), ncclSuccess, NULL);
    expect_result("ncclAllReduce in place",
                  ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, comm, NULL), ncclSuccess, NULL);
    /* The calls of NCCL 2.28-2.29 on a ringreduce communicator: answered where the answer is
       known, refused by name otherwise. */
    expect_result("ncclCommRevoke", ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclInvalidUsage,
                  "ncclCommRevoke");
    expect_result("ncclCommSuspend", ncclCommSuspend(comm, NCCL_SUSPEND_MEM), ncclInvalidUsage,
                  "ncclCommSuspend");
    ncclUniqueId grow;
    expect_result("ncclCommGetUniqueId", ncclCommGetUniqueId(comm, &grow), ncclInvalidUsage,
                  "ncclCommGrow");
    ncclComm_t grown = comm;
    expect_result("ncclCommGrow", ncclCommGrow(comm, 2, NULL, -1, &grown, NULL), ncclInvalidUsage,
                  "ncclCommGrow");
    EXPECT(grown == NULL, "ncclCommGrow leaves no communicator behind a refusal");
    uint64_t stat = 7;
    expect_result("ncclCommMemStats(suspendable)",
                  ncclCommMemStats(comm, ncclStatGpuMemSuspend, &stat), ncclSuccess, NULL);
    EXPECT(stat == 0, "suspendable memory %llu", (unsigned long long)stat);
    expect_result("ncclCommMemStats(total)", ncclCommMemStats(comm, ncclStatGpuMemTotal, &stat),
                  ncclInvalidUsage, "not counted");
    expect_result("ncclSignal", ncclSignal(0, 0, 0, 0, comm, NULL), ncclInvalidUsage, "one-sided");
    ncclWindow_t win = NULL;
    expect_result("ncclCommWindowRegister", ncclCommWindowRegister(comm, buf, 4096, &win,
                  NCCL_WIN_COLL_SYMMETRIC), ncclSuccess, NULL);
    void *user = NULL;
    expect_result("ncclWinGetUserPtr", ncclWinGetUserPtr(comm, win, &user), ncclSuccess, NULL);
    EXPECT(user == buf, "the window's user pointer %p, registered at %p", user, buf);
    void *peer = NULL;
    expect_result("ncclGetPeerDevicePointer", ncclGetPeerDevicePointer(win, 0, 0, &peer),
                  ncclInvalidUsage, "device API");
    expect_result("ncclCommWindowDeregister", ncclCommWindowDeregister(comm, win), ncclSuccess,
                  NULL);
    expect_result("ncclWinGetUserPtr after deregistration", ncclWinGetUserPtr(comm, win, &user),
                  ncclInvalidArgument, "not a live window");
    expect_result("ncclCommFinalize", ncclCommFinalize(comm), ncclSuccess, NULL);
    ncclResult_t async = ncclInternalError;
    expect_result("ncclCommGetAsyncError", ncclCommGetAsyncError(comm, &async), ncclSuccess, NULL);
    EXPECT(async == ncclSuccess, "async error %d", (int)async);
    expect_result("ncclMemFree", ncclMemFree(buf), ncclSuccess, NULL);
    expect_result("ncclCommDestroy", ncclCommDestroy(comm), ncclSuccess, NULL);
  } else {
    expect_result("init without a GPU", ncclCommInitRank(&comm, 1, a, 0), ncclUnhandledCudaError,
                  "no GPU");
    void *ptr = NULL;
    expect_result("ncclMemAlloc without a GPU", ncclMemAlloc(&ptr, 64), ncclUnhandledCudaError,
                  "no GPU");
  }

  int n = 0;
  expect_result("ncclCommCount(NULL)", ncclCommCount(NULL, &n), ncclInvalidArgument, "null");
  expect_result("ncclAllReduce on a null comm",
                ncclAllReduce(NULL, NULL, 4, ncclFloat32, ncclSum, NULL, NULL),
                ncclInvalidArgument, "null");
  expect_result("ncclAllReduce of fp8 on a null comm",
                ncclAllReduce(NULL, NULL, 4, ncclFloat8e4m3, ncclSum, NULL, NULL),
                ncclInvalidArgument, "null");
  expect_result("ncclAllReduce of an unknown type",
                ncclAllReduce(NULL, NULL, 4, (ncclDataType_t)12, ncclSum, NULL, NULL),
                ncclInvalidArgument, "data type");
  expect_result("ncclAllReduce with an operator never made",
                ncclAllReduce(NULL, NULL, 4, ncclFloat32, ncclNumOps + 1000, NULL, NULL),
                ncclInvalidArgument, "operator");
  {
    /* A PreMulSum whose creation fails still hands out an operator, one that fails every
     * call loudly (callers such as PyTorch do not check the creation's result). */
    ncclRedOp_t op = ncclSum;
    float half = 0.5f;
    expect_result("ncclRedOpCreatePreMulSum on a null comm",
                  ncclRedOpCreatePreMulSum(&op, &half, ncclFloat32, ncclScalarHostImmediate, NULL),
                  ncclInvalidArgument, "null");
    EXPECT(op != ncclSum, "a failed PreMulSum left the operator at ncclSum");
    expect_result("ncclAllReduce with a PreMulSum whose creation failed",
                  ncclAllReduce(NULL, NULL, 4, ncclFloat32, op, NULL, NULL), ncclInvalidUsage,
                  "failed");
    expect_result("ncclRedOpDestroy on a null comm", ncclRedOpDestroy(op, NULL),
                  ncclInvalidArgument, "null");
  }
  expect_result("ncclSend on a null comm", ncclSend(NULL, 4, ncclFloat32, 1, NULL, NULL),
                ncclInvalidArgument, "null");
  expect_result("ncclGroupEnd without a start", ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");

  /* NCCL 2.28's configuration, field for field (80 bytes on LP64). */
  EXPECT(sizeof(ncclConfig_t) == 80, "sizeof(ncclConfig_t) = %zu", sizeof(ncclConfig_t));
  EXPECT(offsetof(ncclConfig_t, commName) == 48, "commName at %zu", offsetof(ncclConfig_t, commName));
  EXPECT(offsetof(ncclConfig_t, nvlinkCentricSched) == 76, "nvlinkCentricSched at %zu",
         offsetof(ncclConfig_t, nvlinkCentricSched));
  EXPECT(sizeof(ncclSimInfo_t) == 24, "sizeof(ncclSimInfo_t) = %zu", sizeof(ncclSimInfo_t));

  /* The calls PyTorch, vLLM and nccl-tests import beside the classic set. */
  expect_result("ncclBcast on a null comm", ncclBcast(NULL, 4, ncclFloat32, 0, NULL, NULL),
                ncclInvalidArgument, "null");
  expect_result("ncclGather on a null comm",
                ncclGather(NULL, NULL, 4, ncclFloat32, 0, NULL, NULL), ncclInvalidArgument, "null");
  expect_result("ncclScatter on a null comm",
                ncclScatter(NULL, NULL, 4, ncclFloat32, 0, NULL, NULL), ncclInvalidArgument, "null");
  ncclWindow_t window = NULL;
  expect_result("ncclCommWindowRegister on a null comm",
                ncclCommWindowRegister(NULL, NULL, 0, &window, NCCL_WIN_COLL_SYMMETRIC),
                ncclInvalidArgument, "null");
  expect_result("ncclDevCommCreate on a null comm", ncclDevCommCreate(NULL, NULL, NULL),
                ncclInvalidArgument, "null");
  ncclComm_t shrunk = (ncclComm_t)&window;
  expect_result("ncclCommShrink on a null comm",
                ncclCommShrink(NULL, NULL, 0, &shrunk, NULL, NCCL_SHRINK_DEFAULT),
                ncclInvalidArgument, "null");
  EXPECT(shrunk == NULL, "ncclCommShrink leaves no communicator behind a failure");
  ncclComm_t scalable = NULL;
  expect_result("ncclCommInitRankScalable without ids",
                ncclCommInitRankScalable(&scalable, 2, 0, 0, NULL, NULL), ncclInvalidArgument,
                "at least one");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  expect_result("ncclGroupSimulateEnd without a start", ncclGroupSimulateEnd(&sim),
                ncclInvalidUsage, "ncclGroupStart");
  expect_result("ncclGroupStart", ncclGroupStart(), ncclSuccess, NULL);
  expect_result("ncclGroupSimulateEnd", ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "estimate");
  expect_result("ncclGroupEnd after a simulated end", ncclGroupEnd(), ncclInvalidUsage,
                "ncclGroupStart");
  /* NCCL's order: the group closes first; a null simInfo is a plain ncclGroupEnd, a bad one an
     error that still closes the group. */
  expect_result("ncclGroupStart", ncclGroupStart(), ncclSuccess, NULL);
  expect_result("ncclGroupSimulateEnd(NULL)", ncclGroupSimulateEnd(NULL), ncclSuccess, NULL);
  expect_result("ncclGroupEnd after it", ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");
  expect_result("ncclGroupStart", ncclGroupStart(), ncclSuccess, NULL);
  ncclSimInfo_t raw = sim;
  raw.magic = 0;
  expect_result("ncclGroupSimulateEnd of an uninitialized simInfo", ncclGroupSimulateEnd(&raw),
                ncclInvalidArgument, "NCCL_SIM_INFO_INITIALIZER");
  expect_result("ncclGroupEnd after it", ncclGroupEnd(), ncclInvalidUsage, "ncclGroupStart");
  expect_result("ncclGroupStart", ncclGroupStart(), ncclSuccess, NULL);
  expect_result("ncclGroupEnd", ncclGroupEnd(), ncclSuccess, NULL);
  expect_result("ncclCommDestroy(NULL)", ncclCommDestroy(NULL), ncclInvalidArgument, "null");

  /* NCCL 2.28's ncclCommRevoke and ncclResetDebugInit (cudarc imports them) and the calls of
     2.29 that PyTorch 2.15 imports: through the signature table, on a null communicator or
     window. */
  expect_result("ncclCommRevoke on a null comm", signatures.revoke(NULL, NCCL_REVOKE_DEFAULT),
                ncclInvalidArgument, "null");
  signatures.reset_debug_init();
  ncclUniqueId grow_id;
  expect_result("ncclCommGetUniqueId on a null comm", signatures.comm_get_unique_id(NULL, &grow_id),
                ncclInvalidArgument, "null");
  expect_result("ncclCommGrow of a new rank without an id", signatures.grow(NULL, 2, NULL, 1, NULL, NULL),
                ncclInvalidArgument, "newcomm is null");
  expect_result("ncclCommSuspend on a null comm", signatures.suspend(NULL, NCCL_SUSPEND_MEM),
                ncclInvalidArgument, "null");
  expect_result("ncclCommResume on a null comm", signatures.resume(NULL), ncclInvalidArgument,
                "null");
  uint64_t stat = 7;
  expect_result("ncclCommMemStats on a null comm",
                signatures.mem_stats(NULL, ncclStatGpuMemTotal, &stat), ncclInvalidArgument, "null");
  void *user_ptr = NULL;
  expect_result("ncclWinGetUserPtr on a null comm", signatures.win_get_user_ptr(NULL, window, &user_ptr),
                ncclInvalidArgument, "null");
  expect_result("ncclPutSignal on a null comm",
                signatures.put_signal(NULL, 4, ncclFloat32, 1, window, 0, 0, 0, 0, NULL, NULL),
                ncclInvalidArgument, "null");
  expect_result("ncclSignal on a null comm", signatures.signal(1, 0, 0, 0, NULL, NULL),
                ncclInvalidArgument, "null");
  ncclWaitSignalDesc_t wait = {1, 1, 0, 0};
  expect_result("ncclWaitSignal on a null comm", signatures.wait_signal(1, &wait, NULL, NULL),
                ncclInvalidArgument, "null");
  void *device_ptr = NULL;
  expect_result("ncclGetPeerDevicePointer of a null window",
                signatures.peer_pointer(NULL, 0, 1, &device_ptr), ncclInvalidArgument, "null");
  expect_result("ncclGetLsaMultimemDevicePointer of a null window",
                signatures.lsa_multimem_pointer(NULL, 0, &device_ptr), ncclInvalidArgument, "null");
  expect_result("ncclGetPeerDevicePointer of no window",
                signatures.peer_pointer((ncclWindow_t)&wait, 0, 1, &device_ptr), ncclInvalidArgument,
                "not a live window");

  if (failures == 0) {
    printf("c api: every check passed (%s)\n", has_gpu ? "gpu" : "no gpu");
  }
  return failures == 0 ? 0 : 1;
}
