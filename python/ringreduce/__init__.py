"""ringreduce from Python: collectives across the processes of one host.

One process per rank, as torchrun runs jobs. Each process joins the job with a
:class:`Communicator`, then every rank makes the same calls in the same order::

    import array, ringreduce

    comm = ringreduce.Communicator.from_env()      # host ranks, from torchrun's variables
    grads = array.array("f", [comm.rank + 1.0] * 1024)
    comm.all_reduce(grads)                         # in place: every rank holds the sum
    comm.close()

``import ringreduce`` needs neither torch nor NumPy nor a GPU.

Where ranks run
---------------
- **Host ranks** (``device=None``, the default): the same checked plans as the GPUs, run on
  CPU threads with shared memory between the processes. Calls take any object that exports
  its memory through the buffer protocol — NumPy arrays, ``array.array``, ``bytearray``,
  ``memoryview`` — C-contiguous, and writable where the call writes it. They block until
  the call is complete on this rank, with the interpreter released.
- **GPU ranks** (``device=N``): calls take CUDA tensors of GPU ``N`` and are enqueued on
  ``torch.cuda.current_stream()`` (or ``stream=``) with no host synchronisation; see
  :mod:`ringreduce.torch` (its GPU side not yet run on a GPU).

Meeting
-------
- ``UniqueId()``: made in rank 0's process (it binds the port rank 0 listens on); handed to the
  other ranks as ``str(id)`` (back with ``UniqueId.from_str``), ``bytes(id)``
  (``UniqueId.from_bytes``) or pickled.
- ``Communicator(unique_id, rank, world, device=None, *, timeout=60.0, deterministic=False,
  allow_shared_device=False)``; or ``Communicator.from_env(device=None, ...)`` with torchrun's
  variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
  ``MASTER_PORT``; ringreduce meets at ``MASTER_PORT + 1`` or ``RINGREDUCE_PORT``).
- Properties ``rank``, ``world``, ``device``, ``closed``; ``close()``, or ``with``.

Collectives (NCCL's semantics; ``op`` is ``"sum"``, ``"prod"``, ``"min"``, ``"max"`` or ``"avg"``)
-------------------------------------------------------------------------------------------------
===========================================  ===========================================
call                                         result
===========================================  ===========================================
``all_reduce(x, op="sum", out=None)``        every rank: the reduction of every ``x``
``reduce_scatter(x, op="sum", out=None)``    rank r: block r of the reduction (x has
                                             world blocks)
``all_gather(x, out=None)``                  every rank: every rank's x, rank j's in
                                             block j
``broadcast(x, root=0, out=None)``           every rank: the root's x
``reduce(x, root=0, op="sum", out=None)``    the root: the reduction of every x
``all_to_all(x, out)``                       rank r's block j: rank j's block r
``send_recv(transfers, sends, recvs)``       grouped point-to-point transfers
===========================================  ===========================================

``out=None`` (or ``out`` the same memory as ``x``) runs in place on ``x``; every rank must
choose alike. Each call returns the buffer that holds its result. ``dtype=`` names the
element type where the buffer's format cannot: bfloat16 and fp8 have no buffer format, so a
``uint16`` (or ``array('H')``) buffer of bfloat16 bits goes with ``dtype="bfloat16"``, and
``float16`` from ``array('H')`` with ``dtype="float16"``. Types: float16, bfloat16, float32,
float64, int8, uint8, int32, uint32, int64, uint64, float8_e4m3fn, float8_e5m2.

Errors
------
Every failure raises a subclass of :class:`Error` (see :mod:`ringreduce._errors`):
:class:`ArgumentError` (bad arguments; nothing ran), :class:`Timeout`, :class:`PeerLost`
(``rank`` names the lost peer), :class:`Mismatch` (ranks made different calls),
:class:`CommunicatorFailed`, :class:`Closed`, :class:`NoGpu`, :class:`CudaError`,
:class:`InternalError`.
"""

from . import _errors, _native
from ._communicator import Communicator, Transfer
from ._errors import (
    ArgumentError,
    Closed,
    CommunicatorFailed,
    CudaError,
    Error,
    InternalError,
    Mismatch,
    NoGpu,
    PeerLost,
    Timeout,
)

UniqueId = _native.UniqueId
__version__ = _native.__version__

__all__ = ["Communicator", "UniqueId", "Transfer", *_errors.__all__]
