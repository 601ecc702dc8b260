"""A tensor-parallel MLP forward, captured in a CUDA graph: run with

    torchrun --nproc_per_node 2 examples/python/tp_mlp_graph.py

(on a machine with a GPU; processes share GPU 0 where there are fewer GPUs than processes).
Megatron's split: the first layer's columns and the second layer's rows are sharded over the
ranks, so each rank computes a partial output and one all-reduce sums them — here
``TensorParallel.all_reduce``, with the caller's fallback (``dist.all_reduce``) where
``should_use`` says no. The forward is captured once and replayed with new inputs; every replay
is checked against the unsharded MLP.
"""

import os
import sys

import torch

import ringreduce
import ringreduce.torch as rt

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
gpus = torch.cuda.device_count()
if not gpus:
    sys.exit("tp_mlp_graph.py needs a GPU (TensorParallel takes CUDA tensors)")
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % gpus)
torch.cuda.set_device(device)
comm = ringreduce.Communicator.from_env(device=device.index, allow_shared_device=gpus < world)
tp = rt.TensorParallel(comm)

hidden, inner, tokens = 256, 1024, 32
torch.manual_seed(0)  # every rank makes the whole weights, then keeps its shard
w1 = torch.randn(inner, hidden, device=device) / hidden**0.5
w2 = torch.randn(hidden, inner, device=device) / inner**0.5
shard = inner // world
w1_mine = w1[rank * shard : (rank + 1) * shard].contiguous()  # columns of layer 1
w2_mine = w2[:, rank * shard : (rank + 1) * shard].contiguous()  # rows of layer 2


def forward(x):
    partial = torch.relu(x @ w1_mine.t()) @ w2_mine.t()
    if tp.should_use(partial):
        return tp.all_reduce(partial)
    raise RuntimeError("this example has no fallback: TensorParallel declined the tensor")


x = torch.randn(tokens, hidden, device=device)
forward(x)  # every shape runs eagerly once before it is captured
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with tp.capture():
    with torch.cuda.graph(graph):
        y = forward(x)
worst = 0.0
for step in range(20):
    x.copy_(torch.randn(tokens, hidden, device=device, generator=None))
    graph.replay()
    want = torch.relu(x @ w1.t()) @ w2.t()
    worst = max(worst, (y - want).abs().max().item())
torch.cuda.synchronize()
# The shards' partial sums add in another order than the whole matmul: float32 rounding only.
assert worst < 1e-3, f"rank {rank}: the tensor-parallel forward is off by {worst}"
print(f"rank {rank}: 20 graph replays within {worst:.1e} of the unsharded MLP")
comm.close()
