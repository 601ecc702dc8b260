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
        # What ran, as the library says: host ranks run the two-shot on their threads; GPU
        # ranks one of the GPU forms.
        ran = comm.last_ran()
        assert ran["in_place"] and not ran["captured"], ran
        if comm.device is None:
            assert (ran["algorithm"], ran["form"]) == ("TwoShot", "HostThreads"), ran
        else:
            assert ran["form"] != "HostThreads", ran
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


def scenario_torch(part):
    """Real torch, on host ranks and CPU tensors: ``collectives`` (every collective method and
    custom op on every dtype, exact), ``compile`` (a ``torch.compile``d function around the
    custom ops, ``fullgraph=True``), ``ddp`` (a DDP model whose gradients average through
    ``ringreduce.torch.allreduce_hook``)."""
    import torch

    import ringreduce.torch as rt

    comm = ringreduce.Communicator.from_env(timeout=TIMEOUT)
    rank, world = comm.rank, comm.world
    unsigned = {torch.uint8} | {
        getattr(torch, n) for n in ("uint32", "uint64") if hasattr(torch, n)
    }

    def values(r, n, dtype):
        k = torch.arange(n, dtype=torch.float64)
        return (k * 3 + r * 5) % 7 - (0 if dtype in unsigned else 3)

    def make(r, n, dtype):
        return values(r, n, dtype).to(torch.float32).to(dtype)

    def same(what, got, want):
        got = got.to(torch.float32).to(torch.float64)
        if not torch.equal(got, want):
            raise AssertionError(f"rank {rank}: {what}: got {got.tolist()}, want {want.tolist()}")

    n = 2 * COUNT * world
    if part == "collectives":
        for dtype in rt.DTYPES:
            what = f"{dtype}"
            total = sum(values(r, n, dtype) for r in range(world))
            x = make(rank, n, dtype)
            comm.all_reduce(x)
            same(f"all_reduce {what}", x, total)
            x = make(rank, n, dtype)
            out = rt.all_reduce(comm, x)  # the custom op: a new tensor, x kept
            same(f"op all_reduce {what}", out, total)
            same(f"op all_reduce input {what}", x, values(rank, n, dtype))
            rt.all_reduce_(comm, x)
            same(f"op all_reduce_ {what}", x, total)
            x = make(rank, n, dtype)
            block = n // world
            same(
                f"op reduce_scatter {what}",
                rt.reduce_scatter(comm, x),
                total[rank * block : (rank + 1) * block],
            )
            gathered = torch.cat([values(r, n, dtype) for r in range(world)])
            same(f"op all_gather {what}", rt.all_gather(comm, x), gathered)
            out = torch.empty(world * n, dtype=dtype)
            comm.all_gather(x, out=out)
            same(f"all_gather {what}", out, gathered)
            recv = torch.zeros(n, dtype=dtype)
            ring = [(r, (r + 1) % world, n) for r in range(world)]
            comm.send_recv(ring, sends=[x], recvs=[recv])
            same(f"send_recv {what}", recv, values((rank - 1) % world, n, dtype))
        for bad, why in (
            (torch.ones(4, 2).t(), "not contiguous"),
            (torch.ones(4, dtype=torch.complex64), "no ringreduce type"),
        ):
            try:
                comm.all_reduce(bad)
            except ringreduce.ArgumentError as err:
                assert why in str(err), err
            else:
                raise AssertionError(f"rank {rank}: a tensor {why} was accepted")
        print(f"rank {rank}: torch collectives exact on {len(rt.DTYPES)} dtypes")
    elif part == "compile":
        assert rt.CUSTOM_OPS, "this torch has torch.library.custom_op"
        handle = rt.handle(comm)

        def step(x):
            y = torch.ops.ringreduce.all_reduce(x * 2, handle, "sum")
            z = torch.ops.ringreduce.all_gather(y + 1, handle)
            return torch.ops.ringreduce.reduce_scatter(z, handle, "max") - 1

        # torch's own check of each op: schema, fake implementation against the real one,
        # autograd registration (each rank runs the same calls in the same order).
        x = make(rank, n, torch.float32)
        for op, args in (
            (torch.ops.ringreduce.all_reduce.default, (x, handle, "sum")),
            (torch.ops.ringreduce.all_reduce_.default, (x.clone(), handle, "max")),
            (torch.ops.ringreduce.all_gather.default, (x, handle)),
            (torch.ops.ringreduce.reduce_scatter.default, (x, handle, "sum")),
        ):
            torch.library.opcheck(op, args)
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        for rep in range(3):
            x = make(rank, n, torch.float32) + rep
            y = sum(values(r, n, torch.float32) + rep for r in range(world)) * 2
            # Every rank gathers the same y + 1; the max of world equal copies is that copy.
            block = world * n // world
            want = torch.cat([y + 1] * world)[rank * block : (rank + 1) * block] - 1
            same(f"compiled, call {rep}", compiled(x), want)
        print(f"rank {rank}: torch.compile ran the custom ops")
    elif part == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", rank=rank, world_size=world)
        model = torch.nn.Linear(4, 1, bias=False)
        with torch.no_grad():
            model.weight.fill_(1.0)
        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(comm, rt.allreduce_hook)
        for _ in range(2):
            model.zero_grad()
            ddp(torch.full((2, 4), float(rank + 1))).sum().backward()
            # d(sum of x·w)/dw = the column sums of x: 2·(rank + 1); averaged: world + 1.
            same("DDP gradient", model.weight.grad.flatten(), torch.full((4,), world + 1.0))
        dist.destroy_process_group()
        print(f"rank {rank}: DDP averaged its gradients through the hook")
    try:
        rt.TensorParallel(comm)
    except ringreduce.ArgumentError:
        pass
    else:
        raise AssertionError("TensorParallel took a host rank")
    comm.close()


SCENARIOS = {
    "every_collective": scenario_every_collective,
    "explicit_id": scenario_explicit_id,
    "mismatch": scenario_mismatch,
    "killed_peer": scenario_killed_peer,
    "threads_run": scenario_threads_run,
    "torch": scenario_torch,
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
