"""The package in one process: importing it without NumPy, torch or a GPU; UniqueId; the
exceptions; every argument a call refuses, on a communicator of one host rank (which stays
usable after each refusal); the rendezvous' own errors; GPU ranks where there is no GPU.
"""

import array
import os
import pickle
import subprocess
import sys
import time
import unittest

import ringreduce

try:
    import numpy
except ImportError:
    numpy = None

HERE = os.path.dirname(os.path.abspath(__file__))


def python(code, **env):
    """Runs ``code`` in a fresh interpreter with this one's path: (exit status, output)."""
    ran = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return ran.returncode, ran.stdout + ran.stderr


class Import(unittest.TestCase):
    def test_the_package_under_test_is_the_one_built(self):
        expected = os.environ.get("RINGREDUCE_PYTHON_PACKAGE")
        if expected is None:
            self.skipTest("RINGREDUCE_PYTHON_PACKAGE is not set (tests/python.rs sets it)")
        self.assertTrue(ringreduce.__file__.startswith(expected), ringreduce.__file__)

    def test_imports_and_runs_without_numpy_torch_or_a_gpu(self):
        # numpy and torch made unimportable, whatever this machine has.
        status, output = python(
            "import sys\n"
            "sys.modules['numpy'] = None; sys.modules['torch'] = None\n"
            "import array, ringreduce\n"
            "with ringreduce.Communicator(ringreduce.UniqueId(), 0, 1) as comm:\n"
            "    x = array.array('f', [1.0, 2.0])\n"
            "    comm.all_reduce(x, 'avg')\n"
            "assert list(x) == [1.0, 2.0], x\n"
            "print('ran')\n"
        )
        self.assertEqual((status, output.strip()), (0, "ran"), output)

    def test_the_torch_layer_says_it_needs_torch(self):
        status, output = python(
            "import sys\nsys.modules['torch'] = None\nimport ringreduce.torch\n"
        )
        self.assertNotEqual(status, 0)
        self.assertIn("ringreduce.torch needs PyTorch", output)

    def test_exceptions_form_one_family(self):
        for name in (
            "ArgumentError",
            "Timeout",
            "PeerLost",
            "Mismatch",
            "CommunicatorFailed",
            "Closed",
            "NoGpu",
            "CudaError",
            "InternalError",
        ):
            self.assertTrue(issubclass(getattr(ringreduce, name), ringreduce.Error), name)
        self.assertTrue(issubclass(ringreduce.ArgumentError, ValueError))
        self.assertTrue(issubclass(ringreduce.Timeout, TimeoutError))
        self.assertTrue(issubclass(ringreduce.Error, Exception))


class UniqueIds(unittest.TestCase):
    def test_text_bytes_and_pickle_carry_the_same_id(self):
        uid = ringreduce.UniqueId()
        text = str(uid)
        self.assertTrue(text.startswith("rr1-"), text)
        self.assertEqual(ringreduce.UniqueId.from_str(text), uid)
        self.assertEqual(len(bytes(uid)), 128)
        self.assertEqual(ringreduce.UniqueId.from_bytes(bytes(uid)), uid)
        self.assertEqual(pickle.loads(pickle.dumps(uid)), uid)
        self.assertEqual(hash(ringreduce.UniqueId.from_str(text)), hash(uid))
        self.assertEqual(eval(repr(uid), {"UniqueId": ringreduce.UniqueId}), uid)
        self.assertTrue(uid.address.startswith("127.0.0.1:"), uid.address)
        self.assertNotEqual(ringreduce.UniqueId(), uid)

    def test_anything_else_is_an_argument_error(self):
        text = str(ringreduce.UniqueId())
        for bad in ("", "rr1-", text[:-2], text.replace("rr1-", "rr2-"), text[:-1] + "g"):
            with self.subTest(text=bad), self.assertRaises(ringreduce.ArgumentError):
                ringreduce.UniqueId.from_str(bad)
        for bad in (b"", bytes(128), bytes(ringreduce.UniqueId())[:64]):
            with self.subTest(data=bad[:8]), self.assertRaises(ringreduce.ArgumentError):
                ringreduce.UniqueId.from_bytes(bad)
        with self.assertRaises(ringreduce.Error):
            ringreduce.UniqueId("not an address")


class Joining(unittest.TestCase):
    def test_a_bad_rank_world_or_option_is_an_argument_error(self):
        uid = ringreduce.UniqueId()
        for args, kwargs in (
            ((uid, 2, 2), {}),
            ((uid, 0, 0), {}),
            ((uid, -1, 2), {}),
            ((uid, 0, -2), {}),
            ((uid, "0", 2), {}),
            ((uid, True, 2), {}),
            ((uid, 0, 1), {"timeout": -1.0}),
            ((uid, 0, 1), {"timeout": float("nan")}),
            ((uid, 0, 1, True), {}),
            ((uid, 0, 1, "cuda:x"), {}),
            ((uid, 0, 1, -1), {}),
            ((42, 0, 1), {}),
            (("rr1-nonsense", 0, 1), {}),
        ):
            with self.subTest(args=args[1:], kwargs=kwargs):
                started = time.monotonic()
                with self.assertRaises(ringreduce.ArgumentError) as caught:
                    ringreduce.Communicator(*args, **kwargs)
                self.assertLess(time.monotonic() - started, 2, caught.exception)
                self.assertIsInstance(caught.exception.kind, str)

    def test_ranks_that_never_arrive_time_out_by_name(self):
        started = time.monotonic()
        with self.assertRaises(ringreduce.Timeout) as caught:
            ringreduce.Communicator(ringreduce.UniqueId(), 0, 3, timeout=0.5)
        self.assertLess(time.monotonic() - started, 5)
        err = caught.exception
        self.assertEqual((err.kind, err.missing, err.rank), ("RanksMissing", [1, 2], 1), str(err))

    def test_from_env_names_what_is_missing_or_wrong(self):
        saved = dict(os.environ)
        try:
            for name in (
                "RANK",
                "WORLD_SIZE",
                "LOCAL_RANK",
                "LOCAL_WORLD_SIZE",
                "MASTER_ADDR",
                "MASTER_PORT",
            ):
                os.environ.pop(name, None)
            with self.assertRaisesRegex(ringreduce.ArgumentError, "RANK is not set"):
                ringreduce.Communicator.from_env()
            os.environ.update(
                RANK="3",
                WORLD_SIZE="2",
                LOCAL_RANK="0",
                LOCAL_WORLD_SIZE="1",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT="29400",
            )
            with self.assertRaisesRegex(ringreduce.ArgumentError, "RANK=3 of WORLD_SIZE=2"):
                ringreduce.Communicator.from_env()
            with self.assertRaises(ringreduce.ArgumentError):
                ringreduce.Communicator.from_env(device="gpu0")
            # One rank joins alone, from the variables.
            port = _free_port()
            os.environ.update(
                RANK="0", WORLD_SIZE="1", MASTER_PORT=str(port - 1), RINGREDUCE_PORT=str(port)
            )
            with ringreduce.Communicator.from_env() as comm:
                self.assertEqual((comm.rank, comm.world, comm.device), (0, 1, None))
        finally:
            os.environ.clear()
            os.environ.update(saved)


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OneRank(unittest.TestCase):
    """Refusals on one host rank; after each, the communicator still runs a call."""

    def setUp(self):
        self.comm = ringreduce.Communicator(ringreduce.UniqueId(), 0, 1, timeout=10)

    def tearDown(self):
        x = array.array("i", [1, 2, 3])
        self.comm.all_reduce(x)  # still usable
        self.assertEqual(list(x), [1, 2, 3])
        self.comm.close()

    def refused(self, call, *args, match=None, **kwargs):
        with self.assertRaises(ringreduce.ArgumentError) as caught:
            call(*args, **kwargs)
        if match:
            self.assertIn(match, str(caught.exception))
        return caught.exception

    def test_properties_and_repr(self):
        self.assertEqual((self.comm.rank, self.comm.world, self.comm.device), (0, 1, None))
        self.assertFalse(self.comm.closed)
        self.assertEqual(repr(self.comm), "Communicator(rank=0, world=1, device=None)")

    def test_buffers_of_no_ringreduce_type(self):
        self.refused(self.comm.all_reduce, array.array("h", [1, 2]), match="16-bit integers")
        self.refused(self.comm.all_reduce, memoryview(bytearray(4)).cast("?"), match="booleans")
        self.refused(self.comm.all_reduce, [1.0, 2.0], match="does not export its memory")
        self.refused(self.comm.all_reduce, None, match="pass a buffer")
        self.refused(self.comm.all_reduce, array.array("f", [1.0]), dtype="float64", match="8-byte")
        self.refused(
            self.comm.all_reduce,
            array.array("f", [1.0]),
            dtype="complex64",
            match="not a ringreduce type",
        )
        self.refused(self.comm.all_reduce, array.array("f", [1.0]), "mean", match="not an operator")
        self.refused(
            self.comm.all_reduce,
            array.array("f", [1.0]),
            out=array.array("i", [0]),
            match="one element type",
        )

    def test_buffers_not_contiguous_or_read_only_or_misaligned(self):
        x = array.array("f", [1.0, 2.0, 3.0, 4.0])
        self.refused(self.comm.all_reduce, memoryview(x)[::2], match="not C-contiguous")
        self.refused(
            self.comm.all_reduce,
            x,
            out=memoryview(array.array("f", [0.0] * 8))[::2],
            match="out is not C-contiguous",
        )
        frozen = memoryview(bytes(16)).cast("f")
        self.refused(self.comm.all_reduce, frozen, match="x is read-only")
        self.refused(self.comm.all_reduce, x, out=frozen, match="out is read-only")
        self.refused(
            self.comm.all_reduce, memoryview(bytearray(9))[1:].cast("f"), match="not aligned"
        )
        # A read-only input is fine where nothing writes it.
        out = array.array("f", [0.0] * 4)
        self.comm.all_reduce(memoryview(bytes(array.array("f", [5.0] * 4))).cast("f"), out=out)
        self.assertEqual(list(out), [5.0] * 4)

    def test_overlapping_and_mislaid_buffers(self):
        x = array.array("f", range(8))
        view = memoryview(x)
        self.refused(self.comm.all_reduce, view[0:4], out=view[2:6], match="overlaps")
        self.refused(self.comm.all_reduce, x, out=array.array("f", [0.0] * 7))
        self.refused(self.comm.all_to_all, x, None, match="no in-place form")
        self.refused(self.comm.all_to_all, x, x, match="no in-place form")
        err = self.refused(self.comm.broadcast, x, root=1)
        self.assertEqual(err.kind, "RootOutOfRange")
        self.refused(self.comm.reduce, x, root=-1, match="negative")
        self.refused(self.comm.all_reduce, x, stream=0, match="stream=")
        self.refused(self.comm.all_reduce, x, None, match="op=None")
        self.refused(self.comm.broadcast, x, root="0", match="root='0'")
        self.refused(self.comm.send_recv, [(0, 0)], [x], [x], match="triple")

    def test_send_recv_refusals(self):
        a, b = array.array("i", [1, 2]), array.array("i", [0, 0])
        self.refused(self.comm.send_recv, [(0, 1, 2)], [a], [], match="outside the world")
        self.refused(self.comm.send_recv, [(0, 0, -2)], [a], [b], match="negative")
        self.refused(self.comm.send_recv, [(0, 0, 2)], [], [], match="pass dtype=")
        self.refused(self.comm.send_recv, [(0, 0, 2)], [a], [])  # one receive buffer missing
        two = array.array("i", [0] * 3)
        view = memoryview(two)
        self.refused(
            self.comm.send_recv,
            [(0, 0, 2), (0, 0, 2)],
            [a, a],
            [view[0:2], view[1:3]],
            match="overlap",
        )
        self.refused(self.comm.send_recv, [(0, 0, 2)], [a], [a], match="overlaps sends[0]")
        self.comm.send_recv([ringreduce.Transfer(0, 0, 2)], [a], [b])
        self.assertEqual(list(b), [1, 2])

    def test_device_calls_on_a_host_rank(self):
        native = self.comm._native
        self.refused(
            native.enqueue, "all_reduce", 0, (4096, 4), None, "sum", "f32", 0, match="host rank"
        )
        self.refused(
            native.enqueue_send_recv,
            [(0, 0, 1)],
            [(4096, 1)],
            [(8192, 1)],
            "f32",
            0,
            match="host rank",
        )

    def test_names_bfloat16_and_fp8_by_dtype(self):
        x = array.array("H", [0x3F80, 0x4000])  # bfloat16 1.0, 2.0
        self.comm.all_reduce(x, "avg", dtype="bfloat16")
        self.assertEqual(list(x), [0x3F80, 0x4000])
        self.comm.all_reduce(bytearray(b"\x38\x40"), dtype="float8_e4m3fn")

    @unittest.skipUnless(
        numpy, "waived: numpy is not importable here, so its refusals are not checked"
    )
    def test_numpy_arrays(self):
        np = numpy
        grid = np.arange(12, dtype=np.float32).reshape(3, 4)
        self.comm.all_reduce(grid, "max")  # 2-D, C order
        self.comm.all_reduce(np.ones(4, dtype=np.float16), "sum")
        self.refused(self.comm.all_reduce, grid[:, ::2], match="not C-contiguous")
        self.refused(self.comm.all_reduce, np.asfortranarray(grid), match="not C-contiguous")
        frozen = np.ones(4, dtype=np.int64)
        frozen.setflags(write=False)
        self.refused(self.comm.all_reduce, frozen, match="read-only")
        self.refused(self.comm.all_reduce, np.ones(4, dtype=np.int16), match="16-bit")
        self.refused(self.comm.all_reduce, np.ones(4, dtype=bool), match="booleans")
        self.refused(self.comm.all_reduce, np.ones(4, dtype=np.complex64))
        out = np.zeros(4, dtype=np.int64)
        self.comm.all_reduce(frozen, out=out, dtype=np.int64)
        self.assertEqual(out.tolist(), [1, 1, 1, 1])


class Lifetime(unittest.TestCase):
    def test_closed_communicators_refuse_calls(self):
        with ringreduce.Communicator(ringreduce.UniqueId(), 0, 1) as comm:
            pass
        self.assertTrue(comm.closed)
        comm.close()  # idempotent
        with self.assertRaises(ringreduce.Closed) as caught:
            comm.all_reduce(array.array("f", [1.0]))
        self.assertEqual(caught.exception.kind, "Closed")


class Gpu(unittest.TestCase):
    def test_a_gpu_rank_without_a_gpu_is_a_clear_error(self):
        for device in (0, "cuda:0"):
            with self.subTest(device=device):
                try:
                    comm = ringreduce.Communicator(ringreduce.UniqueId(), 0, 1, device=device)
                except ringreduce.NoGpu as err:
                    self.assertIn("no GPU", str(err))
                    continue
                comm.close()
                self.skipTest("this machine has a GPU: the no-GPU error is not what happens here")


if __name__ == "__main__":
    unittest.main()
