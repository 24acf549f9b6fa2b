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
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_status_page import make_status_page  # noqa: E402
from comm_journal_bench import SIZES, init_one_rank  # noqa: E402


def training_steps(instrumented, size):
    """Runs in a child process; prints the median step time in seconds."""
    if instrumented:
        make_status_page()
        from trainguard import _autoinstrument
        _autoinstrument.install()
    init_one_rank()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    d_in, hidden, d_out, batch, steps = SIZES[size]
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, d_out)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, d_in), torch.randn(batch, d_out)

    def loop():
        start = time.perf_counter()
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        return (time.perf_counter() - start) / steps

    loop()
    print(statistics.median([loop() for _ in range(5)]))
    if instrumented:
        from trainguard import _core

        timings = _core._read_timings(os.environ["TRAINGUARD_STATUS_PAGE"])
        os.unlink(os.environ["TRAINGUARD_STATUS_PAGE"])
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
