"""Issue 14, part 3: the fleet store. Jobs on several controllers share one
PostgreSQL database (a real server the tests start): a node that one job's
controller evicts is refused by the next job while the first still runs,
and `trainguard nodes` shows the eviction with its evidence. The unit suite
(event_store_test) runs the store interface itself against PostgreSQL."""

import json
import os
import subprocess

from conftest import EXAMPLE, PYTHON, TRAINGUARD, Job, gpu_fault_env, wait_for


def nodes(store):
    done = subprocess.run([TRAINGUARD, "nodes", "--store", store, "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return {n["node"]: n for n in json.loads(done.stdout)}


def test_a_node_one_controller_evicts_is_refused_by_the_next_job_on_the_shared_store(
        tmp_path, postgres, no_leftovers):
    store = postgres.new_database()
    first_dir = tmp_path / "first"
    first_dir.mkdir()
    # Rank 1's GPU (on node1) falls off the bus and the rank dies: the node is evicted,
    # the spare takes its place, and the job goes on for a while longer.
    first = Job(first_dir, "first",
                [PYTHON, EXAMPLE, "--steps", "80", "--ckpt-every", "10", "--ckpt-dir", str(first_dir / "ckpt"),
                 "--step-delay", "0.05", "--xid-at-step", "10", "--crash-rank", "1"],
                nnodes=2, nproc=1, flags=["--spares", "1"], store=store, env=gpu_fault_env(first_dir))
    wait_for(lambda: first.events("node_evicted"), 120, "the first job's eviction of node1")
    assert [e["node"] for e in first.events("node_evicted")] == ["node1"]

    # A second controller, on the same store, while the first job still runs.
    second_dir = tmp_path / "second"
    second_dir.mkdir()
    second = Job(second_dir, "second", [PYTHON, "-c", "pass"], nnodes=2, nproc=1, store=store)
    assert second.wait() == 0, second.output()[-3000:]
    assert sorted(e["node"] for e in second.events("node_registered")) == ["node0", "node2"]
    assert "node node1 is cordoned (evicted: " in second.output(), second.output()[-3000:]
    assert "by job first" in second.output()
    assert first.proc.poll() is None, "the first job ended before the second ran: no overlap was tested"

    assert first.wait() == 0, first.output()[-3000:]
    assert [e["node"] for e in first.events("spare_promoted")] == ["node2"]
    # Both controllers wrote to one database, and each job's log is whole.
    for job in (first, second):
        kinds = [e["kind"] for e in job.events()]
        assert kinds[0] == "job_created" and kinds[-1] == "job_succeeded", kinds
    record = nodes(store)["node1"]
    assert record["status"] == "cordoned", record
    assert [(h["action"], h["by"]) for h in record["history"]] == [("gpu-errors", "controller of job first"),
                                                                   ("evict", "controller of job first")]
    # `trainguard uncordon` on the shared store returns the node to every job.
    back = subprocess.run([TRAINGUARD, "uncordon", "--store", store, "node1"], capture_output=True, text=True)
    assert back.returncode == 0, back.stderr
    assert nodes(store)["node1"]["status"] != "cordoned"


def test_an_unreachable_store_is_a_clear_error_that_keeps_the_password_out(tmp_path):
    url = "postgresql://ops:hunter2@127.0.0.1:1/fleet?connect_timeout=2"
    done = subprocess.run([TRAINGUARD, "run", "--nnodes", "1", "--nproc-per-node", "1", "--store", url,
                           "--run-dir", str(tmp_path / "run"), "--", PYTHON, "-c", "pass"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "cannot open store postgresql://ops@127.0.0.1:1/fleet" in done.stderr, done.stderr
    assert "hunter2" not in done.stderr + done.stdout
    assert not os.path.exists(tmp_path / "run" / "logs")


def test_the_same_program_failing_at_the_same_step_on_another_node_is_the_applications_fault(
        tmp_path, postgres, no_leftovers):
    """Issue 14, part 4: the same error at the same rank and step in two jobs of
    one program, on different nodes, follows the program: the second job stops
    at its first incident, naming the first job, instead of restarting."""
    store = postgres.new_database()

    def submit(name):
        run = tmp_path / name
        run.mkdir()
        return Job(run, name, [PYTHON, EXAMPLE, "--steps", "30", "--ckpt-every", "10",
                               "--ckpt-dir", str(run / "ckpt"), "--raise-at-step", "8", "--crash-rank", "1"],
                   nnodes=2, nproc=1, store=store)

    first = submit("monday")
    assert first.wait() != 0, first.output()[-3000:]
    assert len(first.events("generation_started")) == 2  # restarted once to rule out a transient cause
    # The second submission lands on other nodes (node1 is taken out by an operator).
    cordon = subprocess.run([TRAINGUARD, "cordon", "--store", store, "node1", "--reason", "maintenance"],
                            capture_output=True, text=True)
    assert cordon.returncode == 0, cordon.stderr
    second = submit("tuesday")
    assert second.wait() != 0, second.output()[-3000:]
    assert len(second.events("generation_started")) == 1, [e["message"] for e in second.events("decision")]
    decision = second.events("decision")[0]
    assert decision["detail"]["decision"] == "stop", decision
    assert "in job monday (node1)" in decision["message"] and "not the node" in decision["message"], decision
    fleet = second.events("attribution")[0]["detail"]["fleet"]
    attribution = second.events("attribution")[0]
    assert attribution["node"] == "node2"
    # Both of monday's incidents (the failure and its repeat after the restart) are the evidence.
    assert [(p["job_id"], p["node"], p["rank"], p["step"]) for p in fleet["same_error_elsewhere"]] == \
        [("monday", "node1", 1, attribution["step"])] * 2
    assert decision["message"].count("job monday") == 1, decision["message"]
    # The fleet report over both jobs shows the pattern.
    done = subprocess.run([TRAINGUARD, "report", "--fleet", "--store", store, "--json"], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["jobs"] == 2 and report["incidents"] == 3, report
    assert [(p["points_to"], p["jobs"], p["nodes"]) for p in report["recurring"]] == \
        [("program", ["monday", "tuesday"], ["node1", "node2"])], report["recurring"]
