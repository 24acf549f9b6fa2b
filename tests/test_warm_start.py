"""Warm standby ranks (docs/restart.md), end to end with real DDP ranks:

- a warm start is indistinguishable from a cold one for the script (all it
  can observe about its start, and how an uncaught exception is reported);
- every reason not to use a standby (killed, still importing, the script
  edited) falls back to a cold start, says why in the events, and the job's
  final parameters equal a plain run's;
- each node's memory copy of a checkpoint is used only when it verifies
  (a flipped byte, another save: storage, saying why), and a node that comes
  back empty fetches its ranks' copies from the node that held them;
- `--no-warm` makes no standby;
- a newer checkpoint that is skipped is named, with its file and reason.
"""

import json
import os
import re
import signal

import pytest

from conftest import EXAMPLE, PYTHON, Job, plain_example_checksum, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))
OBSERVE = os.path.join(HERE, "observe_start.py")
READY = re.compile(r"warm standby of local rank (\d+) ready")
STEPS = 500


def ready_count(job):
    return len(READY.findall(job.output()))


def wait_ready(job, n, timeout=120):
    wait_for(lambda: ready_count(job) >= n or job.proc.poll() is not None, timeout, "%d warm standbys" % n)
    assert ready_count(job) >= n, "the job ended before its standbys were ready:\n" + job.output()[-3000:]


def standby_pids(tmp_path):
    """The standbys of the job run in `tmp_path` (its directory is in their
    working directory or environment): other tests' jobs, running at the same
    time, have standbys of their own."""
    token = str(tmp_path).encode()
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if b"_standby.main()" not in f.read():
                    continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                mine = token in f.read() or os.readlink("/proc/%s/cwd" % pid).encode().startswith(token)
        except OSError:
            continue
        if mine:
            pids.append(int(pid))
    return pids


def normalized(path):
    with open(path) as f:
        seen = json.load(f)
    seen["fds"] = {fd: re.sub(r"\.gen\d+\.", ".gen*.", t) for fd, t in seen["fds"].items()}
    return seen


def traceback_of(log, generation):
    with open(log) as f:
        text = f.read()
    part = text.split("==== trainguard: generation %d " % generation)[1].split("==== trainguard:")[0]
    return [line for line in part.splitlines() if line.startswith(("Traceback", "  File", "RuntimeError"))]


def test_a_warm_start_looks_like_a_cold_one(tmp_path, no_leftovers):
    out, go = tmp_path / "out", tmp_path / "go"
    out.mkdir()
    go.mkdir()
    # Started the way a shell's `cmd &` starts it, with SIGINT and SIGQUIT
    # ignored: the ranks, cold or warm, still start with every signal at its
    # default (Python's own SIGINT handler).
    ignored = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGQUIT)}
    try:
        job = Job(tmp_path, "obs", [PYTHON, OBSERVE, str(out), "--fail-generations", "2", "--go-dir", str(go)],
                  nnodes=1, nproc=2)
    finally:
        for sig, handler in ignored.items():
            signal.signal(sig, handler)
    for generation in (0, 1):
        wait_ready(job, 2 * (generation + 1))
        (go / ("go%d" % generation)).touch()
    assert job.wait() == 0, job.output()[-3000:]
    started = {e["generation"]: e for e in job.events("ranks_started")}
    assert started[0]["detail"]["warm"] == [] and "the first start has no standby" in started[0]["message"]
    for generation in (1, 2):
        assert sorted(started[generation]["detail"]["warm"]) == [0, 1], started[generation]["message"]
    for rank in (0, 1):
        cold = normalized(out / ("gen0.rank%d.json" % rank))
        assert cold["signals"][str(int(signal.SIGINT))] == repr(signal.default_int_handler), cold["signals"]
        assert cold["signals"][str(int(signal.SIGQUIT))] == repr(signal.SIG_DFL), cold["signals"]
        for generation in (1, 2):
            warm = normalized(out / ("gen%d.rank%d.json" % (generation, rank)))
            differ = {k: (cold[k], warm.get(k)) for k in cold if cold[k] != warm.get(k)}
            assert not differ, "rank %d generation %d differs from the cold start: %s" % (rank, generation, differ)
    # An uncaught exception reads the same: the script's frames, no standby's.
    log = os.path.join(job.tmp, "run", "node0", "logs", "rank0.stderr.log")
    cold_tb, warm_tb = traceback_of(log, 0), traceback_of(log, 1)
    assert cold_tb[0] == "Traceback (most recent call last):" and "observe_start.py" in cold_tb[1]
    assert [line.replace("generation 1", "generation 0") for line in warm_tb] == cold_tb
    restart = [e for e in job.events("downtime")][0]["detail"]
    assert restart["restart_terms"]["warm"] is True
    assert sum(v for k, v in restart["restart_terms"].items() if k.endswith("_ms")) == restart["restart_ms"]


@pytest.fixture(scope="module")
def plain_checksum(tmp_path_factory):
    """The example job's final parameters, run plainly: four processes with
    torchrun's environment, no supervisor, no trainguard."""
    return plain_example_checksum(tmp_path_factory.mktemp("plain"), STEPS)


def run_with_fault(tmp_path, job_id, fault):
    """The example job (its copy, importing one module from an installed-package
    directory after torch), with `fault` applied to its standbys before rank 1 is
    killed; returns the job and its final checksum."""
    site = tmp_path / "lib" / "site-packages"  # installed, not the script's own: the standbys import it
    site.mkdir(parents=True)
    marks = tmp_path / "marks"
    marks.mkdir()
    # Hangs in a warm standby (which runs trainguard._standby) once the flag
    # "hang" exists; with "slow", computes there until the file "go" exists
    # (60 s at most), which the test makes once the restart has begun: the
    # restart always finds them importing, however slow the machine. Either
    # way the standby leaves a mark as it gets there: torch is imported by then.
    (site / "tg_slow_import.py").write_text(
        "import os, sys, time\n"
        "if 'trainguard._standby' in sys.modules and os.path.exists(%r):\n"
        "    open(os.path.join(%r, str(os.getpid())), 'w').close()\n"
        "    time.sleep(3600)\n"
        "if 'trainguard._standby' in sys.modules and os.path.exists(%r):\n"
        "    open(os.path.join(%r, str(os.getpid())), 'w').close()\n"
        "    end = time.monotonic() + 60\n"
        "    while time.monotonic() < end and not os.path.exists(%r):\n"
        "        pass\n" % (str(tmp_path / "hang"), str(marks), str(tmp_path / "slow"), str(marks), str(tmp_path / "go")))
    with open(EXAMPLE) as f:
        source = f.read()
    script = tmp_path / "train.py"
    # After torch: what a standby has left once it marks is what this module adds.
    script.write_text(source.replace("import torch\n", "import torch\nimport tg_slow_import  # noqa: F401\n", 1))
    if fault is hang_imports:
        (tmp_path / "hang").touch()
    if fault is slow_imports:
        (tmp_path / "slow").touch()
    command = [PYTHON, str(script), "--steps", str(STEPS), "--ckpt-every", "20", "--step-delay", "0.02",
               "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "sum")]
    job = Job(tmp_path, job_id, command, flags=["--max-restarts", "2"], env={"PYTHONPATH": str(site)})
    if fault in (hang_imports, slow_imports):
        # Killed once every standby is in the import: what is left of it is
        # the 2 s at most (slow) or nothing (hang), however slow torch's import was.
        wait_for(lambda: len(os.listdir(marks)) >= 4 or job.proc.poll() is not None, 120, "4 standbys in the import")
    else:
        wait_ready(job, 4)
    fault(tmp_path, script)
    os.kill(job.rank_pids()[1], signal.SIGKILL)
    if fault is slow_imports:
        # The restart has begun (and waits for the standbys): let them finish.
        wait_for(lambda: [e for e in job.events("generation_started") if e["generation"] == 1]
                 or job.proc.poll() is not None, 120, "the restart to begin")
        (tmp_path / "go").touch()
    rc = job.wait(300)
    assert rc == 0, job.output()[-3000:]
    return job, (tmp_path / "sum").read_text().strip()


def kill_standbys(tmp_path, script):
    for pid in standby_pids(tmp_path):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not standby_pids(tmp_path), 30, "the standbys killed")


def hang_imports(tmp_path, script):
    """The flag was set before the start: the standbys hang in an import."""


def slow_imports(tmp_path, script):
    """The flag was set before the start: the standbys compute in an import
    until the test lets them go, once the restart has begun."""


def edit_script(tmp_path, script):
    with open(script, "a") as f:
        f.write("# edited between generations\n")


@pytest.mark.parametrize("fault,reason", [
    (kill_standbys, "killed by signal 9"),
    (hang_imports, "still importing and made no progress for 2 s"),
    (edit_script, "changed since the standby was made"),
])
def test_a_standby_that_cannot_serve_falls_back_cold(tmp_path, no_leftovers, plain_checksum, fault, reason):
    job, checksum = run_with_fault(tmp_path, "fb-" + fault.__name__, fault)
    started = [e for e in job.events("ranks_started") if e["generation"] == 1]
    assert len(started) == 2
    for e in started:
        assert e["detail"]["warm"] == [], e["message"]
        reasons = " ".join(e["detail"]["cold"])
        assert reason in reasons, e["message"]
    assert checksum == plain_checksum


def test_a_standby_still_importing_is_awaited_not_replaced_by_a_cold_start(tmp_path, no_leftovers, plain_checksum):
    """Rank 1 dies while the standbys are still importing (each computes in
    an import until the restart has begun): the restart waits for them — they are ahead of a cold
    process — and every rank starts warm; the wait is in the start's event and
    in the restart's terms, and the job ends with a plain run's parameters."""
    job, checksum = run_with_fault(tmp_path, "slow-imports", slow_imports)
    started = [e for e in job.events("ranks_started") if e["generation"] == 1]
    assert len(started) == 2
    for e in started:
        ranks = sorted(int(r) for r in e["detail"]["pids"])
        assert sorted(e["detail"]["warm"]) == ranks, e["message"]
        waited = e["detail"]["standby_wait_ms"]
        assert sorted(int(r) for r in waited) == ranks and all(ms > 0 for ms in waited.values()), e["detail"]
        assert "for 2 standby(s) still importing" in e["message"], e["message"]
    terms = job.events("downtime")[0]["detail"]["restart_terms"]
    assert terms["warm"] is True and terms["standby_wait_ms"] > 0, terms
    assert "waited" in job.output() and "started warm" in job.output()
    assert checksum == plain_checksum


STORE_LINE = re.compile(r"trainguard agent (\S+): node memory copies of checkpoints in (\S+)")


def memory_root(job, node):
    """Where `node`'s agent keeps its memory copies (its own tmpfs, through /proc), as it said."""
    roots = dict(STORE_LINE.findall(job.output()))
    return roots.get(node)


def memory_copies(job, node, tree=""):
    """The whole copies in `node`'s memory: its own tree, or tree="peer" (what other nodes pushed to it)."""
    root = memory_root(job, node)
    found = []
    if not root:
        return found
    top = os.path.join(root, tree) if tree else root
    for d, dirs, files in os.walk(top):
        if not tree and d == root and "peer" in dirs:
            dirs.remove("peer")
        found += [os.path.join(d, f) for f in files if f.endswith(".data")]
    return found


def sources(job, generation):
    """How each rank of a generation said it resumed: {rank: "memory" | "storage"}."""
    said = {}
    for node in ("node0", "node1"):
        for rank in range(4):
            path = os.path.join(job.tmp, "run", node, "logs", "rank%d.stdout.log" % rank)
            if not os.path.exists(path):
                continue
            with open(path) as f:
                part = f.read().split("==== trainguard: generation %d " % generation)[-1]
            m = re.search(r"resumed from step \d+ \(trainguard checkpoint, read from ([^)]+)\)", part)
            if m:
                said[rank] = m.group(1)
    return said


@pytest.mark.parametrize("fault", ["none", "flipped-byte", "another-save"])
def test_a_restart_restores_from_the_nodes_memory_unless_the_copy_is_wrong(tmp_path, no_leftovers, plain_checksum,
                                                                           fault):
    """Each node keeps its ranks' newest committed checkpoint in memory; the
    restarted ranks read it from there, verified as from storage. With one
    byte flipped in node0's copies, or node0's copies filed under another
    save of the step, node0's ranks say why and read storage."""
    job_id = "mem-%s" % fault
    # A commit every 200 steps (4 s): the kill comes seconds before the next one.
    command = [PYTHON, EXAMPLE, "--steps", str(STEPS), "--ckpt-every", "200", "--step-delay", "0.02",
               "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "sum")]
    job = Job(tmp_path, job_id, command, flags=["--max-restarts", "2"])
    wait_for(lambda: job.events("checkpoint_committed") or job.proc.poll() is not None, 120, "a checkpoint")
    wait_for(lambda: memory_root(job, "node0") or job.proc.poll() is not None, 60, "node0's memory copies")
    assert memory_root(job, "node0").startswith("/proc/"), "not the agent's own tmpfs: " + job.output()[-2000:]
    copies = memory_copies(job, "node0")
    assert len(copies) == 2, copies  # ranks 0 and 1, one step each
    if fault == "flipped-byte":
        for path in copies:
            with open(path, "r+b") as f:
                f.seek(100)
                b = f.read(1)
                f.seek(100)
                f.write(bytes([b[0] ^ 0x01]))
    elif fault == "another-save":  # the bytes are right, but filed as another attempt's save of the step
        save_dir = os.path.dirname(copies[0])
        os.rename(save_dir, os.path.join(os.path.dirname(save_dir), "save-anotherattempt-7"))
    os.kill(job.rank_pids()[1], signal.SIGKILL)
    assert job.wait(300) == 0, job.output()[-3000:]
    said = sources(job, 1)
    assert sorted(said) == [0, 1, 2, 3], said
    if fault != "none":
        assert said == {0: "storage", 1: "storage", 2: "memory", 3: "memory"}, said
        alerts = [e for e in job.events("log_alert") if "memory copy" in e["message"]]
        assert {e["rank"] for e in alerts} == {0, 1}, [e["message"] for e in job.events("log_alert")]
        why = "checksum" if fault == "flipped-byte" else "another save of step 200"
        assert all(why in e["message"] for e in alerts), [e["message"] for e in alerts]
    else:
        assert set(said.values()) == {"memory"}, said
    assert (tmp_path / "sum").read_text().strip() == plain_checksum
    assert not memory_copies(job, "node0"), "the agent leaves its memory copies behind"
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("trainguard-%s-" % job_id)]


def test_a_lost_node_comes_back_with_its_checkpoint_from_its_peers_memory(tmp_path, no_leftovers, plain_checksum):
    """Each node pushes its ranks' committed copies to the next node's memory.
    node1's agent is killed (its ranks go with it, and its tmpfs with it): the
    node that replaces it fetches ranks 2 and 3's copies from node0 before they
    start, the ranks restore from them verified as from storage, and the job
    ends with the parameters of a plain run."""
    job_id = "mem-peer"
    # A commit every 200 steps (4 s): the kill comes seconds before the next one.
    command = [PYTHON, EXAMPLE, "--steps", str(STEPS), "--ckpt-every", "200", "--step-delay", "0.02",
               "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "sum")]
    job = Job(tmp_path, job_id, command, flags=["--max-restarts", "2", "--heartbeat-interval", "0.5"])

    def committed():
        steps = [int(d.split("-")[1]) for d in os.listdir(tmp_path / "ckpt")
                 if d.startswith("step-") and os.path.exists(tmp_path / "ckpt" / d / "COMMIT.json")] \
            if os.path.isdir(tmp_path / "ckpt") else []
        return max(steps, default=None)

    def pushed():  # node1's ranks' copies of the newest committed step, whole, in node0's memory
        copies = memory_copies(job, "node0", "peer")
        names = sorted(os.path.basename(p) for p in copies)
        steps = {int(p.split("/step-")[1].split("/")[0]) for p in copies}
        return names == ["rank-00002.data", "rank-00003.data"] and steps == {committed()}
    wait_for(lambda: pushed() or job.proc.poll() is not None, 120, "node1's copies in node0's memory")
    assert pushed(), job.output()[-3000:]
    held = {os.path.basename(p): os.path.getsize(p) for p in memory_copies(job, "node0", "peer")}
    old_root = memory_root(job, "node1")
    os.kill(job.agent_pids()["node1"], signal.SIGKILL)
    assert job.wait(300) == 0, job.output()[-3000:]

    assert job.events("node_lost")[0]["node"] == "node1"
    again = [e for e in job.events("ranks_started") if e["generation"] == 1 and e["node"] == "node1"]
    assert len(again) == 1
    fetched = again[0]["detail"]["memory_restore"]
    assert fetched["from_node"] == "node0" and fetched["problem"] == "", fetched
    assert fetched["files"] == 2 and fetched["bytes"] == sum(held.values()), (fetched, held)
    assert "fetched from node0's memory" in again[0]["message"]
    node0 = [e for e in job.events("ranks_started") if e["generation"] == 1 and e["node"] == "node0"]
    assert "memory_restore" not in node0[0]["detail"], "node0 kept its own copies: nothing to fetch"
    resumed = {e["detail"].get("resumed_step") for e in job.events("first_step") if e["generation"] == 1}
    assert resumed == {200}, resumed
    assert sources(job, 1) == {0: "memory", 1: "memory", 2: "peer memory of node0", 3: "peer memory of node0"}
    assert (tmp_path / "sum").read_text().strip() == plain_checksum
    assert not os.path.exists(old_root), "the killed agent's tmpfs outlived it"
