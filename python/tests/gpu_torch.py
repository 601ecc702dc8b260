"""ringreduce on real PyTorch CUDA tensors, one process per rank (torchrun's model): run it under
``python3 -m torch.distributed.run --nproc_per_node N python/tests/gpu_torch.py`` on a machine
with torch and a GPU. With fewer GPUs than ranks every rank runs on GPU 0
(``allow_shared_device``): correctness only, never speed.

Every collective of the library on CUDA tensors, in place and out of place, every dtype the
library and torch share, every operator; on torch's current stream, on a side stream, and in a
captured CUDA graph replayed with new inputs; a ``torch.compile``d function around the custom
op; ``TensorParallel`` eager and in a graph; DDP averaging through ``allreduce_hook``; the
argument errors a user meets first. Each
rank knows every rank's input (a formula of rank and index), so it computes the expected
result itself, in float64 on the CPU, and compares bit for bit. Prints ``rank R: ok`` and exits
0, or raises.
"""

import os
import sys

import torch

import ringreduce
from ringreduce import ArgumentError

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
GPUS = torch.cuda.device_count()
DEVICE = RANK % GPUS if GPUS else 0
torch.cuda.set_device(DEVICE)
CUDA = torch.device("cuda", DEVICE)

#: Every dtype the library takes that this torch has (small integers are exact in all of them).
DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
] + [
    getattr(torch, name)
    for name in ("uint32", "uint64", "float8_e4m3fn", "float8_e5m2")
    if hasattr(torch, name)
]
FP8 = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}


def values(rank, count, dtype, op="sum"):
    """Rank ``rank``'s input as float64 on the CPU: small integers whose every reduction is
    exact in ``dtype`` (products stay within ±8 for a few ranks; unsigned types stay ≥ 0)."""
    k = torch.arange(count, dtype=torch.float64)
    if op == "prod":
        return ((k + rank) % 2) + 1  # 1 or 2
    if dtype in (torch.uint8, getattr(torch, "uint32", None), getattr(torch, "uint64", None)):
        return (k * 3 + rank * 5) % 7
    return (k * 3 + rank * 5) % 7 - 3


def tensor(rank, count, dtype, op="sum"):
    host = values(rank, count, dtype, op)
    if dtype in FP8:  # torch casts to fp8 on the CPU through float32
        return host.to(torch.float32).to(dtype).to(CUDA)
    return host.to(dtype).to(CUDA)


def fold(op, count, dtype):
    """Every rank's input folded by ``op``, in float64."""
    every = torch.stack([values(r, count, dtype, op) for r in range(WORLD)])
    if op == "sum":
        return every.sum(0)
    if op == "prod":
        return every.prod(0)
    if op == "min":
        return every.min(0).values
    if op == "max":
        return every.max(0).values
    if op == "avg":
        return every.sum(0) * (1.0 / WORLD)
    raise ValueError(op)


def same(got, want, what):
    got = got.to(torch.float64).cpu() if got.dtype not in FP8 else got.float().double().cpu()
    if not torch.equal(got, want.to(torch.float64)):
        bad = (got != want).nonzero()[:5].flatten().tolist()
        raise AssertionError(
            f"rank {RANK}: {what}: first differing indices {bad}: "
            f"got {got[bad].tolist()}, want {want[bad].tolist()}"
        )


def every_dtype(comm):
    count = 1027
    for dtype in DTYPES:
        x = tensor(RANK, count, dtype)
        comm.all_reduce(x)  # in place, on the current stream
        torch.cuda.current_stream().synchronize()
        same(x, fold("sum", count, dtype), f"all_reduce sum {dtype}")


def every_op(comm):
    count = 4099
    for op in ("sum", "prod", "min", "max", "avg"):
        x = tensor(RANK, count, torch.float32, op)
        out = torch.full_like(x, -9.0)
        comm.all_reduce(x, op=op, out=out)
        want = fold(op, count, torch.float32)
        if op == "avg":  # the float avg is the sum times 1/world, in float32
            want = (fold("sum", count, torch.float32).float() * (1.0 / WORLD)).double()
        torch.cuda.synchronize()
        same(out, want, f"all_reduce {op} out of place")
        same(x, values(RANK, count, torch.float32, op), f"all_reduce {op} input kept")


def every_collective(comm):
    for dtype in DTYPES:
        collectives_of(comm, dtype)


def collectives_of(comm, dtype):
    count = 513
    block = lambda r: values(r, WORLD * count, dtype)  # noqa: E731 - rank r's whole input
    # reduce_scatter: rank r gets block r of the sum.
    x = tensor(RANK, WORLD * count, dtype)
    out = torch.empty(count, dtype=dtype, device=CUDA)
    comm.reduce_scatter(x, out=out)
    total = sum(block(r) for r in range(WORLD))
    torch.cuda.synchronize()
    same(out, total[RANK * count : (RANK + 1) * count], f"reduce_scatter {dtype}")
    # all_gather, out of place and in place.
    x = tensor(RANK, count, dtype)
    out = torch.empty(WORLD * count, dtype=dtype, device=CUDA)
    comm.all_gather(x, out=out)
    gathered = torch.cat([values(r, count, dtype) for r in range(WORLD)])
    torch.cuda.synchronize()
    same(out, gathered, f"all_gather {dtype}")
    whole = torch.zeros(WORLD * count, dtype=dtype, device=CUDA)
    whole[RANK * count : (RANK + 1) * count] = x
    comm.all_gather(whole)
    torch.cuda.synchronize()
    same(whole, gathered, f"all_gather in place {dtype}")
    # broadcast and reduce from the last rank.
    root = WORLD - 1
    x = tensor(RANK, count, dtype)
    comm.broadcast(x, root=root)
    torch.cuda.synchronize()
    same(x, values(root, count, dtype), f"broadcast {dtype}")
    x = tensor(RANK, count, dtype)
    out = torch.zeros_like(x)
    comm.reduce(x, root=root, out=out)
    torch.cuda.synchronize()
    if RANK == root:
        same(out, fold("sum", count, dtype), f"reduce at the root {dtype}")
    # all_to_all: block j of rank r's out is rank j's block r.
    x = tensor(RANK, WORLD * count, dtype)
    out = torch.empty_like(x)
    comm.all_to_all(x, out)
    want = torch.cat([block(j)[RANK * count : (RANK + 1) * count] for j in range(WORLD)])
    torch.cuda.synchronize()
    same(out, want, f"all_to_all {dtype}")
    # send/recv: a ring, each rank sends its input to the next.
    transfers = [(r, (r + 1) % WORLD, count) for r in range(WORLD)]
    send = tensor(RANK, count, dtype)
    recv = torch.zeros_like(send)
    comm.send_recv(transfers, sends=[send], recvs=[recv])
    torch.cuda.synchronize()
    same(recv, values((RANK - 1) % WORLD, count, dtype), f"send_recv ring {dtype}")


def streams_and_graphs(comm):
    count, dtype = 8192, torch.float32
    # On a side stream: the call waits for the stream's earlier work (the fill) and the copy
    # after it sees the result; no host synchronisation until the end.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.empty(count, dtype=dtype, device=CUDA)
        x.copy_(values(RANK, count, dtype).to(dtype).to(CUDA, non_blocking=True))
        comm.all_reduce(x)
        y = x * 2
    side.synchronize()
    same(y, fold("sum", count, dtype) * 2, "all_reduce on a side stream")
    # A captured graph, replayed with new inputs (the shape ran eagerly above).
    static = torch.zeros(count, dtype=dtype, device=CUDA)
    comm.all_reduce(static)  # eager run of the shape before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        comm.all_reduce(static)
    for replay in range(3):
        static.copy_((values(RANK, count, dtype) + replay).to(dtype).to(CUDA))
        graph.replay()
        torch.cuda.synchronize()
        want = fold("sum", count, dtype) + replay * WORLD
        same(static, want, f"graph replay {replay}")


def compiled(comm, backend="aot_eager"):
    """A function around the custom op, compiled with fullgraph=True, on CUDA tensors."""
    import ringreduce.torch as rt

    handle = rt.handle(comm)
    count, dtype = 4096, torch.float32

    def step(x):
        return torch.ops.ringreduce.all_reduce(x * 2, handle, "sum") + 1

    fn = torch.compile(step, backend=backend, fullgraph=True)
    for rep in range(2):
        x = tensor(RANK, count, dtype) + rep
        got = fn(x)
        torch.cuda.synchronize()
        same(got, (fold("sum", count, dtype) + rep * WORLD) * 2 + 1, f"compiled, call {rep}")


def compiled_by_inductor(comm):
    """The same, compiled by torch's default backend (Inductor: generated Triton kernels
    around the opaque op)."""
    compiled(comm, backend="inductor")


def tensor_parallel(comm):
    """TensorParallel: eager calls, then a captured graph of a shape that ran eagerly; a shape
    that never ran is declined under capture."""
    import ringreduce.torch as rt

    tp = rt.TensorParallel(comm)
    count, dtype = 2048, torch.bfloat16
    x = tensor(RANK, count, dtype)
    assert tp.should_use(x), "a small bf16 CUDA tensor"
    assert not tp.should_use(x.cpu()), "a CPU tensor"
    assert not tp.should_use(torch.empty(16 << 20, dtype=torch.uint8, device=CUDA)), "too big"
    out = tp.all_reduce(x)
    torch.cuda.synchronize()
    same(out, fold("sum", count, dtype), "TensorParallel.all_reduce")
    same(x, values(RANK, count, dtype), "TensorParallel input kept")
    static = tensor(RANK, count, dtype)
    never = torch.zeros(999, dtype=dtype, device=CUDA)
    graph = torch.cuda.CUDAGraph()
    with tp.capture():
        with torch.cuda.graph(graph):
            assert tp.should_use(static), "a shape that ran eagerly"
            assert not tp.should_use(never), "a shape that never ran"
            result = tp.all_reduce(static)
    for replay in range(100):
        shift = replay % 50  # bf16 holds every sum exactly: |x| ≤ 3·world + 49·world < 256
        static.copy_((values(RANK, count, dtype) + shift).to(dtype).to(CUDA))
        graph.replay()
        torch.cuda.synchronize()
        same(result, fold("sum", count, dtype) + shift * WORLD, f"TP graph replay {replay}")


def ddp(comm):
    """DDP on CUDA (gloo for DDP's own broadcasts) averaging its gradients through the hook."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import ringreduce.torch as rt

    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 1, bias=False).to(CUDA)
    with torch.no_grad():
        model.weight.fill_(1.0)
    net = DistributedDataParallel(model, device_ids=[DEVICE])
    net.register_comm_hook(comm, rt.allreduce_hook)
    for _ in range(2):
        model.zero_grad()
        net(torch.full((2, 4), float(RANK + 1), device=CUDA)).sum().backward()
        torch.cuda.synchronize()
        same(model.weight.grad.flatten(), torch.full((4,), WORLD + 1.0), "DDP gradient")
    dist.destroy_process_group()


def argument_errors(comm):
    for what, bad in (
        ("a CPU tensor", torch.ones(8)),
        ("a non-contiguous tensor", torch.ones(8, 2, device=CUDA).t()),
        ("a complex tensor", torch.ones(8, dtype=torch.complex64, device=CUDA)),
    ):
        try:
            comm.all_reduce(bad)
        except ArgumentError:
            continue
        raise AssertionError(f"rank {RANK}: {what} was not refused")


def main():
    comm = ringreduce.Communicator.from_env(
        device=DEVICE, allow_shared_device=GPUS < WORLD, timeout=120.0
    )
    steps = [
        every_dtype,
        every_op,
        every_collective,
        streams_and_graphs,
        compiled,
        compiled_by_inductor,
        tensor_parallel,
        ddp,
        argument_errors,
    ]
    chosen = sys.argv[1:]  # step names to run (default: all); every step runs, failures listed
    failed = []
    for step in steps:
        if chosen and step.__name__ not in chosen:
            continue
        try:
            step(comm)
            print(f"rank {RANK}: {step.__name__} ok", flush=True)
        except Exception as err:  # noqa: BLE001 - report and go on to the next step
            failed.append(step.__name__)
            print(f"rank {RANK}: {step.__name__} FAILED: {type(err).__name__}: {err}", flush=True)
            if isinstance(err, ringreduce.Error) and comm.closed:
                break
    comm.close()
    if failed:
        raise SystemExit(f"rank {RANK}: failed: {failed}")
    print(f"rank {RANK}: ok", flush=True)


if __name__ == "__main__":
    main()
