"""Restart against cold start, with warm standby ranks (docs/restart.md).

For each workload — the example job (examples/train_ddp.py) and an
import-heavy script that never imports trainguard (bench/heavy_train.py:
torch, SciPy, pandas, scikit-learn, SymPy) — on 2 nodes x 2 ranks (gloo):

  cold start  launch -> first step of generation 0 (the baseline, same job, same run)
  restart     all ranks stopped -> first step of generation 1, after rank 1
              is killed once every node's standbys are ready:
                warm         the default
                no-warm      --no-warm (every rank starts cold)
                spare        --spares 1; node1 is cordoned before the kill,
                             so a spare with its own standbys takes its place
                quick-repeat rank 1 killed 1.5 s after the first step of
                             generation 0 and again of generation 1, while
                             the standbys made after that step still import:
                             two restarts, each against the cold start

and the final parameters of each run beside a plain run's (four processes
with torchrun's environment, no supervisor): "identical" or not. The restart's
terms (rendezvous, process start, imports, process group, restore, first
step) come from the `downtime` event.

    /usr/bin/python3 bench/restart_bench.py [--runs 3] [--steps 300] [--modes warm,no-warm,spare,quick-repeat]
"""

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from conftest import EXAMPLE, PYTHON, TRAINGUARD, Job, free_port, wait_for  # noqa: E402

HEAVY = os.path.join(ROOT, "bench", "heavy_train.py")
READY = re.compile(r"warm standby of local rank \d+ ready")
TERMS = ("rendezvous_ms", "standby_wait_ms", "process_start_ms", "imports_ms", "pg_init_ms", "restore_ms", "first_step_ms")


def command(workload, tmp, steps, plain=False):
    script = EXAMPLE if workload == "example" else HEAVY
    argv = [PYTHON, script, "--steps", str(steps), "--ckpt-every", "20", "--ckpt-dir", os.path.join(tmp, "ckpt"),
            "--out", os.path.join(tmp, "sum")]
    if not plain:
        argv += ["--step-delay", "0.02"]
    if workload == "example" and plain:
        argv += ["--ckpt-engine", "torch"]
    return argv


def plain_checksum(workload, steps):
    tmp = tempfile.mkdtemp(prefix="tg-plain-")
    port = free_port()
    procs = []
    for rank in range(4):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank % 2), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT="0")
        env.pop("PYTHONPATH", None)
        procs.append(subprocess.Popen(command(workload, tmp, steps, plain=True), env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        for p in procs:
            if p.wait(timeout=600) != 0:
                raise SystemExit("the plain run of %s failed" % workload)
        with open(os.path.join(tmp, "sum")) as f:
            return f.read().strip()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def kill_after_first_step(job, generation, delay):
    """Kills rank 1 `delay` s after the first step of `generation` (or at
    once, if the controller heard of that step later); returns how long after
    that step the kill came."""
    def first():
        return [e for e in job.events("first_step") if e["generation"] == generation]
    wait_for(lambda: first() or job.proc.poll() is not None, 120, "the first step of generation %d" % generation)
    at = first()[0]["detail"]["first_step_unix_ms"] / 1000
    time.sleep(max(0.0, at + delay - time.time()))
    os.kill(job.rank_pids(generation)[1], signal.SIGKILL)
    return time.time() - at


def quick_repeat_run(workload, i, steps):
    tmp = tempfile.mkdtemp(prefix="tg-restart-")
    job = Job(tmp, "restart-%s-quick-%d" % (workload, i), command(workload, tmp, steps), flags=["--max-restarts", "3"])
    try:
        after = [kill_after_first_step(job, generation, 1.5) for generation in (0, 1)]
        if job.wait(600) != 0:
            raise SystemExit("%s quick-repeat run %d failed:\n%s" % (workload, i, job.output()[-3000:]))
        cold = [e for e in job.events("first_step") if e["generation"] == 0][0]["detail"]["since_launch_ms"]
        downs = [e["detail"] for e in job.events("downtime")]
        with open(os.path.join(tmp, "sum")) as f:
            checksum = f.read().strip()
        return cold / 1000, [d["restart_ms"] / 1000 for d in downs], [d.get("restart_terms", {}) for d in downs], \
            after, checksum
    finally:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGTERM)
            job.wait(60)
        shutil.rmtree(tmp, ignore_errors=True)


def report_quick_repeat(workload, runs, steps, reference):
    for i in range(runs):
        cold, restarts, terms, after, checksum = quick_repeat_run(workload, i, steps)
        for n, (restart, t, a) in enumerate(zip(restarts, terms, after)):
            print("%-8s quick-repeat run %d restart %d (kill %.2f s after the first step): restart %6.3f s   "
                  "cold start %6.3f s   ratio %.2f   %s" % (
                      workload, i, n + 1, a, restart, cold, restart / cold, "warm" if t.get("warm") else "cold"))
            print("         terms: " + " + ".join("%s %.3f" % (k[:-3], t.get(k, 0) / 1000) for k in TERMS))
        print("         parameters %s" % ("identical to a plain run" if checksum == reference
                                          else "DIFFER from a plain run"))


def one_run(workload, mode, i, steps):
    tmp = tempfile.mkdtemp(prefix="tg-restart-")
    flags = ["--max-restarts", "2"]
    nodes_needed = 4
    if mode == "no-warm":
        flags.append("--no-warm")
    if mode == "spare":
        flags += ["--spares", "1"]
        nodes_needed = 6  # the spare's two standbys as well
    job = Job(tmp, "restart-%s-%s-%d" % (workload, mode, i), command(workload, tmp, steps), flags=flags)
    try:
        # A checkpoint first, so that every restart restores one.
        wait_for(lambda: job.events("checkpoint_committed") or job.proc.poll() is not None, 120, "a checkpoint")
        if mode == "no-warm":
            pass
        else:
            wait_for(lambda: len(READY.findall(job.output())) >= nodes_needed or job.proc.poll() is not None,
                     120, "the standbys")
        if mode == "spare":
            subprocess.run([TRAINGUARD, "cordon", "--store", job.store, "node1", "--reason", "restart bench"],
                           check=True, capture_output=True)
        os.kill(job.rank_pids()[1], signal.SIGKILL)
        if job.wait(600) != 0:
            raise SystemExit("%s %s run %d failed:\n%s" % (workload, mode, i, job.output()[-3000:]))
        cold = [e for e in job.events("first_step") if e["generation"] == 0][0]["detail"]["since_launch_ms"]
        down = job.events("downtime")[0]["detail"]
        with open(os.path.join(tmp, "sum")) as f:
            checksum = f.read().strip()
        if mode == "spare":
            promoted = job.events("spare_promoted")
            if not promoted:
                raise SystemExit("no spare was promoted:\n" + job.event_lines()[-3000:])
        return cold / 1000, down["restart_ms"] / 1000, down.get("restart_terms", {}), checksum
    finally:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGTERM)
            job.wait(60)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workloads", default="example,heavy")
    ap.add_argument("--modes", default="warm,no-warm,spare,quick-repeat")
    args = ap.parse_args()
    med = statistics.median
    print("runs: %d per mode, 2 nodes x 2 ranks (gloo, CPU), medians; restart = all stopped -> first new step"
          % args.runs)
    for workload in args.workloads.split(","):
        reference = plain_checksum(workload, args.steps)
        for mode in args.modes.split(","):
            if mode == "quick-repeat":
                report_quick_repeat(workload, args.runs, args.steps, reference)
                continue
            colds, restarts, terms, same = [], [], {k: [] for k in TERMS}, True
            for i in range(args.runs):
                cold, restart, t, checksum = one_run(workload, mode, i, args.steps)
                colds.append(cold)
                restarts.append(restart)
                for k in TERMS:
                    terms[k].append(t.get(k, 0) / 1000)
                same = same and checksum == reference
            print("%-8s %-8s restart %6.3f s   cold start %6.3f s   ratio %.2f   parameters %s" % (
                workload, mode, med(restarts), med(colds), med(restarts) / med(colds),
                "identical to a plain run" if same else "DIFFER from a plain run"))
            print("         terms: " + " + ".join("%s %.3f" % (k[:-3], med(v)) for k, v in terms.items()))


if __name__ == "__main__":
    main()
