"""Issue 43's acceptance runs: a plain DDP script (bench/straggler_ddp.py, no
`import trainguard`) under `trainguard run`, 4 nodes x 1 rank on gloo.

  --slow-runs N      rank 2 (node2) computes --slow times as much from step
                     --slow-from on: named within 5 steps?
  --healthy-runs N   nothing wrong: is anybody named?
  --start-runs N     rank 2 slow from its first step: named within 15 steps?

For each run it prints who was named, at which step, after how many slow
steps, with the phase and the cause the event carries, and the job's median
step time; then the totals. Every naming of a node that was not slowed is
a false one. The script counts its steps from 1, trainguard (which counts
the optimizer's steps of a script that does not number them) from 0: the
script's step S is trainguard's S - 1.

    /usr/bin/python3 bench/straggler_acceptance.py [--slow-runs 10] [--healthy-runs 10] [--start-runs 3]
"""

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINGUARD = os.path.join(ROOT, "build", "trainguard")
SCRIPT = os.path.join(ROOT, "bench", "straggler_ddp.py")
PYTHON = "/usr/bin/python3"


def run(tmp, job, args, slow, slow_from):
    d = os.path.join(tmp, job)
    os.makedirs(d)
    store = os.path.join(d, "s.db")
    cmd = [TRAINGUARD, "run", "--nnodes", "4", "--nproc-per-node", "1", "--store", store, "--job-id", job,
           "--run-dir", os.path.join(d, "run"), "--", PYTHON, SCRIPT, "--steps", str(args.steps),
           "--hidden", str(args.hidden), "--slow", str(slow), "--slow-from", str(slow_from)]
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600).returncode
    db = sqlite3.connect(store)
    named = []
    for node, step, detail in db.execute(
            "SELECT node, step, detail_json FROM events WHERE job_id=? AND kind='straggler' ORDER BY id", (job,)):
        d = json.loads(detail or "{}")
        named.append({"node": node, "step": step, "phase": d.get("phase", ""), "cause": d.get("cause", ""),
                      "first_step": d.get("first_step"), "measure": d.get("measure", "")})
    steps = [s for (s,) in db.execute(
        "SELECT duration_us FROM step_timings WHERE job_id=? AND node='node0'", (job,)) if s]
    db.close()
    return rc, named, (statistics.median(steps) / 1000 if steps else 0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--slow-runs", type=int, default=10)
    p.add_argument("--healthy-runs", type=int, default=10)
    p.add_argument("--start-runs", type=int, default=3)
    p.add_argument("--slow", type=float, default=1.2)
    p.add_argument("--slow-from", type=int, default=120)
    p.add_argument("--steps", type=int, default=220)
    p.add_argument("--hidden", type=int, default=384)
    p.add_argument("--keep", help="keep the runs' stores in this directory")
    args = p.parse_args()
    tmp = args.keep or tempfile.mkdtemp(prefix="straggler-acceptance-")
    within, false_named, start_within, runs = [], [], [], []
    try:
        plan = ([("slow", args.slow, args.slow_from)] * args.slow_runs +
                [("healthy", 1.0, 0)] * args.healthy_runs + [("start", args.slow, 1)] * args.start_runs)
        for i, (kind, slow, slow_from) in enumerate(plan):
            rc, named, step_ms = run(tmp, "%s%d" % (kind, i), args, slow, slow_from)
            since = slow_from - 1  # trainguard's number of the first slow step
            wrong = [n for n in named if kind == "healthy" or n["node"] != "node2" or
                     (kind == "slow" and n["step"] < since)]
            right = next((n for n in named if n not in wrong), None)
            after = right["step"] - since + 1 if right else None
            false_named += [(kind, i, n) for n in wrong]
            if kind == "slow":
                within.append(after is not None and after <= 5)
            if kind == "start":
                start_within.append(after is not None and after <= 15)
            runs.append((kind, after))
            print("%-7s run %2d: rc %d, step %.0f ms, node2 named %s%s; false namings: %s" % (
                kind, i, rc, step_ms,
                "at step %d, its slow step no. %d, by %s, phase %r, cause %r" % (
                    right["step"], after, right["measure"] or "windows", right["phase"], right["cause"])
                if right else "never" if kind != "healthy" else "-",
                "" if not right else " (from step %s)" % right["first_step"],
                ["%s at %d (%s)" % (n["node"], n["step"], n["phase"]) for n in wrong] or "none"), flush=True)
        afters = [a for k, a in runs if k == "slow" and a is not None]
        print("\n%.2fx compute from the script's step %d: named within 5 steps in %d of %d runs "
              "(slow steps to naming: %s)" % (
            args.slow, args.slow_from, sum(within), len(within), sorted(afters)))
        print("healthy: %d of %d runs named somebody" % (
            len({i for k, i, _ in false_named if k == "healthy"}), args.healthy_runs))
        print("slow from the start: named within 15 steps in %d of %d runs (%s)" % (
            sum(start_within), len(start_within), [a for k, a in runs if k == "start"]))
        print("false namings in all runs: %d" % len(false_named))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
