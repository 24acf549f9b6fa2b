"""Recovery while the store does not take writes (issue 21): a 2 x 2 DDP
job (a plain script, gloo, this machine) whose SQLite store another process
holds locked (BEGIN EXCLUSIVE) from just before a rank is killed until the
job has restarted; beside it, the same kill with the store free, in the same
run. Figures, from the controller's own clock (the API reads it while the
store is locked):

- detection: kill -9 -> the failure's detected time (its event's detail);
- recovery: kill -9 -> the new generation RUNNING in /api/v1/job;
- nodes declared lost (must be 0).

    /usr/bin/python3 bench/store_stall_bench.py [--runs 3] [--hold 30]
"""

import argparse
import json
import os
import signal
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from conftest import PYTHON, Job, api_url, wait_for  # noqa: E402

PLAIN_DDP = os.path.join(ROOT, "tests", "plain_ddp.py")


def job_view(url):
    with urllib.request.urlopen(url + "/api/v1/job", timeout=10) as r:
        return json.loads(r.read())


def one(locked, hold, i):
    tmp = tempfile.mkdtemp(prefix="tg-stall-")
    job = Job(tmp, "stall-%s-%d" % ("locked" if locked else "free", i),
              [PYTHON, PLAIN_DDP, "--steps", "100000", "--step-delay", "0.02", "--ckpt-every", "50",
               "--ckpt", os.path.join(tmp, "ck.pt"), "--out", os.path.join(tmp, "out")],
              flags=["--max-restarts", "1"])
    release = threading.Event()
    holder = None
    try:
        url = api_url(job)
        wait_for(lambda: job_view(url)["step"] >= 5, 120, "5 steps")
        pids = job.rank_pids()
        if locked:
            ready = threading.Event()

            def hold_lock():
                db = sqlite3.connect(job.store, timeout=30, isolation_level=None)
                db.execute("BEGIN EXCLUSIVE")
                ready.set()
                release.wait(hold)
                db.execute("COMMIT")
                db.close()

            holder = threading.Thread(target=hold_lock)
            holder.start()
            assert ready.wait(30)
        t_kill = time.time()
        os.kill(pids[3], signal.SIGKILL)
        wait_for(lambda: job_view(url)["generation"] >= 1 and job_view(url)["state"] == "RUNNING", 120,
                 "the restart")
        recovery = time.time() - t_kill
        still_locked = holder is not None and holder.is_alive()
        release.set()
        if holder:
            holder.join()
        job.proc.send_signal(signal.SIGINT)
        job.wait(120)
        failure = job.events("failure")[0]
        detection = failure["detail"]["detected_unix_ms"] / 1e3 - t_kill
        lost = len(job.events("node_lost"))
        return detection, recovery, lost, still_locked
    finally:
        release.set()
        if job.proc.poll() is None:
            job.proc.kill()
            job.proc.wait()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--hold", type=float, default=30)
    a = p.parse_args()
    rows = {}
    for locked in (False, True):
        rows[locked] = [one(locked, a.hold, i) for i in range(a.runs)]
    for locked in (False, True):
        r = rows[locked]
        print("%-22s detection median %6.0f ms (max %5.0f)   kill -> restarted median %5.2f s (max %5.2f)   "
              "nodes lost %d   lock still held at restart: %s" % (
                  "store locked %.0f s" % a.hold if locked else "store free (baseline)",
                  statistics.median(x[0] for x in r) * 1e3, max(x[0] for x in r) * 1e3,
                  statistics.median(x[1] for x in r), max(x[1] for x in r), sum(x[2] for x in r),
                  "/".join("yes" if x[3] else "no" for x in r) if locked else "-"))


if __name__ == "__main__":
    main()
