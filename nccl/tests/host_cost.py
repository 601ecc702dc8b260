"""Host time of an eager ncclAllReduce, called through ctypes as vLLM's pynccl calls it: 8 bytes
in place on a stream of the process's own, REPS rounds of CALLS calls, every rank looping at
once, one stream synchronisation per round. Prints one JSON line per rank: the median host
time of each round's calls, and over all calls the median and p99, in microseconds.

    python3 host_cost.py LIB RANK WORLD DIR

LIB is the NCCL library to load (libnccl.so.2, or ringreduce-nccl's libringreduce_nccl.so), DIR
a directory the ranks share (rank 0 leaves the unique id there). host_cost.sh runs it for both
libraries side by side. Needs only the CUDA runtime (libcudart), no torch: nothing else loads
an NCCL into the process.
"""

import ctypes
import json
import os
import statistics
import sys
import time

REPS, CALLS = 5, 200


def cudart():
    for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
        for base in ("", "/usr/local/cuda/lib64/"):
            try:
                return ctypes.CDLL(base + name)
            except OSError:
                pass
    try:
        import nvidia.cuda_runtime as m

        lib = os.path.join(list(m.__path__)[0], "lib")
        name = next(f for f in os.listdir(lib) if f.startswith("libcudart.so"))
        return ctypes.CDLL(os.path.join(lib, name))
    except Exception as e:
        sys.exit(f"no libcudart: {e}")


def check(what, rc):
    if rc != 0:
        sys.exit(f"{what} returned {rc}")


def main():
    lib_path, rank, world, shared = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    cuda = cudart()
    check("cudaSetDevice", cuda.cudaSetDevice(0))
    nccl = ctypes.CDLL(lib_path)
    uid = ctypes.create_string_buffer(128)
    id_file = os.path.join(shared, "id")
    if rank == 0:
        check("ncclGetUniqueId", nccl.ncclGetUniqueId(uid))
        with open(id_file + ".tmp", "wb") as f:
            f.write(uid.raw)
        os.rename(id_file + ".tmp", id_file)
    else:
        while not os.path.exists(id_file):
            time.sleep(0.01)
        with open(id_file, "rb") as f:
            ctypes.memmove(uid, f.read(), 128)
    comm = ctypes.c_void_p()

    class UniqueId(ctypes.Structure):  # ncclUniqueId, passed by value
        _fields_ = [("internal", ctypes.c_byte * 128)]

    unique = UniqueId()
    ctypes.memmove(ctypes.byref(unique), uid, 128)
    nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
    check("ncclCommInitRank", nccl.ncclCommInitRank(ctypes.byref(comm), world, unique, rank))
    stream = ctypes.c_void_p()
    check("cudaStreamCreate", cuda.cudaStreamCreate(ctypes.byref(stream)))
    buf = ctypes.c_void_p()
    check("cudaMalloc", cuda.cudaMalloc(ctypes.byref(buf), ctypes.c_size_t(8)))
    check("cudaMemset", cuda.cudaMemset(buf, 0, ctypes.c_size_t(8)))
    all_reduce = nccl.ncclAllReduce
    all_reduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                           ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    float32, total = 7, 0  # ncclFloat32, ncclSum
    # The shape's first call (a plan made with the peers, under ringreduce) is not timed.
    check("ncclAllReduce", all_reduce(buf, buf, 2, float32, total, comm, stream))
    check("cudaStreamSynchronize", cuda.cudaStreamSynchronize(stream))
    rounds, every = [], []
    for _ in range(REPS):
        times = []
        for _ in range(CALLS):
            t0 = time.perf_counter_ns()
            rc = all_reduce(buf, buf, 2, float32, total, comm, stream)
            times.append((time.perf_counter_ns() - t0) / 1000)
            check("ncclAllReduce", rc)
        check("cudaStreamSynchronize", cuda.cudaStreamSynchronize(stream))
        rounds.append(statistics.median(times))
        every += times
    every.sort()
    err = ctypes.c_int()
    nccl.ncclCommGetAsyncError(comm, ctypes.byref(err))
    check("ncclCommGetAsyncError", err.value)
    check("ncclCommDestroy", nccl.ncclCommDestroy(comm))
    print(json.dumps({
        "lib": os.path.basename(lib_path), "rank": rank, "world": world,
        "round_medians_us": [round(m, 2) for m in rounds],
        "median_us": round(statistics.median(every), 2),
        "p99_us": round(every[int(len(every) * 0.99)], 2),
    }), flush=True)


if __name__ == "__main__":
    main()
