"""save_every="auto" against a fixed interval ten times as long, side by side
(docs/checkpoint_policy.md).

Two runs of the example job (examples/train_ddp.py, 2 nodes x 2 ranks,
gloo) with the same failures: a rank killed every --fail-every seconds of
training, --kills times. The first saves by the controller's plan
(`--ckpt-every auto`, the failure prior set to the failures it will get:
4 GPUs failing every --fail-every s); the second every 10 x the K the first
settled on (the baseline, same run). For each: the plan's interval beside
√(2·δ·M) for the δ and M the job itself reports, the K the ranks kept, the
saves, the work lost at the failures (the downtime report's lost work), ETTR,
and the final parameters beside a plain run's.

    /usr/bin/python3 bench/checkpoint_plan_bench.py [--steps 1500] [--fail-every 8] [--kills 4]
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from conftest import EXAMPLE, PYTHON, TRAINGUARD, Job, plain_example_checksum, wait_for  # noqa: E402

SAID = re.compile(r"\[rank0\]: trainguard: checkpoint every (\d+) step\(s\), ([0-9.]+) s")


def run(tmp, name, every, steps, fail_every, kills, prior, min_interval):
    d = os.path.join(tmp, name)
    os.makedirs(d)
    job = Job(d, name, [PYTHON, EXAMPLE, "--steps", str(steps), "--ckpt-every", str(every), "--step-delay", "0.02",
                        "--ckpt-dir", os.path.join(d, "ckpt"), "--out", os.path.join(d, "sum")],
              flags=["--failure-prior", str(prior), "--checkpoint-min-interval", str(min_interval),
                     "--max-restarts", str(kills + 2)])
    try:
        for generation in range(kills):
            wait_for(lambda: any(e["generation"] == generation for e in job.events("first_step"))
                     or job.proc.poll() is not None, 180, "generation %d's first step" % generation)
            deadline = time.monotonic() + fail_every
            while time.monotonic() < deadline and job.proc.poll() is None:
                time.sleep(0.1)
            pids = job.rank_pids(generation)
            if job.proc.poll() is not None or 1 not in pids:
                break
            os.kill(pids[1], signal.SIGKILL)
        rc = job.wait(600)
    finally:
        job.end()
    report = json.loads(subprocess.run([TRAINGUARD, "report", "--store", job.store, "--json", name],
                                       capture_output=True, text=True, check=True).stdout)
    plan = job.events("checkpoint_plan")
    said = SAID.findall(job.output())
    with open(os.path.join(d, "sum")) as f:
        checksum = f.read().strip()
    return {"rc": rc, "report": report, "plans": [e["detail"] for e in plan],
            "said": [(int(k), float(s)) for k, s in said], "k": int(said[-1][0]) if said else every,
            "saves": len(job.events("checkpoint_committed")), "checksum": checksum}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--fail-every", type=float, default=8.0, help="seconds of training between kills")
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--min-interval", type=float, default=0.05, help="--checkpoint-min-interval of both runs")
    args = ap.parse_args()
    # 4 GPUs, a failure every fail_every seconds: failures per 1000 GPU-hours.
    prior = 1000 * 3600 / args.fail_every / 4
    tmp = tempfile.mkdtemp(prefix="tg-plan-bench-")
    try:
        plain_dir = os.path.join(tmp, "plain")
        os.makedirs(plain_dir)
        reference = plain_example_checksum(plain_dir, args.steps)
        auto = run(tmp, "auto", "auto", args.steps, args.fail_every, args.kills, prior, args.min_interval)
        fixed = run(tmp, "fixed", 10 * auto["k"], args.steps, args.fail_every, args.kills, prior, args.min_interval)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    plans = auto["plans"]
    for i, p in enumerate(plans):
        optimum = math.sqrt(2 * p["save_cost_s"] * p["job_mtbf_s"])
        print("plan %d: every %.2f s to memory; sqrt(2*C*M) = %.3f s for the C %.4f s and MTBF %.1f s it states%s"
              % (i + 1, p["memory_interval_s"], optimum, p["save_cost_s"], p["job_mtbf_s"],
                 " (the minimum interval %.2f s binds)" % args.min_interval
                 if p["memory_interval_s"] <= args.min_interval * 1.001 else
                 " (%.0f %% off)" % (100 * abs(p["memory_interval_s"] - optimum) / optimum)))
    print("the ranks: " + ", ".join("K %d (%.2f s)" % (k, s) for k, s in auto["said"]))
    print("%-22s %6s %6s %8s %9s %7s %7s  %s" % ("run", "K", "saves", "lost s", "lost steps", "restarts", "ETTR",
                                                 "parameters"))
    for name, r in (("auto (the plan)", auto), ("fixed, 10 x K", fixed)):
        rep = r["report"]
        print("%-22s %6d %6d %8.2f %9d %7d %6.1f%%  %s" % (
            name, r["k"], r["saves"], rep["downtime"]["lost_work_s"], rep["downtime"]["lost_steps"],
            rep["restarts"], 100 * (rep["ettr"] or 0),
            "identical to a plain run" if r["checksum"] == reference else "DIFFERENT from a plain run"))
    lost_auto, lost_fixed = auto["report"]["downtime"]["lost_work_s"], fixed["report"]["downtime"]["lost_work_s"]
    print("lost work: auto %.2f s, fixed %.2f s (%.2fx)" % (lost_auto, lost_fixed,
                                                            lost_auto / lost_fixed if lost_fixed else float("nan")))
    for name, r in (("auto", auto), ("fixed", fixed)):
        line = r["report"].get("checkpoints", {}).get("line")
        if line:
            print("%s: %s" % (name, line))


if __name__ == "__main__":
    main()
