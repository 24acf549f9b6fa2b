"""The controller's HTTP API and /metrics (docs/api.md), against a real
`trainguard run` of a DDP script that does not import trainguard: the API
follows a real failure as it happens (JSON and the live event stream),
/metrics parses with Prometheus' own parser and agrees with the API, actions
need the job's secret, and `trainguard status` reads the same API."""

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import threading
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from conftest import PYTHON, ROOT, TRAINGUARD, Job, api_url, wait_for

PLAIN_DDP = os.path.join(ROOT, "tests", "plain_ddp.py")


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=10) as r:
        return json.loads(r.read())


def post(url, path, token=None, body=None):
    req = urllib.request.Request(url + path, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    if token is not None:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


class EventStream:
    """Reads /api/v1/events/stream (server-sent events) on a thread."""

    def __init__(self, url):
        self.events = []
        self.ended = threading.Event()
        self.lock = threading.Lock()
        self.response = urllib.request.urlopen(url + "/api/v1/events/stream", timeout=120)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        kind, data = None, None
        for raw in self.response:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: "):])
            elif line == "" and kind is not None:
                if kind == "end":
                    self.ended.set()
                    return
                with self.lock:
                    self.events.append(data)
                kind, data = None, None
        self.ended.set()

    def kinds(self):
        with self.lock:
            return [e["kind"] for e in self.events]


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("trainguard_"), family.name
        assert family.documentation, family.name
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    return text, samples


def value(samples, name, **labels):
    found = [v for l, v in samples.get(name, []) if all(l.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def test_the_api_and_metrics_follow_a_real_failure_and_actions_need_the_token(tmp_path, no_leftovers):
    job = Job(tmp_path, "observed", [PYTHON, PLAIN_DDP, "--steps", "100000", "--step-delay", "0.02",
                                     "--ckpt", str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "out")],
              nnodes=2, nproc=2, flags=["--max-restarts", "2", "--http", "127.0.0.1:0"])
    try:
        url = api_url(job)
        stream = EventStream(url)
        wait_for(lambda: get(url, "/api/v1/job")["step"] >= 15, 120, "15 steps")
        ranks = get(url, "/api/v1/ranks")["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
        assert all(r["running"] and r["pid"] > 0 for r in ranks), ranks
        victim = ranks[3]
        assert victim["node"] == "node1"
        os.kill(victim["pid"], signal.SIGKILL)

        def recovered():
            j = get(url, "/api/v1/job")
            return j["restart_count"] == 1 and j["state"] == "RUNNING" and j["step"] > j["checkpoint_step"] + 3
        wait_for(recovered, 120, "the job to restart and step again")
        # The restart's term closes when the controller learns the new
        # generation's first step; until then it runs on to now.
        wait_for(lambda: not get(url, "/api/v1/incidents")["incidents"][0]["restart_open"], 60,
                 "the restart's first step")
        wait_for(lambda: "decision" in stream.kinds(), 30, "the decision on the live stream")
        kinds = stream.kinds()
        assert kinds.index("failure") < kinds.index("attribution") < kinds.index("decision"), kinds

        incidents = get(url, "/api/v1/incidents")["incidents"]
        assert len(incidents) == 1, incidents
        incident = incidents[0]
        assert incident["culprit_ranks"] == [3] and incident["culprit_nodes"] == ["node1"], incident
        assert incident["decision"] == "restart"
        assert incident["category"]
        assert "SIGKILL" in json.dumps(incident["evidence"]) or "signal 9" in json.dumps(incident), incident

        # /metrics, read between two reads of the API: the same job. (Steps
        # arrive with heartbeats, tens at a time: moving figures are bracketed.)
        before = get(url, "/api/v1/job")
        text, samples = metrics(url)
        job_json = get(url, "/api/v1/job")
        nodes = get(url, "/api/v1/nodes")["nodes"]
        downtime = get(url, "/api/v1/downtime")
        assert value(samples, "trainguard_job_state", state="RUNNING") == 1
        assert value(samples, "trainguard_job_state", state="FAILED") == 0
        assert value(samples, "trainguard_job_restarts_total") == job_json["restart_count"] == 1
        assert value(samples, "trainguard_job_incidents_total", category=incident["category"]) == 1
        assert value(samples, "trainguard_job_nodes") == job_json["active_nnodes"] == 2
        for n in nodes:
            assert value(samples, "trainguard_node_up", node=n["node_id"]) == (1 if n["connected"] else 0)
            assert 0 <= value(samples, "trainguard_node_heartbeat_age_seconds", node=n["node_id"]) < 5
        # Terms that no longer move once the incident is over are equal; ETTR moves slowly.
        for term, key in [("startup", "startup_s"), ("detection", "detection_s"), ("shutdown", "shutdown_s"),
                          ("lost_work", "lost_work_s"), ("restart", "restart_s")]:
            assert abs(value(samples, "trainguard_job_downtime_seconds", term=term) - downtime["downtime"][key]) < 1e-6, term
        ettr = value(samples, "trainguard_job_ettr_ratio")
        assert min(before["ettr"], job_json["ettr"]) - 0.02 <= ettr <= max(before["ettr"], job_json["ettr"]) + 0.02
        assert 0 < job_json["ettr"] < 1
        assert value(samples, "trainguard_job_lost_steps_total") == downtime["downtime"]["lost_steps"]
        assert before["step"] <= value(samples, "trainguard_job_step") <= job_json["step"]
        phases = {l["phase"] for l, _ in samples["trainguard_node_phase_seconds"]}
        assert {"forward", "backward", "optimizer"} <= phases, phases
        assert 'trainguard_rank_step{job_id="observed",rank="3",node="node1"}' in text

        # `trainguard status` reads the same API.
        status = subprocess.run([TRAINGUARD, "status", "--store", job.store], capture_output=True, text=True,
                                timeout=30)
        assert status.returncode == 0, status.stderr
        assert "job observed: RUNNING" in status.stdout and "restarts 1/2" in status.stdout, status.stdout
        assert "live from " + url in status.stdout
        assert "last incident #1" in status.stdout and "rank 3 on node1 -> restart" in status.stdout, status.stdout

        # Actions: refused without the token or with a wrong one; done with it.
        token_file = os.path.join(str(tmp_path), "run", "job-secret")
        assert os.stat(token_file).st_mode & 0o777 == 0o600
        token = open(token_file).read().strip()
        assert post(url, "/api/v1/cancel")[0] == 401
        assert post(url, "/api/v1/cancel", token="x" * len(token))[0] == 403
        assert post(url, "/api/v1/nodes/spare9/cordon", token=token, body={})[0] == 400  # no reason
        code, body = post(url, "/api/v1/nodes/spare9/cordon", token=token, body={"reason": "bad DIMM"})
        assert code == 200 and body["status"] == "cordoned", body
        assert get(url, "/api/v1/job")["state"] == "RUNNING"
        code, body = post(url, "/api/v1/cancel", token=token, body={"reason": "enough for today"})
        assert code == 200, body
        rc = job.wait(timeout=120)
    finally:
        job.end()
    assert rc != 0
    assert "cancelled through the API from 127.0.0.1: enough for today" in job.output()
    # The stream ended with the job and carried every event once, in order.
    assert stream.ended.wait(30)
    streamed = [(e["id"], e["kind"]) for e in stream.events]
    with sqlite3.connect(job.store) as db:
        stored = db.execute("SELECT id, kind FROM events WHERE job_id='observed' ORDER BY id").fetchall()
    assert streamed == [tuple(row) for row in stored], (streamed, stored)
    assert stream.events[-1]["kind"] == "job_failed"
    nodes = subprocess.run([TRAINGUARD, "nodes", "--store", job.store], capture_output=True, text=True, timeout=30)
    assert re.search(r"spare9\s+cordoned", nodes.stdout), nodes.stdout
    ended = subprocess.run([TRAINGUARD, "status", "--store", job.store, "observed"], capture_output=True, text=True,
                           timeout=30)
    assert "job observed: FAILED" in ended.stdout and "from the store: the job has ended" in ended.stdout, ended.stdout


def test_http_flags_bad_input_is_refused_and_off_means_no_api(tmp_path, no_leftovers):
    def run(*flags):
        return subprocess.run([TRAINGUARD, "run", "--store", str(tmp_path / "s.db"), "--run-dir",
                               str(tmp_path / "run"), *flags, "--", PYTHON, "-c", "pass"],
                              capture_output=True, text=True, timeout=120)

    bad = run("--http", "localhost")
    assert bad.returncode == 2 and "--http 'localhost' is not HOST:PORT" in bad.stderr, bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = run("--http", "127.0.0.1:%d" % port)
    assert busy.returncode == 2 and "cannot listen on 127.0.0.1:%d" % port in busy.stderr, busy.stderr
    missing = run("--secret-file", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "nope cannot be read" in missing.stderr, missing.stderr
    (tmp_path / "empty").write_text("  \n")
    empty = run("--secret-file", str(tmp_path / "empty"))
    assert empty.returncode == 2 and "is empty" in empty.stderr, empty.stderr

    off = run("--http", "off", "--job-id", "quiet")
    assert off.returncode == 0, off.stderr
    assert "API and metrics at" not in off.stderr
    status = subprocess.run([TRAINGUARD, "status", "--store", str(tmp_path / "s.db"), "quiet"], capture_output=True,
                            text=True, timeout=30)
    assert "job quiet: SUCCEEDED" in status.stdout, status.stdout
    unknown = subprocess.run([TRAINGUARD, "status", "--store", str(tmp_path / "s.db"), "nosuch"], capture_output=True,
                             text=True, timeout=30)
    assert unknown.returncode == 2 and "has no job nosuch (its newest: quiet)" in unknown.stderr, unknown.stderr
