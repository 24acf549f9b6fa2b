"""Cost of the automatic journal of communication operations and phases.

1. Per recorded operation: torch.distributed's all_reduce of one element on
   a one-rank gloo group, called directly and through trainguard's journaling
   wrapper (issue + complete written to a real status page), in the same
   process; and the wrapper around a function that does nothing, which is
   the journal's own cost.
2. Per training step: a DDP training step (SGD, one rank on gloo; a tiny MLP
   64-256-1 with batch 32, and a larger one 512-2048-512 with batch 64) in a
   process without instrumentation and in one with all of it (step counter,
   phases, the DDP comm hook and the journal), alternated.

    /usr/bin/python3 bench/comm_journal_bench.py
"""

import os
import socket
import statistics
import subprocess
import sys
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_status_page import make_status_page  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_one_rank():
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                       "RANK": "0", "WORLD_SIZE": "1"})


def per_operation():
    path = make_status_page()
    init_one_rank()
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import trainguard
    from trainguard import _comm_journal

    assert trainguard.init(), "could not attach to the benchmark status page"
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    t = torch.ones(1)
    plain = c10d.all_reduce
    _comm_journal.hook_distributed(c10d)
    wrapped = c10d.all_reduce
    assert wrapped is not plain
    n = 20_000

    def rounds(fn):
        return min(timeit.repeat(lambda: fn(t), number=n, repeat=5)) / n

    for fn in (plain, wrapped):
        rounds(fn)  # warm up
    base = statistics.median([rounds(plain) for _ in range(3)])
    journaled = statistics.median([rounds(wrapped) for _ in range(3)])

    def nothing(tensor, op=None, group=None, async_op=False):
        return None

    noop = _comm_journal._journaled(c10d, nothing, "all_reduce", 0, -1, 2, 3)
    own = min(timeit.repeat(lambda: noop(t), number=n, repeat=5)) / n
    bare = min(timeit.repeat(lambda: nothing(t), number=n, repeat=5)) / n
    ops = trainguard._core._read_status_page(path)["groups"][0]["issued"]
    os.unlink(path)
    assert ops >= 2 * n, "the journal did not record the operations (%d)" % ops
    dist.destroy_process_group()
    print("torch %s; all_reduce of 1 element, 1 rank, gloo: direct %.2f us, journaled %.2f us "
          "(+%.2f us)" % (torch.__version__, base * 1e6, journaled * 1e6, (journaled - base) * 1e6))
    print("journal's own cost per operation (wrapper around a no-op): %.2f us" % ((own - bare) * 1e6))


SIZES = {"tiny": (64, 256, 1, 32, 200), "larger": (512, 2048, 512, 64, 30)}


def time_ddp_steps(instrumented, size):
    """In a child process: the DDP training step of SIZES[size], with or
    without trainguard's automatic instrumentation attached to a real status
    page. Returns the median step time in seconds and the page's path (None
    uninstrumented; the caller checks it and removes it) with the process
    group still up."""
    page = None
    if instrumented:
        page = make_status_page()
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
    return statistics.median([loop() for _ in range(5)]), page


def training_steps(instrumented, size):
    """Runs in a child process; prints the median step time in seconds."""
    import torch.distributed as dist

    median, page = time_ddp_steps(instrumented, size)
    print(median)
    if page:
        from trainguard import _core

        recorded = _core._read_status_page(page)
        os.unlink(page)
        buckets = sum(1 for op in recorded["ops"] if op["op"] == "all_reduce")
        assert recorded["step_count"] > 0 and buckets > 0, "instrumentation recorded nothing"
    dist.destroy_process_group()


def per_step(size):
    results = {False: [], True: []}
    for _ in range(3):
        for instrumented in (False, True):
            out = subprocess.run([sys.executable, __file__, "--steps", str(int(instrumented)), size],
                                 capture_output=True, text=True, check=True,
                                 env=dict(os.environ, TRAINGUARD_INSTRUMENT="1", TRAINGUARD_DDP_JOURNAL="1"))
            results[instrumented].append(float(out.stdout.strip().splitlines()[-1]))
    p, i = statistics.median(results[False]), statistics.median(results[True])
    d_in, hidden, d_out, batch, _ = SIZES[size]
    print("DDP training step (MLP %d-%d-%d, batch %d, SGD, 1 rank, gloo): uninstrumented %.1f us, "
          "instrumented (steps, phases, journal) %.1f us (%+.1f us, %+.2f %%)"
          % (d_in, hidden, d_out, batch, p * 1e6, i * 1e6, (i - p) * 1e6, (i - p) / p * 100))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--steps":
        training_steps(sys.argv[2] == "1", sys.argv[3])
    else:
        per_operation()
        per_step("tiny")
        per_step("larger")
