"""Failure to the first step of the next generation when a node must go,
beside a plain restart measured in the same run (the example DDP job,
2 nodes x 1 rank, gloo, this machine):

- plain restart: rank 1 crashes (user code); the same nodes restart.
- eviction, spare: rank 1 reports an Xid 79 (GPU off the bus): its node is
  evicted and cordoned; the idle spare (`--spares 1`) takes its group rank.
- eviction, no spare: the same, and `run` starts a new agent in its place
  (the stand-in for a scheduler allocating a node).
- eviction, spare, diagnosed: `--spares 1 --diagnose quick`: a diagnosis
  round of the three agents (one at a time: they share this host) runs
  between the stop and the restart.

Each figure is the failure event -> the first step of generation 1, median
of --runs, with its two parts from the incident's downtime accounting.

    /usr/bin/python3 bench/spare_bench.py [--runs 3]
"""

import argparse
import os
import signal
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from conftest import EXAMPLE, PYTHON, Job, gpu_fault_env, wait_for  # noqa: E402

SCENARIOS = [
    ("plain restart (crash, same nodes)", ["--crash-at-step", "20"], []),
    ("eviction, spare takes the place", ["--xid-at-step", "20"], ["--spares", "1"]),
    ("eviction, new node started", ["--xid-at-step", "20"], []),
    ("eviction, spare, quick diagnosis round", ["--xid-at-step", "20"], ["--spares", "1", "--diagnose", "quick"]),
]


def one(label, fault, flags, i):
    tmp = tempfile.mkdtemp(prefix="tg-spare-bench-")
    job = Job(tmp, "spare-bench-%d" % i, [PYTHON, EXAMPLE, "--steps", "60", "--ckpt-every", "10",
                                          "--ckpt-dir", os.path.join(tmp, "ckpt"), "--crash-rank", "1", *fault],
              nnodes=2, nproc=1, flags=[*flags, "--max-restarts", "2"], env=gpu_fault_env(tmp))
    try:
        rc = job.wait(240)
        assert rc == 0, job.output()[-2000:]
        failure = job.events("failure")[0]
        first = [e for e in job.events("first_step") if e["generation"] == 1][0]
        downtime = job.events("downtime")[0]["detail"]
        return ((first["wall_ns"] - failure["wall_ns"]) / 1e9, downtime["shutdown_ms"] / 1e3,
                downtime["restart_ms"] / 1e3)
    finally:
        try:
            os.killpg(job.proc.pid, signal.SIGKILL)
        except OSError:
            pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    results = {label: [] for label, _, _ in SCENARIOS}
    for i in range(args.runs):  # interleaved, so that the machine's slow spells hit every scenario
        for label, fault, flags in SCENARIOS:
            results[label].append(one(label, fault, flags, i))
    print("failure -> first step of the next generation, 2 nodes x 1 rank, median of %d" % args.runs)
    print("  (shutdown: failure -> every rank stopped; restart: stopped -> first step, diagnosis included)")
    med = statistics.median
    base = med(r[0] for r in results[SCENARIOS[0][0]])
    for label, _, _ in SCENARIOS:
        total = med(r[0] for r in results[label])
        print("  %-40s %6.2f s  (%+.2f s against the plain restart; shutdown %.2f s, restart %.2f s)"
              % (label, total, total - base, med(r[1] for r in results[label]), med(r[2] for r in results[label])))


if __name__ == "__main__":
    main()
