"""--alert-webhook: a real HTTP receiver started by the test gets the job's
incident, attribution, decision and end as JSON POSTs; a receiver that fails
is retried; the job never waits on it."""

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from conftest import EXAMPLE, PYTHON, TRAINGUARD, Job, wait_for


class Receiver:
    """Collects POSTed JSON; answers 500 to the first `failures` requests."""

    def __init__(self, failures=0):
        self.bodies = []
        self.failures = failures
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.bodies.append((self.path, self.headers["Content-Type"], json.loads(body)))
                    fail = receiver.failures > 0
                    receiver.failures -= 1
                self.send_response(500 if fail else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = "http://127.0.0.1:%d/hooks/trainguard" % self.server.server_address[1]

    def alerts(self):
        with self.lock:
            return list(self.bodies)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_webhook_gets_the_incident_its_decision_and_the_end_and_a_failed_post_is_retried(tmp_path, no_leftovers):
    receiver = Receiver(failures=1)
    try:
        job = Job(tmp_path, "alerted", [PYTHON, EXAMPLE, "--steps", "30", "--ckpt-every", "5",
                                        "--ckpt-dir", str(tmp_path / "ckpt"), "--crash-at-step", "12",
                                        "--crash-rank", "1"],
                  nnodes=2, nproc=1, flags=["--max-restarts", "2", "--alert-webhook", receiver.url])
        assert job.wait(timeout=240) == 0, job.output()[-3000:]
        # Delivered before `run` exited: the job's end is there without waiting.
        got = receiver.alerts()
        kinds = [b["alert"] for _, _, b in got]
        assert {"incident", "attribution", "decision", "job_end"} <= set(kinds), kinds
        assert all(path == "/hooks/trainguard" and ctype == "application/json" for path, ctype, _ in got)
        # The first alert was refused with 500 and sent again.
        assert got[0][2] == got[1][2], (got[0], got[1])
        # The incident names the exit seen first: rank 1's, or its peer's,
        # which lost its connection to rank 1 within milliseconds (the two
        # agents report in a race); the attribution names rank 1, which
        # failed first in time.
        incident = next(b for _, _, b in got if b["alert"] == "incident")
        assert incident["job"] == "alerted" and incident["rank"] in (0, 1), incident
        assert incident["node"] == "node%d" % incident["rank"], incident
        attribution = next(b for _, _, b in got if b["alert"] == "attribution")
        assert attribution["detail"]["culprit_ranks"] == [1], attribution
        decision = next(b for _, _, b in got if b["alert"] == "decision")
        assert decision["detail"]["decision"] == "restart", decision
        end = next(b for _, _, b in got if b["alert"] == "job_end")
        assert end["event"] == "job_succeeded" and end["text"].startswith("[trainguard] job alerted: "), end
        # Every alert is one of the job's recorded events.
        messages = {e["message"] for e in job.events()}
        assert all(b["message"] in messages for _, _, b in got)
    finally:
        receiver.close()


def test_a_bad_webhook_url_is_refused_before_anything_starts(tmp_path):
    done = subprocess.run([TRAINGUARD, "run", "--store", str(tmp_path / "s.db"), "--alert-webhook",
                           "hooks.example/x", "--", PYTHON, EXAMPLE, "--steps", "1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--alert-webhook: webhook URL 'hooks.example/x' has no scheme" in done.stderr, done.stderr
