"""Kill trials with real PyTorch ranks (gloo) and the Python Checkpointer
(issue 7): ranks save a state that differs between attempts, one random rank
or all ranks are SIGKILLed at a seeded random moment (while saving,
persisting, committing or retiring old steps), and the next launch restarts
from the newest complete checkpoint (sometimes the one before, so committed
steps are saved again). Every restore must be exactly one attempt's save of
that step, on every rank; every step `ckpt ls` calls complete must pass
`ckpt verify`, and no committed step may be torn.

TG_KILL_TRIALS_PY (default 50) and TG_KILL_SEED_PY (printed) repeat or extend it.
"""

import json
import os
import random
import select
import signal
import subprocess
import time

import pytest

from conftest import BUILD, PYTHON, TRAINGUARD, free_port, wait_for

ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt_kill_zygote.py")


class Zygote:
    def __init__(self, tmp):
        env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
        env.pop("TRAINGUARD_STATUS_PAGE", None)
        self.proc = subprocess.Popen([PYTHON, ZYGOTE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, timeout, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "the rank launcher did not answer %s within %d s" % (cmd["cmd"], timeout)
        return json.loads(self.proc.stdout.readline())

    def close(self):
        try:
            self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except Exception:
            self.proc.kill()


def rank_events(log, rank):
    try:
        with open("%s-%d.jsonl" % (log, rank)) as f:
            return [json.loads(l) for l in f if l.endswith("\n")]
    except OSError:
        return []


def rank_log(log, rank):
    try:
        with open("%s-%d.log" % (log, rank)) as f:
            return f.read()[-3000:]
    except OSError:
        return ""


def check_directory(d, context):
    listing = json.loads(subprocess.run([TRAINGUARD, "ckpt", "ls", "--json", d], check=True,
                                        capture_output=True, text=True).stdout)
    for c in listing:
        assert c["committed"] == c["complete"], "%s: step %d committed but torn: %s" % (
            context, c["step"], c["problem"])
        if c["complete"]:
            v = subprocess.run([TRAINGUARD, "ckpt", "verify", d, str(c["step"])],
                               capture_output=True, text=True)
            assert v.returncode == 0, "%s: ls calls step %d complete, verify says: %s" % (
                context, c["step"], v.stdout + v.stderr)
    return listing


@pytest.mark.parametrize("world,numel,keep_last,default_trials", [
    (3, 1 << 18, None, 50),   # DDP replicas, keep_last drawn from 1..3
    (1, 4 << 20, 1, 20),      # one rank, 16 MiB + 2 MiB, keep_last=1: kills during retention
], ids=["3-ranks", "1-rank-retention"])
def test_kills_at_random_moments_never_restore_a_mixed_or_torn_state(tmp_path, world, numel,
                                                                     keep_last, default_trials):
    WORLD = world
    trials = int(os.environ.get("TG_KILL_TRIALS_PY", str(default_trials)))
    seed = int(os.environ.get("TG_KILL_SEED_PY", str(time.time_ns() % 10**9)))
    print("python kill trials: %d, TG_KILL_SEED_PY=%d" % (trials, seed))
    rng = random.Random(seed)
    d = str(tmp_path / "ck")
    zygote = Zygote(tmp_path)
    full_run = None  # seconds an unkilled launch saves for (launch 0 measures it)
    tally = {"one": 0, "all": 0, "restored": 0, "previous": 0}
    try:
        for k in range(trials + 1):  # the last launch only checks the last kill's restore
            context = "launch %d (repeat with TG_KILL_SEED_PY=%d)" % (k, seed)
            log = str(tmp_path / ("launch-%d" % k))
            restart_from = "previous" if rng.random() < 0.25 else "latest"
            pids = zygote.ask(30, cmd="launch", attempt=k, world=WORLD, port=free_port(), dir=d,
                              keep_last=keep_last or rng.randint(1, 3), numel=numel, saves=6,
                              restart_from=restart_from, log=log)["pids"]
            try:
                loaded = wait_for(lambda: all(any(e["event"] == "loaded" for e in rank_events(log, r))
                                              for r in range(WORLD)) and
                                  [next(e for e in rank_events(log, r) if e["event"] == "loaded")
                                   for r in range(WORLD)],
                                  60, "every rank of %s to restore" % context)
            except AssertionError as e:  # what the ranks printed by then, and what they did
                raise AssertionError("%s: %s; events %s" % (e, [rank_log(log, r) for r in range(WORLD)],
                                                             [rank_events(log, r) for r in range(WORLD)])) from None
            t_loaded = time.monotonic()
            steps = {(e["step"], e["attempt"]) for e in loaded}
            assert len(steps) == 1, "%s: ranks restored different saves: %s" % (context, loaded)
            if k > 0:
                assert loaded[0]["step"] is not None, "%s: nothing restored" % context
                assert all(e["whole"] for e in loaded), "%s: MIXED restore: %s" % (context, loaded)
                assert loaded[0]["attempt"] < k
                tally["restored"] += 1
                tally["previous"] += restart_from == "previous"
            if k == trials:
                for p in pids:
                    os.kill(p, signal.SIGKILL)
                zygote.ask(60, cmd="reap")
                break
            if k == 0:
                wait_for(lambda: all(any(e["event"] == "done" for e in rank_events(log, r))
                                     for r in range(WORLD)), 120, "launch 0 to finish")
                full_run = time.monotonic() - t_loaded
            else:
                time.sleep(rng.uniform(0, full_run * 1.1))
                if rng.random() < 0.5:
                    os.kill(rng.choice(pids), signal.SIGKILL)  # one rank dies ...
                    time.sleep(rng.uniform(0, 0.05))           # ... the supervisor stops the rest
                    tally["one"] += 1
                else:
                    tally["all"] += 1
                for p in pids:
                    try:
                        os.kill(p, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            status = zygote.ask(60, cmd="reap")["status"]
            if k == 0:
                assert status == [0] * WORLD, [rank_log(log, r) for r in range(WORLD)]
            check_directory(d, context)
    finally:
        zygote.close()
    print("python kill trials: %d restores checked (%d from the step before the newest); "
          "killed one rank %d times, all ranks %d times; unkilled launch saved for %.2f s"
          % (tally["restored"], tally["previous"], tally["one"], tally["all"], full_run or 0))
    assert tally["restored"] == trials
