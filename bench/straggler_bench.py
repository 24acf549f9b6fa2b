"""Straggler detection on real DDP jobs (the example, 4 nodes x 1 rank, gloo,
on this machine): --healthy runs with nothing wrong, then --slow runs where
node2's rank gets 0.4 of a CPU per 10 ms (a cgroup; root) from its step
--slow-from-step on (0: from its start). For each run:
who was named and when, and, recomputed from the stored timings the way the
detector does (per step: a node's compute / the other nodes' median; per
window of 10 steps: the median), the largest window ratio of a healthy node
(how close noise came to the 1.07 threshold) and the throttled node's median
ratio (how much slower it really was).

    /usr/bin/python3 bench/straggler_bench.py [--healthy 10] [--slow 3] [--steps 150] [--slow-from-step 60]

A throttled run counts how many steps after the throttle began node2 was
named (the change-point detector names it at once; the windows alone took
3 windows of 10 steps after the start-up window).
"""

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from conftest import cpu_cgroup, remove_cgroup, status_page_step  # noqa: E402

TRAINGUARD = os.path.join(ROOT, "build", "trainguard")
EXAMPLE = os.path.join(ROOT, "examples", "train_ddp.py")
WINDOW = 10


def compute(totals):
    t = dict(kv.rsplit("=", 1) for kv in totals.split(";") if kv)
    return int(t.get("forward", 0)) + int(t.get("optimizer", 0))


def window_ratios(db, job):
    """node -> [window ratio], as the detector computes them (warm-up window skipped)."""
    steps = {}
    for node, step, totals in db.execute("SELECT node, step, totals FROM step_timings WHERE job_id=?", (job,)):
        steps.setdefault(step, {})[node] = compute(totals)
    per = {}
    for step, values in steps.items():
        if len(values) < 3 or step < WINDOW:
            continue
        for node, v in values.items():
            others = statistics.median([x for n, x in values.items() if n != node])
            if others > 0:
                per.setdefault(node, {}).setdefault(step // WINDOW, []).append(v / others)
    return {node: [statistics.median(r) for _, r in sorted(w.items()) if len(r) * 2 >= WINDOW]
            for node, w in per.items()}


def run(tmp, job, steps, slow, slow_from=0):
    d = os.path.join(tmp, job)
    os.makedirs(d)
    store = os.path.join(d, "s.db")
    cg = cpu_cgroup("trainguard-bench-%s-%d" % (job, os.getpid()), 0.4, period=10000) if slow else None
    proc = subprocess.Popen([TRAINGUARD, "run", "--nnodes", "4", "--nproc-per-node", "1", "--store", store,
                             "--job-id", job, "--run-dir", os.path.join(d, "run"), "--",
                             sys.executable, EXAMPLE, "--steps", str(steps), "--hidden", "512", "--batch", "128",
                             "--ckpt-dir", os.path.join(d, "ckpt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if cg:
        deadline = time.monotonic() + 60
        pid = None
        while pid is None and time.monotonic() < deadline:
            for p in os.listdir("/proc"):
                try:
                    env = open("/proc/%s/environ" % p, "rb").read().split(b"\0")
                except OSError:
                    continue
                if p.isdigit() and b"TRAINGUARD_JOB_ID=" + job.encode() in env and b"RANK=2" in env:
                    pid = p
            time.sleep(0.05)
        throttled_at = 0
        while slow_from and proc.poll() is None:
            throttled_at = status_page_step(job, "node2", 2)
            if throttled_at is not None and throttled_at >= slow_from - 1:
                break
            time.sleep(0.005)
        procs = os.path.join(cg, "cgroup.procs" if os.path.exists(os.path.join(cg, "cgroup.procs")) else "tasks")
        with open(procs, "w") as f:
            f.write(pid)
        throttled_from = (throttled_at or 0) + 1 if slow_from else 0
    rc = proc.wait()
    if cg:
        remove_cgroup(cg)
    else:
        throttled_from = None
    db = sqlite3.connect(store)
    named = [(n, s, m) for n, s, m in db.execute(
        "SELECT node, step, message FROM events WHERE job_id=? AND kind='straggler' ORDER BY id", (job,))]
    ratios = window_ratios(db, job)
    db.close()
    return rc, named, ratios, throttled_from


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--healthy", type=int, default=10)
    p.add_argument("--slow", type=int, default=3)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--slow-from-step", type=int, default=60)
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="straggler-bench-")
    try:
        false_runs, closest = 0, []
        for i in range(args.healthy):
            rc, named, ratios, _ = run(tmp, "healthy%d" % i, args.steps, False)
            worst = max(max(r) for r in ratios.values() if r)
            closest.append(worst)
            false_runs += bool(named)
            print("healthy run %d: rc %d, named %s, largest window ratio %.3f"
                  % (i, rc, [n for n, _, _ in named] or "nobody", worst), flush=True)
        detected, real, after = [], [], []
        for i in range(args.slow):
            rc, named, ratios, since = run(tmp, "slow%d" % i, args.steps, True, args.slow_from_step)
            first = next(((n, s) for n, s, _ in named), None)
            later = [r for w, r in enumerate(ratios.get("node2", [])) if (w + 1) * WINDOW >= since]
            real.append(statistics.median(later or [0]))
            if first and first[0] == "node2":
                detected.append(first[1])
                after.append(first[1] - since + 1)
            print("throttled run %d: rc %d, throttled from step %d, named %s at step %s (%s steps after); "
                  "node2's median window ratio since %.3f"
                  % (i, rc, since, [n for n, _, _ in named] or "nobody", first[1] if first else "-",
                     after[-1] if first and first[0] == "node2" else "-", real[-1]), flush=True)
        print("healthy: %d of %d runs named a node; largest healthy window ratio per run: min %.3f median %.3f "
              "max %.3f (threshold 1.07, 3 net slow windows to report)"
              % (false_runs, args.healthy, min(closest), statistics.median(closest), max(closest)))
        if args.slow:
            print("throttled (~%.0f %% slower): node2 named in %d of %d runs, at steps %s: %s steps after the "
                  "throttle began" % ((statistics.median(real) - 1) * 100, len(detected), args.slow, detected, after))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
