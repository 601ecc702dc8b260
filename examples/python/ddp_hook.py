"""DDP with ringreduce averaging the gradients: run with

    torchrun --nproc_per_node 2 examples/python/ddp_hook.py

On GPUs each process trains on its GPU (``LOCAL_RANK``; processes share GPU 0 where there are
fewer GPUs than processes); without one, on the CPU with host ranks. The same small model is
trained twice from the same start on the same data: once with DDP's own all-reduce (the gloo
backend) and once with ``ringreduce.torch.allreduce_hook``; the parameters must agree.
"""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ringreduce
import ringreduce.torch as rt

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
gpus = torch.cuda.device_count()
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % gpus) if gpus else None
if device is not None:
    torch.cuda.set_device(device)
place = device or torch.device("cpu")

dist.init_process_group("gloo")  # DDP's own process group (parameter broadcast, the baseline)
comm = ringreduce.Communicator.from_env(
    device=None if device is None else device.index, allow_shared_device=gpus < world
)


def train(hook):
    torch.manual_seed(0)  # the same start on every rank and in both runs
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
    ).to(place)
    net = DistributedDataParallel(model, device_ids=None if device is None else [device.index])
    if hook:
        net.register_comm_hook(comm, rt.allreduce_hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    for _ in range(5):
        x = torch.randn(8, 16, generator=data).to(place)
        loss = (net(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().cpu() for p in model.parameters()], loss.item()


baseline, _ = train(hook=False)
params, loss = train(hook=True)
gap = max((a - b).abs().max().item() for a, b in zip(baseline, params))
# The two all-reduces add the ranks' gradients in different orders: a few ulps apart.
assert gap < 1e-5, f"rank {rank}: the hook's parameters differ from gloo's by {gap}"
print(f"rank {rank}: loss {loss:.4f}; parameters within {gap:.1e} of DDP's own all-reduce")
comm.close()
dist.destroy_process_group()
