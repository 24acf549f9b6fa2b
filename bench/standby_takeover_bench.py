"""Takeover by a standby controller (docs/standby.md), against the restart
of a lone controller, measured in the same run.

A 2 nodes x 2 ranks DDP job (tests/plain_ddp.py, no `import trainguard`) with
two `trainguard controller` processes on one real PostgreSQL store; after
20 steps the leader is lost, `--runs` times each way:

  kill -9   the leader's process dies (its sessions close at once)
  SIGSTOP   the leader is paused (its sessions stay open: the agents notice
            its silence), continued after the takeover: it steps down

For each: leader lost -> the standby recorded that it took the job
(`controller_restarted`) -> every agent back with its ranks (`job_resumed`).
The baseline: the same job with one controller on a SQLite store, killed and
started again at once with the same line (as an operator or a supervisor
would; docs/events.md, "controller restarts").

    /usr/bin/python3 bench/standby_takeover_bench.py [--runs 10]
"""

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from conftest import PostgresServer, events, wait_for  # noqa: E402
from test_controller_restart import Cluster  # noqa: E402
from test_standby import Pair, takeover_seconds  # noqa: E402


def takeover(pg, how, i):
    tmp = tempfile.mkdtemp(prefix="tg-standby-bench-")
    pair = Pair(tmp, pg, "bench-%s-%d" % (how, i), steps=100000)
    try:
        pair.wait_for(lambda: pair.step("host1", 3) >= 20, 120, "20 steps on every rank")
        pair.controllers[0].send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        lost_at = time.time()
        pair.wait_for(lambda: "job_resumed" in pair.kinds(), 60, "the takeover")
        return takeover_seconds(pair.events(), lost_at)
    finally:
        pair.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)


def restart(i):
    tmp = tempfile.mkdtemp(prefix="tg-restart-bench-")
    c = Cluster(tmp, "bench-restart-%d" % i, steps=100000)
    try:
        c.wait_for(lambda: c.step("host1", 3) >= 20, 120, "20 steps on every rank")
        c.controllers[0].kill()
        lost_at = time.time()
        c.controllers[0].wait()
        c.start_controller()
        c.wait_for(lambda: any(e["kind"] == "job_resumed" for e in events(c.store, c.job_id)), 60, "the restart")
        return takeover_seconds(events(c.store, c.job_id), lost_at)
    finally:
        c.kill_all()
        shutil.rmtree(tmp, ignore_errors=True)


def line(name, runs):
    led = [r[0] for r in runs]
    followed = [r[1] for r in runs]
    return "%-34s led: median %.1f s, max %.1f s   every agent back: median %.1f s, max %.1f s   (%d runs)" % (
        name, statistics.median(led), max(led), statistics.median(followed), max(followed), len(runs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    pg = PostgresServer()
    try:
        kills = [takeover(pg, "kill", i) for i in range(args.runs)]
        pauses = [takeover(pg, "stop", i) for i in range(args.runs)]
    finally:
        pg.stop()
    restarts = [restart(i) for i in range(max(3, args.runs // 3))]
    print(line("standby takeover after kill -9", kills))
    print(line("standby takeover after SIGSTOP", pauses))
    print(line("baseline: the same line again", restarts))


if __name__ == "__main__":
    main()
