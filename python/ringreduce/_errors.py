"""ringreduce's exceptions: one base, :class:`Error`, and a subclass per cause.

Every failure of a ringreduce call raises one of these (never aborts the interpreter). Each
carries the core's message (which names the rank, the call and what was expected) and two
attributes:

- ``kind``: the core's name for the cause (``"RankFailed"``, ``"CallMismatch"``,
  ``"InvalidArgument"``, ... — docs/ERRORS.md lists every one);
- ``rank``: the rank the error names (the one that failed, whose call differs, that timed out),
  or ``None``.

=====================  ====================================================================
class                  raised when
=====================  ====================================================================
ArgumentError          a call's arguments are refused before anything runs: a buffer of no
                       ringreduce type, not C-contiguous, read-only where it is written,
                       of the wrong length; an unknown operator; a rank outside the world.
                       Also a ``ValueError``. The communicator stays usable.
Timeout                a rank did not make progress before the deadline (``timeout=``), or
                       ranks never arrived at the rendezvous (``missing`` lists them).
                       Also a ``TimeoutError``.
PeerLost               a peer's process died or its call failed: ``rank`` names it.
Mismatch               the ranks disagree: different calls (collective, count, type,
                       operator, root, in place or not), or at the rendezvous a different
                       world size, configuration or a rank claimed twice.
CommunicatorFailed     a call on a communicator an earlier failure broke (its
                       ``__cause__`` is that failure): make a new one with a new id.
Closed                 a call after ``close()``.
NoGpu                  a GPU rank was asked for where no GPU or driver is.
CudaError              a CUDA call failed (the driver's message included).
InternalError          a bug in ringreduce (please report it with the message).
Error                  anything else (out of host resources, no peer access between two
                       GPUs, a call that cannot be captured into a CUDA graph, ...).
=====================  ====================================================================

After any error but ``ArgumentError`` (and ``Closed``), the communicator is broken: later
calls raise ``CommunicatorFailed`` at once.
"""


class Error(Exception):
    """Base class of every ringreduce error."""

    #: The core's name for the cause (``"RankFailed"``, ``"InvalidArgument"``, ...).
    kind = "Error"
    #: The rank the error names, or ``None``.
    rank = None


class ArgumentError(Error, ValueError):
    """A call's arguments were refused before anything ran; the communicator stays usable."""


class Timeout(Error, TimeoutError):
    """A rank made no progress before the deadline, or ranks never joined the rendezvous."""

    #: For a rendezvous that timed out: the ranks that never arrived.
    missing = None


class PeerLost(Error):
    """A peer's process died, or its call failed; ``rank`` names it."""


class Mismatch(Error):
    """The ranks disagree: their calls differ, or their world size or configuration did."""


class CommunicatorFailed(Error):
    """An earlier failure (the ``__cause__``) broke this communicator: make a new one."""


class Closed(Error):
    """The communicator was closed."""


class NoGpu(Error):
    """No GPU or CUDA driver for a GPU rank."""


class CudaError(Error):
    """A CUDA call failed."""


class InternalError(Error):
    """A bug in ringreduce: please report it with its message."""


__all__ = [
    "Error",
    "ArgumentError",
    "Timeout",
    "PeerLost",
    "Mismatch",
    "CommunicatorFailed",
    "Closed",
    "NoGpu",
    "CudaError",
    "InternalError",
]
