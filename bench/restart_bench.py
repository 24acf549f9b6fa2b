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

and the final parameters of each run beside a plain run's (four processes
with torchrun's environment, no supervisor): "identical" or not. The restart's
terms (rendezvous, process start, imports, process group, restore, first
step) come from the `downtime` event.

    /usr/bin/python3 bench/restart_bench.py [--runs 3] [--steps 300]
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from conftest import EXAMPLE, PYTHON, TRAINGUARD, Job, free_port, wait_for  # noqa: E402

HEAVY = os.path.join(ROOT, "bench", "heavy_train.py")
READY = re.compile(r"warm standby of local rank \d+ ready")
TERMS = ("rendezvous_ms", "process_start_ms", "imports_ms", "pg_init_ms", "restore_ms", "first_step_ms")


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
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise SystemExit("the plain run of %s failed" % workload)
    with open(os.path.join(tmp, "sum")) as f:
        return f.read().strip()


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workloads", default="example,heavy")
    args = ap.parse_args()
    med = statistics.median
    print("runs: %d per mode, 2 nodes x 2 ranks (gloo, CPU), medians; restart = all stopped -> first new step"
          % args.runs)
    for workload in args.workloads.split(","):
        reference = plain_checksum(workload, args.steps)
        for mode in ("warm", "no-warm", "spare"):
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
