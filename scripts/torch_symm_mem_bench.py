#!/usr/bin/env python3
"""PyTorch's symmetric-memory all-reduces, timed the way `ringreduce bench` times its rows.

Run one process per GPU:

    python3 -m torch.distributed.run --nproc_per_node 2 scripts/torch_symm_mem_bench.py --out X.json

then hand X.json to `ringreduce bench --torch-json X.json`, which prints it as its own table and
counts it in the comparison's "best of all" column.

What it measures, per size (bytes per rank, -b..-e, x2; f32 sum, eager, no CUDA graphs):
  * torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group_name): out of place (returns a new
    tensor);
  * torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", group_name): in place.
Each on a buffer from torch.distributed._symmetric_memory.empty, rendezvoused on the world group.
Per operator and size: one checked call (rank- and index-dependent small integers, exact sums),
-w warm-up calls, -n calls back to back then one synchronisation (time_us = wall clock / n), and -n
calls each timed from the call to the end of torch.cuda.synchronize() (call median, mean, p99 =
the ceil(0.99 n)-th smallest). Rank 0's clock; rank 0 writes the JSON.

The environment: TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NCCL_NVLS_ENABLE=0 are set here, before
torch is imported (NVLink multicast must stay off on the shared test machines; ringreduce's and
NCCL's rows are measured with it off too). The operators are looked up, not assumed: the JSON's
"ops_available" says which this PyTorch has, and a row whose operator is missing or fails carries
"error" instead of times.
"""

import os

# Before torch (and NCCL) read them.
FORCED_ENV = {"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NCCL_NVLS_ENABLE": "0"}
_overridden = {k: os.environ.get(k) for k in FORCED_ENV if os.environ.get(k) not in (None, FORCED_ENV[k])}
os.environ.update(FORCED_ENV)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

OPS = [
    # (operator name in torch.ops.symm_mem, placement)
    ("one_shot_all_reduce", "out_of_place"),
    ("two_shot_all_reduce_", "in_place"),
]


def parse_bytes(text):
    text = text.strip()
    units = {"K": 10, "M": 20, "G": 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) << units[text[-1].upper()]
    return int(text)


def stats(samples):
    """(median, mean, p99) of samples in microseconds; p99 = the ceil(0.99 n)-th smallest."""
    s = sorted(samples)
    n = len(s)
    if n == 0:
        return None, None, None
    median = s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2
    p99 = s[min(max(math.ceil(0.99 * n), 1), n) - 1]
    return median, sum(s) / n, p99


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write (rank 0)")
    parser.add_argument("-b", "--min-bytes", default="8", help="smallest size, bytes per rank")
    parser.add_argument("-e", "--max-bytes", default="32M", help="largest size, bytes per rank")
    parser.add_argument("-n", "--iters", type=int, default=200, help="timed calls per pass")
    parser.add_argument("-w", "--warmup", type=int, default=20, help="warm-up calls per size")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    try:
        import torch.distributed._symmetric_memory as symm_mem
    except ImportError as e:  # a PyTorch without symmetric memory
        symm_mem = None
        symm_import_error = f"torch.distributed._symmetric_memory: {e}"
    else:
        symm_import_error = None

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    group = dist.group.WORLD
    group_name = group.group_name

    ops_available = {name: hasattr(torch.ops.symm_mem, name) if symm_mem else False for name, _ in OPS}
    # Older PyTorch needs symmetric memory enabled per group; newer ones have no such call.
    if symm_mem is not None and hasattr(symm_mem, "enable_symm_mem_for_group"):
        symm_mem.enable_symm_mem_for_group(group_name)

    sizes = []
    size = max(parse_bytes(args.min_bytes), 4)
    while size <= parse_bytes(args.max_bytes):
        sizes.append(size // 4 * 4)
        size *= 2

    rows = []
    for size_bytes in sizes:
        numel = size_bytes // 4
        for name, placement in OPS:
            row = {"op": name, "placement": placement, "size_bytes": size_bytes, "error": None}
            rows.append(row)
            if symm_mem is None:
                row["error"] = symm_import_error
                continue
            if not ops_available[name]:
                row["error"] = f"torch.ops.symm_mem.{name} does not exist in PyTorch {torch.__version__}"
                continue
            op = getattr(torch.ops.symm_mem, name)
            try:
                buf = symm_mem.empty(numel, dtype=torch.float32, device=device)
                symm_mem.rendezvous(buf, group_name)
                index = torch.arange(numel, device=device, dtype=torch.float32)
                fresh = (index.remainder(13) + 1) * (rank + 1)  # small integers: exact sums
                want = (index.remainder(13) + 1) * (world * (world + 1) / 2)

                def call():
                    return op(buf, "sum", group_name)

                # Checked call on fresh inputs.
                buf.copy_(fresh)
                torch.cuda.synchronize()
                dist.barrier()
                got = call()
                got = buf if got is None else got
                torch.cuda.synchronize()
                row["wrong"] = int((got != want).sum().item())

                for _ in range(args.warmup):
                    call()
                torch.cuda.synchronize()
                dist.barrier()
                start = time.perf_counter()
                for _ in range(args.iters):
                    call()
                torch.cuda.synchronize()
                row["time_us"] = (time.perf_counter() - start) / args.iters * 1e6

                dist.barrier()
                per_call = []
                for _ in range(args.iters):
                    t = time.perf_counter()
                    call()
                    torch.cuda.synchronize()
                    per_call.append((time.perf_counter() - t) * 1e6)
                row["call_median_us"], row["call_mean_us"], row["call_p99_us"] = stats(per_call)
                del buf
            except Exception as e:  # noqa: BLE001 — reported in the row, the sweep goes on
                row["error"] = f"{type(e).__name__}: {e}"
                torch.cuda.synchronize()
            dist.barrier()
            if rank == 0:
                if row["error"]:
                    print(f"{size_bytes:>11} {name:>22} error: {row['error']}", flush=True)
                else:
                    print(
                        f"{size_bytes:>11} {name:>22} {row['time_us']:9.2f} us"
                        f"  call med {row['call_median_us']:8.2f}  p99 {row['call_p99_us']:8.2f}"
                        f"  #wrong {row['wrong']}",
                        flush=True,
                    )

    if rank == 0:
        report = {
            "source": "scripts/torch_symm_mem_bench.py",
            "torch_version": torch.__version__,
            "world": world,
            "dtype": "f32",
            "op": "sum",
            "device": torch.cuda.get_device_name(device),
            "env": {k: os.environ[k] for k in FORCED_ENV},
            "env_overridden": {k: v for k, v in _overridden.items()},
            "ops_available": ops_available,
            "iters": args.iters,
            "warmup": args.warmup,
            "rows": rows,
        }
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"# JSON: {args.out}; ops available: {ops_available}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
