"""``ringreduce.Communicator``: one rank of a job, every collective as a method.

The engine is the extension module's ``_native.Communicator`` (python/src/communicator.rs);
this class gives it Python's signatures, and sends a GPU rank's calls (and any call given
torch tensors) to :mod:`ringreduce.torch`, a host rank's to the engine's host-buffer methods.
"""

from collections import namedtuple

from . import _native
from ._errors import ArgumentError

#: One transfer of a grouped send/recv: ``count`` elements from rank ``src`` to rank ``dst``
#: (``src == dst`` is a local copy). Any ``(src, dst, count)`` triple works as well.
Transfer = namedtuple("Transfer", ["src", "dst", "count"])


def _is_tensor(obj):
    """True for a torch tensor, without importing torch (host-only jobs never load it)."""
    return type(obj).__module__.split(".")[0] == "torch" and hasattr(obj, "data_ptr")


def _dtype_name(dtype):
    """``dtype=`` as the engine takes it: a name (``"float32"``, ``"bf16"``, ...), from a
    string, a NumPy dtype or scalar type, or a torch dtype (``torch.float16``)."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    name = getattr(dtype, "name", None)  # numpy.dtype('float32').name
    if isinstance(name, str):
        return name
    name = getattr(dtype, "__name__", None)  # numpy.float32
    if isinstance(name, str):
        return name
    return str(dtype)  # torch.float16 -> "torch.float16"


def _op_name(op):
    """``op=`` as the engine takes it: a name, from a string or an enum member
    (``torch.distributed.ReduceOp.SUM``'s ``name``)."""
    name = op if isinstance(op, str) else getattr(op, "name", None)
    if not isinstance(name, str):
        raise ArgumentError(f"op={op!r}: one of 'sum', 'prod', 'min', 'max', 'avg'")
    return name


def _integer(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentError(f"{name}={value!r} is not an integer")
    return value


def _transfer(t):
    """A transfer as an ``(src, dst, count)`` triple of integers."""
    try:
        src, dst, count = t
    except (TypeError, ValueError):
        raise ArgumentError(f"transfer {t!r}: a Transfer or an (src, dst, count) triple") from None
    return (_integer("src", src), _integer("dst", dst), _integer("count", count))


def _device(device, local_allowed):
    """``device=`` as the engine takes it: ``None`` (host ranks), a GPU index, or ``"local"``
    (``from_env``: the GPU ``LOCAL_RANK`` names). Also ``"cuda:N"`` and ``torch.device``."""
    if device is None or (local_allowed and device == "local"):
        return device
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if isinstance(device, str):
        kind, _, text = device.partition(":")
        index = int(text) if text.isdigit() else (None if text == "" else text)
    else:  # torch.device("cuda", 1)
        kind, index = getattr(device, "type", None), getattr(device, "index", None)
    if kind == "cuda" and isinstance(index, int):
        return index
    if kind == "cuda" and index is None and local_allowed:
        return "local"
    choices = 'None (host ranks), a GPU index, "cuda:N"' + (' or "local"' if local_allowed else "")
    raise ArgumentError(f"device={device!r}: pass {choices}")


class Communicator:
    """One rank of a job whose ranks are processes (torchrun's model).

    ``Communicator(unique_id, rank, world)`` joins as a *host rank* (CPU memory, the same
    checked plans as the GPUs, shared memory between the processes);
    ``Communicator(unique_id, rank, world, device=N)`` as a *GPU rank* on GPU ``N``, whose
    calls take CUDA tensors. ``unique_id`` is a :class:`UniqueId` (or its text or bytes) made
    in rank 0's process. Joining waits, with the interpreter released, until every rank has
    joined (at most ``timeout`` seconds: then :class:`ringreduce.Timeout`).

    Keywords (every rank must pass the same): ``timeout`` (seconds a call or the rendezvous may
    take; 60), ``deterministic`` (fold reductions in rank order on every algorithm),
    ``allow_shared_device`` (GPU ranks: let several ranks share one GPU).

    Every rank must make the same calls in the same order — the same collective, count, type,
    operator, root, and in place or not (``out`` given or not) — or every rank gets
    :class:`ringreduce.Mismatch`. Host-rank calls block until complete, with the interpreter
    released (other threads run; don't touch a buffer a call is using). A call refused for its
    arguments (:class:`ringreduce.ArgumentError`) changes nothing; any other failure breaks the
    communicator (later calls raise :class:`ringreduce.CommunicatorFailed`).

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        unique_id,
        rank,
        world,
        device=None,
        *,
        timeout=60.0,
        deterministic=False,
        allow_shared_device=False,
    ):
        if isinstance(unique_id, str):
            unique_id = _native.UniqueId.from_str(unique_id)
        elif isinstance(unique_id, (bytes, bytearray)):
            unique_id = _native.UniqueId.from_bytes(bytes(unique_id))
        elif not isinstance(unique_id, _native.UniqueId):
            raise ArgumentError(
                f"unique_id: a ringreduce.UniqueId (or its str or bytes), got "
                f"{type(unique_id).__name__}"
            )
        _integer("rank", rank), _integer("world", world)
        self._native = _native.Communicator(
            unique_id,
            rank,
            world,
            _device(device, local_allowed=False),
            timeout=float(timeout),
            deterministic=bool(deterministic),
            allow_shared_device=bool(allow_shared_device),
        )

    @classmethod
    def from_env(cls, device=None, *, timeout=60.0, deterministic=False, allow_shared_device=False):
        """Joins with the rank, world and meeting place from the launcher's variables
        (torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
        ``MASTER_ADDR``, ``MASTER_PORT``; ringreduce meets at ``MASTER_PORT + 1``, or at
        ``RINGREDUCE_PORT``). ``device``: ``None`` for a host rank, a GPU index, or
        ``"local"`` for the GPU ``LOCAL_RANK`` names (GPU 0 where the process sees one GPU).
        A missing or malformed variable raises :class:`ringreduce.ArgumentError` naming it."""
        self = cls.__new__(cls)
        self._native = _native.Communicator.from_env(
            _device(device, local_allowed=True),
            timeout=float(timeout),
            deterministic=bool(deterministic),
            allow_shared_device=bool(allow_shared_device),
        )
        return self

    @property
    def rank(self):
        """This rank."""
        return self._native.rank

    @property
    def world(self):
        """The number of ranks."""
        return self._native.world

    @property
    def device(self):
        """This rank's GPU index, or ``None`` for a host rank."""
        return self._native.device

    @property
    def closed(self):
        """True once :meth:`close` was called."""
        return self._native.closed

    def all_reduce(self, x, op="sum", out=None, *, dtype=None, stream=None):
        """Every rank's result is the reduction (``op``: ``"sum"``, ``"prod"``, ``"min"``,
        ``"max"``, ``"avg"``) of every rank's ``x``: in ``x`` when ``out`` is ``None`` (or
        ``x``), else in ``out`` (as many elements as ``x``). Returns the result's buffer."""
        return self._call("all_reduce", 0, x, out, op, dtype, stream)

    def reduce_scatter(self, x, op="sum", out=None, *, dtype=None, stream=None):
        """Rank ``r`` gets block ``r`` of the reduction of every rank's ``x`` (``world`` blocks
        of ``count`` elements): in ``out`` (``count`` elements), or, when ``out`` is ``None``,
        in block ``r`` of ``x`` (the other blocks are left undefined). ``out`` being block
        ``r`` of ``x`` is in place too (NCCL's form). Returns ``out``, or ``x``."""
        return self._call("reduce_scatter", 0, x, out, op, dtype, stream)

    def all_gather(self, x, out=None, *, dtype=None, stream=None):
        """Every rank gets every rank's ``x`` (``count`` elements), rank ``j``'s in block ``j``
        of ``out`` (``world`` × ``count``). In place when ``out`` is ``None``: ``x`` is then
        the whole ``world`` × ``count`` buffer, holding this rank's input in block ``rank``
        (or ``x`` is that block of ``out``: NCCL's form). Returns ``out``, or ``x``."""
        return self._call("all_gather", 0, x, out, "sum", dtype, stream)

    def broadcast(self, x, root=0, out=None, *, dtype=None, stream=None):
        """Every rank gets rank ``root``'s ``x``: in ``x`` when ``out`` is ``None``, else in
        ``out`` (a non-root's ``x`` is not read, and may be ``None``). Returns ``out``, or
        ``x``."""
        return self._call("broadcast", root, x, out, "sum", dtype, stream)

    def reduce(self, x, root=0, op="sum", out=None, *, dtype=None, stream=None):
        """Rank ``root`` gets the reduction of every rank's ``x``: in its ``x`` when ``out`` is
        ``None``, else in its ``out``. Other ranks' buffers are not written, but they pass
        ``out`` exactly when the root does (any buffer: in place or not is part of the call
        every rank must agree on). Returns ``out``, or ``x``."""
        return self._call("reduce", root, x, out, op, dtype, stream)

    def all_to_all(self, x, out, *, dtype=None, stream=None):
        """Rank ``r``'s block ``j`` of ``out`` is rank ``j``'s block ``r`` of ``x`` (both
        ``world`` blocks of ``count`` elements; no in-place form). Returns ``out``."""
        if out is None:
            raise ArgumentError("all_to_all has no in-place form: pass out")
        return self._call("all_to_all", 0, x, out, "sum", dtype, stream)

    def send_recv(self, transfers, sends=(), recvs=(), *, dtype=None, stream=None):
        """Grouped point-to-point transfers, in one call so that an exchange where every rank
        both sends and receives cannot deadlock. Every rank passes the same ``transfers``
        (:class:`Transfer` or ``(src, dst, count)`` triples) and its own ends of them:
        ``sends``, one buffer per transfer it sends, and ``recvs``, one per transfer it
        receives, each in the order of ``transfers``. A rank with no buffer in the call passes
        ``dtype=`` (every rank's call names the same type). Returns ``recvs``."""
        transfers = [_transfer(t) for t in transfers]
        sends, recvs = list(sends), list(recvs)
        if self._native.device is not None or any(_is_tensor(b) for b in sends + recvs):
            from . import torch as _torch

            _torch.send_recv(self._native, transfers, sends, recvs, dtype, stream)
        else:
            _no_stream(stream)
            self._native.send_recv(transfers, sends, recvs, _dtype_name(dtype))
        return recvs

    def last_ran(self):
        """What this rank's latest call ran, as the library says: a dict with ``algorithm``,
        ``form`` and ``reach`` by name (e.g. ``"OneShot"``, ``"LlKernel"``, ``"Peers"``) and
        ``in_place``, ``copied``, ``registered``, ``captured`` as bools; ``None`` before the
        first call."""
        return self._native.last_ran()

    def synchronize(self):
        """Waits for every call this rank has enqueued on a stream (a host rank's calls have
        completed when they return)."""
        self._native.synchronize()

    def close(self):
        """Leaves the job: later calls raise :class:`ringreduce.Closed`. Idempotent. A GPU
        rank waits for its peers' teardown (at most the timeout)."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return repr(self._native)

    def _call(self, name, root, x, out, op, dtype, stream):
        root, op = _integer("root", root), _op_name(op)
        if self._native.device is not None or _is_tensor(x) or _is_tensor(out):
            from . import torch as _torch

            _torch.collective(self._native, name, root, x, out, op, dtype, stream)
        else:
            _no_stream(stream)
            self._native.collective(name, root, x, out, op, _dtype_name(dtype))
        return x if out is None else out


def _no_stream(stream):
    if stream is not None:
        raise ArgumentError(
            "stream= orders a GPU rank's call on a CUDA stream: host buffers take none"
        )
