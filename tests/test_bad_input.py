"""Bad input: a clear one-line error and a non-zero exit, never a hang."""

import os
import subprocess

from conftest import PYTHON, TRAINGUARD, free_port, wait_for


def run(*args, timeout=60):
    return subprocess.run([TRAINGUARD, *args], capture_output=True, text=True, timeout=timeout)


def error_line(r):
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.returncode != 0
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_unknown_flag(tmp_path):
    assert "--bogus" in error_line(run("run", "--bogus", "--", "true"))


def test_missing_command(tmp_path):
    assert "command" in error_line(run("run", "--store", str(tmp_path / "s.db")))


def test_missing_subcommand():
    assert run().returncode != 0


def test_nonexistent_script(tmp_path):
    line = error_line(run("run", "--store", str(tmp_path / "s.db"), "--", PYTHON, "/no/such/train.py"))
    assert "script not found: /no/such/train.py" in line


def test_nonexistent_program(tmp_path):
    assert "no-such-program" in error_line(run("run", "--store", str(tmp_path / "s.db"), "--", "no-such-program"))


def test_unwritable_store(tmp_path):
    line = error_line(run("run", "--store", "/nonexistent-dir/s.db", "--", "true"))
    assert "/nonexistent-dir/s.db" in line


def test_unreachable_controller(tmp_path):
    port = free_port()
    line = error_line(run("agent", "--controller", "127.0.0.1:%d" % port, "--connect-timeout", "1",
                          "--run-dir", str(tmp_path)))
    assert "cannot reach the controller" in line


def test_bad_controller_address(tmp_path):
    assert "HOST:PORT" in error_line(run("agent", "--controller", "nocolon", "--run-dir", str(tmp_path)))


def test_protocol_version_mismatch(tmp_path):
    port = free_port()
    ctl = subprocess.Popen([TRAINGUARD, "controller", "--listen", "127.0.0.1:%d" % port,
                            "--store", str(tmp_path / "s.db"), "--rendezvous-timeout", "60",
                            "--", "true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = run("agent", "--controller", "127.0.0.1:%d" % port, "--protocol-version", "99",
                "--connect-timeout", "20", "--run-dir", str(tmp_path))
        assert "protocol version mismatch" in error_line(r)
    finally:
        ctl.terminate()
        ctl.wait(timeout=30)


def test_events_of_missing_store(tmp_path):
    assert "no store" in error_line(run("events", "--store", str(tmp_path / "none.db")))


def test_ckpt_commands_on_a_missing_directory(tmp_path):
    assert "no checkpoint directory" in error_line(run("ckpt", "ls", str(tmp_path / "none")))
    assert "no checkpoint directory" in error_line(run("ckpt", "verify", str(tmp_path / "none")))
