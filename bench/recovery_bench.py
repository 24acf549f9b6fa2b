"""Detection and restart figures of trainguard on the example DDP job
(2 nodes x 2 ranks, gloo, this machine), each beside a baseline measured in
the same run:

- crash detection: kill -9 of a rank -> the controller's failure event.
  Baseline: kill -9 of a plain child process -> waitpid() returns in the
  killing process (the floor any supervisor can reach).
- hang detection: the rank's last step before its SIGSTOP -> failure event,
  minus --hang-timeout.
  Baseline: the heartbeat interval (the sampling period of the detector).
- restart: all ranks stopped -> first step of the new generation.
  Baseline: cold start of the same job, launch -> first step of generation 0.

    /usr/bin/python3 bench/recovery_bench.py [--runs 3]
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from conftest import EXAMPLE, PYTHON, Job, status_page_step, wait_for  # noqa: E402

HANG_TIMEOUT = 3.0
HEARTBEAT = 0.5


def example(tmp):
    return [PYTHON, EXAMPLE, "--steps", "100000", "--ckpt-every", "50", "--step-delay", "0.02",
            "--ckpt-dir", os.path.join(tmp, "ckpt")]


def at_step(job, rank, step):
    wait_for(lambda: any((status_page_step(job.job_id, n, rank) or -1) >= step
                         for n in ("node0", "node1")), 120, "rank %d at step %d" % (rank, step))


def one_fault(kind, i):
    tmp = tempfile.mkdtemp(prefix="tg-bench-")
    job = Job(tmp, "bench-%s-%d" % (kind, i), example(tmp),
              flags=["--hang-timeout", str(HANG_TIMEOUT), "--heartbeat-interval", str(HEARTBEAT),
                     "--max-restarts", "1"])
    try:
        pids = wait_for(lambda: len(job.rank_pids()) == 4 and job.rank_pids(), 60, "ranks")
        at_step(job, 1, 5)
        t_fault = time.time()
        os.kill(pids[1], signal.SIGKILL if kind == "crash" else signal.SIGSTOP)
        downtime = wait_for(lambda: job.events("downtime"), 120, "the restart's first step")[0]
        failure = job.events("failure")[0]
        if kind == "crash":
            detection = failure["wall_ns"] / 1e9 - t_fault
        else:
            # A hang starts at the rank's last step (a little before SIGSTOP):
            # the controller's own fault time, which the detail records.
            detection = failure["detail"]["detection_ms"] / 1000
        return detection, downtime["detail"]["restart_ms"] / 1000, downtime["detail"]["shutdown_ms"] / 1000, \
            first0_cold(job)
    finally:
        os.killpg(job.proc.pid, signal.SIGTERM)
        job.wait(60)


def first0_cold(job):
    """Launch -> first step of generation 0, as the controller recorded it."""
    first = [e for e in job.events("first_step") if e["generation"] == 0][0]
    return first["detail"]["since_launch_ms"] / 1000


def waitpid_baseline():
    p = subprocess.Popen(["sleep", "60"])
    time.sleep(0.05)
    t = time.time()
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    return time.time() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    crash, hang, restart, shutdown, cold = [], [], [], [], []
    for i in range(args.runs):
        d, r, s, c = one_fault("crash", i)
        crash.append(d), restart.append(r), shutdown.append(s), cold.append(c)
        d, r, s, c = one_fault("hang", i)
        hang.append(d - HANG_TIMEOUT), restart.append(r), shutdown.append(s), cold.append(c)
    base = statistics.median(waitpid_baseline() for _ in range(20))
    med = statistics.median
    print("runs: %d per fault kind, 2 nodes x 2 ranks, heartbeat %.1f s, hang timeout %.1f s"
          % (args.runs, HEARTBEAT, HANG_TIMEOUT))
    print("crash detection (kill -9 -> failure event): %8.3f s   baseline waitpid after kill: %.4f s"
          % (med(crash), base))
    print("hang detection beyond the timeout (from the last step): %5.3f s   baseline heartbeat interval: %.3f s"
          % (med(hang), HEARTBEAT))
    print("shutdown (detection -> all ranks stopped)  : %8.3f s   (hangs include the stack capture)"
          % med(shutdown))
    print("restart (stopped -> first new step)        : %8.3f s   baseline cold start to first step: %.3f s"
          % (med(restart), med(cold)))


if __name__ == "__main__":
    main()
