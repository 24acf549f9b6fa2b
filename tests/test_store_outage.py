"""Issue 21: nothing slow under the controller's lock, and nothing lost when
the store goes away. Real processes, a DDP script that does not import
trainguard, a real PostgreSQL server stopped and started again, a real
SQLite file another process holds locked."""

import json
import os
import sqlite3
import subprocess
import threading
import time
import urllib.request

from conftest import PYTHON, ROOT, TRAINGUARD, Job, PostgresServer, api_url, gpu_fault_env, wait_for

PLAIN_DDP = os.path.join(ROOT, "tests", "plain_ddp.py")
# What a rank prints when its GPU fails; the driver's Xid 79 comes through
# the stand-in NVML (conftest.gpu_fault_env), which corroborates it.
LAUNCH_FAILURE = "RuntimeError: CUDA error: unspecified launch failure"


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def metric(url, name):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return None


def ddp_command(tmp_path, steps, *extra):
    return [PYTHON, PLAIN_DDP, "--steps", str(steps), "--step-delay", "0.05", "--ckpt-every", "10",
            "--ckpt", str(tmp_path / "ck.pt"), "--out", str(tmp_path / "out"), *extra]


def assert_each_event_once(events):
    seen = set()
    for e in events:
        key = (e["kind"], e["wall_ns"], e["node"], e["rank"], e["message"])
        assert key not in seen, ("an event stored twice", e)
        seen.add(key)


def test_postgresql_stopped_during_an_incident_loses_no_event_and_no_cordon(tmp_path, no_leftovers):
    """PostgreSQL goes away; then a rank's GPU falls off the bus. The job is
    stopped, node1 evicted and cordoned, the spare promoted and the job
    restarted while the server is down; when it is back every event of the
    incident and the cordon are in the store, once each, in order."""
    pg = PostgresServer()
    try:
        store = pg.new_database()
        trigger = tmp_path / "die"
        gpu = gpu_fault_env(tmp_path)
        job = Job(tmp_path, "outage", ddp_command(tmp_path, 300, "--die-when", str(trigger), "--die-rank", "1",
                                                  "--die-line", LAUNCH_FAILURE),
                  nnodes=2, nproc=1, flags=["--spares", "1", "--max-restarts", "2"], store=store, env=gpu)
        url = api_url(job)
        wait_for(lambda: get_json(url + "/api/v1/job")["step"] >= 5 or job.proc.poll() is not None, 120,
                 "5 steps")
        assert job.proc.poll() is None, job.output()[-3000:]
        before = [e["kind"] for e in job.events()]
        pg.halt()
        halted = time.monotonic()
        with open(os.path.join(gpu["TG_FAKE_NVML_XID_DIR"], "node1"), "w") as f:
            f.write("0 79\n")  # the driver's Xid for node1's GPU 0, then its rank's CUDA error
        trigger.write_text("now")
        # The whole recovery runs while the store is away: the API reads the controller, not the store.
        wait_for(lambda: get_json(url + "/api/v1/job")["generation"] >= 1, 120, "the restart during the outage")
        assert metric(url, "trainguard_store_unavailable") == 1.0
        assert metric(url, "trainguard_store_queue_depth") > 0
        assert metric(url, "trainguard_store_write_retries_total") > 0
        # At least 10 s without a server, however fast the recovery was.
        time.sleep(max(0.0, 10 - (time.monotonic() - halted)))
        pg.resume()
        wait_for(lambda: metric(url, "trainguard_store_queue_depth") == 0 or job.proc.poll() is not None, 60,
                 "the queued writes stored")
        assert job.wait(240) == 0, job.output()[-3000:]
        events = job.events()
        kinds = [e["kind"] for e in events]
        assert kinds[:len(before)] == before  # nothing before the outage changed
        for once in ["failure", "attribution", "decision", "node_evicted", "spare_promoted", "restarting",
                     "stopped", "downtime", "job_succeeded"]:
            assert kinds.count(once) == 1, (once, kinds)
        assert kinds.count("generation_started") == 2, kinds
        assert kinds.index("failure") < kinds.index("decision") < kinds.index("node_evicted") < \
            kinds.index("restarting") < kinds.index("job_succeeded"), kinds
        assert_each_event_once(events)
        assert [e["node"] for e in job.events("node_evicted")] == ["node1"]
        attribution = job.events("attribution")[0]["detail"]
        assert attribution["category"] == "gpu_hardware", attribution
        # The cordon is in the fleet store: the next job refuses node1.
        done = subprocess.run([TRAINGUARD, "nodes", "--store", store, "--json"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        record = {n["node"]: n for n in json.loads(done.stdout)}["node1"]
        assert record["status"] == "cordoned", record
        assert [h["action"] for h in record["history"]] == ["gpu-errors", "evict"], record  # the Xid, then the eviction
        assert "the store does not take writes" in job.output()
        assert "the store takes writes again" in job.output()
    finally:
        pg.stop()


def test_a_locked_sqlite_store_holds_up_no_heartbeat_exit_or_restart(tmp_path, no_leftovers):
    """Another process holds the job's SQLite file locked (BEGIN EXCLUSIVE)
    for 30 s while a rank is killed: the failure is detected at once, no node
    is declared lost, the job restarts while the lock is still held, and
    afterwards every event is in the store once."""
    job = Job(tmp_path, "locked", ddp_command(tmp_path, 400), nnodes=2, nproc=2)
    url = api_url(job)
    wait_for(lambda: get_json(url + "/api/v1/job")["step"] >= 5 or job.proc.poll() is not None, 120, "5 steps")
    assert job.proc.poll() is None, job.output()[-3000:]
    pids = job.rank_pids()
    locked = threading.Event()
    release = threading.Event()

    def hold():
        db = sqlite3.connect(job.store, timeout=30, isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        locked.set()
        release.wait(30)
        db.execute("COMMIT")
        db.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(30), "the store could not be locked"
        killed_at_ms = time.time() * 1000
        os.kill(pids[3], 9)
        wait_for(lambda: get_json(url + "/api/v1/job")["generation"] >= 1 and
                 get_json(url + "/api/v1/job")["state"] == "RUNNING", 25, "the restart while the store is locked")
        assert holder.is_alive() and not release.is_set()  # the lock was held all along
        assert metric(url, "trainguard_store_queue_depth") > 0  # the writes wait for the lock
        nodes = get_json(url + "/api/v1/nodes")["nodes"]
        assert all(n["role"] == "member" for n in nodes), nodes
    finally:
        release.set()
        holder.join()
    assert job.wait(240) == 0, job.output()[-3000:]
    events = job.events()
    kinds = [e["kind"] for e in events]
    assert "node_lost" not in kinds, kinds
    assert kinds.count("failure") == 1 and kinds.count("job_succeeded") == 1, kinds
    failure = job.events("failure")[0]
    assert failure["rank"] == 3
    # Detected when the exit came, not when the store let the event in.
    assert failure["detail"]["detected_unix_ms"] - killed_at_ms < 5000, failure["detail"]
    assert_each_event_once(events)
