"""PyTorch's NCCL backend on ringreduce's NCCL-compatible library, unchanged: run under torchrun
with the library preloaded, on a machine with torch and a GPU:

    LD_PRELOAD=/path/to/libringreduce_nccl.so RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1 \\
    RINGREDUCE_NCCL_LOG=1 python3 -m torch.distributed.run --nproc_per_node 2 torch_preload.py

(``RINGREDUCE_NCCL_ALLOW_SHARED_GPU=1`` only where ranks share a GPU: correctness, not speed.)

Every ``torch.distributed`` call a job makes on the ``nccl`` backend — all_reduce with every
operator, all_gather_into_tensor, reduce_scatter_tensor, broadcast, reduce, all_to_all_single,
send/recv, barrier — on every dtype torch maps to NCCL's, exact against torch's own arithmetic
(each rank knows every rank's input); a few DDP steps giving the parameters plain arithmetic
gives; all-reduces captured in a CUDA graph and replayed with new inputs. Prints
``rank R: STEP ok`` per step and exits 0, or names what failed and exits 1.
"""

import os
import sys

import torch
import torch.distributed as dist

RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
GPUS = torch.cuda.device_count()
DEVICE = RANK % GPUS
torch.cuda.set_device(DEVICE)
CUDA = torch.device("cuda", DEVICE)

DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
]


def values(rank, count, dtype, op="sum"):
    """Rank ``rank``'s input, as float64 on the CPU: small integers, exact in every dtype and
    every reduction here."""
    k = torch.arange(count, dtype=torch.float64)
    if op == "prod":
        return ((k + rank) % 2) + 1
    return (k * 3 + rank * 5) % 7 - (0 if dtype == torch.uint8 else 3)


def tensor(rank, count, dtype, op="sum"):
    return values(rank, count, dtype, op).to(dtype).to(CUDA)


def same(got, want, what):
    got = got.double().cpu()
    want = want.double()
    if not torch.equal(got, want):
        bad = (got != want).nonzero().flatten()[:5].tolist()
        raise AssertionError(f"{what}: at {bad} got {got[bad].tolist()}, want {want[bad].tolist()}")


def every_dtype():
    count = 1031
    for dtype in DTYPES:
        x = tensor(RANK, count, dtype)
        dist.all_reduce(x)
        same(x, sum(values(r, count, dtype) for r in range(WORLD)), f"all_reduce {dtype}")


def every_op():
    count = 2053
    ops = {
        "sum": (dist.ReduceOp.SUM, lambda s: s.sum(0)),
        "prod": (dist.ReduceOp.PRODUCT, lambda s: s.prod(0)),
        "min": (dist.ReduceOp.MIN, lambda s: s.min(0).values),
        "max": (dist.ReduceOp.MAX, lambda s: s.max(0).values),
        # NCCL's avg on floats: the sum times 1/world (ringreduce's definition too).
        "avg": (dist.ReduceOp.AVG, lambda s: (s.sum(0).float() * (1.0 / WORLD)).double()),
    }
    for name, (op, fold) in ops.items():
        x = tensor(RANK, count, torch.float32, name)
        dist.all_reduce(x, op=op)
        every = torch.stack([values(r, count, torch.float32, name) for r in range(WORLD)])
        same(x, fold(every), f"all_reduce {name}")


def every_collective():
    count, dtype = 517, torch.float32
    whole = lambda r: values(r, WORLD * count, dtype)  # noqa: E731
    total = sum(whole(r) for r in range(WORLD))
    # all_gather_into_tensor
    out = torch.empty(WORLD * count, dtype=dtype, device=CUDA)
    dist.all_gather_into_tensor(out, tensor(RANK, count, dtype))
    same(out, torch.cat([values(r, count, dtype) for r in range(WORLD)]), "all_gather_into_tensor")
    # reduce_scatter_tensor
    out = torch.empty(count, dtype=dtype, device=CUDA)
    dist.reduce_scatter_tensor(out, tensor(RANK, WORLD * count, dtype))
    same(out, total[RANK * count : (RANK + 1) * count], "reduce_scatter_tensor")
    # broadcast from the last rank; reduce to rank 0
    x = tensor(RANK, count, dtype)
    dist.broadcast(x, src=WORLD - 1)
    same(x, values(WORLD - 1, count, dtype), "broadcast")
    x = tensor(RANK, count, dtype)
    dist.reduce(x, dst=0)
    if RANK == 0:
        same(x, sum(values(r, count, dtype) for r in range(WORLD)), "reduce")
    # all_to_all_single
    out = torch.empty(WORLD * count, dtype=dtype, device=CUDA)
    dist.all_to_all_single(out, tensor(RANK, WORLD * count, dtype))
    want = torch.cat([whole(j)[RANK * count : (RANK + 1) * count] for j in range(WORLD)])
    same(out, want, "all_to_all_single")
    # send/recv around a ring, as one batch (each rank both sends and receives)
    recv = torch.full((count,), -9.0, device=CUDA)
    ops = [
        dist.P2POp(dist.isend, tensor(RANK, count, dtype), (RANK + 1) % WORLD),
        dist.P2POp(dist.irecv, recv, (RANK - 1) % WORLD),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    same(recv, values((RANK - 1) % WORLD, count, dtype), "batch_isend_irecv ring")
    # plain send/recv: rank 0 to the last rank (two ranks: each rank of the communicator takes
    # part in every group, as ringreduce-nccl asks)
    if WORLD == 2:
        if RANK == 0:
            dist.send(tensor(0, count, dtype), dst=WORLD - 1)
        elif RANK == WORLD - 1:
            got = torch.zeros(count, device=CUDA)
            dist.recv(got, src=0)
            same(got, values(0, count, dtype), "send/recv")
    dist.barrier()


def ddp():
    from torch.nn.parallel import DistributedDataParallel

    model = torch.nn.Linear(4, 1, bias=False).to(CUDA)
    with torch.no_grad():
        model.weight.fill_(1.0)
    net = DistributedDataParallel(model, device_ids=[DEVICE])
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    want = torch.ones(4, dtype=torch.float32)
    for _ in range(3):
        opt.zero_grad()
        net(torch.full((2, 4), float(RANK + 1), device=CUDA)).sum().backward()
        opt.step()
        # The gradient averaged over the ranks: each rank's is 2·(rank + 1) per weight.
        want -= 0.1 * torch.full((4,), float(WORLD + 1))
    got = model.weight.detach().flatten().cpu()
    if not torch.allclose(got, want, rtol=0, atol=1e-6):  # the update may fuse (one rounding)
        raise AssertionError(f"DDP parameters: got {got.tolist()}, want {want.tolist()}")


def graphs():
    count = 4096
    static = tensor(RANK, count, torch.float32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # torch warms a captured collective up on a side stream
        dist.all_reduce(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(static)
        dist.all_reduce(static)
    for replay in range(3):
        static.copy_((values(RANK, count, torch.float32) + replay).float().to(CUDA))
        graph.replay()
        torch.cuda.synchronize()
        once = sum(values(r, count, torch.float32) + replay for r in range(WORLD))
        same(static, once * WORLD, f"graph replay {replay}")


def main():
    dist.init_process_group("nccl")
    failed = []
    for step in (every_dtype, every_op, every_collective, ddp, graphs):
        try:
            step()
            torch.cuda.synchronize()
            print(f"rank {RANK}: {step.__name__} ok", flush=True)
        except Exception as err:  # noqa: BLE001 - report each step, go on
            failed.append(step.__name__)
            print(f"rank {RANK}: {step.__name__} FAILED: {type(err).__name__}: {err}", flush=True)
    dist.destroy_process_group()
    if failed:
        sys.exit(f"rank {RANK}: failed: {failed}")
    print(f"rank {RANK}: ok", flush=True)


if __name__ == "__main__":
    main()
