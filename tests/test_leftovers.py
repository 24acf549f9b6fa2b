"""scripts/leftovers.py, which every CI run's tests run under: it must name
what a command left behind (here a file in /tmp and a process that escaped
into a session of its own), kill such processes, pass the command's own
failure through, and collect orphans as init would (a test that waits for a
killed process to be gone must not find a zombie of the subreaper's)."""

import os
import subprocess
import uuid

from conftest import ROOT, processes_mentioning, wait_for

LEFTOVERS = os.path.join(ROOT, "scripts", "leftovers.py")


def guarded(script):
    return subprocess.run(["/usr/bin/python3", LEFTOVERS, "--", "bash", "-c", script],
                          capture_output=True, text=True, timeout=60)


def test_a_file_and_an_escaped_process_are_named_and_the_process_is_killed():
    tag = "tg-leftover-probe-" + uuid.uuid4().hex[:8]
    path = "/tmp/" + tag
    try:
        # The sleep's own session and a parent that exits: reparented to the subreaper.
        done = guarded("touch %s; (setsid bash -c 'sleep 120; :' %s </dev/null >/dev/null 2>&1 &); exit 0"
                       % (path, tag))
        assert done.returncode == 1, done.stdout + done.stderr
        assert "tmp       " + tag in done.stdout, done.stdout
        assert [line for line in done.stdout.splitlines() if line.strip().startswith("processes")
                and tag in line], done.stdout
        wait_for(lambda: not processes_mentioning(tag), 10, "the leftover sleep to be killed")
    finally:
        if os.path.exists(path):
            os.remove(path)


def test_the_commands_failure_passes_through_and_a_killed_orphan_is_collected_at_once():
    done = guarded("exit 3")
    assert done.returncode == 3, done.stdout + done.stderr
    # An orphan killed by the command is gone (not a zombie) within a second.
    # (Exit codes of its own: the command's status comes first, whatever
    # other tests running at the same time put in /tmp.)
    script = ('p=$(bash -c "sleep 60 </dev/null >/dev/null 2>&1 & echo \\$!"); kill -9 $p; '
              'for i in $(seq 100); do kill -0 $p 2>/dev/null || exit 42; sleep 0.01; done; exit 7')
    done = guarded(script)
    assert done.returncode == 42, (done.returncode, done.stdout, done.stderr)
