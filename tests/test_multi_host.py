"""Issue 9, part 2: one command on every host, as with torchrun. Two "hosts"
are two network namespaces joined by a veth pair, each with its own address
and hostname; each runs the same `trainguard torchrun` line but for
--node_rank. The host that owns the rendezvous endpoint runs the controller;
both run an agent. A rank killed on the other host restarts the job on both."""

import os
import shutil
import signal
import subprocess

import pytest

from conftest import PYTHON, TRAINGUARD, events, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
PLAIN = os.path.join(HERE, "plain_ddp.py")


def sh(*argv):
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def two_hosts():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        pytest.skip("needs root, ip and unshare for network namespaces")
    tag = str(os.getpid() % 100000)
    hosts = [("tgA" + tag, "va" + tag, "10.231.%d.1" % (os.getpid() % 250)),
             ("tgB" + tag, "vb" + tag, "10.231.%d.2" % (os.getpid() % 250))]
    try:
        for ns, _, _ in hosts:
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", hosts[0][1], "type", "veth", "peer", "name", hosts[1][1])
        for ns, dev, addr in hosts:
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield hosts
    finally:
        for ns, _, _ in hosts:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def launch(ns, dev, hostname, node_rank, endpoint, tmp_path, log):
    # The same command line on both hosts but for the node rank; gloo is told
    # which interface to use, as on a real cluster (GLOO_SOCKET_IFNAME).
    line = [TRAINGUARD, "torchrun", "--nnodes=2", "--nproc_per_node=2",
            "--node_rank=%d" % node_rank, "--rdzv_endpoint=%s" % endpoint, "--rdzv_id=twohosts",
            "--max_restarts=2", "--store", str(tmp_path / "tg.db"), "--run-dir", str(tmp_path / "run"),
            "--python", PYTHON, PLAIN, "--steps", "60", "--ckpt-every", "5", "--step-delay", "0.05",
            "--ckpt", str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "out.txt")]
    script = 'hostname %s && exec "$@"' % hostname
    return subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", script, "sh",
                             *line], stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, GLOO_SOCKET_IFNAME=dev), start_new_session=True)


def test_the_same_command_on_two_hosts_forms_one_job_that_restarts_on_both(two_hosts, tmp_path,
                                                                          no_leftovers):
    (ns_a, dev_a, addr_a), (ns_b, dev_b, _) = two_hosts
    endpoint = "%s:29400" % addr_a
    logs = [open(str(tmp_path / ("host%d.log" % i)), "w") for i in range(2)]
    # Host B first: it waits for the controller the way torchrun waits for its rendezvous.
    procs = [None, None]
    procs[1] = launch(ns_b, dev_b, "hostb", 1, endpoint, tmp_path, logs[1])
    procs[0] = launch(ns_a, dev_a, "hosta", 0, endpoint, tmp_path, logs[0])
    store = str(tmp_path / "tg.db")
    try:
        started = wait_for(lambda: [e for e in events(store, "twohosts") if e["kind"] == "ranks_started"
                                    and e["generation"] == 0 and e["node"] == "hostb"], 120,
                           "host B's ranks to start")
        # Kill a rank on host B once the job made progress (a checkpoint exists).
        wait_for(lambda: os.path.exists(str(tmp_path / "ckpt.pt")), 120, "the first checkpoint")
        victim = int(sorted(started[0]["detail"]["pids"].items())[0][1])
        os.kill(victim, signal.SIGKILL)
        rcs = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for f in logs:
            f.close()
    out = [open(str(tmp_path / ("host%d.log" % i))).read() for i in range(2)]
    assert rcs == [0, 0], (rcs, out[0][-3000:], out[1][-3000:])

    evs = events(store, "twohosts")
    registered = {e["node"]: e["detail"] for e in evs if e["kind"] == "node_registered"}
    assert registered["hosta"]["group_rank"] == 0 and registered["hostb"]["group_rank"] == 1
    assert registered["hosta"]["address"] == addr_a and registered["hostb"]["address"] != addr_a
    failure = [e for e in evs if e["kind"] == "failure"]
    assert len(failure) == 1 and failure[0]["node"] == "hostb" and failure[0]["rank"] in (2, 3)
    assert failure[0]["detail"]["signal"] == signal.SIGKILL
    restarted = {e["node"] for e in evs if e["kind"] == "ranks_started" and e["generation"] == 1}
    assert restarted == {"hosta", "hostb"}
    assert [e for e in evs if e["kind"] == "job_succeeded"][0]["detail"]["restart_count"] == 1
    assert os.path.exists(str(tmp_path / "out.txt"))
    # Host A served the controller; host B only joined it.
    assert "controller on port 29400" in out[0] and "joins the controller at %s" % endpoint in out[1]
    # Each host keeps its own ranks' logs.
    assert (tmp_path / "run" / "hostb" / "logs" / "rank2.stderr.log").exists()
    assert (tmp_path / "run" / "hosta" / "logs" / "rank0.stderr.log").exists()
    assert not (tmp_path / "run" / "hosta" / "logs" / "rank2.stderr.log").exists()


def test_a_loopback_endpoint_makes_hosts_of_one_machine(tmp_path, no_leftovers):
    # Without namespaces: two processes on this machine, the first to bind the
    # endpoint serves it; node ids come from the node ranks. One fails: both exit with its code.
    from conftest import free_port
    endpoint = "127.0.0.1:%d" % free_port()
    procs = []
    for rank in (1, 0):
        procs.append(subprocess.Popen(
            [TRAINGUARD, "run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
             "--rdzv-endpoint", endpoint, "--rdzv-id", "loop", "--max-restarts", "0",
             "--store", str(tmp_path / ("tg%d.db" % rank)), "--run-dir", str(tmp_path / "run"),
             "--", PYTHON, "-c", "import os, sys; sys.exit(7 if os.environ['RANK'] == '1' else 0)"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [7, 7], outs
    served = [i for i, o in enumerate(outs) if "controller on port" in o]
    assert len(served) == 1, outs
    joined = outs[1 - served[0]]
    assert "is served already" in joined or "joins the controller" in joined
    store = str(tmp_path / ("tg%d.db" % (1 - served[0])))
    nodes = {e["node"] for e in events(store, "loop") if e["kind"] == "node_registered"}
    assert nodes == {"node0", "node1"}


def test_an_elastic_line_starts_with_the_hosts_that_came_once_the_join_window_closes(tmp_path, no_leftovers):
    # torchrun --nnodes=1:2: one host alone meets the minimum; the job waits
    # --elastic-wait for the second, then runs with a world of one.
    from conftest import free_port
    endpoint = "127.0.0.1:%d" % free_port()
    done = subprocess.run(
        [TRAINGUARD, "torchrun", "--nnodes=1:2", "--nproc-per-node=1", "--rdzv-endpoint", endpoint,
         "--rdzv-id", "elastic", "--elastic-wait", "2", "--store", str(tmp_path / "tg.db"),
         "--run-dir", str(tmp_path / "run"), "--no-python", "--",
         PYTHON, "-c", "import os; open(os.environ['OUT'], 'w').write(os.environ['WORLD_SIZE'])"],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, OUT=str(tmp_path / "world.txt")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "elastic" in done.stderr and "down to 1" in done.stderr
    assert (tmp_path / "world.txt").read_text() == "1"
    evs = events(str(tmp_path / "tg.db"), "elastic")
    created, started = [e for e in evs if e["kind"] in ("job_created", "generation_started")]
    assert created["detail"]["min_nnodes"] == 1 and created["detail"]["nnodes"] == 2
    assert started["detail"]["nnodes"] == 1
    assert (started["wall_ns"] - created["wall_ns"]) / 1e9 >= 2.0  # the join window was kept
