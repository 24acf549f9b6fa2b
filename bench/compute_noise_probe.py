"""How noisy is a rank's per-step compute against its peers', measured by the
wall clock and by CPU time? The figure a straggler test's threshold rests on.

A 4-rank DDP job on gloo (no trainguard) times each step's forward three
ways: wall clock (time.perf_counter_ns), the process's CPU time
(time.process_time_ns: every thread of the rank) and the calling thread's
(time.thread_time_ns). For each rank and step it takes the log of its
forward over the median of the other ranks' at the same step (what slows
every rank at once cancels) and prints, per rank, that log ratio's median
and robust spread (1.4826 x MAD) over the steps before --slow-from, and its
median from then on. With --slow F, rank 2 adds busy compute of (F - 1)
times its forward's own CPU time from --slow-from on: a compute straggler.

    /usr/bin/python3 bench/compute_noise_probe.py [--steps 200] [--slow 1.2] [--slow-from 100] [--threads N]

Measured on the project's 2-core machine (4 ranks, rank 2 at 1.2x from
step 100; three runs, 1 or 2 threads a rank): wall spread 3.0-4.4 % a
step, CPU time 0.4-0.7 % (process and thread alike); rank 2's median log
ratio from step 100 is 0.20 by all three. A 20 % slowdown is about 5 wall
spreads of one step and about 35 CPU-time spreads.
"""

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SERIES = ("wall", "process cpu", "thread cpu")


def rank_main(rank, world, args, init_file, out):
    if args.threads:
        torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(64, 512)
    busy = torch.randn(256, 256)
    rows = []
    for step in range(args.steps):
        w0, c0, t0 = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
        y = ddp(x)
        if rank == 2 and step >= args.slow_from and args.slow > 1:
            until = time.process_time_ns() + (time.process_time_ns() - c0) * (args.slow - 1)
            while time.process_time_ns() < until:
                busy @ busy
        rows.append((time.perf_counter_ns() - w0, time.process_time_ns() - c0, time.thread_time_ns() - t0))
        y.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    out[rank] = rows
    dist.destroy_process_group()


def log_ratios(rows, series, rank, steps):
    out = []
    for s in steps:
        others = sorted(rows[r][s][series] for r in rows if r != rank)
        out.append(math.log(rows[rank][s][series] / statistics.median(others)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--slow", type=float, default=1.2)
    ap.add_argument("--slow-from", type=int, default=100)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per rank (0: torch's default)")
    args = ap.parse_args()
    world = 4
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(rank_main, args=(world, args, os.path.join(tmp, "rendezvous"), out), nprocs=world)
        rows = dict(out)
    warm = 20  # the first steps are start-up
    before = range(warm, min(args.slow_from, args.steps))
    after = range(args.slow_from, args.steps)
    print("%d ranks, %d steps; rank 2 at %.2fx from step %d" % (world, args.steps, args.slow, args.slow_from))
    print("%-12s %4s %10s %10s %14s" % ("series", "rank", "median", "spread", "median after"))
    for i, name in enumerate(SERIES):
        for rank in sorted(rows):
            lr = log_ratios(rows, i, rank, before)
            med = statistics.median(lr)
            spread = 1.4826 * statistics.median(abs(v - med) for v in lr)
            late = statistics.median(log_ratios(rows, i, rank, after)) if len(after) else float("nan")
            print("%-12s %4d %10.4f %10.4f %14.4f" % (name, rank, med, spread, late))
    return 0


if __name__ == "__main__":
    sys.exit(main())
