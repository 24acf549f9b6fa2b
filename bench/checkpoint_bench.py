"""Checkpoint figures of trainguard's two-phase checkpointer, each beside a
baseline measured in the same run on the same disk:

- blocked time per save (what the training loop waits) vs torch.save;
- phase-1 throughput vs a plain memcpy of the same bytes (ctypes.memmove);
- phase-2 throughput vs a plain sequential write + fsync of the same bytes;
- restore time vs torch.load;
- bytes written and read per checkpoint by 4 DDP replicas, vs the state size.

    /usr/bin/python3 bench/checkpoint_bench.py [--sizes-mib 256,2048] [--dir DIR]
"""

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("TRAINGUARD_BUILD", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.join(BUILD, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import torch  # noqa: E402

import trainguard  # noqa: E402
from conftest import free_port  # noqa: E402

REPEAT = 5


def make_state(mib):
    n = mib * (1 << 20) // 4
    pieces = 16
    return {"model": {"layer%d.weight" % i: torch.randn(n // pieces) for i in range(pieces)},
            "step": 1}


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def memcpy_baseline(nbytes):
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)  # faulted in
    return min(timed(lambda: ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)) for _ in range(REPEAT))


def write_fsync_baseline(path, nbytes):
    buf = memoryview(bytearray(os.urandom(1 << 20) * 64))  # 64 MiB chunk
    times = []
    for _ in range(REPEAT):
        t = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        left = nbytes
        while left > 0:
            left -= os.write(fd, buf[:min(left, len(buf))])
        os.fsync(fd)
        os.close(fd)
        times.append(time.perf_counter() - t)
        os.unlink(path)
    return min(times)


def bench_size(mib, root):
    state = make_state(mib)
    nbytes = sum(t.numel() * 4 for t in state["model"].values())
    work = tempfile.mkdtemp(prefix="tg-ckpt-bench-", dir=root)
    try:
        # torch.save: blocks for the whole serialization and write.
        tpath = os.path.join(work, "state.pt")
        torch_save = statistics.median(timed(lambda: torch.save(state, tpath)) for _ in range(REPEAT))
        torch_load = statistics.median(timed(lambda: torch.load(tpath)) for _ in range(REPEAT))
        os.unlink(tpath)

        ck = trainguard.Checkpointer(os.path.join(work, "tg"), keep_last=1)
        blocked, snap, persist = [], [], []
        for i in range(REPEAT + 1):
            blocked.append(timed(lambda: ck.save(i, state)))
            ck.wait()
            s = ck.stats()
            snap.append(s["last_snapshot_s"])
            persist.append(s["last_persist_s"])
        # The first save also allocates and faults in the host buffer: report it apart.
        first_blocked = blocked.pop(0)
        snap.pop(0)
        persist.pop(0)
        load = statistics.median(timed(lambda: ck.load_latest()) for _ in range(REPEAT))
        shutil.rmtree(os.path.join(work, "tg"))

        memcpy = memcpy_baseline(nbytes)
        write = write_fsync_baseline(os.path.join(work, "raw.bin"), nbytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gib = nbytes / (1 << 30)
    med = statistics.median
    print("state %d MiB (%d tensors, float32)" % (mib, len(state["model"])))
    print("  blocked per save : trainguard %8.3f s   torch.save %8.3f s   -> %.1fx less (first save, "
          "allocating the buffer: %.3f s)" % (med(blocked), torch_save, torch_save / med(blocked), first_blocked))
    print("  phase 1          : %6.2f GiB/s   memcpy %6.2f GiB/s   -> ratio %.2f"
          % (gib / med(snap), gib / memcpy, memcpy / med(snap)))
    print("  phase 2          : %6.2f GiB/s   write+fsync %6.2f GiB/s   -> ratio %.2f"
          % (gib / med(persist), gib / write, write / med(persist)))
    print("  restore          : trainguard %8.3f s   torch.load %8.3f s" % (load, torch_load))


def bench_replicas(mib, root, replicas=4):
    work = tempfile.mkdtemp(prefix="tg-ckpt-ddp-", dir=root)
    numel = mib * (1 << 20) // 4
    worker = os.path.join(ROOT, "tests", "ckpt_worker.py")
    try:
        results = {}
        for mode in ("save", "load"):
            port = free_port()
            procs = []
            for r in range(replicas):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(replicas), MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), PYTHONPATH=os.path.join(BUILD, "python"))
                procs.append(subprocess.Popen([sys.executable, worker, "--dir", work, "--mode", mode,
                                               "--steps", "1", "--numel", str(numel)],
                                              env=env, stdout=subprocess.PIPE, text=True))
            outs = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
            results[mode] = outs
        state = numel * 4
        written = sum(o["stats"]["bytes_written"] for o in results["save"])
        read = sum(o["bytes_read"] for o in results["load"])
        print("%d DDP replicas, %d MiB state: written %.3fx the state size, read %.3fx "
              "(torch.save by every rank would write %dx)"
              % (replicas, mib, written / state, read / state, replicas))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mib", default="256,2048")
    ap.add_argument("--dir", default="/tmp", help="a directory on the disk to measure")
    ap.add_argument("--replica-mib", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print("disk under %s; %d repetitions, medians" % (args.dir, REPEAT))
    for mib in [int(s) for s in args.sizes_mib.split(",")]:
        bench_size(mib, args.dir)
    bench_replicas(args.replica_mib, args.dir)


if __name__ == "__main__":
    main()
