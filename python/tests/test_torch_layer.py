"""ringreduce.torch's own logic, on a stand-in for torch (standin/torch: not torch) and a
stand-in for a GPU rank's engine that records each call after binding it to the real engine
method's signature. What this proves: tensors are refused or passed on as ringreduce.torch
says, with the right addresses, counts, type names and stream handle, and the right streams
recorded. What it cannot: anything about real torch or a GPU (python/README.md lists that code
as never run).
"""

import inspect
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "standin"))

import torch  # noqa: E402 - the stand-in

import ringreduce  # noqa: E402
from ringreduce import _native  # noqa: E402

assert not hasattr(torch, "__version__"), "the stand-in must shadow a real torch here"


class GpuEngine:
    """A GPU rank's engine as ringreduce.torch meets it: records each enqueue, after binding
    its arguments to the real method's signature (a call the real engine would refuse by
    its arity fails here too)."""

    def __init__(self, rank=0, world=2, device=0):
        self.rank, self.world, self.device = rank, world, device
        self.calls = []

    def _record(self, method, *args):
        inspect.signature(getattr(_native.Communicator, method)).bind(self, *args)
        self.calls.append((method, *args))

    def enqueue(self, *args):
        self._record("enqueue", *args)

    def enqueue_send_recv(self, *args):
        self._record("enqueue_send_recv", *args)


def gpu_rank(**kwargs):
    comm = ringreduce.Communicator.__new__(ringreduce.Communicator)
    comm._native = GpuEngine(**kwargs)
    return comm


def tensor(numel=8, dtype=torch.float32, index=0, **kwargs):
    return torch.Tensor(numel, dtype, torch.device("cuda", index), **kwargs)


class TorchLayer(unittest.TestCase):
    def test_in_place_on_the_current_stream(self):
        comm, x = gpu_rank(), tensor()
        self.assertIs(comm.all_reduce(x, "avg"), x)
        current = torch.cuda.current_stream(torch.device("cuda", 0)).cuda_stream
        self.assertEqual(
            comm._native.calls,
            [("enqueue", "all_reduce", 0, (x.data_ptr(), 8), None, "avg", "f32", current)],
        )
        # Recorded even on the current stream: the tensor may have been allocated on another.
        self.assertEqual(len(x.recorded), 1)
        self.assertEqual(x.recorded[0].cuda_stream, current)

    def test_out_of_place_on_a_stream_passed_in(self):
        comm, x, out = gpu_rank(rank=1), tensor(16, torch.bfloat16), tensor(8, torch.bfloat16)
        stream = torch.cuda.Stream(0x7777, torch.device("cuda", 0))
        self.assertIs(comm.reduce_scatter(x, "max", out=out, stream=stream), out)
        self.assertEqual(
            comm._native.calls,
            [
                (
                    "enqueue",
                    "reduce_scatter",
                    0,
                    (x.data_ptr(), 16),
                    (out.data_ptr(), 8),
                    "max",
                    "bf16",
                    0x7777,
                )
            ],
        )
        self.assertEqual((x.recorded, out.recorded), ([stream], [stream]))

    def test_every_collective_names_itself_and_its_root(self):
        comm = gpu_rank(rank=1)
        x, out = tensor(4, torch.int64), tensor(8, torch.int64)
        comm.all_gather(x, out=out)
        comm.broadcast(None, root=0, out=x)
        comm.reduce(x, root=1, op="prod")
        comm.all_to_all(out, tensor(8, torch.int64))
        got = [(c[1], c[2], c[5], c[6]) for c in comm._native.calls]
        self.assertEqual(
            got,
            [
                ("all_gather", 0, "sum", "i64"),
                ("broadcast", 0, "sum", "i64"),
                ("reduce", 1, "prod", "i64"),
                ("all_to_all", 0, "sum", "i64"),
            ],
        )
        self.assertIsNone(comm._native.calls[1][3])  # a non-root's broadcast passes no x

    def test_every_torch_type_ringreduce_has(self):
        for dtype, name in (
            (torch.float16, "f16"),
            (torch.bfloat16, "bf16"),
            (torch.float32, "f32"),
            (torch.float64, "f64"),
            (torch.int8, "i8"),
            (torch.uint8, "u8"),
            (torch.int32, "i32"),
            (torch.uint32, "u32"),
            (torch.int64, "i64"),
            (torch.uint64, "u64"),
            (torch.float8_e4m3fn, "f8e4m3"),
            (torch.float8_e5m2, "f8e5m2"),
        ):
            comm = gpu_rank()
            comm.all_reduce(tensor(2, dtype))
            self.assertEqual(comm._native.calls[0][6], name, dtype)

    def test_send_recv_passes_each_end(self):
        comm = gpu_rank(rank=0, world=2)
        send, recv = tensor(3, torch.float16), tensor(5, torch.float16)
        self.assertEqual(comm.send_recv([(0, 1, 3), (1, 0, 5)], [send], [recv]), [recv])
        self.assertEqual(
            comm._native.calls,
            [
                (
                    "enqueue_send_recv",
                    [(0, 1, 3), (1, 0, 5)],
                    [(send.data_ptr(), 3)],
                    [(recv.data_ptr(), 5)],
                    "f16",
                    0x5000,
                )
            ],
        )
        apart = gpu_rank(rank=2, world=3)
        apart.send_recv([(0, 1, 3)], dtype=torch.bfloat16)  # no tensor on this rank
        self.assertEqual(apart._native.calls[0][4], "bf16")

    def test_refusals_before_anything_is_enqueued(self):
        comm = gpu_rank()
        x = tensor()
        for call, match in (
            (lambda: comm.all_reduce(tensor(index=1)), "cuda:0"),
            (
                lambda: comm.all_reduce(torch.Tensor(4, torch.float32, torch.device("cpu"))),
                "cuda:0",
            ),
            (lambda: comm.all_reduce(tensor(contiguous=False)), "not contiguous"),
            (lambda: comm.all_reduce(tensor(dtype=torch.int16)), "no ringreduce type"),
            (lambda: comm.all_reduce(x, out=tensor(dtype=torch.float64)), "one element type"),
            (lambda: comm.all_reduce(x, out=bytearray(32)), "a torch tensor"),
            (lambda: comm.all_reduce(x, dtype="float16"), "differs"),
            (lambda: comm.send_recv([(0, 1, 3)]), "pass dtype="),
        ):
            with self.subTest(match=match), self.assertRaisesRegex(ringreduce.ArgumentError, match):
                call()
        self.assertEqual(comm._native.calls, [])
        comm.all_reduce(x, dtype="float32")
        comm.all_reduce(x, dtype=torch.float32)
        self.assertEqual(len(comm._native.calls), 2)

    def test_cuda_tensors_on_a_host_rank_are_refused(self):
        # (CPU tensors are a host rank's buffers: test_torch_cpu.py runs them on real torch.)
        with ringreduce.Communicator(ringreduce.UniqueId(), 0, 1) as comm:
            with self.assertRaisesRegex(ringreduce.ArgumentError, "host rank"):
                comm.all_reduce(tensor())


if __name__ == "__main__":
    unittest.main()
