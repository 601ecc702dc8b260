"""ringreduce.torch with real torch on host ranks (CPU tensors), two processes per job as
torchrun runs them: every collective and custom op on every dtype, exact; a function around the
custom ops compiled by ``torch.compile(fullgraph=True)``; a DDP model averaging its gradients
through ``allreduce_hook``; examples/python/ddp_hook.py under torchrun. Each job's ranks are
``ranks.py torch PART``; a test passes when every rank exits 0. Waived where torch is not
importable (CI has none).
"""

import unittest

from launch import Job, report

try:
    import torch  # noqa: F401

    HAVE_TORCH = hasattr(torch, "__version__")
except ImportError:
    HAVE_TORCH = False


@unittest.skipUnless(HAVE_TORCH, "waived: torch is not importable here")
class TorchOnHostRanks(unittest.TestCase):
    def run_job(self, part, expect, world=2, within=240):
        results = Job("torch", world, [part]).finish(within)
        self.assertTrue(all(status == 0 for status, _, _ in results.values()), report(results))
        self.assertIn(expect, results[0][1])

    def test_every_collective_and_custom_op_on_cpu_tensors(self):
        self.run_job("collectives", "torch collectives exact")

    def test_torch_compile_runs_the_custom_ops(self):
        self.run_job("compile", "torch.compile ran the custom ops")

    def test_ddp_averages_gradients_through_the_hook(self):
        self.run_job("ddp", "DDP averaged its gradients")

    def test_the_ddp_example_runs_under_torchrun(self):
        import os
        import subprocess
        import sys

        from launch import free_port

        example = os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "python",
            "ddp_hook.py",
        )
        ran = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
             "--master_port", str(free_port()), example],
            capture_output=True, text=True, timeout=240,
        )
        self.assertEqual(ran.returncode, 0, ran.stdout + ran.stderr)
        self.assertIn("of DDP's own all-reduce", ran.stdout)


if __name__ == "__main__":
    unittest.main()
