"""ringreduce on PyTorch CUDA tensors: the GPU ranks' side of :class:`ringreduce.Communicator`.

**Not yet run on a GPU.** Nothing in this module has run: the machines that build and test
ringreduce have neither a GPU nor torch. It is written against torch's documented API and the
core's raw-stream calls (``RankCommunicator::enqueue_collective_on_raw`` and
``enqueue_collective_in_place_on_raw``, ``enqueue_send_recv_on_raw``), which the NCCL-compatible
library also uses, and is kept this small so that its first run on a GPU has little to find.

You don't call this module yourself: a :class:`ringreduce.Communicator` made with
``device=N`` (a GPU rank) sends every call whose buffers are torch tensors here. Each call:

- checks every tensor: on CUDA, on this rank's GPU (``cuda:N``), contiguous, of a type
  ringreduce has (float16, bfloat16, float32, float64, int8, uint8, int32, int64, and where
  torch has them uint32, uint64, float8_e4m3fn, float8_e5m2), all of one type — else
  :class:`ringreduce.ArgumentError`, before anything is enqueued;
- enqueues the collective on ``stream`` — a ``torch.cuda.Stream``, by default
  ``torch.cuda.current_stream()`` of this rank's GPU — and returns at once: the collective
  starts after the work already queued there, and the work queued there later sees its
  result, with no host synchronisation (call ``torch.cuda.synchronize()`` or
  ``comm.synchronize()`` to wait on the host);
- keeps the tensors' memory for the collective: the stream it ran on is recorded on every
  tensor (``Tensor.record_stream``), since torch's caching allocator orders a freed block only
  after the work of the stream it was allocated on, which need not be this one.

The rest is the host ranks' rule: ``out=None`` is in place; every rank must make the same
calls. Calls on a host rank, or with CPU tensors, raise :class:`ringreduce.ArgumentError`
(host ranks take host buffers: ``tensor.numpy()`` shares a CPU tensor's memory).
"""

try:
    import torch
except ImportError as err:  # pragma: no cover - depends on the machine
    raise ImportError(
        "ringreduce.torch needs PyTorch (import torch failed: " + str(err) + "); host ranks "
        "need no torch: pass them NumPy arrays or any buffer"
    ) from err

from ._errors import ArgumentError

#: torch's element types and ringreduce's names for them.
DTYPES = {
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int32: "i32",
    torch.int64: "i64",
}
for _torch_name, _name in (
    ("uint32", "u32"),
    ("uint64", "u64"),
    ("float8_e4m3fn", "f8e4m3"),
    ("float8_e5m2", "f8e5m2"),
):
    if hasattr(torch, _torch_name):
        DTYPES[getattr(torch, _torch_name)] = _name


def _memory(native, tensor, role):
    """``(address, count)`` of ``tensor`` and its type's name, after the checks above."""
    if tensor is None:
        return None, None
    if not isinstance(tensor, torch.Tensor):
        raise ArgumentError(
            f"{role}: a torch tensor (a GPU rank's calls, and calls given tensors, take tensors "
            f"alone), got {type(tensor).__name__}"
        )
    if native.device is None:
        raise ArgumentError(
            f"{role} is a tensor on {tensor.device}, and this is a host rank: GPU tensors need "
            "Communicator(..., device=N); host ranks take host buffers (tensor.numpy())"
        )
    if tensor.device.type != "cuda" or tensor.device.index != native.device:
        raise ArgumentError(
            f"{role} is on {tensor.device}; this rank's GPU is cuda:{native.device}"
        )
    if not tensor.is_contiguous():
        raise ArgumentError(f"{role} is not contiguous: pass tensor.contiguous()")
    name = DTYPES.get(tensor.dtype)
    if name is None:
        raise ArgumentError(f"{role}: {tensor.dtype} has no ringreduce type")
    return (tensor.data_ptr(), tensor.numel()), name


def _one_type(named, dtype):
    """The call's one type: its tensors' (``named``: role → ringreduce's name of the type),
    which ``dtype=`` (a torch dtype or a name), where given, must agree with."""
    names = {name for name in named.values() if name is not None}
    if len(names) > 1:
        raise ArgumentError(f"one call moves one element type; the tensors hold {sorted(names)}")
    if dtype is None:
        if not names:
            raise ArgumentError("this rank passes no tensor to the call: pass dtype=")
        return names.pop()
    if isinstance(dtype, str):  # "float16" -> torch.float16 -> "f16"; "f16" stays
        wanted = DTYPES.get(getattr(torch, dtype.replace("torch.", ""), None), dtype)
    elif dtype in DTYPES:
        wanted = DTYPES[dtype]
    else:
        raise ArgumentError(f"dtype={dtype!r} has no ringreduce type")
    if names and wanted not in names:
        raise ArgumentError(f"dtype={dtype} differs from the tensors' type ({names.pop()})")
    return wanted


def _stream(native, stream):
    """The stream to enqueue on, and its raw handle (``cudaStream_t`` as an integer)."""
    if stream is None:
        stream = torch.cuda.current_stream(torch.device("cuda", native.device))
    return stream, int(stream.cuda_stream)


def _keep(tensors, stream):
    """Records ``stream`` on each tensor (module doc)."""
    for tensor in tensors:
        if tensor is not None:
            tensor.record_stream(stream)


def collective(native, name, root, x, out, op, dtype, stream):
    """One collective on tensors (``ringreduce.Communicator``'s methods): enqueued on
    ``stream`` through the engine's ``enqueue``."""
    x_memory, x_type = _memory(native, x, "x")
    out_memory, out_type = _memory(native, out, "out")
    element = _one_type({"x": x_type, "out": out_type}, dtype)
    chosen, handle = _stream(native, stream)
    native.enqueue(name, root, x_memory, out_memory, op, element, handle)
    _keep((x, out), chosen)


def send_recv(native, transfers, sends, recvs, dtype, stream):
    """Grouped send/recv on tensors, enqueued on ``stream`` through ``enqueue_send_recv``."""
    send_memory = [_memory(native, t, f"sends[{i}]") for i, t in enumerate(sends)]
    recv_memory = [_memory(native, t, f"recvs[{i}]") for i, t in enumerate(recvs)]
    named = {f"buffer {i}": name for i, (_, name) in enumerate(send_memory + recv_memory)}
    element = _one_type(named, dtype)
    chosen, handle = _stream(native, stream)
    native.enqueue_send_recv(
        transfers, [m for m, _ in send_memory], [m for m, _ in recv_memory], element, handle
    )
    _keep(list(sends) + list(recvs), chosen)
