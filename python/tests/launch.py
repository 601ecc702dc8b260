"""A launcher for the tests' jobs: starts ``world`` processes of ``ranks.py SCENARIO`` with the
variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_RUN_ID``, and ``RINGREDUCE_PORT`` on a free
port), and collects what each rank printed and how it exited. A job that outlives its deadline
is killed, every rank of it.
"""

import os
import socket
import subprocess
import sys
import time

RANKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ranks.py")
_jobs = 0


def free_port():
    """A free TCP port on 127.0.0.1 (bound, then released for rank 0 to take)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """The processes of one job, by rank."""

    def __init__(self, scenario, world, args=(), start=None, extra_env=None):
        global _jobs
        _jobs += 1
        port = free_port()
        self.scenario, self.world = scenario, world
        self.env = dict(
            os.environ,
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port - 1),
            RINGREDUCE_PORT=str(port),
            TORCHELASTIC_RUN_ID=f"{scenario}-{os.getpid()}-{_jobs}",
            PYTHONUNBUFFERED="1",
        )
        self.env.update(extra_env or {})
        self.args = [str(a) for a in args]
        self.procs = {}
        for rank in range(world) if start is None else start:
            self.start(rank)

    def start(self, rank, **env):
        """Starts rank ``rank`` (with ``env`` added to the job's variables)."""
        self.procs[rank] = subprocess.Popen(
            [sys.executable, RANKS, self.scenario, *self.args],
            env=dict(self.env, RANK=str(rank), LOCAL_RANK=str(rank), **env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return self.procs[rank]

    def kill(self, rank):
        """SIGKILLs rank ``rank`` and reaps it."""
        self.procs[rank].kill()
        self.procs[rank].communicate()
        del self.procs[rank]

    def finish(self, within):
        """Waits for every rank (at most ``within`` seconds; then kills the job): by rank,
        ``(exit status, stdout, stderr)``, the status ``None`` for a rank that was killed."""
        deadline = time.monotonic() + within
        results = {}
        for rank, proc in sorted(self.procs.items()):
            try:
                out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
                results[rank] = (proc.returncode, out, err)
            except subprocess.TimeoutExpired:
                for other in self.procs.values():
                    other.kill()
                out, err = proc.communicate()
                results[rank] = (None, out, err + f"\n(killed after {within} s)")
        return results


def report(results):
    """Every rank's status and output, for a failed test's message."""
    return "\n".join(
        f"--- rank {rank}: exit {status}\n{out}{err}"
        for rank, (status, out, err) in sorted(results.items())
    )
