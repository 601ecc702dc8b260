"""One rank of a test job: ``python ranks.py SCENARIO [ARG]``, started by ``launch.py`` with
torchrun's variables (``RANK``, ``WORLD_SIZE``, ...). Exits 0 when every check of the scenario
held on this rank; otherwise prints what failed (rank, call, index, got, want) and exits 1.
"""

import os
import sys
import threading
import time
import traceback

import ringreduce
from reference import OPS, TYPES, ArrayBackend, NumpyBackend

COUNT = 5  # elements per block: odd, so a block boundary off by one shows
TIMEOUT = 30.0


class Checker:
    """Compares buffers with expected values, bit for bit, and counts the checks."""

    def __init__(self, backend, rank):
        self.backend, self.rank, self.checks = backend, rank, 0

    def expect(self, what, t, buf, want_values):
        got = self.backend.codes(buf)
        want = [t.code(v) for v in want_values]
        wrong = [
            (i, t.value(g), t.value(w))
            for i, (g, w) in enumerate(zip(got, want))
            if t.key(g) != t.key(w)
        ]
        if len(got) != len(want) or wrong:
            raise AssertionError(
                f"rank {self.rank}: {what} on {t}: {len(wrong)} wrong of {len(want)}; first "
                f"(index, got, want): {wrong[:4]}"
            )
        self.checks += 1


def every_collective(comm, backend):
    """Every collective, in place and out of place, on every type, against exact values."""
    rank, world, c = comm.rank, comm.world, COUNT
    check = Checker(backend, rank)
    for t in TYPES:
        make = lambda values: backend.make(t, values)  # noqa: E731
        dtype = backend.dtype(t)
        gen = lambda r, n, base=0: [t.input(r, base + i) for i in range(n)]  # noqa: E731
        reduced = lambda op, n: [  # noqa: E731
            t.reduce(op, [t.input(r, i) for r in range(world)], world) for i in range(n)
        ]

        # All-reduce, in place, every operator; out of place, leaving x as it was.
        for op in OPS:
            x = make(gen(rank, c))
            assert comm.all_reduce(x, op, dtype=dtype) is x
            check.expect(f"all_reduce({op}) in place", t, x, reduced(op, c))
        for op in ("sum", "avg"):
            x, out = make(gen(rank, 3 * c)), make([0] * (3 * c))
            assert comm.all_reduce(x, op, out=out, dtype=dtype) is out
            check.expect(f"all_reduce({op}) out", t, out, reduced(op, 3 * c))
            check.expect(f"all_reduce({op}) out: x untouched", t, x, gen(rank, 3 * c))

        # Reduce-scatter: block `rank` of the reduction; in place, in out, and NCCL's form
        # (out is block `rank` of x).
        block = slice(rank * c, (rank + 1) * c)
        for op in ("sum", "max"):
            want = reduced(op, world * c)[block]
            x, out = make(gen(rank, world * c)), make([0] * c)
            comm.reduce_scatter(x, op, out=out, dtype=dtype)
            check.expect(f"reduce_scatter({op}) out", t, out, want)
            x = make(gen(rank, world * c))
            comm.reduce_scatter(x, op, dtype=dtype)
            check.expect(f"reduce_scatter({op}) in place", t, x[block], want)
        x = make(gen(rank, world * c))
        comm.reduce_scatter(x, "sum", out=memoryview(x)[block], dtype=dtype)
        check.expect(
            "reduce_scatter in place, NCCL's form", t, x[block], reduced("sum", world * c)[block]
        )

        # All-gather: rank j's block in block j; out of place, in place, NCCL's form.
        gathered = [v for j in range(world) for v in gen(j, c)]
        x, out = make(gen(rank, c)), make([0] * (world * c))
        comm.all_gather(x, out=out, dtype=dtype)
        check.expect("all_gather out", t, out, gathered)
        x = make([0] * (rank * c) + gen(rank, c) + [0] * ((world - rank - 1) * c))
        comm.all_gather(x, dtype=dtype)
        check.expect("all_gather in place", t, x, gathered)
        out = make([0] * (world * c))
        out[block] = make(gen(rank, c))
        comm.all_gather(memoryview(out)[block], out=out, dtype=dtype)
        check.expect("all_gather in place, NCCL's form", t, out, gathered)

        # Broadcast from the last rank: in place; out of place, a non-root passing no x or one
        # that is not read.
        root = world - 1
        x = make(gen(rank, c))
        comm.broadcast(x, root, dtype=dtype)
        check.expect("broadcast in place", t, x, gen(root, c))
        x = make(gen(rank, c)) if rank == root else None
        out = make([0] * c)
        comm.broadcast(x, root, out=out, dtype=dtype)
        check.expect("broadcast out", t, out, gen(root, c))
        x, out = make(gen(rank, c)), make([0] * c)
        comm.broadcast(x, root, out=out, dtype=dtype)  # a non-root's x is not read
        check.expect("broadcast out, every rank passing x", t, out, gen(root, c))
        check.expect("broadcast out: x untouched", t, x, gen(rank, c))

        # Reduce to rank 0: the root gets the reduction, the others' buffers stay as they were.
        for op in ("sum", "min"):
            x = make(gen(rank, c))
            comm.reduce(x, 0, op, dtype=dtype)
            check.expect(
                f"reduce({op}) in place", t, x, reduced(op, c) if rank == 0 else gen(rank, c)
            )
        sentinel = [t.input(world, i) for i in range(c)]
        x, out = make(gen(rank, c)), make(sentinel)
        comm.reduce(x, 0, "prod", out=out, dtype=dtype)
        check.expect("reduce(prod) out", t, out, reduced("prod", c) if rank == 0 else sentinel)
        check.expect("reduce(prod) out: x untouched", t, x, gen(rank, c))

        # All-to-all: block j of rank r's out is block r of rank j's x.
        x, out = make(gen(rank, world * c)), make([0] * (world * c))
        comm.all_to_all(x, out, dtype=dtype)
        check.expect("all_to_all", t, out, [v for j in range(world) for v in gen(j, c, rank * c)])

        # Send/recv: a ring of transfers of different counts and a local copy on rank 0; then
        # one transfer that the other ranks (beyond 0 and 1) take no part in.
        transfers = [ringreduce.Transfer(r, (r + 1) % world, c + r) for r in range(world)]
        transfers.append((0, 0, 2))
        data = lambda k: gen(transfers[k][0], transfers[k][2], 100 * k)  # noqa: E731
        sends = [make(data(k)) for k, tr in enumerate(transfers) if tr[0] == rank]
        recvs = [make([0] * tr[2]) for tr in transfers if tr[1] == rank]
        assert comm.send_recv(transfers, sends, recvs, dtype=dtype) == recvs
        mine = [k for k, tr in enumerate(transfers) if tr[1] == rank]
        for k, buf in zip(mine, recvs):
            check.expect(f"send_recv transfer {k}", t, buf, data(k))
        sends = [make(gen(0, 3))] if rank == 0 else []
        recvs = [make([0] * 3)] if rank == 1 else []
        comm.send_recv([(0, 1, 3)], sends, recvs, dtype=t.dtype_arg or t.name)
        if rank == 1:
            check.expect("send_recv, a rank apart", t, recvs[0], gen(0, 3))
    return check.checks


def scenario_every_collective(backend_name):
    backend = ArrayBackend()
    if backend_name == "numpy":
        import numpy

        backend = NumpyBackend(numpy)
    with ringreduce.Communicator.from_env(timeout=TIMEOUT) as comm:
        # An argument refused on every rank changes nothing: the job goes on.
        try:
            comm.all_reduce(bytearray(4), dtype="int16")
        except ringreduce.ArgumentError:
            pass
        else:
            raise AssertionError("dtype='int16' was accepted")
        checks = every_collective(comm, backend)
    print(f"rank {comm.rank}: {checks} checks on {backend.name} buffers")


def scenario_explicit_id():
    """Rank 0 makes the id and prints it; the launcher hands it to the others."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank == 0:
        uid = ringreduce.UniqueId()
        print(f"id {uid}", flush=True)
    else:
        uid = os.environ["RR_TEST_ID"]
    with ringreduce.Communicator(uid, rank, world, timeout=TIMEOUT) as comm:
        import array

        x = array.array("i", [rank + 1] * 4)
        comm.all_reduce(x)
        assert list(x) == [world * (world + 1) // 2] * 4, list(x)


def scenario_mismatch(what):
    """The second call differs on rank 1 (its count, its type, or in place or not): every
    rank gets Mismatch naming a rank whose call differs, and the communicator is broken."""
    import array

    comm = ringreduce.Communicator.from_env(timeout=TIMEOUT)
    x = array.array("f", [1.0] * 8)
    comm.all_reduce(x)
    assert list(x) == [float(comm.world)] * 8, list(x)
    odd = comm.rank == 1
    x = array.array("f", [1.0] * 8)
    if what == "count":
        call = lambda: comm.all_reduce(array.array("f", [1.0] * (9 if odd else 8)))  # noqa: E731
    elif what == "dtype":
        call = lambda: comm.all_reduce(array.array("i" if odd else "f", [1] * 8))  # noqa: E731
    else:
        call = lambda: comm.all_reduce(
            x, out=array.array("f", [0.0] * 8) if odd else None
        )  # noqa: E731
    started = time.monotonic()
    try:
        call()
    except ringreduce.Mismatch as err:
        assert err.kind == "CallMismatch", err.kind
        assert err.rank == (0 if odd else 1), (err.rank, str(err))
        assert "all-reduce" in str(err), str(err)
    else:
        raise AssertionError("a mismatched call succeeded")
    assert time.monotonic() - started < 10, "the mismatch took the timeout to show"
    try:
        comm.all_reduce(x)
    except ringreduce.CommunicatorFailed as err:
        assert isinstance(err.__cause__, ringreduce.Mismatch), repr(err.__cause__)
    else:
        raise AssertionError("a broken communicator ran a call")
    comm.close()


def scenario_killed_peer(victim):
    """Rank `victim` joins, says "ready" and waits to be killed; the others call and must get
    PeerLost naming it, well before the timeout."""
    import array

    victim = int(victim)
    comm = ringreduce.Communicator.from_env(timeout=TIMEOUT)
    if comm.rank == victim:
        print("ready", flush=True)
        time.sleep(TIMEOUT * 2)
        raise AssertionError("the victim was not killed")
    print("calling", flush=True)
    started = time.monotonic()
    try:
        comm.all_reduce(array.array("f", [1.0] * 4096))
    except ringreduce.PeerLost as err:
        took = time.monotonic() - started
        assert err.rank == victim, (err.rank, str(err))
        assert err.kind == "RankFailed", err.kind
        assert took < 10, f"named after {took:.1f} s"
    else:
        raise AssertionError("a call with a dead peer succeeded")
    try:
        comm.all_reduce(array.array("f", [1.0] * 4))
    except ringreduce.CommunicatorFailed as err:
        assert isinstance(err.__cause__, ringreduce.PeerLost), repr(err.__cause__)
    else:
        raise AssertionError("a broken communicator ran a call")


def scenario_threads_run():
    """While rank 0 waits in a call (rank 1 comes a second late), another thread of rank 0's
    runs: the call released the interpreter."""
    import array

    comm = ringreduce.Communicator.from_env(timeout=TIMEOUT)
    if comm.rank != 0:
        time.sleep(1.0)
        comm.all_reduce(array.array("f", [1.0] * 16))
        return
    ticks, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.005)

    counter = threading.Thread(target=count)
    counter.start()
    time.sleep(0.05)
    before = ticks[0]
    started = time.monotonic()
    comm.all_reduce(array.array("f", [1.0] * 16))
    waited, during = time.monotonic() - started, ticks[0] - before
    stop.set()
    counter.join()
    assert waited > 0.5, f"the call did not wait ({waited:.2f} s): the test proves nothing"
    assert during > 20, f"the other thread ticked {during} times in {waited:.2f} s"
    comm.close()


SCENARIOS = {
    "every_collective": scenario_every_collective,
    "explicit_id": scenario_explicit_id,
    "mismatch": scenario_mismatch,
    "killed_peer": scenario_killed_peer,
    "threads_run": scenario_threads_run,
}

if __name__ == "__main__":
    try:
        SCENARIOS[sys.argv[1]](*sys.argv[2:])
    except BaseException:  # noqa: B902 - every failure is this rank's report
        print(f"rank {os.environ.get('RANK')}: FAILED", flush=True)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
