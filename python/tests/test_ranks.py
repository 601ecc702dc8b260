"""Host ranks as separate processes, as torchrun runs them: every collective on every type with
exact results (2 and 3 ranks; array.array, and NumPy where it is installed), an explicit
UniqueId, mismatched calls, a killed peer, and the interpreter released during a call. Each
job's ranks are ``ranks.py`` processes (launch.py); a test passes when every rank exits 0.
"""

import time
import unittest

from launch import Job, report

try:
    import numpy  # noqa: F401

    HAVE_NUMPY = True
except ImportError:
    HAVE_NUMPY = False


class Ranks(unittest.TestCase):
    def run_job(self, scenario, world, *args, within=60):
        results = Job(scenario, world, args).finish(within)
        self.assertTrue(all(status == 0 for status, _, _ in results.values()), report(results))
        return results

    def test_every_collective_on_array_buffers(self):
        for world in (2, 3):
            with self.subTest(world=world):
                results = self.run_job("every_collective", world, "array")
                self.assertIn("checks on array buffers", results[0][1])

    @unittest.skipUnless(
        HAVE_NUMPY, "waived: numpy is not importable here, so the NumPy runs are skipped"
    )
    def test_every_collective_on_numpy_arrays(self):
        for world in (2, 3):
            with self.subTest(world=world):
                results = self.run_job("every_collective", world, "numpy")
                self.assertIn("checks on numpy buffers", results[0][1])

    def test_an_explicit_unique_id_made_by_rank_0(self):
        world = 3
        job = Job("explicit_id", world, start=[0])
        line = job.procs[0].stdout.readline()
        self.assertTrue(line.startswith("id rr1-"), line)
        for rank in range(1, world):
            job.start(rank, RR_TEST_ID=line.split()[1])
        results = job.finish(60)
        self.assertTrue(all(status == 0 for status, _, _ in results.values()), report(results))

    def test_mismatched_calls_are_a_mismatch_on_every_rank(self):
        for what in ("count", "dtype", "in_place"):
            with self.subTest(differs=what):
                self.run_job("mismatch", 3, what)

    def test_a_killed_peer_is_named_on_every_other_rank(self):
        world, victim = 3, 1
        job = Job("killed_peer", world, [victim])
        self.assertEqual(job.procs[victim].stdout.readline().strip(), "ready")
        for rank in range(world):
            if rank != victim:
                self.assertEqual(job.procs[rank].stdout.readline().strip(), "calling")
        time.sleep(0.3)  # the others are waiting in the call
        job.kill(victim)
        results = job.finish(60)
        self.assertTrue(all(status == 0 for status, _, _ in results.values()), report(results))

    def test_other_threads_run_while_a_call_waits(self):
        self.run_job("threads_run", 2)


if __name__ == "__main__":
    unittest.main()
