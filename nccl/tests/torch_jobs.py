"""Real PyTorch jobs, unchanged, on the `nccl` backend: run once under ringreduce's library and
once under the real NCCL on the same machine, then compared (`torch_jobs.sh` does all three).

    python3 -m torch.distributed.run --nproc_per_node N torch_jobs.py JOB OUTDIR

with `LD_PRELOAD=libringreduce_nccl.so` for ringreduce, or `TORCH_JOBS_REAL_NCCL=1` for the
real NCCL — then each rank claims a host of its own (`NCCL_HOSTID`, set here before init) so
that NCCL accepts ranks sharing one GPU (with `NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`).

Each job checks what plain arithmetic says where the arithmetic is exact (inputs of small
integers, factors of powers of two) and saves, per rank, what it computed to
OUTDIR/JOB-RANK.pt for `compare`: `python3 torch_jobs.py compare DIR_A DIR_B` compares two runs
step by step (exact where the job's arithmetic is exact, else within a tolerance). Prints
`rank R: JOB ok` and exits 0, or names what failed and exits 1.

Jobs: premul (PREMUL_SUM with a host factor and a device factor, all-reduce and
reduce-scatter, every float type), groups (`new_group`, `new_subgroups_by_enumeration` after
`init_process_group(device_id=...)`), ddp (a small transformer, 4 steps), fsdp (FSDP2
`fully_shard` with a gradient divide factor, 4 steps), mesh (a 2-D `DeviceMesh`, FSDP x TP, on 4
ranks), pipeline (a stage per rank, activations forward and gradients back, one pair of ranks
at a time), late (one rank reaches an all-reduce TORCH_JOBS_LATE seconds, default 75, after the
others), coalesce (torch's coalescing manager with async ops around all-reduces, around
`all_gather_into_tensor`s and around `reduce_scatter_tensor`s; lists of uneven sizes:
`all_gather`, `reduce_scatter`, `all_to_all` and `all_to_all_single` with split sizes, and
again with pairs of ranks that exchange nothing: NCCL's 0-byte send/recv),
gatherscatter (`gather` to the first and to the last rank, `scatter` from rank 0, `broadcast`
from the last rank, `reduce` to rank 1), graph (a communicator of the job's own through ctypes, as
vLLM's pynccl makes one: the NCCL library in the process, an id from rank 0 handed out by
`broadcast_object_list`, `ncclCommInitRank`; `ncclAllReduce` run once on a side stream, then
captured there in a CUDA graph between a copy in and a scale, replayed 20 times on new inputs;
`ncclCommDestroy`), killed (the last rank SIGKILLs itself between two all-reduces; the
survivors' second all-reduce must fail within TORCH_JOBS_KILLED_WAIT seconds, default 30, and
each saves how long that took — under the real NCCL it may still wait then, since NCCL leaves a
lost peer to torch's watchdog, and the job says so and passes).

`killed` sets TORCH_NCCL_ASYNC_ERROR_HANDLING=0 unless it is set (torch's watchdog would take a
survivor down as it reads the error), ignores SIGTERM (torchrun ends the other workers once it
sees one die) and leaves without a barrier; torchrun's exit code is the killed rank's, so
`torch_jobs.sh` judges it by the survivors' `rank R: killed ok` lines, and `compare` skips it.
"""

import ctypes
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
REAL_NCCL = os.environ.get("TORCH_JOBS_REAL_NCCL") == "1"


def init():
    if REAL_NCCL:
        os.environ["NCCL_HOSTID"] = f"torch-jobs-host-{RANK}"
    device = torch.device("cuda", RANK % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    return device


def same(got, want, what):
    got, want = got.double().cpu(), want.double().cpu()
    if not torch.equal(got, want):
        bad = (got != want).nonzero().flatten()[:5].tolist()
        raise AssertionError(f"{what}: at {bad} got {got[bad].tolist()}, want {want[bad].tolist()}")


def inputs(rank, count):
    """Rank `rank`'s input: small integers, exact in every float type, times 1/4 too."""
    k = torch.arange(count, dtype=torch.float64)
    return (k * 3 + rank * 5) % 7 - 3


def given(rank, count, device):
    """`inputs(rank, count)` as float32 on `device`."""
    return inputs(rank, count).float().to(device)


def job_premul(device, out):
    count = 4096
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        want = sum(inputs(r, count) for r in range(WORLD)) * 0.25
        # PyTorch 2.11 takes a device factor of bf16 for no type (it wants a float one, then
        # refuses it for bf16 inputs, under the real NCCL too).
        kinds = [("host", 0.25)]
        if dtype != torch.bfloat16:
            kinds.append(("device", torch.tensor(0.25, dtype=dtype, device=device)))
        for kind, factor in kinds:
            op = dist._make_nccl_premul_sum(factor)
            x = inputs(RANK, count).to(dtype).to(device)
            dist.all_reduce(x, op=op)
            # PyTorch 2.11 hands NCCL a bf16 host factor that reads as 0 (the real NCCL sums
            # zeros too): that case is compared with NCCL's result, not with arithmetic.
            quirk = dtype == torch.bfloat16 and kind == "host"
            if not quirk:
                same(x, want, f"all_reduce premul {kind} {dtype}")
            out[f"all_reduce-{kind}-{dtype}"] = x.cpu()
            full = torch.cat([inputs(RANK, count)] * WORLD).to(dtype).to(device)
            part = torch.empty(count, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(part, full, op=op)
            if not quirk:
                same(part, want, f"reduce_scatter_tensor premul {kind} {dtype}")
            out[f"reduce_scatter-{kind}-{dtype}"] = part.cpu()
    torch.cuda.synchronize()


def job_groups(device, out):
    count = 1000
    ends = [0, WORLD - 1]
    group = dist.new_group(ends)
    x = inputs(RANK, count).to(device)
    if RANK in ends:
        dist.all_reduce(x, group=group)
        same(x, sum(inputs(r, count) for r in ends), "all_reduce on new_group([0, last])")
    out["new_group"] = x.cpu()
    # Subgroups of consecutive pairs (a single last rank alone).
    pairs = [list(range(i, min(i + 2, WORLD))) for i in range(0, WORLD, 2)]
    mine, _ = dist.new_subgroups_by_enumeration(pairs)
    members = next(p for p in pairs if RANK in p)
    y = inputs(RANK, count).to(device)
    dist.all_reduce(y, group=mine)
    same(y, sum(inputs(r, count) for r in members), "all_reduce on a subgroup")
    out["subgroup"] = y.cpu()
    # The default group still works after the splits.
    z = inputs(RANK, count).to(device)
    dist.all_reduce(z)
    same(z, sum(inputs(r, count) for r in range(WORLD)), "all_reduce on the default group")
    torch.cuda.synchronize()


class Tiny(torch.nn.Module):
    """A small transformer: embedding, one encoder layer, a head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(32, 64)

    def forward(self, tokens):
        return self.head(self.layer(self.embed(tokens)))


def batches(steps):
    g = torch.Generator().manual_seed(1234 + RANK)
    return [torch.randint(0, 64, (4, 16), generator=g) for _ in range(steps)]


def train(model, device, out, steps=4):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, tokens in enumerate(batches(steps)):
        tokens = tokens.to(device)
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        out[f"loss-{step}"] = loss.detach().cpu()
    torch.cuda.synchronize()


def job_ddp(device, out):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        Tiny().to(device), device_ids=[device.index], bucket_cap_mb=1
    )
    train(model, device, out)
    for name, p in model.module.named_parameters():
        out[f"param-{name}"] = p.detach().cpu()


def job_fsdp(device, out):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Tiny().to(device)
    fully_shard(model.layer)
    fully_shard(model)
    model.set_gradient_divide_factor(float(WORLD * 2))
    train(model, device, out)
    for name, p in model.named_parameters():
        out[f"param-{name}"] = p.full_tensor().detach().cpu()


def job_mesh(device, out):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    assert WORLD == 4, "the mesh job runs on 4 ranks (2 x 2)"
    mesh = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)
    ).to(device)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(99 + mesh["dp"].get_local_rank())
    for step in range(4):
        x = torch.randn(8, 32, generator=g).to(device)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out[f"loss-{step}"] = loss.detach().cpu()
    for name, p in model.named_parameters():
        out[f"param-{name}"] = p.full_tensor().detach().cpu()
    torch.cuda.synchronize()


def job_pipeline(device, out):
    """A stage per rank: rank r receives activations from r - 1, applies x * (r + 2), sends
    them to r + 1; the gradients come back the same way. Only two ranks take part in each
    transfer."""
    count = 2048
    x = inputs(0, count).to(device)
    if RANK > 0:
        dist.recv(x, src=RANK - 1)
    y = x * (RANK + 2)
    if RANK < WORLD - 1:
        dist.send(y, dst=RANK + 1)
    grad = torch.ones(count, dtype=torch.float32, device=device)
    if RANK < WORLD - 1:
        dist.recv(grad, src=RANK + 1)
    grad = grad * (RANK + 2)
    if RANK > 0:
        dist.send(grad, dst=RANK - 1)
    scale = 1.0
    for r in range(RANK + 1):
        scale *= r + 2
    same(y, inputs(0, count) * scale, "pipeline forward")
    back = 1.0
    for r in range(RANK, WORLD):
        back *= r + 2
    same(grad, torch.full((count,), back), "pipeline backward")
    out["forward"], out["backward"] = y.cpu(), grad.cpu()
    # An activation longer than a 64 MiB arena (80 MiB of float32), and ten tensors at once
    # (batch_isend_irecv: more receives from one peer than ringreduce's kernel runs at once),
    # each stage passing the previous stage's on; stage 1 comes 2 s late, and under ringreduce
    # stage 0's sends return once enqueued (on the channel, or on its pair's communicator, made
    # above, where there is none).
    long = (20 << 20) + 3
    big = given(0, long, device) if RANK == 0 else torch.zeros(long, device=device)
    many = [given(k, 1000 + k, device) if RANK == 0 else torch.zeros(1000 + k, device=device)
            for k in range(10)]
    torch.cuda.synchronize()
    if RANK == 1:
        time.sleep(2)
    if RANK > 0:
        dist.recv(big, src=RANK - 1)
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, t, RANK - 1) for t in many])
        for w in works:
            w.wait()
    if RANK < WORLD - 1:
        started = time.monotonic()
        dist.send(big, dst=RANK + 1)
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, RANK + 1) for t in many])
        for w in works:
            w.wait()
        sent = time.monotonic() - started
        print(f"rank {RANK}: long and batched sends returned in {sent:.3f} s", flush=True)
        real = os.environ.get("TORCH_JOBS_REAL_NCCL") == "1"
        assert real or RANK != 0 or sent < 0.5, f"rank 0 waited {sent:.3f} s for stage 1"
    torch.cuda.synchronize()
    same(big, inputs(0, long), "pipeline long activation")
    for k, t in enumerate(many):
        same(t, inputs(k, 1000 + k), f"pipeline batch tensor {k}")
    out["long"], out["batch"] = big[-4096:].cpu(), torch.cat(many).cpu()
    torch.cuda.synchronize()


def job_late(device, out):
    late = float(os.environ.get("TORCH_JOBS_LATE", "75"))
    x = inputs(RANK, 100).to(device)
    if RANK == WORLD - 1:
        time.sleep(late)
    started = time.monotonic()
    dist.all_reduce(x)
    torch.cuda.synchronize()
    same(x, sum(inputs(r, 100) for r in range(WORLD)), f"all_reduce with a rank {late} s late")
    out["late"] = x.cpu()
    out["waited"] = torch.tensor(time.monotonic() - started)


def coalesced(calls):
    """`calls()` inside torch's coalescing manager with async ops, then waited for."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    with _coalescing_manager(async_ops=True) as cm:
        calls()
    cm.wait()


def coalesced_all_reduce(device, out):
    counts = (1000, 4099, 17, 65536)
    xs = [given(RANK + i, c, device) for i, c in enumerate(counts)]
    coalesced(lambda: [dist.all_reduce(x) for x in xs])
    for i, (x, c) in enumerate(zip(xs, counts)):
        same(x, sum(inputs(r + i, c) for r in range(WORLD)), f"coalesced all_reduce {i}")
        out[f"coalesced-all_reduce-{i}"] = x.cpu()


def coalesced_gather_scatter(device, out):
    counts = (1000, 17, 4099)
    parts = [given(RANK + i, c, device) for i, c in enumerate(counts)]
    fulls = [torch.empty(WORLD * c, device=device) for c in counts]
    coalesced(lambda: [dist.all_gather_into_tensor(f, p) for f, p in zip(fulls, parts)])
    wholes = [given(RANK + i, WORLD * c, device) for i, c in enumerate(counts)]
    shards = [torch.empty(c, device=device) for c in counts]
    coalesced(lambda: [dist.reduce_scatter_tensor(s, w) for s, w in zip(shards, wholes)])
    for i, c in enumerate(counts):
        want = torch.cat([inputs(r + i, c) for r in range(WORLD)])
        same(fulls[i], want, f"coalesced all_gather_into_tensor {i}")
        total = sum(inputs(r + i, WORLD * c) for r in range(WORLD))
        same(shards[i], total[RANK * c : (RANK + 1) * c], f"coalesced reduce_scatter_tensor {i}")
        out[f"coalesced-all_gather-{i}"] = fulls[i].cpu()
        out[f"coalesced-reduce_scatter-{i}"] = shards[i].cpu()


def uneven(rank):
    """A size per rank, all different."""
    return 1000 + 333 * rank


def split(src, dst):
    """How many elements rank `src` sends rank `dst` in the all-to-alls."""
    return 10 + 7 * src + 13 * dst


def sparse(src, dst):
    """As `split`, but nothing between ranks of odd sum: pairs that exchange nothing either way,
    which torch sends as NCCL's 0-byte send/recv (an MoE layer's empty routes)."""
    return 0 if (src + dst) % 2 else split(src, dst)


def uneven_lists(device, out):
    # all_gather of a size per rank: torch runs it as coalesced broadcasts.
    got = [torch.empty(uneven(r), device=device) for r in range(WORLD)]
    dist.all_gather(got, given(RANK, uneven(RANK), device))
    for r in range(WORLD):
        same(got[r], inputs(r, uneven(r)), f"uneven all_gather, rank {r}'s part")
    out["uneven-all_gather"] = torch.cat(got).cpu()
    # reduce_scatter of a size per rank: coalesced reduces. Rank r's part j is inputs(r + 2j).
    mine = torch.empty(uneven(RANK), device=device)
    dist.reduce_scatter(mine, [given(RANK + 2 * j, uneven(j), device) for j in range(WORLD)])
    want = sum(inputs(r + 2 * RANK, uneven(RANK)) for r in range(WORLD))
    same(mine, want, "uneven reduce_scatter")
    out["uneven-reduce_scatter"] = mine.cpu()


def uneven_all_to_all(device, out, sizes=split, name="uneven"):
    """Rank i sends rank j inputs(i * WORLD + j, sizes(i, j))."""
    sent = [given(RANK * WORLD + j, sizes(RANK, j), device) for j in range(WORLD)]
    got = [torch.empty(sizes(j, RANK), device=device) for j in range(WORLD)]
    dist.all_to_all(got, sent)
    want = torch.cat([inputs(j * WORLD + RANK, sizes(j, RANK)) for j in range(WORLD)])
    same(torch.cat(got), want, f"{name} all_to_all")
    single = torch.empty(int(want.numel()), device=device)
    dist.all_to_all_single(
        single,
        torch.cat(sent),
        output_split_sizes=[sizes(j, RANK) for j in range(WORLD)],
        input_split_sizes=[sizes(RANK, j) for j in range(WORLD)],
    )
    same(single, want, f"{name} all_to_all_single")
    out[f"{name}-all_to_all"] = torch.cat(got).cpu()
    out[f"{name}-all_to_all_single"] = single.cpu()


def job_coalesce(device, out):
    coalesced_all_reduce(device, out)
    coalesced_gather_scatter(device, out)
    uneven_lists(device, out)
    uneven_all_to_all(device, out)
    uneven_all_to_all(device, out, sparse, "sparse")
    torch.cuda.synchronize()


def gather_to(dst, count, device, out):
    got = [torch.empty(count, device=device) for _ in range(WORLD)] if RANK == dst else None
    dist.gather(given(RANK, count, device), gather_list=got, dst=dst)
    if RANK == dst:
        want = torch.cat([inputs(r, count) for r in range(WORLD)])
        same(torch.cat(got), want, f"gather to {dst}")
        out[f"gather-{dst}"] = torch.cat(got).cpu()


def job_gatherscatter(device, out):
    count = 1031
    gather_to(0, count, device, out)
    gather_to(WORLD - 1, count, device, out)
    parts = [given(r + 7, count, device) for r in range(WORLD)] if RANK == 0 else None
    mine = torch.empty(count, device=device)
    dist.scatter(mine, scatter_list=parts, src=0)
    same(mine, inputs(RANK + 7, count), "scatter from rank 0")
    out["scatter"] = mine.cpu()
    x = given(RANK, count, device)
    dist.broadcast(x, src=WORLD - 1)
    same(x, inputs(WORLD - 1, count), f"broadcast from rank {WORLD - 1}")
    out["broadcast"] = x.cpu()
    root = 1 % WORLD
    y = given(RANK, count, device)
    dist.reduce(y, dst=root)
    if RANK == root:  # the other ranks' buffers are NCCL's to leave as it likes
        same(y, sum(inputs(r, count) for r in range(WORLD)), f"reduce to {root}")
        out["reduce"] = y.cpu()
    torch.cuda.synchronize()


NCCL_FLOAT32, NCCL_SUM = 7, 0


class NcclId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


def nccl_library():
    """The NCCL library the process runs on: a preloaded one (ringreduce's), else one whose
    symbols the process already exports, else torch's wheel's."""
    for path in os.environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if "nccl" in os.path.basename(path):
            return ctypes.CDLL(path)
    here = ctypes.CDLL(None)
    if hasattr(here, "ncclCommInitRank"):
        return here
    try:
        import nvidia.nccl

        return ctypes.CDLL(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))
    except (ImportError, OSError):
        return ctypes.CDLL("libnccl.so.2")


class Nccl:
    """NCCL's C API through ctypes, each call's result checked."""

    SIGNATURES = {
        "ncclGetVersion": [ctypes.POINTER(ctypes.c_int)],
        "ncclGetUniqueId": [ctypes.POINTER(NcclId)],
        "ncclCommInitRank": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, NcclId, ctypes.c_int],
        "ncclAllReduce": [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                          ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p],
        "ncclCommDestroy": [ctypes.c_void_p],
    }

    def __init__(self):
        self.lib = nccl_library()
        self.lib.ncclGetErrorString.argtypes = [ctypes.c_int]
        self.lib.ncclGetErrorString.restype = ctypes.c_char_p
        for name, args in self.SIGNATURES.items():
            getattr(self.lib, name).argtypes = args
            getattr(self.lib, name).restype = ctypes.c_int

    def __call__(self, name, *args):
        code = getattr(self.lib, name)(*args)
        if code != 0:
            text = self.lib.ncclGetErrorString(code).decode()
            raise RuntimeError(f"{name}: {text} (ncclResult_t {code})")

    def comm(self):
        """A communicator of every rank: rank 0's id through the default process group."""
        version = ctypes.c_int()
        self("ncclGetVersion", ctypes.byref(version))
        if RANK == 0:
            where = self.lib._name or "the process's own symbols"
            print(f"rank 0: graph: NCCL {version.value} from {where}", flush=True)
        uid = NcclId()
        if RANK == 0:
            self("ncclGetUniqueId", ctypes.byref(uid))
        box = [bytes(uid)]
        dist.broadcast_object_list(box, src=0)
        comm = ctypes.c_void_p()
        self("ncclCommInitRank", ctypes.byref(comm), WORLD, NcclId.from_buffer_copy(box[0]), RANK)
        return comm

    def all_reduce(self, comm, x):
        """In place, float32, sum, on the current stream."""
        stream = torch.cuda.current_stream().cuda_stream
        ptr = x.data_ptr()
        self("ncclAllReduce", ptr, ptr, x.numel(), NCCL_FLOAT32, NCCL_SUM, comm, stream)


def fresh(rank, replay, count):
    """Rank `rank`'s input to replay `replay` (-1: the eager warm-up)."""
    return inputs(rank + replay + 1, count) + replay


def job_graph(device, out):
    count = 4096
    nccl = Nccl()
    comm = nccl.comm()
    static_in = given(0, count, device)
    buf = torch.empty_like(static_in)

    def step():  # what the graph holds: a copy in, the all-reduce, a scale
        buf.copy_(static_in)
        nccl.all_reduce(comm, buf)
        return buf * 0.5

    static_in.copy_(fresh(RANK, -1, count).float().to(device))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # eager once on the capture stream first, as vLLM does
        warm = step()
    side.synchronize()
    same(warm, sum(fresh(r, -1, count) for r in range(WORLD)) * 0.5, "the eager warm-up")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        result = step()
    for replay in range(20):
        static_in.copy_(fresh(RANK, replay, count).float().to(device))
        graph.replay()
        torch.cuda.synchronize()
        same(result, sum(fresh(r, replay, count) for r in range(WORLD)) * 0.5, f"replay {replay}")
        out[f"replay-{replay}"] = result.cpu()
    graph.reset()
    nccl("ncclCommDestroy", comm)


def kill_last_rank():
    """The last rank SIGKILLs itself once every rank has finished the first all-reduce (they
    meet through the job's store: no collective is in flight as it dies)."""
    store = dist.distributed_c10d._get_default_store()
    store.add("torch-jobs-killed", 1)
    if RANK != WORLD - 1:
        return
    while store.add("torch-jobs-killed", 0) < WORLD:
        time.sleep(0.01)
    print(f"rank {RANK}: killed: SIGKILL now", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def outlive(x, wait):
    """The all-reduce the killed rank never joins: (seconds, the error it raised), or (seconds,
    None) when it still waits after `wait` seconds."""
    started = time.monotonic()
    try:
        work = dist.all_reduce(x, async_op=True)
        while not work.is_completed():
            if time.monotonic() - started > wait:
                return time.monotonic() - started, None
            time.sleep(0.05)
        # With a timeout, wait() raises the error the group has read from the communicator; it
        # reads it as it checks the work, and may have seen the work end first: ask once more.
        work.wait(timeout=timedelta(seconds=wait))
        time.sleep(1.0)
        work.wait(timeout=timedelta(seconds=wait))
    except Exception as err:  # noqa: BLE001 - the error this job waits for
        return time.monotonic() - started, err
    raise AssertionError(f"the all-reduce completed with rank {WORLD - 1} gone, naming no error")


def job_killed(device, out):
    assert WORLD >= 2, "the killed job needs a survivor"
    wait = float(os.environ.get("TORCH_JOBS_KILLED_WAIT", "30"))
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    x = given(RANK, 100, device)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    same(x, sum(inputs(r, 100) for r in range(WORLD)), "all_reduce before the kill")
    out["first"] = x.cpu()
    kill_last_rank()
    waited, err = outlive(given(RANK, 100, device), wait)
    out["waited"] = torch.tensor(waited)
    if err is not None:
        said = (str(err).strip().splitlines() or [""])[0][:200]
        print(f"rank {RANK}: killed: the all-reduce failed after {waited:.2f} s: "
              f"{type(err).__name__}: {said}", flush=True)
    elif REAL_NCCL:
        print(f"rank {RANK}: killed: the all-reduce still waits after {waited:.0f} s "
              "(expected: the real NCCL leaves a lost peer to torch's watchdog)", flush=True)
    else:
        raise AssertionError(f"the all-reduce still waits {waited:.0f} s after the kill")


JOBS = {
    "premul": job_premul,
    "groups": job_groups,
    "ddp": job_ddp,
    "fsdp": job_fsdp,
    "mesh": job_mesh,
    "pipeline": job_pipeline,
    "late": job_late,
    "coalesce": job_coalesce,
    "gatherscatter": job_gatherscatter,
    "graph": job_graph,
    "killed": job_killed,
}
# Compared exactly (their arithmetic is); the rest within TOLERANCE. `waited` is a time.
EXACT = {"premul", "groups", "pipeline", "late", "coalesce", "gatherscatter", "graph"}
TOLERANCE = 1e-5
# Not compared: a rank is killed; what the survivors saw differs by library (ringreduce names
# the lost rank, the real NCCL may wait), and each run checks it itself.
UNCOMPARED = {"killed"}
# Jobs that lose a rank: the survivors save and leave, without a barrier or an orderly end.
ALONE = {"killed"}
# Environment a job sets before init, unless the caller set it.
JOB_ENV = {"killed": {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}}


def compare(dir_a, dir_b):
    names = sorted(f for f in os.listdir(dir_a) if f.endswith(".pt"))
    if not names:
        print(f"nothing to compare in {dir_a}")
        return 1
    failed = compared = 0
    for name in names:
        job = name.split("-")[0]
        if job in UNCOMPARED:
            print(f"{name}: not compared (the job kills a rank; each run checked itself)")
            continue
        path_b = os.path.join(dir_b, name)
        if not os.path.exists(path_b):
            print(f"{name}: missing in {dir_b}")
            failed += 1
            continue
        a, b = torch.load(os.path.join(dir_a, name)), torch.load(path_b)
        compared += 1
        for key in sorted(set(a) | set(b)):
            if key == "waited":
                continue
            if key not in a or key not in b:
                print(f"{name} {key}: in one run only")
                failed += 1
                continue
            x, y = a[key].double(), b[key].double()
            ok = torch.equal(x, y) if job in EXACT else torch.allclose(x, y, rtol=TOLERANCE, atol=TOLERANCE)
            diff = (x - y).abs().max().item() if x.numel() else 0.0
            print(f"{name} {key}: {'same' if ok else 'DIFFERENT'} (max |a - b| {diff:.3g})")
            failed += not ok
    print(f"compared {compared} files: {failed} differences")
    return 1 if failed else 0


def main():
    if sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    job, outdir = sys.argv[1], sys.argv[2]
    for key, value in JOB_ENV.get(job, {}).items():
        os.environ.setdefault(key, value)
    if os.environ.get("TORCH_JOBS_TRACEBACK"):  # where a stuck job waits, after N seconds
        import faulthandler
        faulthandler.dump_traceback_later(int(os.environ["TORCH_JOBS_TRACEBACK"]))
    device = init()
    out = {}
    try:
        JOBS[job](device, out)
    except Exception as e:  # noqa: BLE001 - named and exits 1
        print(f"rank {RANK}: {job} FAILED: {type(e).__name__}: {e}", flush=True)
        os._exit(1)
    os.makedirs(outdir, exist_ok=True)
    torch.save(out, os.path.join(outdir, f"{job}-{RANK}.pt"))
    if job in ALONE:  # a rank is gone: a barrier would wait for it
        print(f"rank {RANK}: {job} ok", flush=True)
        os._exit(0)
    dist.barrier()
    print(f"rank {RANK}: {job} past the final barrier", flush=True)
    dist.destroy_process_group()
    print(f"rank {RANK}: {job} ok", flush=True)


if __name__ == "__main__":
    main()
