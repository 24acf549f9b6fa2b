"""Issue 11, parts 2-4: diagnostics, spares and cordons with real jobs (the
example DDP job with gloo). An evicted node is cordoned in the store; an idle
spare takes its group rank at the restart, and the job ends with the
parameters of an uninterrupted run. With `--diagnose quick`, a node whose CPU
a real cgroup quota throttles is found by the controller's diagnosis round
after a rank is killed, evicted with its figures as evidence, and replaced by
the spare. An operator's cordon keeps a node out of the next job until
`trainguard uncordon`."""

import json
import os
import signal
import subprocess

import pytest

from conftest import EXAMPLE, PYTHON, TRAINGUARD, Job, cpu_cgroup, gpu_fault_env, remove_cgroup, wait_for

STEPS = 40


def example(tmp_path, *extra, steps=STEPS):
    return [PYTHON, EXAMPLE, "--steps", str(steps), "--ckpt-every", "10",
            "--ckpt-dir", os.path.join(str(tmp_path), "ckpt"),
            "--out", os.path.join(str(tmp_path), "checksum.txt"), *extra]


def checksum(tmp_path):
    with open(os.path.join(str(tmp_path), "checksum.txt")) as f:
        return f.read().strip()


def nodes(store):
    done = subprocess.run([TRAINGUARD, "nodes", "--store", store, "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {n["node"]: n for n in json.loads(done.stdout)}


def test_a_spare_takes_the_evicted_nodes_group_rank_and_the_result_is_unchanged(tmp_path, no_leftovers):
    ref = tmp_path / "ref"
    ref.mkdir()
    reference = Job(ref, "reference", example(ref))
    assert reference.wait() == 0, reference.output()[-2000:]

    run = tmp_path / "spare"
    run.mkdir()
    job = Job(run, "spare", example(run, "--xid-at-step", "15", "--crash-rank", "3"), flags=["--spares", "1"],
              env=gpu_fault_env(run))
    assert job.wait() == 0, job.output()[-3000:]
    registered = {e["node"]: e["detail"] for e in job.events("node_registered")}
    assert set(registered) == {"node0", "node1", "node2"}, registered  # the pool is fixed: no new node
    assert registered["node2"]["spare"] is True
    assert [e["node"] for e in job.events("node_evicted")] == ["node1"]
    promoted = job.events("spare_promoted")
    assert [(e["node"], e["detail"]["group_rank"]) for e in promoted] == [("node2", 1)]
    # The spare's ranks are 2 and 3 in generation 1.
    started = [e for e in job.events("ranks_started") if e["generation"] == 1 and e["node"] == "node2"]
    assert sorted(int(r) for r in started[0]["detail"]["pids"]) == [2, 3], started
    assert checksum(run) == checksum(ref)
    assert nodes(job.store)["node1"]["status"] == "cordoned"


def test_an_elastic_job_goes_on_with_fewer_nodes_when_no_spare_is_left(tmp_path, no_leftovers):
    """--nnodes 2:3 and no spare: the node whose GPU "falls off the bus" is
    evicted, nobody takes its place, and the job restarts at once on the two
    nodes left (group ranks renumbered, world size 2) from its checkpoint, and
    completes. The script saves with torch.save on rank 0, as elastic scripts
    do, so a smaller world can load it."""
    job = Job(tmp_path, "elastic", example(tmp_path, "--ckpt-engine", "torch", "--xid-at-step", "15",
                                           "--crash-rank", "1"), nnodes="2:3", nproc=1,
              env=gpu_fault_env(tmp_path))
    assert job.wait() == 0, job.output()[-3000:]
    assert sorted(e["node"] for e in job.events("node_registered")) == ["node0", "node1", "node2"]
    assert [e["node"] for e in job.events("node_evicted")] == ["node1"]
    resized = job.events("world_resized")
    assert [(e["detail"]["nnodes"], e["detail"]["world_size"]) for e in resized] == [(2, 2)], resized
    assert job.events("group_ranks_renumbered")[0]["detail"]["moved"] == {"node2": [2, 1]}
    assert not job.events("waiting_for_nodes")  # nothing was coming: no wait
    started = [e for e in job.events("ranks_started") if e["generation"] == 1]
    assert sorted((e["node"], sorted(int(r) for r in e["detail"]["pids"])) for e in started) == \
        [("node0", [0]), ("node2", [1])], started
    first = [e for e in job.events("first_step") if e["generation"] == 1]
    assert first and first[0]["detail"]["first_step"] == 11, first  # after the checkpoint of step 10, not from 0
    assert job.events("job_succeeded")[0]["step"] == STEPS
    assert nodes(job.store)["node1"]["status"] == "cordoned"


def test_an_operators_cordon_keeps_the_node_out_until_uncordoned(tmp_path, no_leftovers):
    store = str(tmp_path / "trainguard.db")
    refused = subprocess.run([TRAINGUARD, "cordon", "--store", store, "node0"], capture_output=True, text=True)
    assert refused.returncode != 0 and "--reason" in refused.stderr, refused.stderr
    blank = subprocess.run([TRAINGUARD, "cordon", "--store", store, "node0", "--reason", " "],
                           capture_output=True, text=True)
    assert blank.returncode == 2 and "say why" in blank.stderr, blank.stderr
    done = subprocess.run([TRAINGUARD, "cordon", "--store", store, "node0", "--reason", "fan failure, ticket 42"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "node node0 cordoned by operator " in done.stdout, done.stdout + done.stderr
    listed = nodes(store)["node0"]
    assert listed["status"] == "cordoned" and listed["reason"] == "fan failure, ticket 42"
    assert listed["history"][0]["action"] == "cordon" and listed["history"][0]["by"].startswith("operator ")

    job = Job(tmp_path, "without-node0", [PYTHON, "-c", "pass"], nnodes=2, nproc=1)
    assert job.wait() == 0, job.output()[-2000:]
    assert sorted(e["node"] for e in job.events("node_registered")) == ["node1", "node2"]
    assert "node node0 is cordoned (fan failure, ticket 42)" in job.output()

    back = subprocess.run([TRAINGUARD, "uncordon", "--store", store, "node0"], capture_output=True, text=True)
    assert back.returncode == 0, back.stderr
    job = Job(tmp_path, "with-node0", [PYTHON, "-c", "pass"], nnodes=2, nproc=1)
    assert job.wait() == 0, job.output()[-2000:]
    assert sorted(e["node"] for e in job.events("node_registered")) == ["node0", "node1"]
    assert [h["action"] for h in nodes(store)["node0"]["history"]] == ["cordon", "uncordon"]


@pytest.fixture
def half_cpu():
    if os.geteuid() != 0:
        pytest.skip("a CPU quota needs root")
    path = cpu_cgroup("trainguard-evict-%d" % os.getpid(), 0.5)
    if path is None:
        pytest.skip("no cpu cgroup controller")
    yield path
    remove_cgroup(path)


def test_a_throttled_node_is_diagnosed_evicted_and_replaced_by_the_spare(tmp_path, half_cpu, no_leftovers):
    ref = tmp_path / "ref"
    ref.mkdir()
    # 200 steps of 50 ms: the job still runs when its standbys have settled,
    # also on a machine where their imports take several seconds (seen: a
    # 40-step job ended first); its restart runs at full speed. The step delay
    # does not change the result.
    reference = Job(ref, "reference", example(ref, steps=200), nnodes=3, nproc=1)
    assert reference.wait() == 0, reference.output()[-2000:]

    run = tmp_path / "diag"
    run.mkdir()
    job = Job(run, "diag", example(run, "--step-delay", "0.05", "--step-delay-first-attempt", steps=200),
              nnodes=3, nproc=1,
              flags=["--spares", "1", "--diagnose", "quick", "--max-restarts", "2", "--rendezvous-timeout", "60"])
    wait_for(lambda: (job.page_step("node1", 1) or -1) >= 12, 120, "rank 1 to reach step 12")
    preflight = job.events("diagnosis")
    assert preflight and preflight[0]["detail"]["purpose"] == "preflight" and not preflight[0]["detail"]["evicted"]
    job.wait_for_quiet(standbys=3)
    # Throttle node1 (its agent, where the diagnostics run), then kill its rank.
    agent = job.agent_pids()["node1"]
    with open(os.path.join(half_cpu, "cgroup.procs"), "w") as f:
        f.write(str(agent))
    os.kill(job.rank_pids(0)[1], signal.SIGKILL)
    assert job.wait(timeout=240) == 0, job.output()[-3000:]

    evicted = job.events("node_evicted")
    assert [e["node"] for e in evicted] == ["node1"], evicted
    evidence = evicted[0]["detail"]["evidence"]
    assert evidence["purpose"] == "incident 1"
    # A 50 % quota halves what the CPU does: compute and memory copy (at least one
    # of them below 70 % of the median even on a noisy shared host).
    cpu_bound = [f for f in evidence["figures"] if f["name"] in ("compute_gflops", "memory_gbps") and not f["ok"]]
    assert cpu_bound and all(0.25 < f["value"] / f["median"] < 0.7 for f in cpu_bound), evidence
    assert all("of the median" in line for line in evidence["failures"]), evidence
    # The incident's round measured every node again before deciding (the
    # preflight round may have had a confirming pass of its own: noise).
    incident_round = next(e["detail"]["round"] for e in job.events("diagnosis")
                          if e["detail"]["purpose"] == "incident 1")
    confirming = [e for e in job.events("diagnosis_confirming") if e["detail"]["round"] == incident_round]
    assert sorted(confirming[0]["detail"]["nodes"]) == ["node0", "node1", "node2", "node3"], confirming
    assert [(e["node"], e["detail"]["group_rank"]) for e in job.events("spare_promoted")] == [("node3", 1)]
    assert checksum(run) == checksum(ref)
    # `trainguard events` shows the eviction with its evidence.
    text = subprocess.run([TRAINGUARD, "events", "--store", job.store, "diag"], capture_output=True, text=True)
    assert "node node1 evicted and cordoned: diagnostics (incident 1): " in text.stdout, text.stdout

    # The next job on the same store runs without node1, until it is uncordoned.
    nxt = Job(run, "next", [PYTHON, "-c", "pass"], nnodes=3, nproc=1)
    assert nxt.wait() == 0, nxt.output()[-2000:]
    assert sorted(e["node"] for e in nxt.events("node_registered")) == ["node0", "node2", "node3"]
    history = nodes(job.store)["node1"]["history"]
    assert [(h["action"], h["by"]) for h in history] == [("evict", "controller of job diag")]
    assert history[0]["evidence"]["figures"]
