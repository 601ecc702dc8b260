"""ringreduce on PyTorch tensors: the torch side of :class:`ringreduce.Communicator`, and the
places a torch program plugs it in (custom ops, a DDP hook, a tensor-parallel object).

Where it has run (python/README.md says more): on host ranks with real torch (CPU tensors,
``torch.compile``, DDP); its GPU side — the core's raw-stream calls
(``RankCommunicator::enqueue_collective`` and ``enqueue_collective_in_place``,
``enqueue_send_recv``), which the NCCL-compatible library also uses — has not run on a
GPU yet.

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
calls. A host rank takes CPU tensors (their memory, shared with NumPy, is the buffer; types
NumPy lacks — bfloat16, the fp8 types — pass as their bits); a GPU rank takes CUDA tensors
alone.

Beyond the communicator's methods, this module is where torch programs plug ringreduce in:

- **custom ops** (``torch.ops.ringreduce.*``, registered with ``torch.library`` where torch has
  ``custom_op``, 2.4 and later): :func:`all_reduce`, :func:`all_gather` and
  :func:`reduce_scatter` return new tensors through them, so ``torch.compile`` sees one opaque
  call each (their fake implementations give shapes without running anything) and a compiled
  model runs them; :func:`all_reduce_` reduces in place;
- **a DDP communication hook**, :func:`allreduce_hook`
  (``model.register_comm_hook(comm, ringreduce.torch.allreduce_hook)``): each gradient bucket
  averaged over the ranks on the bucket's stream;
- **a tensor-parallel object**, :class:`TensorParallel`, in the shape inference engines use for
  their custom all-reduce (``should_use``, ``all_reduce``, ``capture``).
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


#: Types NumPy lacks: a host rank passes their bits, as tensors of this integer type.
_BITS = {torch.bfloat16: torch.int16}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(torch, _name):
        _BITS[getattr(torch, _name)] = torch.uint8


def _host_memory(tensor, role):
    """A host rank's buffer for ``tensor`` (a NumPy view of its memory) and its type's name;
    anything not a tensor passes as it is, for the engine to judge."""
    if tensor is None or not isinstance(tensor, torch.Tensor):
        return tensor, None
    if tensor.device.type != "cpu":
        raise ArgumentError(
            f"{role} is a tensor on {tensor.device}, and this is a host rank: CUDA tensors "
            "need Communicator(..., device=N)"
        )
    if not tensor.is_contiguous():
        raise ArgumentError(f"{role} is not contiguous: pass tensor.contiguous()")
    name = DTYPES.get(tensor.dtype)
    if name is None:
        raise ArgumentError(f"{role}: {tensor.dtype} has no ringreduce type")
    bits = tensor.detach()
    if tensor.dtype in _BITS:
        bits = bits.view(_BITS[tensor.dtype])
    return bits.numpy(), name


def _host_collective(native, name, root, x, out, op, dtype, stream):
    """One collective of a host rank on CPU tensors: blocking, as every host call."""
    if stream is not None:
        raise ArgumentError(
            "stream= orders a GPU rank's call on a CUDA stream: host buffers take none"
        )
    x_buffer, x_type = _host_memory(x, "x")
    out_buffer, out_type = _host_memory(out, "out")
    element = None
    if x_type or out_type or dtype is not None:
        element = _one_type({"x": x_type, "out": out_type}, dtype)
    native.collective(name, root, x_buffer, out_buffer, op, element)


def collective(native, name, root, x, out, op, dtype, stream):
    """One collective on tensors (``ringreduce.Communicator``'s methods): a GPU rank's is
    enqueued on ``stream`` through the engine's ``enqueue``; a host rank's runs on CPU
    tensors."""
    if native.device is None:
        _host_collective(native, name, root, x, out, op, dtype, stream)
        return
    x_memory, x_type = _memory(native, x, "x")
    out_memory, out_type = _memory(native, out, "out")
    element = _one_type({"x": x_type, "out": out_type}, dtype)
    chosen, handle = _stream(native, stream)
    native.enqueue(name, root, x_memory, out_memory, op, element, handle)
    _keep((x, out), chosen)


def send_recv(native, transfers, sends, recvs, dtype, stream):
    """Grouped send/recv on tensors: a GPU rank's enqueued on ``stream`` through
    ``enqueue_send_recv``, a host rank's on CPU tensors."""
    if native.device is None:
        if stream is not None:
            raise ArgumentError(
                "stream= orders a GPU rank's call on a CUDA stream: host buffers take none"
            )
        send_memory = [_host_memory(t, f"sends[{i}]") for i, t in enumerate(sends)]
        recv_memory = [_host_memory(t, f"recvs[{i}]") for i, t in enumerate(recvs)]
        named = {f"buffer {i}": n for i, (_, n) in enumerate(send_memory + recv_memory)}
        element = _one_type(named, dtype) if any(named.values()) or dtype else None
        native.send_recv(
            transfers, [b for b, _ in send_memory], [b for b, _ in recv_memory], element
        )
        return
    send_memory = [_memory(native, t, f"sends[{i}]") for i, t in enumerate(sends)]
    recv_memory = [_memory(native, t, f"recvs[{i}]") for i, t in enumerate(recvs)]
    named = {f"buffer {i}": name for i, (_, name) in enumerate(send_memory + recv_memory)}
    element = _one_type(named, dtype)
    chosen, handle = _stream(native, stream)
    native.enqueue_send_recv(
        transfers, [m for m, _ in send_memory], [m for m, _ in recv_memory], element, handle
    )
    _keep(list(sends) + list(recvs), chosen)


# --- Custom ops: what torch.compile and CUDA graphs see ----------------------------------------

#: Communicators the custom ops can name, by handle (an op's arguments are tensors and numbers).
_COMMUNICATORS = {}


def handle(comm):
    """The number that names ``comm`` in the custom ops' arguments
    (``torch.ops.ringreduce.all_reduce(x, handle, "sum")``): take it once, outside compiled
    code, and call the ops with it there. The same for the same communicator, as long as it is
    open."""
    native = getattr(comm, "_native", None)
    if native is None:
        raise ArgumentError(f"a ringreduce.Communicator, got {type(comm).__name__}")
    if native.closed:
        _COMMUNICATORS.pop(id(native), None)
        raise ArgumentError("the communicator is closed")
    _COMMUNICATORS[id(native)] = comm
    return id(native)


def _communicator(handle):
    comm = _COMMUNICATORS.get(handle)
    if comm is None or comm.closed:
        raise ArgumentError(f"no open ringreduce communicator has handle {handle}")
    return comm


def _blocks(x, world, what):
    if x.numel() % world:
        raise ArgumentError(f"{what}: {x.numel()} elements do not split into {world} blocks")
    return x.numel() // world


def _op_all_reduce(x: torch.Tensor, handle: int, op: str) -> torch.Tensor:
    out = torch.empty_like(x)
    _communicator(handle).all_reduce(x, op=op, out=out)
    return out


def _op_all_reduce_(x: torch.Tensor, handle: int, op: str) -> None:
    _communicator(handle).all_reduce(x, op=op)


def _op_all_gather(x: torch.Tensor, handle: int) -> torch.Tensor:
    comm = _communicator(handle)
    out = x.new_empty((comm.world * x.numel(),))
    comm.all_gather(x.reshape(-1), out=out)
    return out


def _op_reduce_scatter(x: torch.Tensor, handle: int, op: str) -> torch.Tensor:
    comm = _communicator(handle)
    out = x.new_empty((_blocks(x, comm.world, "reduce_scatter"),))
    comm.reduce_scatter(x.reshape(-1), op=op, out=out)
    return out


if hasattr(torch, "library") and hasattr(torch.library, "custom_op"):
    _op_all_reduce = torch.library.custom_op("ringreduce::all_reduce", mutates_args=())(
        _op_all_reduce
    )
    _op_all_reduce_ = torch.library.custom_op("ringreduce::all_reduce_", mutates_args=("x",))(
        _op_all_reduce_
    )
    _op_all_gather = torch.library.custom_op("ringreduce::all_gather", mutates_args=())(
        _op_all_gather
    )
    _op_reduce_scatter = torch.library.custom_op("ringreduce::reduce_scatter", mutates_args=())(
        _op_reduce_scatter
    )

    # The fake implementations: shapes and types only, nothing runs (the world comes from the
    # communicator, which the handle names at trace time as at run time).
    @_op_all_reduce.register_fake
    def _(x, handle, op):
        return torch.empty_like(x)

    @_op_all_reduce_.register_fake
    def _(x, handle, op):
        return None

    @_op_all_gather.register_fake
    def _(x, handle):
        return x.new_empty((_communicator(handle).world * x.numel(),))

    @_op_reduce_scatter.register_fake
    def _(x, handle, op):
        return x.new_empty((_blocks(x, _communicator(handle).world, "reduce_scatter"),))

    CUSTOM_OPS = True
else:  # pragma: no cover - torch < 2.4: plain functions, which torch.compile traces into
    CUSTOM_OPS = False


def all_reduce(comm, x, op="sum"):
    """A new tensor: the reduction of every rank's ``x`` (``torch.ops.ringreduce.all_reduce``,
    opaque to ``torch.compile``). ``op``: ``"sum"``, ``"prod"``, ``"min"``, ``"max"``,
    ``"avg"``."""
    return _op_all_reduce(x, handle(comm), op)


def all_reduce_(comm, x, op="sum"):
    """Reduces every rank's ``x`` into ``x`` (``torch.ops.ringreduce.all_reduce_``); returns
    ``x``."""
    _op_all_reduce_(x, handle(comm), op)
    return x


def all_gather(comm, x):
    """A new 1-D tensor of ``world × x.numel()`` elements: every rank's ``x`` in rank order
    (``torch.ops.ringreduce.all_gather``)."""
    return _op_all_gather(x, handle(comm))


def reduce_scatter(comm, x, op="sum"):
    """A new 1-D tensor: this rank's block of the reduction of every rank's ``x`` (``world``
    equal blocks; ``torch.ops.ringreduce.reduce_scatter``)."""
    return _op_reduce_scatter(x, handle(comm), op)


# --- DDP -----------------------------------------------------------------------------------


def allreduce_hook(comm, bucket):
    """A DDP communication hook: ``model.register_comm_hook(comm, allreduce_hook)``. Averages
    the gradient bucket over the ranks in place (``op="avg"``, as DDP's default hook does with
    NCCL), on the stream current when DDP calls the hook; returns a future already holding the
    bucket, which records that stream so that DDP's use of the result waits for the
    collective (no host synchronisation)."""
    tensor = bucket.buffer()
    comm.all_reduce(tensor, op="avg")
    devices = [tensor.device] if tensor.device.type == "cuda" else []
    future = torch.futures.Future(devices=devices)
    future.set_result(tensor)
    return future


# --- Tensor parallelism --------------------------------------------------------------------


class TensorParallel:
    """The all-reduce of a tensor-parallel model's layers, in the shape inference engines give
    their custom all-reduce: ask :meth:`should_use` for each tensor, call :meth:`all_reduce`
    when it says yes, and take another path (NCCL) when it says no.

    ``comm`` is a GPU rank's communicator; ``max_bytes`` the largest tensor to take (8 MiB by
    default: beyond it, bandwidth-bound all-reduces gain little over NCCL's). Calls capture into
    CUDA graphs, but a captured shape must have run eagerly first (a first call allocates,
    which a capture forbids): under :meth:`capture`, or in any capture, ``should_use`` says no
    to a shape this object has not run eagerly, so the caller's fallback takes it."""

    def __init__(self, comm, max_bytes=8 << 20):
        if comm.device is None:
            raise ArgumentError("TensorParallel needs a GPU rank's communicator (device=N)")
        self.comm = comm
        self.max_bytes = int(max_bytes)
        self._ran = set()  # (count, element size, in place, avg) run eagerly
        self._capturing = False

    def _key(self, tensor, inplace, op):
        return (tensor.numel(), tensor.element_size(), inplace, op == "avg")

    def should_use(self, tensor, inplace=False, op="sum"):
        """Whether :meth:`all_reduce` takes ``tensor``: a contiguous CUDA tensor on this rank's
        GPU, of a type the library has, at most ``max_bytes``, and — while a graph is being
        captured — of a shape already run eagerly. Every rank must get the same answer (they
        pass tensors of the same shapes)."""
        if self.comm.closed or not isinstance(tensor, torch.Tensor):
            return False
        if tensor.device.type != "cuda" or tensor.device.index != self.comm.device:
            return False
        if not tensor.is_contiguous() or tensor.dtype not in DTYPES:
            return False
        if tensor.numel() * tensor.element_size() > self.max_bytes:
            return False
        capturing = self._capturing or torch.cuda.is_current_stream_capturing()
        return not capturing or self._key(tensor, inplace, op) in self._ran

    def all_reduce(self, tensor, op="sum", inplace=False):
        """The all-reduce of ``tensor`` over the ranks: a new tensor, or ``tensor`` itself when
        ``inplace``. Enqueued on the current stream."""
        out = tensor if inplace else torch.empty_like(tensor)
        self.comm.all_reduce(tensor, op=op, out=None if inplace else out)
        if not (self._capturing or torch.cuda.is_current_stream_capturing()):
            self._ran.add(self._key(tensor, inplace, op))
        return out

    def capture(self):
        """A context for capturing graphs (``with tp.capture(): with torch.cuda.graph(g):
        ...``): inside it, :meth:`should_use` takes only shapes that ran eagerly."""
        return _Capture(self)


class _Capture:
    def __init__(self, tp):
        self.tp = tp

    def __enter__(self):
        self.tp._capturing = True
        return self.tp

    def __exit__(self, *exc):
        self.tp._capturing = False
        return False
