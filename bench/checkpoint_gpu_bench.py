"""Checkpoints of CUDA tensors (needs a GPU and a CUDA build of trainguard):
the page-locked snapshot path, checked and timed beside baselines measured in
the same run.

1. Ordering: a tensor whose final value is written by a kernel still queued
   on the training stream when save() is called must be saved with that
   value (the snapshot's copies may not overtake the training stream's work).
2. Blocked time per save of a GPU-resident state vs torch.save of it.
3. Phase-1 throughput (device to page-locked host) vs one torch copy of the
   same bytes into page-locked memory.
4. Restore time and exactness.

    python3 bench/checkpoint_gpu_bench.py [--mib 2048] [--dir DIR]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import trainguard


def timed(fn, sync=True):
    if sync:
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def ordering_check(directory, trials):
    """Queues a lot of matrix products, then a fill that runs after them on
    the same stream, then saves at once: on the default stream, and on a
    stream of the script's own."""
    ck = trainguard.Checkpointer(os.path.join(directory, "order"), keep_last=1)
    a = torch.zeros(64 << 20, device="cuda")             # 256 MiB
    w = torch.randn(8192, 8192, device="cuda")
    side = torch.cuda.Stream()
    bad = 0
    for trial in range(trials):
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream() if trial % 2 == 0 else side
        with torch.cuda.stream(stream):
            x = w
            for _ in range(40):                           # ~40 x 1.1 TFLOP, queued
                x = x @ w
                x = x / x.norm()
            a.fill_(float(trial + 1))                      # runs after the products
            ck.save(trial, {"a": a})                       # no synchronize before it
        ck.wait()
        step, state = ck.load_latest()
        ok = step == trial and bool((state["a"] == float(trial + 1)).all())
        bad += not ok
        print("  ordering trial %d (%s stream): saved value %s" % (
            trial, "default" if trial % 2 == 0 else "own",
            "right" if ok else "WRONG (%s)" % state["a"][:4].tolist()))
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--ordering-trials", type=int, default=6)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    directory = args.dir or tempfile.mkdtemp(prefix="tg_gpu_bench_")
    print("device: %s; torch %s" % (torch.cuda.get_device_name(), torch.__version__))
    bad = ordering_check(directory, args.ordering_trials)

    pieces = 16
    n = args.mib * (1 << 20) // 4 // pieces
    state = {"model": {"layer%d" % i: torch.randn(n, device="cuda") for i in range(pieces)},
             "step": 1}
    nbytes = n * 4 * pieces
    ck = trainguard.Checkpointer(os.path.join(directory, "tg"), keep_last=1)
    blocked = []
    for step in range(6):
        blocked.append(timed(lambda: ck.save(step, state)))
        ck.wait()
    first, blocked = blocked[0], statistics.median(blocked[1:])
    torch_path = os.path.join(directory, "torch.pt")
    torch_save = statistics.median(timed(lambda: torch.save(state, torch_path)) for _ in range(3))
    pinned = [torch.empty(n, dtype=torch.float32, pin_memory=True) for _ in range(pieces)]

    def pinned_copy():
        for dst, src in zip(pinned, state["model"].values()):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
    pinned_copy()
    copy = statistics.median(timed(pinned_copy) for _ in range(5))
    restore_t = timed(lambda: ck.load_latest(), sync=False)
    step, restored = ck.load_latest()
    exact = all(torch.equal(restored["model"][k], v.cpu()) for k, v in state["model"].items())
    torch_load = timed(lambda: torch.load(torch_path, map_location="cpu"), sync=False)
    gib = nbytes / (1 << 30)
    print("state %d MiB of CUDA tensors (%d tensors)" % (nbytes >> 20, pieces))
    print("  blocked per save : trainguard %7.3f s   torch.save %7.3f s   -> %.1fx less "
          "(first save, allocating page-locked memory: %.3f s)"
          % (blocked, torch_save, torch_save / blocked, first))
    print("  phase 1 (D2H)    : %6.2f GiB/s   torch copy into pinned memory %6.2f GiB/s   -> ratio %.2f"
          % (gib / blocked, gib / copy, copy / blocked))
    print("  restore          : trainguard %7.3f s   torch.load %7.3f s   exact: %s"
          % (restore_t, torch_load, exact))
    print("  stats: %s" % ck.stats())
    print("ordering: %d of %d saves wrong" % (bad, args.ordering_trials))
    if args.dir is None:
        shutil.rmtree(directory, ignore_errors=True)
    sys.exit(0 if bad == 0 and exact else 1)


if __name__ == "__main__":
    main()
