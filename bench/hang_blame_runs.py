"""Who is blamed for a stalled rank of an unmodified DDP script on torch
1.13 (DDP's bucket all-reduces are not journaled there), over N runs: a
random rank of 2 nodes x 2 ranks stops inside its loop at a random step.
A run is right when the failure event, the attribution (incident),
`trainguard hang --json` and `trainguard report --json` all name that rank
and only its node. Beside it, from the same runs, the baseline: the rank
the hang detector noticed first (the one longest without progress when the
timeout expired), which is what `hang` named before it read the incident.

    /usr/bin/python3 bench/hang_blame_runs.py [--runs 10]
"""

import argparse
import json
import os
import random
import shutil
import sqlite3
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("TRAINGUARD_BUILD", os.path.join(ROOT, "build"))
TRAINGUARD = os.path.join(BUILD, "trainguard")
PYTHON = "/usr/bin/python3"


def events(store, job, kind):
    con = sqlite3.connect(store)
    try:
        rows = con.execute("SELECT rank, node, message, detail_json FROM events WHERE job_id = ? AND kind = ?",
                           (job, kind)).fetchall()
    finally:
        con.close()
    return [{"rank": r, "node": n, "message": m, "detail": json.loads(d)} for r, n, m, d in rows]


def one_run(tmp, stalled, step):
    store = os.path.join(tmp, "trainguard.db")
    command = [PYTHON, os.path.join(ROOT, "tests", "plain_ddp.py"), "--steps", str(step + 15),
               "--step-delay", "0.05", "--sleep-rank", str(stalled), "--sleep-at-step", str(step),
               "--ckpt", os.path.join(tmp, "ck.pt"), "--out", os.path.join(tmp, "sum.txt")]
    argv = [TRAINGUARD, "run", "--nnodes", "2", "--nproc-per-node", "2", "--store", store, "--job-id", "stall",
            "--run-dir", os.path.join(tmp, "run"), "--hang-timeout", "3", "--heartbeat-interval", "0.5",
            "--stop-grace", "1", "--", *command]
    with open(os.path.join(tmp, "run.log"), "w") as log:
        rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp, timeout=600).returncode
    failure = events(store, "stall", "failure")[0]
    attribution = events(store, "stall", "attribution")[0]["detail"]
    hang = json.loads(subprocess.run([TRAINGUARD, "hang", "--store", store, "stall", "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    report = json.loads(subprocess.run([TRAINGUARD, "report", "--store", store, "stall", "--json"],
                                       capture_output=True, text=True, check=True).stdout)["incidents"][0]
    hung = failure["detail"].get("hung_ranks", [])
    noticed = max(hung, key=lambda e: e["age_ms"])["rank"] if hung else -1
    views = {
        "failure": ([failure["rank"]], None),
        "incident": (attribution["culprit_ranks"], attribution["culprit_nodes"]),
        "hang": (hang["culprit_ranks"], hang["culprit_nodes"]),
        "report": (report.get("culprit_ranks"), report.get("culprit_nodes")),
    }
    node = "node%d" % (stalled // 2)
    right = rc == 0 and all(r == [stalled] and n in (None, [node]) for r, n in views.values())
    return right, noticed == stalled, views, attribution.get("culprit_evidence", "")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    right = noticed_right = 0
    for i in range(args.runs):
        stalled, step = rng.randrange(4), rng.randrange(3, 11)
        tmp = tempfile.mkdtemp(prefix="tg-blame-")
        try:
            ok, noticed_ok, views, why = one_run(tmp, stalled, step)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        right += ok
        noticed_right += noticed_ok
        print("run %2d: rank %d stalled at step %2d: %s%s; %s" %
              (i + 1, stalled, step, "right" if ok else "WRONG ",
               "" if ok else " " + json.dumps(views), why), flush=True)
    print("one right culprit everywhere: %d/%d runs; baseline (the rank noticed first): %d/%d" %
          (right, args.runs, noticed_right, args.runs))


if __name__ == "__main__":
    main()
