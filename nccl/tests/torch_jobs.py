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
others).
"""

import os
import sys
import time

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


JOBS = {
    "premul": job_premul,
    "groups": job_groups,
    "ddp": job_ddp,
    "fsdp": job_fsdp,
    "mesh": job_mesh,
    "pipeline": job_pipeline,
    "late": job_late,
}
# Compared exactly (their arithmetic is); the rest within TOLERANCE. `waited` is a time.
EXACT = {"premul", "groups", "pipeline", "late"}
TOLERANCE = 1e-5


def compare(dir_a, dir_b):
    names = sorted(f for f in os.listdir(dir_a) if f.endswith(".pt"))
    if not names:
        print(f"nothing to compare in {dir_a}")
        return 1
    failed = 0
    for name in names:
        path_b = os.path.join(dir_b, name)
        if not os.path.exists(path_b):
            print(f"{name}: missing in {dir_b}")
            failed += 1
            continue
        a, b = torch.load(os.path.join(dir_a, name)), torch.load(path_b)
        job = name.split("-")[0]
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
    print(f"compared {len(names)} files: {failed} differences")
    return 1 if failed else 0


def main():
    if sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    job, outdir = sys.argv[1], sys.argv[2]
    device = init()
    out = {}
    try:
        JOBS[job](device, out)
    except Exception as e:  # noqa: BLE001 - named and exits 1
        print(f"rank {RANK}: {job} FAILED: {type(e).__name__}: {e}", flush=True)
        os._exit(1)
    os.makedirs(outdir, exist_ok=True)
    torch.save(out, os.path.join(outdir, f"{job}-{RANK}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {RANK}: {job} ok", flush=True)


if __name__ == "__main__":
    main()
