"""Issue 9: exit statuses and defaults that fit the conventions: a failed job
exits with its failing rank's exit code, a run ended by Ctrl-C with 130, and
the event store lives in a per-user state directory, not the current one."""

import os
import signal
import subprocess

from conftest import TRAINGUARD, events, wait_for


def run(tmp_path, *args, env=None, **kw):
    return subprocess.Popen([TRAINGUARD, "run", *args], cwd=str(tmp_path),
                            env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def test_a_failed_job_exits_with_its_failing_ranks_exit_code(tmp_path, no_leftovers):
    script = tmp_path / "exit3.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    sys.exit(3)\n"
                      "time.sleep(60)\n")
    p = run(tmp_path, "--nproc-per-node", "2", "--max-restarts", "0", "--store",
            str(tmp_path / "db"), "--stop-grace", "1", str(script))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 3, err[-2000:]


def test_a_rank_killed_by_a_signal_gives_128_plus_the_signal(tmp_path, no_leftovers):
    script = tmp_path / "kill.py"
    script.write_text("import os, signal, time\n"
                      "if os.environ['RANK'] == '0':\n"
                      "    os.kill(os.getpid(), signal.SIGKILL)\n"
                      "time.sleep(60)\n")
    p = run(tmp_path, "--nproc-per-node", "2", "--max-restarts", "0", "--store",
            str(tmp_path / "db"), "--stop-grace", "1", str(script))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGKILL, err[-2000:]


def test_ctrl_c_exits_130_and_leaves_nothing_running(tmp_path, no_leftovers):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(120)\n")
    store = str(tmp_path / "db")
    p = run(tmp_path, "--nproc-per-node", "2", "--store", store, "--job-id", "ctrlc",
            "--stop-grace", "1", str(script))
    wait_for(lambda: any(e["kind"] == "ranks_started" for e in events(store, "ctrlc")), 60,
             "ranks to start")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err[-2000:]


def test_ctrl_c_on_a_host_waiting_for_its_controller_exits_130_at_once(tmp_path, no_leftovers):
    # The endpoint's port is held by something that never answers as a
    # controller, so this host joins as an agent and waits, as torchrun waits
    # for its rendezvous; Ctrl-C must end the wait, not the rendezvous timeout.
    import socket
    import time
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        endpoint = "127.0.0.1:%d" % held.getsockname()[1]
        p = run(tmp_path, "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", endpoint,
                "--rendezvous-timeout", "60", "--store", str(tmp_path / "db"), "/bin/true")
        waiting = ""
        deadline = time.monotonic() + 30
        while "joins the controller" not in waiting and time.monotonic() < deadline:
            waiting += p.stderr.readline()
        assert "joins the controller at " + endpoint in waiting, waiting
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=20)
    assert p.returncode == 130, waiting + err


def test_the_default_store_is_per_user_not_in_the_current_directory(tmp_path, no_leftovers):
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    env = {"HOME": str(home), "XDG_STATE_HOME": ""}
    p = run(work, "--job-id", "where", "--", "/bin/true", env=env)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert os.listdir(str(work)) == []
    store = home / ".local" / "state" / "trainguard" / "trainguard.db"
    assert store.exists(), err
    shown = subprocess.run([TRAINGUARD, "events", "where"], cwd=str(work), capture_output=True,
                           text=True, env=dict(os.environ, **env), timeout=30)
    assert shown.returncode == 0 and "job_succeeded" in shown.stdout, shown.stderr
    # XDG_STATE_HOME wins when set.
    state = tmp_path / "state"
    p = run(work, "--job-id", "xdg", "--", "/bin/true", env={"HOME": str(home), "XDG_STATE_HOME": str(state)})
    p.communicate(timeout=60)
    assert (state / "trainguard" / "trainguard.db").exists()
