"""Issue 9, part 4: a rank the kernel's OOM killer kills is attributed to
`oom`, from the kernel's own report, which the agent reads from /dev/kmsg and
keeps only when it names one of the job's processes. The job runs inside a
memory-limited cgroup, where one rank allocates until the kernel kills it."""

import os
import subprocess

import pytest

from conftest import PYTHON, TRAINGUARD, events

GREEDY = ("import os, sys, time\n"
          "print('rank', os.environ['RANK'], 'up', flush=True)\n"
          "if os.environ['RANK'] != '1':\n"
          "    time.sleep(120); sys.exit(0)\n"
          "hoard = []\n"
          "while True:\n"
          "    hoard.append(bytearray(32 << 20))      # bytearray touches every page\n"
          "    time.sleep(0.01)\n")


def memory_cgroup(name, limit_bytes):
    """Creates a memory cgroup (v2 or v1) limited to `limit_bytes` without swap; its path."""
    if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        with open("/sys/fs/cgroup/cgroup.controllers") as f:
            if "memory" not in f.read().split():
                return None
        path = "/sys/fs/cgroup/" + name
        os.mkdir(path)
        with open(path + "/memory.max", "w") as f:
            f.write(str(limit_bytes))
        if os.path.exists(path + "/memory.swap.max"):
            with open(path + "/memory.swap.max", "w") as f:
                f.write("0")
        return path
    if os.path.isdir("/sys/fs/cgroup/memory"):
        path = "/sys/fs/cgroup/memory/" + name
        os.mkdir(path)
        with open(path + "/memory.limit_in_bytes", "w") as f:
            f.write(str(limit_bytes))
        return path
    return None


@pytest.fixture
def cgroup():
    if os.geteuid() != 0:
        pytest.skip("needs root for a memory cgroup and /dev/kmsg")
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
    except OSError:
        pytest.skip("/dev/kmsg is not readable here")
    path = memory_cgroup("trainguard-oom-%d" % os.getpid(), 400 << 20)
    if path is None:
        pytest.skip("no memory cgroup controller")
    yield path
    # Empty once the job's processes are gone (no_leftovers waits for that).
    for _ in range(100):
        try:
            os.rmdir(path)
            break
        except OSError:
            import time
            time.sleep(0.1)


def test_a_rank_killed_by_the_oom_killer_is_attributed_to_oom(tmp_path, cgroup, no_leftovers):
    script = tmp_path / "greedy.py"
    script.write_text(GREEDY)
    store = str(tmp_path / "tg.db")
    line = [TRAINGUARD, "run", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0",
            "--store", store, "--job-id", "oom", "--run-dir", str(tmp_path / "run"),
            "--", PYTHON, str(script)]
    done = subprocess.run(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *line],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 128 + 9, done.stderr[-3000:]
    evs = events(store, "oom")
    failure = [e for e in evs if e["kind"] == "failure"][0]
    assert failure["rank"] == 1 and failure["detail"]["signal"] == 9
    pid = [e for e in evs if e["kind"] == "ranks_started"][0]["detail"]["pids"]["1"]
    kernel = failure["detail"].get("kernel_lines", [])
    assert any("Killed process %d " % pid in l for l in kernel), kernel[-10:]
    attribution = [e for e in evs if e["kind"] == "attribution"][0]["detail"]
    assert attribution["category"] == "oom" and attribution["rule"] == "oom-host", attribution
    assert attribution["culprit_ranks"] == [1]
