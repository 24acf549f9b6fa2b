"""False positives of the replica check and the numeric sentinels over
healthy runs (docs/sdc.md): N runs of the example job (2 nodes x 2 ranks,
DDP: one set of four replicas) and N runs of tests/tp_pp_dp.py with
--replicated-dp (8 ranks, TP x DP x PP: four sets of two data-parallel
peers; only the last stage computes a loss), none with a fault. A run counts
as a false positive if it has any replica_divergence, numeric_anomaly,
numeric_spike, sdc_confirmation or failure event, or does not succeed. The
figure beside it, from the same runs: how many fingerprint steps were
compared (the sets learned and each run's checkpoint_verified events).

    /usr/bin/python3 bench/sdc_false_positives.py [--runs 20]
"""

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("TRAINGUARD_BUILD", os.path.join(ROOT, "build"))
TRAINGUARD = os.path.join(BUILD, "trainguard")
PYTHON = "/usr/bin/python3"
BAD = ("replica_divergence", "numeric_anomaly", "numeric_spike", "sdc_confirmation", "failure")


def run(tmp, name, nnodes, nproc, command):
    store = os.path.join(tmp, "trainguard.db")
    argv = [TRAINGUARD, "run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc), "--store", store,
            "--job-id", name, "--run-dir", os.path.join(tmp, "run"), "--", *command]
    with open(os.path.join(tmp, "run.log"), "w") as log:
        rc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tmp, timeout=600).returncode
    con = sqlite3.connect(store)
    try:
        rows = con.execute("SELECT kind, detail_json FROM events WHERE job_id = ?", (name,)).fetchall()
    finally:
        con.close()
    kinds = [k for k, _ in rows]
    sets = [json.loads(d)["sets"] for k, d in rows if k == "replica_sets"]
    return rc, [k for k in kinds if k in BAD], sets, kinds.count("checkpoint_verified")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    workloads = {
        "example (DDP, 4 replicas)": (2, 2, [PYTHON, os.path.join(ROOT, "examples", "train_ddp.py"), "--steps", "300",
                                             "--ckpt-every", "20", "--step-delay", "0.01", "--ckpt-dir", "ckpt"]),
        "tp_pp_dp --replicated-dp": (4, 2, [PYTHON, os.path.join(ROOT, "tests", "tp_pp_dp.py"), "--steps", "200",
                                            "--step-delay", "0.01", "--replicated-dp"]),
    }
    for label, (nnodes, nproc, command) in workloads.items():
        false_positives, learned, verified = [], [], 0
        for i in range(args.runs):
            tmp = tempfile.mkdtemp(prefix="tg-sdcfp-")
            try:
                rc, bad, sets, ver = run(tmp, "fp%d" % i, nnodes, nproc, command)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            if rc != 0 or bad:
                false_positives.append((i, rc, bad))
            learned.append(json.dumps(sets))
            verified += ver
            print("  %s run %d: rc %d, sets %s, flagged %s" % (label, i, rc, sets, bad or "nothing"), flush=True)
        print("%s: %d false positive(s) in %d healthy runs; sets learned %s; %d checkpoint(s) verified"
              % (label, len(false_positives), args.runs, sorted(set(learned)), verified), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
