"""Issue 40: a standby controller takes the job over when its leader's host
dies. Two `trainguard controller` processes for one job share a real
PostgreSQL store; one leads (holds the job's lead in the store), the other
waits. Two agents are given both addresses. The leader is killed (kill -9),
or paused (SIGSTOP) for 30 s and continued: the standby leads, the agents follow
it with their ranks (same PIDs), the job goes on and ends with the parameters
of an uninterrupted run, every event is stored once, and a paused leader that
wakes up steps down having written nothing and stands by again. Real processes, a DDP script that does not import trainguard."""

import os
import re
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import PYTHON, ROOT, TRAINGUARD, Job, PostgresServer, events, free_port, status_page_step, wait_for

PLAIN_DDP = os.path.join(ROOT, "tests", "plain_ddp.py")

REFERENCE = {}  # steps -> the checksum of an uninterrupted run's final parameters


def uninterrupted(tmp_path, steps):
    """The checksum of the final parameters of the same training without a
    fault: `trainguard run` of the same script on 2 nodes x 2 ranks, once per
    number of steps (without the step delay: it only sleeps)."""
    if steps not in REFERENCE:
        ref = tmp_path / ("reference-%d" % steps)
        ref.mkdir()
        job = Job(ref, "reference-%d" % steps, [PYTHON, PLAIN_DDP, "--steps", str(steps), "--ckpt-every", "10",
                                                "--ckpt", str(ref / "ck.pt"), "--out", str(ref / "out")])
        assert job.wait() == 0, job.output()[-2000:]
        REFERENCE[steps] = (ref / "out").read_text().strip()
        assert len(REFERENCE[steps]) == 64, REFERENCE[steps]  # a SHA-256 in hex
    return REFERENCE[steps]


class Pair:
    """A leader and a standby controller, and two agents that know both."""

    def __init__(self, tmp_path, pg, job_id, steps, hosts=None, controller_store=None):
        """`hosts`: where each controller runs, (network namespace or None,
        address); by default both on this host's loopback. `controller_store`:
        the store's URL as the controllers reach it."""
        self.tmp = str(tmp_path)
        self.tmp_path = tmp_path
        self.job_id = job_id
        self.steps = steps
        self.store = pg.new_database()
        self.controller_store = self.store if controller_store is None else controller_store(self.store)
        self.hosts = hosts or [(None, "127.0.0.1"), (None, "127.0.0.1")]
        self.ports = [free_port(), free_port()] if hosts is None else [29400, 29400]
        secret = os.path.join(self.tmp, "secret")
        with open(secret, "w") as f:
            f.write("a job secret\n")
        self.secret = secret
        self.command = [PYTHON, PLAIN_DDP, "--steps", str(steps), "--step-delay", "0.05", "--ckpt-every", "10",
                        "--ckpt", os.path.join(self.tmp, "ck.pt"), "--out", os.path.join(self.tmp, "out")]
        self.controllers = [self.start_controller(0)]
        wait_for(lambda: "controller on port" in self.log("controller0.log") or self.controllers[0].poll() is not None,
                 60, "the first controller to lead")
        assert self.controllers[0].poll() is None, self.logs()
        self.controllers.append(self.start_controller(1))
        wait_for(lambda: "standby: job %s is led by" % job_id in self.log("controller1.log")
                 or self.controllers[1].poll() is not None, 60, "the second controller to wait as a standby")
        assert self.controllers[1].poll() is None, self.logs()
        endpoints = ",".join("%s:%d" % (h[1], p) for h, p in zip(self.hosts, self.ports))
        self.agents = []
        for i in range(2):
            log = open(os.path.join(self.tmp, "agent%d.log" % i), "w")
            self.agents.append(subprocess.Popen(
                [TRAINGUARD, "agent", "--controller", endpoints, "--node-id", "host%d" % i, "--group-rank", str(i),
                 "--run-dir", os.path.join(self.tmp, "host%d" % i), "--secret-file", secret,
                 "--reconnect-window", "60", "--quiet"],
                stdout=log, stderr=subprocess.STDOUT))

    def start_controller(self, i):
        log = open(os.path.join(self.tmp, "controller%d.log" % i), "w")
        ns, address = self.hosts[i]
        return subprocess.Popen(
            (["ip", "netns", "exec", ns] if ns else []) +
            [TRAINGUARD, "controller", "--listen", "%s:%d" % (address, self.ports[i]), "--nnodes", "2",
             "--nproc-per-node", "2", "--store", self.controller_store, "--job-id", self.job_id,
             "--secret-file", self.secret,
             "--reconnect-window", "60", "--max-restarts", "2", "--run-dir", os.path.join(self.tmp, "ctl%d" % i),
             "--", *self.command],
            stdout=log, stderr=subprocess.STDOUT)

    def log(self, name):
        path = os.path.join(self.tmp, name)
        if not os.path.exists(path):
            return ""
        with open(path) as f:
            return f.read()

    def logs(self):
        return "".join("\n--- %s:\n%s" % (n, self.log(n)[-2500:]) for n in sorted(os.listdir(self.tmp))
                       if n.endswith(".log"))

    def wait_for(self, predicate, timeout, what):
        try:
            return wait_for(predicate, timeout, what)
        except AssertionError as e:
            raise AssertionError("%s%s\n--- events:\n%s" % (e, self.logs(), "\n".join(
                "%s %s" % (x["kind"], x["message"][:160]) for x in self.events())[-4000:])) from None

    def events(self):
        return events(self.store, self.job_id)

    def kinds(self):
        return [e["kind"] for e in self.events()]

    def step(self, node, rank):
        agent = self.agents[int(node[len("host"):])].pid
        return status_page_step(self.job_id, node, rank, agent) or -1

    def rank_pids(self):
        pids = {}
        for e in self.events():
            if e["kind"] == "ranks_started" and e["generation"] == 0:
                pids.update({int(r): p for r, p in e["detail"]["pids"].items()})
        return pids

    def finish(self, leader):
        """The new leader and the agents end well, with the parameters an
        uninterrupted run ends with."""
        assert leader.wait(timeout=240) == 0, self.logs()
        for a in self.agents:
            assert a.wait(timeout=60) == 0, self.logs()
        with open(os.path.join(self.tmp, "out")) as f:
            trained = f.read().strip()
        assert trained == uninterrupted(self.tmp_path, self.steps), "the parameters differ from an uninterrupted run's"

    def kill_all(self):
        for p in self.controllers + self.agents:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                except OSError:
                    pass
                p.kill()
                p.wait()


def assert_taken_over_once(pair, pids):
    stored = pair.events()
    kinds = [e["kind"] for e in stored]
    for once in ["job_created", "generation_started", "first_step", "controller_restarted", "job_resumed",
                 "job_succeeded", "replica_sets", "layout"]:
        assert kinds.count(once) == 1, (once, kinds)
    assert kinds.count("ranks_started") == 2 and kinds.count("node_reconnected") == 2, kinds
    assert "failure" not in kinds and "restarting" not in kinds, kinds
    seen = set()
    for e in stored:
        key = (e["kind"], e["wall_ns"], e["node"], e["rank"], e["message"])
        assert key not in seen, ("an event stored twice", e)
        seen.add(key)
    reconnected = {}
    for e in stored:
        if e["kind"] == "node_reconnected":
            reconnected.update({int(r): p for r, p in e["detail"]["pids"].items()})
    assert reconnected == pids, (reconnected, pids)
    return stored


def assert_stands_by_again(pair, old, port=None):
    """The old leader steps down and waits as a standby again, the same
    process (PID), having written nothing; its old port (`port`, on this
    host) is free: nothing of the old controller was kept."""
    log = lambda: pair.log("controller0.log")
    pair.wait_for(lambda: "this controller steps down" in log() or old.poll() is not None, 30,
                  "the old leader to step down")
    pair.wait_for(lambda: "standby: job %s is led by" % pair.job_id in log() or old.poll() is not None, 30,
                  "the old leader to stand by again")
    assert old.poll() is None, log()[-2000:]
    assert log().index("this controller steps down") < log().index("standby: job %s is led by" % pair.job_id)
    if port is not None:
        # EADDRINUSE if a listening socket of the old image outlived it: the agents' port, and its API's.
        api = re.search(r"API and metrics at http://127\.0\.0\.1:(\d+)", log())
        assert api, log()[-2000:]
        for p in (port, int(api.group(1))):
            with socket.socket() as s:
                s.bind(("127.0.0.1", p))


def takeover_seconds(stored, lost_at):
    """Leader lost -> the standby recorded that it took the job -> every agent back with its ranks."""
    led = next(e for e in stored if e["kind"] == "controller_restarted")["wall_ns"] / 1e9 - lost_at
    followed = next(e for e in stored if e["kind"] == "job_resumed")["wall_ns"] / 1e9 - lost_at
    return led, followed


def test_kill_9_of_the_leader_hands_the_job_to_its_standby_and_the_ranks_keep_running(tmp_path, no_leftovers):
    pg = PostgresServer()
    pair = None
    try:
        pair = Pair(tmp_path, pg, "standby-kill", steps=260)
        pair.wait_for(lambda: pair.step("host1", 3) >= 20, 120, "20 steps on every rank")
        pids = pair.rank_pids()
        assert sorted(pids) == [0, 1, 2, 3]
        pair.controllers[0].kill()
        lost_at = time.time()
        pair.controllers[0].wait()
        pair.wait_for(lambda: "job_resumed" in pair.kinds(), 60, "the standby to take the job and its agents")
        pair.finish(pair.controllers[1])
        stored = assert_taken_over_once(pair, pids)
        led, followed = takeover_seconds(stored, lost_at)
        print("takeover after kill -9: the standby led after %.1f s, every agent followed after %.1f s" % (led, followed))
        assert led < 10, (led, pair.logs())
        log = pair.log("controller1.log")
        assert "leads it now (epoch 2)" in log and "SUCCEEDED: all 4 ranks exited 0" in log, log[-3000:]
    finally:
        if pair:
            pair.kill_all()
        pg.stop()


def test_a_paused_leader_is_replaced_and_once_continued_steps_down_having_written_nothing(tmp_path, no_leftovers):
    pg = PostgresServer()
    pair = None
    try:
        pair = Pair(tmp_path, pg, "standby-pause", steps=700)
        pair.wait_for(lambda: pair.step("host1", 3) >= 20, 120, "20 steps on every rank")
        pids = pair.rank_pids()
        old = pair.controllers[0]
        old.send_signal(signal.SIGSTOP)
        lost_at = time.time()
        pair.wait_for(lambda: "job_resumed" in pair.kinds(), 60, "the standby to take the job and its agents")
        stored_before = len(pair.events())
        # Paused for 30 s in all; then it wakes up, finds its lead gone and goes.
        time.sleep(max(0.0, 30 - (time.time() - lost_at)))
        old.send_signal(signal.SIGCONT)
        assert_stands_by_again(pair, old, pair.ports[0])
        assert len(pair.events()) >= stored_before
        pair.finish(pair.controllers[1])
        assert old.wait(timeout=60) == 0, pair.logs()  # the standby again: the job ended, nothing to take over
        stored = assert_taken_over_once(pair, pids)
        led, followed = takeover_seconds(stored, lost_at)
        print("takeover after SIGSTOP: the standby led after %.1f s, every agent followed after %.1f s" % (led, followed))
        assert led < 10, (led, pair.logs())
        assert all(a.returncode == 0 for a in pair.agents)
    finally:
        if pair:
            pair.kill_all()
        pg.stop()


def test_a_rank_killed_just_after_the_leader_died_is_recovered_once_by_the_new_leader(tmp_path, no_leftovers):
    pg = PostgresServer()
    pair = None
    try:
        pair = Pair(tmp_path, pg, "standby-rank", steps=260)
        pair.wait_for(lambda: pair.step("host1", 3) >= 20, 120, "20 steps on every rank")
        pids = pair.rank_pids()
        pair.controllers[0].kill()
        pair.controllers[0].wait()
        time.sleep(1)  # the rank dies while no controller leads
        os.kill(pids[3], signal.SIGKILL)
        pair.finish(pair.controllers[1])
        kinds = pair.kinds()
        for once in ["controller_restarted", "failure", "attribution", "decision", "restarting"]:
            assert kinds.count(once) == 1, (once, kinds)
        # The failure names the exit reported first (rank 3's, or a peer's that
        # lost its connection to it: the agents reconnect in a race); the
        # attribution, made once both nodes are back, names rank 3, which died
        # first in time.
        failure = next(e for e in pair.events() if e["kind"] == "failure")
        assert failure["detail"]["failure_kind"] == "rank_failed", failure
        attribution = next(e for e in pair.events() if e["kind"] == "attribution")
        assert 3 in attribution["detail"]["culprit_ranks"], attribution
        assert kinds.index("controller_restarted") < kinds.index("failure"), kinds
        assert kinds.count("generation_started") == 2, kinds
    finally:
        if pair:
            pair.kill_all()
        pg.stop()


def test_with_postgresql_stopped_during_the_takeover_nobody_leads_until_it_is_back(tmp_path, no_leftovers):
    pg = PostgresServer()
    pair = None
    try:
        pair = Pair(tmp_path, pg, "standby-store", steps=500)
        pair.wait_for(lambda: pair.step("host1", 3) >= 20, 120, "20 steps on every rank")
        pids = pair.rank_pids()
        pair.controllers[0].kill()
        pair.controllers[0].wait()
        pg.halt()
        halted = time.monotonic()
        # No leader while the store is away; the ranks train on.
        stepped = pair.step("host0", 0)
        pair.wait_for(lambda: pair.step("host0", 0) >= stepped + 40, 60, "steps while the store is away")
        time.sleep(max(0.0, 12 - (time.monotonic() - halted)))
        assert "leads it now" not in pair.log("controller1.log"), pair.logs()
        assert all(os.path.exists("/proc/%d" % p) for p in pids.values())
        pg.resume()
        pair.wait_for(lambda: "leads it now" in pair.log("controller1.log"), 60, "the standby to lead once the store is back")
        pair.finish(pair.controllers[1])
        assert_taken_over_once(pair, pids)
    finally:
        if pair:
            pair.kill_all()
        pg.stop()


def sh(*argv):
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_controller_hosts():
    """Two hosts for the controllers, network namespaces on a bridge of this
    host, which runs PostgreSQL and the agents: (namespace, address, its
    link) each, and the bridge's address."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and ip for network namespaces")
    tag = str(os.getpid() % 100000)
    net = "10.232.%d" % (os.getpid() % 250)
    bridge = "tgsb" + tag
    hosts = [("tgsA" + tag, "%s.2" % net, "tgsa" + tag), ("tgsB" + tag, "%s.3" % net, "tgsb" + tag + "x")]
    try:
        sh("ip", "link", "add", bridge, "type", "bridge")
        sh("ip", "addr", "add", net + ".1/24", "dev", bridge)
        sh("ip", "link", "set", bridge, "up")
        for i, (ns, addr, dev) in enumerate(hosts):
            outside = "tgsh%d%s" % (i, tag)
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", outside, "type", "veth", "peer", "name", dev)
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "link", "set", outside, "master", bridge)
            sh("ip", "link", "set", outside, "up")
        yield hosts, net + ".1"
    finally:
        for ns, _, _ in hosts:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, timeout=30)


def test_a_leader_cut_off_the_network_is_replaced_and_once_back_steps_down(tmp_path, two_controller_hosts,
                                                                          no_leftovers):
    """The leader's host loses its link (`ip link set down`): it reaches
    neither the store nor the agents. The standby on the other host leads,
    the agents follow it; when the link is back, the old leader finds its
    lead gone and steps down, having written nothing."""
    hosts, bridge_ip = two_controller_hosts
    pg = PostgresServer(also_on=bridge_ip)
    pair = None
    try:
        pair = Pair(tmp_path, pg, "standby-cut", steps=500, hosts=[(ns, addr) for ns, addr, _ in hosts],
                    controller_store=lambda url: url.replace("127.0.0.1", bridge_ip))
        pair.wait_for(lambda: pair.step("host1", 3) >= 20, 120, "20 steps on every rank")
        pids = pair.rank_pids()
        ns, _, dev = hosts[0]
        sh("ip", "-n", ns, "link", "set", dev, "down")
        lost_at = time.time()
        pair.wait_for(lambda: "job_resumed" in pair.kinds(), 60, "the standby to take the job and its agents")
        time.sleep(max(0.0, 15 - (time.time() - lost_at)))
        sh("ip", "-n", ns, "link", "set", dev, "up")
        old = pair.controllers[0]
        assert_stands_by_again(pair, old)
        pair.finish(pair.controllers[1])
        assert old.wait(timeout=60) == 0, pair.logs()
        stored = assert_taken_over_once(pair, pids)
        led, followed = takeover_seconds(stored, lost_at)
        print("takeover after a cut link: the standby led after %.1f s, every agent followed after %.1f s"
              % (led, followed))
        assert led < 10, (led, pair.logs())
    finally:
        if pair:
            pair.kill_all()
        pg.stop()
