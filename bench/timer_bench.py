"""Cost of the always-on phase timers for a script that does not import
trainguard: the same DDP training step (1 rank, gloo, SGD) timed in a process
without trainguard and in one with its automatic instrumentation (steps,
phases timed into the status page's timing ring, GC pauses) attached to a
real status page; DDP's comm-hook journal is off in both (torch 1.13's
default), so the difference is the timers and the step counter. Runs
alternate 3 times; medians.

    /usr/bin/python3 bench/timer_bench.py
"""

import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from comm_journal_bench import SIZES, time_ddp_steps  # noqa: E402


def training_steps(instrumented, size):
    """Runs in a child process; prints the median step time in seconds."""
    import torch.distributed as dist

    median, page = time_ddp_steps(instrumented, size)
    print(median)
    if page:
        from trainguard import _core

        timings = _core._read_timings(page)
        os.unlink(page)
        names = {t["name"] for t in timings if t["kind"] == "phase"}
        assert {"forward", "backward", "optimizer"} <= names, "the timers recorded nothing: %s" % names
    dist.destroy_process_group()


def per_step(size):
    results = {False: [], True: []}
    for _ in range(3):
        for instrumented in (False, True):
            out = subprocess.run([sys.executable, __file__, "--steps", str(int(instrumented)), size],
                                 capture_output=True, text=True, check=True,
                                 env=dict(os.environ, TRAINGUARD_INSTRUMENT="1", TRAINGUARD_DDP_JOURNAL="0"))
            results[instrumented].append(float(out.stdout.strip().splitlines()[-1]))
    p, i = statistics.median(results[False]), statistics.median(results[True])
    d_in, hidden, d_out, batch, _ = SIZES[size]
    print("DDP training step (MLP %d-%d-%d, batch %d): without trainguard %.1f us, with timers %.1f us "
          "(%+.1f us, %+.2f %%); runs: without %s, with %s"
          % (d_in, hidden, d_out, batch, p * 1e6, i * 1e6, (i - p) * 1e6, (i - p) / p * 100,
             " ".join("%.0f" % (x * 1e6) for x in results[False]),
             " ".join("%.0f" % (x * 1e6) for x in results[True])))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--steps":
        training_steps(sys.argv[2] == "1", sys.argv[3])
    else:
        per_step("tiny")
        per_step("larger")
