"""Agents prove they belong to the job: with a job secret the controller
refuses an agent that shows none or a wrong one, with the reason on both
sides; with TLS certificates the stream is encrypted and an agent that does
not speak TLS cannot join. Real controller and agent processes, a real DDP
script that does not import trainguard."""

import os
import subprocess

from conftest import PYTHON, ROOT, TRAINGUARD, events, free_port

PLAIN_DDP = os.path.join(ROOT, "tests", "plain_ddp.py")


def controller(tmp_path, port, job_id, *flags):
    store = os.path.join(str(tmp_path), "ctl.db")
    proc = subprocess.Popen([TRAINGUARD, "controller", "--listen", "127.0.0.1:%d" % port, "--nnodes", "1",
                             "--nproc-per-node", "1", "--store", store, "--job-id", job_id,
                             "--run-dir", os.path.join(str(tmp_path), "ctl"), *flags, "--", PYTHON, PLAIN_DDP,
                             "--steps", "5", "--ckpt", os.path.join(str(tmp_path), "ck.pt"),
                             "--out", os.path.join(str(tmp_path), "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, store


def finish(ctl):
    """The controller's output once it ended (killed if it did not within 60 s)."""
    try:
        out, _ = ctl.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        ctl.kill()
        out, _ = ctl.communicate()
    return out


def agent(tmp_path, port, node, *flags, env=None, timeout=60):
    return subprocess.run([TRAINGUARD, "agent", "--controller", "127.0.0.1:%d" % port, "--node-id", node,
                           "--run-dir", os.path.join(str(tmp_path), node), *flags],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_an_agent_without_the_job_secret_is_refused_and_one_with_it_joins(tmp_path, no_leftovers):
    secret = tmp_path / "secret"
    secret.write_text("correct horse battery staple\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("correct horse battery stapler\n")
    port = free_port()
    ctl, store = controller(tmp_path, port, "guarded", "--secret-file", str(secret))
    try:
        none = agent(tmp_path, port, "intruder")
        assert none.returncode != 0
        assert "controller refused registration: it showed no job secret: start it with --secret-file" in none.stderr, \
            none.stderr
        bad = agent(tmp_path, port, "impostor", "--secret-file", str(wrong))
        assert bad.returncode != 0 and "its job secret is wrong" in bad.stderr, bad.stderr
        missing = agent(tmp_path, port, "lost", "--secret-file", str(tmp_path / "nofile"))
        assert missing.returncode == 2 and "nofile cannot be read" in missing.stderr, missing.stderr
        env = dict(os.environ, TRAINGUARD_SECRET_FILE=str(secret))
        good = agent(tmp_path, port, "member", env=env, timeout=120)
        assert good.returncode == 0, good.stderr
    finally:
        out = finish(ctl)
    assert ctl.returncode == 0, out
    assert "agent intruder" in out and "refused: it showed no job secret" in out, out
    assert "agent impostor" in out and "refused: its job secret is wrong" in out
    evs = events(store, "guarded")
    refused = [e["node"] for e in evs if e["kind"] == "agent_refused"]
    assert refused == ["intruder", "impostor"], refused
    assert [e["node"] for e in evs if e["kind"] == "node_registered"] == ["member"]
    assert all("correct horse" not in e["message"] for e in evs)


def test_tls_streams_need_an_agent_that_trusts_the_certificate(tmp_path, no_leftovers):
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=trainguard-test", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", key, "-out", cert], check=True, capture_output=True, timeout=60)
    port = free_port()
    ctl, store = controller(tmp_path, port, "encrypted", "--tls-cert", cert, "--tls-key", key)
    try:
        plain = agent(tmp_path, port, "plain", "--connect-timeout", "3")
        assert plain.returncode != 0
        assert "(if it serves TLS, give --tls-ca)" in plain.stderr, plain.stderr
        good = agent(tmp_path, port, "member", "--tls-ca", cert, timeout=120)
        assert good.returncode == 0, good.stderr
    finally:
        out = finish(ctl)
    assert ctl.returncode == 0, out
    assert "agents are not authenticated" in out  # no --secret-file: said at start
    assert [e["node"] for e in events(store, "encrypted") if e["kind"] == "node_registered"] == ["member"]

    # `run` hands its own agents the certificate to trust and the job's secret.
    run = subprocess.run([TRAINGUARD, "run", "--nnodes", "2", "--nproc-per-node", "1", "--store",
                          str(tmp_path / "run.db"), "--run-dir", str(tmp_path / "run"), "--tls-cert", cert,
                          "--tls-key", key, "--", PYTHON, PLAIN_DDP, "--steps", "5",
                          "--ckpt", str(tmp_path / "ck2.pt"), "--out", str(tmp_path / "out2")],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert os.stat(tmp_path / "run" / "job-secret").st_mode & 0o777 == 0o600
    not_a_pem = subprocess.run([TRAINGUARD, "run", "--store", str(tmp_path / "run.db"), "--tls-cert", key,
                                "--tls-key", cert, "--", PYTHON, "-c", "pass"], capture_output=True, text=True,
                               timeout=60)
    assert not_a_pem.returncode == 2 and "is --tls-key %s the key of --tls-cert %s?" % (cert, key) in \
        not_a_pem.stderr, not_a_pem.stderr
    only_cert = subprocess.run([TRAINGUARD, "run", "--store", str(tmp_path / "run.db"), "--tls-cert", cert, "--",
                                PYTHON, "-c", "pass"], capture_output=True, text=True, timeout=60)
    assert only_cert.returncode == 2 and "TLS needs both --tls-cert and --tls-key" in only_cert.stderr, \
        only_cert.stderr
