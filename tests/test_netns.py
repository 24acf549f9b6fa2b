"""Issue 11, part 1: `run --netns` puts every node in a network namespace of
its own, with its own address behind one bridge, so that ranks talk over
real links; everything is removed again when the job ends, and when it is
interrupted. Without root it says so in one line, and runs in the host's
network only when asked to (--netns-fallback)."""

import os
import shutil
import signal
import pathlib
import re
import subprocess
import tempfile
import time
import urllib.request

import pytest

from conftest import EXAMPLE, PYTHON, TRAINGUARD, Job, api_url, wait_for


# What `run --netns` makes (cli/netns_fabric.cc), a job's 6-hex-digit tag in
# each name: namespaces tg-TAG-NODE; a bridge tgbTAG, veth ends tgvTAG<n> and
# tgpTAG<n>, rack bridges and uplinks tgkTAG<i>, tguTAG<i>, tgdTAG<i>. Only
# these are this file's to count: other tests (a Slurm cluster, two hosts)
# make namespaces and links of their own at the same time.
FABRIC_NAMESPACE = re.compile(r"^tg-[0-9a-f]{6}-")
FABRIC_LINK = re.compile(r"^tg[bvpkud][0-9a-f]{6}")


def namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip() and FABRIC_NAMESPACE.match(line)}


def links():
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}
    return {n for n in names if FABRIC_LINK.match(n)}


@pytest.fixture
def root_with_ip():
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 for network namespaces")
    before = (namespaces(), links())
    yield before
    # Nothing of a job may stay behind. (What a failed test left is removed
    # before the check fails, so that the next test starts clean.)
    left = (namespaces() - before[0], links() - before[1])
    for ns in left[0]:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    for link in left[1]:
        subprocess.run(["ip", "link", "del", link], capture_output=True)
    assert left == (set(), set())


def example(tmp_path, *extra):
    return [PYTHON, EXAMPLE, "--steps", "30", "--ckpt-every", "10", "--ckpt-dir", str(tmp_path / "ckpt"), *extra]


def test_each_node_has_its_own_namespace_and_address_and_nothing_stays(tmp_path, root_with_ip, no_leftovers):
    job = Job(tmp_path, "netns", example(tmp_path, "--crash-at-step", "12"), flags=["--netns"])
    started = wait_for(lambda: len(job.events("ranks_started")) >= 2 and job.events("ranks_started"), 120,
                       "both nodes' ranks")
    made = namespaces() - root_with_ip[0]
    assert len(made) == 2, made
    # Each rank process lives in its node's namespace (not the host's).
    host_ns = os.readlink("/proc/self/ns/net")
    for e in started:
        for pid in e["detail"]["pids"].values():
            assert os.readlink("/proc/%d/ns/net" % int(pid)) != host_ns
    assert job.wait() == 0, job.output()[-3000:]  # through a crash and a restart over the veths
    addresses = {e["node"]: e["detail"]["address"] for e in job.events("node_registered")}
    assert len(set(addresses.values())) == 2 and all(a.startswith("10.") for a in addresses.values()), addresses
    masters = {e["detail"]["master_addr"] for e in job.events("generation_started")}
    assert masters == {addresses["node0"]}, masters
    assert len(job.events("generation_started")) == 2


def test_an_interrupted_job_removes_its_namespaces(tmp_path, root_with_ip, no_leftovers):
    job = Job(tmp_path, "netns-int", example(tmp_path, "--step-delay", "1"), flags=["--netns"])
    wait_for(lambda: len(job.events("ranks_started")) >= 2, 120, "both nodes' ranks")
    assert len(namespaces() - root_with_ip[0]) == 2
    os.killpg(job.proc.pid, signal.SIGINT)
    assert job.wait() == 130


def test_without_root_netns_is_refused_in_one_line_or_falls_back_when_asked():
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to drop to another user")
    with tempfile.TemporaryDirectory() as tmp:  # pytest's own directories are root's alone
        os.chmod(tmp, 0o777)
        refused_then_fallback(pathlib.Path(tmp))


def refused_then_fallback(tmp_path):
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    line = [TRAINGUARD, "run", "--netns", "--nnodes", "2", "--store", str(tmp_path / "tg.db"),
            "--run-dir", str(tmp_path / "run"), "--", PYTHON, "-c", "pass"]
    refused = subprocess.run(as_nobody + line, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().count("\n") == 0 and "--netns needs root" in refused.stderr, refused.stderr
    fallback = subprocess.run(as_nobody + line[:2] + ["--netns-fallback"] + line[2:], capture_output=True,
                              text=True, timeout=120)
    assert fallback.returncode == 0, fallback.stderr[-2000:]
    assert "the nodes share this host's network" in fallback.stderr


def host_side_of(namespace):
    """The root-namespace end of the node's veth pair (its "switch port")."""
    line = subprocess.run(["ip", "-n", namespace, "-o", "link", "show", "tg0"], capture_output=True,
                          text=True, check=True).stdout
    peer_index = line.split("@if")[1].split(":")[0]
    for l in subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout.splitlines():
        if l.split(":")[0].strip() == peer_index:
            return l.split(":")[1].strip().split("@")[0]
    raise AssertionError("no host side for %s" % namespace)


def flap(interface, down_s=0.3):
    """Takes the link down for `down_s` (the fault itself: a cable out that long)."""
    subprocess.run(["ip", "link", "set", interface, "down"], check=True)
    try:
        time.sleep(down_s)
    finally:
        subprocess.run(["ip", "link", "set", interface, "up"], check=True)


def test_one_short_flap_is_survived_and_repeated_flapping_evicts_the_node(tmp_path, root_with_ip, no_leftovers):
    job = Job(tmp_path, "flap", [PYTHON, EXAMPLE, "--steps", "400", "--ckpt-every", "20",
                                 "--ckpt-dir", str(tmp_path / "ckpt"), "--step-delay", "0.05"],
              nnodes=2, nproc=1, flags=["--netns", "--spares", "1", "--heartbeat-interval", "0.5"])
    wait_for(lambda: job.events("first_step"), 120, "the first step")
    wait_for(lambda: (job.page_step("node1", 1) or -1) >= 10, 120, "rank 1 at step 10")
    agent = job.agent_pids()["node1"]
    ns = subprocess.run(["ip", "netns", "identify", str(agent)], capture_output=True, text=True).stdout.strip()
    assert ns.endswith("-node1"), ns
    port = host_side_of(ns)

    flap(port)
    flapped = wait_for(lambda: job.events("link_flap"), 30, "the flap to be seen")
    assert flapped[0]["node"] == "node1" and flapped[0]["detail"]["link"] == "tg0"
    step = job.page_step("node1", 1)
    wait_for(lambda: (job.page_step("node1", 1) or -1) >= step + 10, 60, "training to go on")
    assert not job.events("failure") and not job.events("node_evicted")

    flap(port)
    wait_for(lambda: len(job.events("link_flap")) >= 2, 30, "the second flap to be seen")
    flap(port)
    evicted = wait_for(lambda: job.events("node_evicted"), 60, "node1 to be evicted")
    assert [e["node"] for e in evicted] == ["node1"]
    assert evicted[0]["detail"]["evidence"]["rule"] == "link-flapping", evicted[0]
    assert "node node1 link tg0 flapped 3 times" in job.events("link_flapping")[0]["message"]
    assert job.wait(timeout=240) == 0, job.output()[-3000:]
    attribution = job.events("attribution")[0]["detail"]
    assert attribution["rule"] == "link-flapping" and attribution["category"] == "network", attribution
    assert [e["node"] for e in job.events("spare_promoted")] == ["node2"]


# Serial: the diagnosis round judges each node's measured speed against its
# peers' (conftest.py, `serial`); other tests' bursts on the shared cores
# stretch the round past the test's bounds.
@pytest.mark.serial
def test_a_throttled_link_fails_exactly_that_nodes_network_test_and_the_spare_takes_over(
        tmp_path, root_with_ip, no_leftovers):
    job = Job(tmp_path, "tbf", [PYTHON, EXAMPLE, "--steps", "150", "--ckpt-every", "10",
                                "--ckpt-dir", str(tmp_path / "ckpt"), "--step-delay", "0.05"],
              nnodes=3, nproc=1, flags=["--netns", "--spares", "1", "--diagnose", "quick"])
    wait_for(lambda: job.events("first_step") or job.proc.poll() is not None, 120, "the first step")
    assert job.events("first_step"), job.event_lines()[-4000:]
    preflight = job.events("diagnosis")[0]["detail"]
    assert preflight["purpose"] == "preflight" and not preflight["evicted"], preflight
    figures = [e for e in job.events("diagnostics") if e["node"] == "node1"][0]["detail"]["figures"]
    assert {f["name"] for f in figures} >= {"net_tx_mbps", "net_rx_mbps", "net_rtt_us"}, figures
    job.wait_for_quiet(standbys=3)
    # node1's switch port sends it at most 40 Mbit/s; then its rank dies.
    agent = job.agent_pids()["node1"]
    ns = subprocess.run(["ip", "netns", "identify", str(agent)], capture_output=True, text=True).stdout.strip()
    subprocess.run(["tc", "qdisc", "add", "dev", host_side_of(ns), "root", "tbf", "rate", "40mbit",
                    "burst", "32kbit", "latency", "400ms"], check=True)
    os.kill(job.rank_pids(0)[1], signal.SIGKILL)
    assert job.wait(timeout=300) == 0, job.output()[-3000:]
    evicted = job.events("node_evicted")
    assert [e["node"] for e in evicted] == ["node1"], evicted
    failures = evicted[0]["detail"]["evidence"]["failures"]
    assert failures and all(line.startswith("net_rx_mbps") for line in failures), failures
    assert [e["node"] for e in job.events("spare_promoted")] == ["node3"]


def retransmit_ratios(url):
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {s.labels["node"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "trainguard_node_tcp_retransmit_ratio"}


def test_a_node_whose_own_link_drops_its_packets_shows_its_tcp_retransmissions(tmp_path, root_with_ip, no_leftovers):
    """The network cause a communication straggler is given: node1's own
    egress queue (its NIC, as it were) holds 5 ms at most and drops the rest,
    so node1's TCP retransmits; the kernel's counters of each node's
    namespace reach /metrics, and only node1's stand out."""
    job = Job(tmp_path, "retrans", [PYTHON, EXAMPLE, "--steps", "300", "--hidden", "512", "--ckpt-every", "1000",
                                    "--ckpt-dir", str(tmp_path / "ckpt"), "--step-delay", "0.02"],
              nnodes=3, nproc=1, flags=["--netns", "--heartbeat-interval", "0.5"])
    url = api_url(job)
    wait_for(lambda: (job.page_step("node1", 1) or -1) >= 10 or job.proc.poll() is not None, 120,
             "rank 1 at step 10")
    assert job.proc.poll() is None, job.output()[-3000:]
    healthy = wait_for(lambda: (lambda r: r if len(r) == 3 else None)(retransmit_ratios(url)), 30,
                       "every node's retransmit ratio")
    assert all(v < 0.01 for v in healthy.values()), healthy
    agent = job.agent_pids()["node1"]
    ns = subprocess.run(["ip", "netns", "identify", str(agent)], capture_output=True, text=True).stdout.strip()
    assert ns.endswith("-node1"), ns
    subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "tg0", "root", "tbf", "rate", "20mbit", "burst",
                    "32kbit", "latency", "5ms"], check=True)
    try:
        seen = wait_for(lambda: (lambda r: r if r.get("node1", 0) >= 0.01 else None)(retransmit_ratios(url))
                        if job.proc.poll() is None else {"ended": True}, 60, "node1's retransmissions")
        assert "ended" not in seen, job.output()[-3000:]
        assert all(seen[n] < seen["node1"] / 3 for n in ("node0", "node2")), seen
    finally:
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "tg0", "root"], check=False)
    assert job.wait(timeout=240) == 0, job.output()[-3000:]


@pytest.mark.serial  # its diagnosis round judges nodes against each other, as above
def test_racks_get_bridges_of_their_own_and_diagnosis_runs_real_collectives(tmp_path, root_with_ip, no_leftovers):
    """The issue's first acceptance case: 4 nodes x 2 ranks and a spare, in
    namespaces, in two racks; the example DDP job runs to completion. Each
    rack has its own bridge (a top-of-rack switch) linked to the spine; the
    preflight round runs, after each node's own probes, an all-to-all of each
    node's two ranks and an all-reduce of each rack's two nodes with PyTorch on
    gloo over those links, and passes every node."""
    job = Job(tmp_path, "racks", example(tmp_path, "--step-delay", "0.1"), nnodes=4, nproc=2,
              flags=["--netns", "--nodes-per-rack", "2", "--diagnose", "quick", "--spares", "1"])
    wait_for(lambda: job.events("generation_started"), 180, "the preflight round")
    wait_for(lambda: [e for e in job.events("node_registered") if e["detail"]["spare"]], 60, "the spare")
    made = links() - root_with_ip[1]
    bridges = {name for name in made if name.startswith("tgk")}
    assert len(bridges) == 3, made  # rack0, rack1, and rack2 for the spare (node4), once it started
    ports = sorted(len(subprocess.run(["ip", "-o", "link", "show", "master", bridge], capture_output=True,
                                      text=True).stdout.splitlines()) for bridge in bridges)
    assert ports == [2, 3, 3], ports  # each node's port and the rack's uplink
    assert job.wait(timeout=240) == 0, job.output()[-3000:]
    assert job.events("job_succeeded")[0]["step"] == 30
    spare = [e for e in job.events("node_registered") if e["detail"]["spare"]]
    assert [e["node"] for e in spare] == ["node4"], spare
    by_node = {}
    for e in job.events("diagnostics"):
        for f in e["detail"]["figures"]:
            by_node.setdefault(e["node"], {})[f["name"]] = f
    # The preflight round has the job's nodes (`run` starts the spare once generation 0 has started).
    assert sorted(by_node) == ["node0", "node1", "node2", "node3"]
    for node, figures in by_node.items():
        for name in ("alltoall_gbps", "rack_allreduce_gbps"):
            assert name in figures and "error" not in figures[name] and figures[name]["value"] > 0, (node, figures)
    stages = [e["detail"]["stage"] for e in job.events("diagnostics")]
    # The nodes' own suite first, each node again where one fell below the
    # others' median only (a neighbour's burst on the shared cores: the round
    # says so, diagnosis_confirming), then the collectives once.
    suites = next((i for i, s in enumerate(stages) if s != "suite"), len(stages))
    assert suites == 4 or (suites > 4 and job.events("diagnosis_confirming")), stages
    assert stages[suites:] == ["all-to-all"] * 4 + ["rack all-reduce"] * 4, stages
    verdict = job.events("diagnosis")[0]["detail"]
    assert not verdict["evicted"], verdict
