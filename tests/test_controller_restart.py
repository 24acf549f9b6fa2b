"""The controller survives its own restart: `kill -9` of the controller of a
running 2x2 job, then the same `trainguard controller` line again. The
agents keep their ranks running (same PIDs) and reconnect, the job goes on
and completes, and the store has every event once, with the restart in it.
A rank that dies while the controller is away is handled once it is back.
Real processes, a DDP script that does not import trainguard."""

import os
import signal
import sqlite3
import subprocess

import pytest

from conftest import PYTHON, ROOT, TRAINGUARD, alive, events, free_port, status_page_step, wait_for

PLAIN_DDP = os.path.join(ROOT, "tests", "plain_ddp.py")


class Cluster:
    """A controller and two agents started by hand, as on two hosts."""

    def __init__(self, tmp_path, job_id, steps, script_args=()):
        self.tmp = str(tmp_path)
        self.job_id = job_id
        self.port = free_port()
        self.store = os.path.join(self.tmp, "ctl.db")
        secret = os.path.join(self.tmp, "secret")
        with open(secret, "w") as f:
            f.write("a job secret\n")
        self.controller_argv = [
            TRAINGUARD, "controller", "--listen", "127.0.0.1:%d" % self.port, "--nnodes", "2",
            "--nproc-per-node", "2", "--store", self.store, "--job-id", job_id, "--secret-file", secret,
            "--reconnect-window", "30", "--max-restarts", "2", "--run-dir", os.path.join(self.tmp, "ctl"), "--",
            PYTHON, PLAIN_DDP, "--steps", str(steps), "--step-delay", "0.05", "--ckpt-every", "10",
            "--ckpt", os.path.join(self.tmp, "ck.pt"), "--out", os.path.join(self.tmp, "out"), *script_args]
        self.controllers = []
        self.start_controller()
        self.agents = []
        for i in range(2):
            log = open(os.path.join(self.tmp, "agent%d.log" % i), "w")
            self.agents.append(subprocess.Popen(
                [TRAINGUARD, "agent", "--controller", "127.0.0.1:%d" % self.port, "--node-id", "host%d" % i, "--group-rank", str(i),
                 "--run-dir", os.path.join(self.tmp, "host%d" % i), "--secret-file", secret,
                 "--reconnect-window", "30", "--quiet"],
                stdout=log, stderr=subprocess.STDOUT))

    def start_controller(self):
        log = open(os.path.join(self.tmp, "controller%d.log" % len(self.controllers)), "w")
        self.controllers.append(subprocess.Popen(self.controller_argv, stdout=log, stderr=subprocess.STDOUT))

    def restart_controller_and_finish(self):
        """The same controller line again; the job and its agents end well."""
        self.start_controller()
        assert self.controllers[-1].wait(timeout=240) == 0, self.log("controller1.log")[-3000:]
        for a in self.agents:
            assert a.wait(timeout=60) == 0

    def wait_controller(self, timeout):
        """The newest controller's exit code; past `timeout`, a failure that
        shows what the job did by then (its events, the controller's log)."""
        try:
            return self.controllers[-1].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            said = "\n".join("%s gen %s %s: %s" % (e["kind"], e["generation"], e["node"], e["message"][:300])
                             for e in events(self.store, self.job_id))
            pytest.fail("the controller did not end within %d s; events:\n%s\ncontroller%d.log:\n%s"
                        % (timeout, said, len(self.controllers) - 1,
                           self.log("controller%d.log" % (len(self.controllers) - 1))[-4000:]))

    def log(self, name):
        with open(os.path.join(self.tmp, name)) as f:
            return f.read()

    def step(self, node, rank):
        agent = self.agents[int(node[len("host"):])].pid
        return status_page_step(self.job_id, node, rank, agent) or -1

    def rank_pids(self):
        pids = {}
        for e in events(self.store, self.job_id):
            if e["kind"] == "ranks_started" and e["generation"] == 0:
                pids.update({int(r): p for r, p in e["detail"]["pids"].items()})
        return pids

    def stored(self):
        with sqlite3.connect(self.store) as db:
            return db.execute("SELECT id, kind, node, rank, step, message FROM events WHERE job_id=? ORDER BY id",
                              (self.job_id,)).fetchall()

    def wait_for(self, predicate, timeout, what):
        """conftest's wait_for, with the controllers' and agents' logs and the
        job's events in the message when it times out."""
        try:
            return wait_for(predicate, timeout, what)
        except AssertionError as e:
            logs = ""
            for name in sorted(os.listdir(self.tmp)):
                if name.endswith(".log"):
                    logs += "\n--- %s:\n%s" % (name, self.log(name)[-2000:])
            stored = "\n".join("%s %s" % (row[1], row[5][:160]) for row in self.stored()) \
                if os.path.exists(self.store) else "(no store)"
            raise AssertionError("%s%s\n--- events:\n%s" % (e, logs, stored[-4000:])) from None

    def kill_all(self):
        for p in self.controllers + self.agents:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_kill_9_of_the_controller_and_a_restart_leave_the_ranks_running_and_the_job_completes(tmp_path, no_leftovers):
    c = Cluster(tmp_path, "survivor", steps=200)
    try:
        c.wait_for(lambda: c.step("host1", 3) >= 20, 120, "20 steps on every rank")
        pids = c.rank_pids()
        assert sorted(pids) == [0, 1, 2, 3]
        before = c.stored()
        c.controllers[0].send_signal(signal.SIGKILL)
        c.controllers[0].wait()
        # Without a controller the ranks train on.
        stepped = c.step("host0", 0)
        c.wait_for(lambda: c.step("host0", 0) >= stepped + 10, 60, "steps while the controller is away")
        assert all(alive(p) for p in pids.values())
        c.restart_controller_and_finish()
    finally:
        c.kill_all()
    after = c.stored()
    # Nothing recorded before the kill is lost or changed; nothing is recorded twice.
    assert after[:len(before)] == before
    kinds = [row[1] for row in after]
    for once in ["job_created", "generation_started", "first_step", "controller_restarted", "job_resumed",
                 "job_succeeded", "replica_sets", "layout"]:
        assert kinds.count(once) == 1, (once, kinds)
    # What the monitors learned before the kill goes on after it: nothing of
    # it is recorded a second time.
    for kind in ["checkpoint_verified", "straggler", "torch_checkpoint_dir"]:
        rows = [row[2:] for row in after if row[1] == kind]
        assert len(rows) == len(set(rows)), (kind, rows)
    assert kinds.count("ranks_started") == 2 and kinds.count("node_reconnected") == 2, kinds
    assert "failure" not in kinds and "restarting" not in kinds, kinds
    committed = [row[4] for row in after if row[1] == "checkpoint_committed"]
    assert committed == sorted(set(committed)), committed
    # The same rank processes ran the job to its end.
    reconnected = {}
    for e in events(c.store, "survivor"):
        if e["kind"] == "node_reconnected":
            reconnected.update({int(r): p for r, p in e["detail"]["pids"].items()})
    assert reconnected == pids
    log = c.log("controller1.log")
    assert "taking it back" in log and "SUCCEEDED: all 4 ranks exited 0 at step 199 after 0 restart(s)" in log, log[-3000:]
    assert "reconnected to the controller" in c.log("agent0.log")


def test_a_rank_that_dies_while_the_controller_is_away_is_handled_when_it_is_back(tmp_path, no_leftovers):
    c = Cluster(tmp_path, "orphaned", steps=120)
    try:
        c.wait_for(lambda: c.step("host1", 3) >= 15, 120, "15 steps on every rank")
        pids = c.rank_pids()
        c.controllers[0].send_signal(signal.SIGKILL)
        c.controllers[0].wait()
        os.kill(pids[3], signal.SIGKILL)
        c.wait_for(lambda: not alive(pids[3]), 10, "rank 3 to die")
        c.restart_controller_and_finish()
    finally:
        c.kill_all()
    evs = events(c.store, "orphaned")
    kinds = [e["kind"] for e in evs]
    restarted = kinds.index("controller_restarted")
    failures = [e for e in evs if e["kind"] == "failure"]
    assert len(failures) == 1 and failures[0]["rank"] == 3, failures
    assert kinds.index("failure") > restarted
    assert "killed by SIGKILL" in failures[0]["message"] or "signal 9" in failures[0]["message"], failures[0]
    assert kinds.count("generation_started") == 2 and kinds[-1] == "job_succeeded", kinds


def test_a_deterministic_bug_stops_at_its_first_repeat_across_a_kill_9_of_the_controller(tmp_path, no_leftovers):
    """Issue 21: the recovery policy's memory is part of the job's status. Rank
    1 raises the same ValueError at step 35 in every run (5 steps after its checkpoint); the controller is
    killed (kill -9) right after it decided to restart once, and started
    again: the job still stops at the first repeat, with the same reason as
    without the controller's restart, instead of restarting it again."""
    c = Cluster(tmp_path, "determined", steps=200, script_args=["--raise-at-step", "35", "--die-rank", "1"])
    try:
        c.wait_for(lambda: [e for e in events(c.store, "determined") if e["kind"] == "decision"], 120,
                 "the first decision")
        c.controllers[0].send_signal(signal.SIGKILL)
        c.controllers[0].wait()
        c.start_controller()
        assert c.wait_controller(240) == 1, c.log("controller1.log")[-3000:]
        for a in c.agents:
            a.wait(timeout=60)
    finally:
        c.kill_all()
    evs = events(c.store, "determined")
    kinds = [e["kind"] for e in evs]
    assert kinds.count("controller_restarted") == 1, kinds
    decisions = [e["detail"]["decision"] for e in evs if e["kind"] == "decision"]
    assert decisions == ["restart", "stop"], decisions
    stop = [e for e in evs if e["kind"] == "decision"][1]
    assert "happened again after a restart: it is deterministic" in stop["detail"]["reason"], stop
    assert kinds.count("generation_started") == 2 and kinds[-1] == "job_failed", kinds
    assert "deterministic" in c.log("controller1.log")
