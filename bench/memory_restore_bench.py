"""Restore of a checkpoint from the node's memory copy against storage
(docs/restart.md), one rank, in the same run:

  memory, huge      Checkpointer.load_latest() with the node's memory copy on
                    a tmpfs with huge pages, as the agent makes it when it
                    may (root: here a mounted one with the same options)
  memory, /dev/shm  the same copy in /dev/shm, the agent's fallback (no huge
                    pages: half a million page-table entries per 2 GiB)
  disk, cold cache  the same load from this machine's disk after the page
                    cache was dropped (root: /proc/sys/vm/drop_caches), what a
                    restarted node that did not just write the file pays
  disk, warm cache  the same load while the file is still in the page cache

Each load is verified (every checksum) and its tensor compared with the
saved one. A memory copy is mapped, not copied: the restored tensors are
copy-on-write views of it. So each load is followed, in turn, by what a
script does next, measured apart:

  into the model    the restored tensor copied into the model's own
                    (load_state_dict: what DDP, single-rank and GPU scripts do;
                    a group of replicas assembles its stream over the process
                    group, which copies it anyway)
  updated in place  the restored tensor itself updated in place (an optimizer
                    state that load_state_dict keeps as given): each 4 KiB page
                    of a mapped copy is copied on its first write

    sudo /usr/bin/python3 bench/memory_restore_bench.py [--gib 2] [--runs 3]
"""

import argparse
import os
import shutil
import statistics
import subprocess
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


def load(directory, memory_dir, model):
    """(restore s, into-the-model s, updated-in-place s, source, state)."""
    if memory_dir:
        os.environ["TRAINGUARD_MEMORY_CHECKPOINTS"] = memory_dir
    else:
        os.environ.pop("TRAINGUARD_MEMORY_CHECKPOINTS", None)
    ckpt = trainguard.Checkpointer(directory, keep_last=1)
    t0 = time.perf_counter()
    step, state = ckpt.load_latest()
    took = time.perf_counter() - t0
    t1 = time.perf_counter()
    model.copy_(state["w"])
    into_model = time.perf_counter() - t1
    t2 = time.perf_counter()
    state["w"].mul_(1.0)
    in_place = time.perf_counter() - t2
    return took, into_model, in_place, ckpt.last_source, state


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default="", help="checkpoint directory on the disk to measure (default: a temp dir)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root, to drop the page cache")
    directory = tempfile.mkdtemp(prefix="tg-memrestore-", dir=args.dir or None)
    huge_dir = tempfile.mkdtemp(prefix="tg-memrestore-huge-")
    memory_dir = tempfile.mkdtemp(prefix="tg-memrestore-", dir="/dev/shm")
    mounted = False
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "huge=within_size,mode=0700", "tmpfs", huge_dir], check=True)
        mounted = True
        n = int(args.gib * (1 << 30)) // 4
        tensor = torch.arange(n, dtype=torch.float32)
        os.environ["TRAINGUARD_MEMORY_CHECKPOINTS"] = huge_dir
        saver = trainguard.Checkpointer(directory, keep_last=1)
        saver.save(1, {"w": tensor})
        saver.wait()
        del saver
        shutil.rmtree(memory_dir)
        shutil.copytree(huge_dir, memory_dir)
        results = {"memory, huge": [], "memory, /dev/shm": [], "disk, cold cache": [], "disk, warm cache": []}
        writes = {name: [] for name in results}
        models = {name: [] for name in results}
        model = torch.zeros_like(tensor)  # the model's own parameters, already in memory
        for _ in range(args.runs):
            for name, mem in (("memory, huge", huge_dir), ("memory, /dev/shm", memory_dir),
                              ("disk, cold cache", ""), ("disk, warm cache", "")):
                if name == "disk, cold cache":
                    drop_caches()
                took, into_model, in_place, source, state = load(directory, mem, model)
                want = "memory" if mem else "storage"
                if source != want or not torch.equal(state["w"], tensor):
                    raise SystemExit("%s: read from %s, or the state differs" % (name, source))
                results[name].append(took)
                models[name].append(into_model)
                writes[name].append(in_place)
                del state
        size = n * 4 / (1 << 30)
        base = statistics.median(results["disk, cold cache"])
        print("restore of a %.2f GiB state (one rank, load_latest, verified), median of %d;" % (size, args.runs))
        print("x: how many times faster than the disk with a cold cache, for the restore alone and with what follows")
        med = {name: statistics.median(times) for name, times in results.items()}
        into = {name: statistics.median(times) for name, times in models.items()}
        inplace = {name: statistics.median(times) for name, times in writes.items()}
        cold = "disk, cold cache"
        print("  %-18s %16s %24s %24s" % ("", "restore", "+ into the model", "+ updated in place"))
        for name in results:
            print("  %-18s %7.3f s %5.1fx   %7.3f s %5.1fx   %7.3f s %5.1fx" % (
                name, med[name], med[cold] / med[name],
                med[name] + into[name], (med[cold] + into[cold]) / (med[name] + into[name]),
                med[name] + inplace[name], (med[cold] + inplace[cold]) / (med[name] + inplace[name])))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(memory_dir, ignore_errors=True)
        if mounted:
            subprocess.run(["umount", huge_dir], check=False)
        os.rmdir(huge_dir)


if __name__ == "__main__":
    main()
