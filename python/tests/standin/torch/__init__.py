"""A stand-in for the few parts of PyTorch that ``ringreduce.torch`` touches — *not* torch.

With it, ``test_torch_layer.py`` runs ringreduce.torch's own logic on a machine without torch
or a GPU: which tensors it refuses, what it hands the engine (addresses, counts, type names,
the stream's handle), when it records a stream on a tensor. It proves nothing about torch's
API itself, nor about a GPU: those run on a GPU machine only (python/README.md says which code
has not run yet). Each attribute here mirrors the torch attribute of the same name.
"""

import itertools
import types


class dtype:
    def __init__(self, name, itemsize):
        self.name, self.itemsize = name, itemsize

    def __repr__(self):
        return f"torch.{self.name}"


float16, bfloat16 = dtype("float16", 2), dtype("bfloat16", 2)
float32, float64 = dtype("float32", 4), dtype("float64", 8)
int8, uint8, int16 = dtype("int8", 1), dtype("uint8", 1), dtype("int16", 2)
int32, uint32 = dtype("int32", 4), dtype("uint32", 4)
int64, uint64 = dtype("int64", 8), dtype("uint64", 8)
float8_e4m3fn, float8_e5m2 = dtype("float8_e4m3fn", 1), dtype("float8_e5m2", 1)
half, float, double = float16, float32, float64


class device:
    def __init__(self, type, index=None):
        self.type, self.index = type, index

    def __eq__(self, other):
        return (self.type, self.index) == (other.type, other.index)

    def __repr__(self):
        return f"device(type={self.type!r}, index={self.index})"


_addresses = itertools.count(0x7F0000000000, 0x10000)


class Tensor:
    """A tensor as far as ringreduce.torch looks: where, what type, how many, contiguous."""

    def __init__(self, numel, dtype=float32, device=device("cuda", 0), contiguous=True):
        self._numel, self.dtype, self.device = numel, dtype, device
        self._contiguous, self._ptr = contiguous, next(_addresses)
        self.recorded = []  # the streams record_stream was called with

    def data_ptr(self):
        return self._ptr

    def numel(self):
        return self._numel

    def is_contiguous(self):
        return self._contiguous

    def record_stream(self, stream):
        self.recorded.append(stream)


class _Stream:
    def __init__(self, handle, device):
        self.cuda_stream, self.device = handle, device


_current = {}


def _current_stream(device=None):
    index = 0 if device is None else device.index
    return _current.setdefault(index, _Stream(0x5000 + index, device))


cuda = types.SimpleNamespace(current_stream=_current_stream, Stream=_Stream)
