"""Restore of a checkpoint from the node's memory copy against storage
(docs/restart.md), one rank, in the same run:

  memory            Checkpointer.load_latest() with the node's memory copy
                    (a tmpfs, as the agent sets it up)
  disk, cold cache  the same load from this machine's disk after the page
                    cache was dropped (root: /proc/sys/vm/drop_caches), what a
                    restarted node that did not just write the file pays
  disk, warm cache  the same load while the file is still in the page cache

Each load is verified (every checksum) and its tensor compared with the
saved one.

    sudo /usr/bin/python3 bench/memory_restore_bench.py [--gib 2] [--runs 3]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.environ.get("TRAINGUARD_BUILD", os.path.join(ROOT, "build")), "python"))

import torch  # noqa: E402

import trainguard  # noqa: E402


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def load(directory, memory_dir):
    if memory_dir:
        os.environ["TRAINGUARD_MEMORY_CHECKPOINTS"] = memory_dir
    else:
        os.environ.pop("TRAINGUARD_MEMORY_CHECKPOINTS", None)
    ckpt = trainguard.Checkpointer(directory, keep_last=1)
    t0 = time.perf_counter()
    step, state = ckpt.load_latest()
    took = time.perf_counter() - t0
    return took, ckpt.last_source, state


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default="", help="checkpoint directory on the disk to measure (default: a temp dir)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root, to drop the page cache")
    directory = tempfile.mkdtemp(prefix="tg-memrestore-", dir=args.dir or None)
    memory_dir = tempfile.mkdtemp(prefix="tg-memrestore-", dir="/dev/shm")
    try:
        n = int(args.gib * (1 << 30)) // 4
        tensor = torch.arange(n, dtype=torch.float32)
        os.environ["TRAINGUARD_MEMORY_CHECKPOINTS"] = memory_dir
        saver = trainguard.Checkpointer(directory, keep_last=1)
        saver.save(1, {"w": tensor})
        saver.wait()
        del saver
        results = {"memory": [], "disk, cold cache": [], "disk, warm cache": []}
        for _ in range(args.runs):
            for name, mem in (("memory", memory_dir), ("disk, cold cache", ""), ("disk, warm cache", "")):
                if name == "disk, cold cache":
                    drop_caches()
                took, source, state = load(directory, mem)
                want = "memory" if mem else "storage"
                if source != want or not torch.equal(state["w"], tensor):
                    raise SystemExit("%s: read from %s, or the state differs" % (name, source))
                results[name].append(took)
                del state
        size = n * 4 / (1 << 30)
        base = statistics.median(results["disk, cold cache"])
        print("restore of a %.2f GiB state (one rank, load_latest, verified), median of %d:" % (size, args.runs))
        for name, times in results.items():
            med = statistics.median(times)
            print("  %-17s %7.3f s  %6.2f GiB/s  %5.1fx faster than the disk with a cold cache"
                  % (name, med, size / med, base / med))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(memory_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
