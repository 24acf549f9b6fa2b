"""Issue 11, part 2: the node diagnostics suite (`trainguard diag`) finds the
one bad node among healthy ones: a CPU throttled by a real cgroup quota (to
50 %) by its compute figure against the nodes' median, a checkpoint disk that
is a full tmpfs by its failed write and free space. Each "node" is a node id
whose suite runs on this machine, one after the other; the figures go to a
real SQLite store and `diag --show` judges the newest of every node."""

import json
import os
import subprocess

import pytest

from conftest import TRAINGUARD, cpu_cgroup, remove_cgroup

NODES = ["node-0", "node-1", "node-2", "node-3"]


def diag(store, *args, cgroup=None, timeout=120):
    line = [TRAINGUARD, "diag", "--store", store, *args]
    if cgroup is not None:  # join the cgroup, then become trainguard: the whole suite runs throttled
        line = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *line]
    return subprocess.run(line, capture_output=True, text=True, timeout=timeout)


def shown(store):
    done = diag(store, "--show", "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, {n["node"]: n for n in json.loads(done.stdout)["nodes"]}


def remeasure_flagged(store, paths, keep=()):
    """What an operator does with a node flagged against the median: measure it
    again. This VM's speed changes by up to 2x over tens of seconds, and records
    of nodes measured one after the other can straddle such a change (the
    controller's own rounds measure every node twice for that reason). Up to
    three times: a busy CI machine's swings outlast two."""
    for _ in range(3):
        _, nodes = shown(store)
        flagged = [n for n, v in nodes.items() if not v["healthy"] and n not in keep]
        if not flagged:
            return
        for n in flagged:
            diag(store, "--node-id", n, "--path", paths[n])


@pytest.fixture
def half_cpu():
    if os.geteuid() != 0:
        pytest.skip("a CPU quota needs root")
    path = cpu_cgroup("trainguard-diag-%d" % os.getpid(), 0.5)
    if path is None:
        pytest.skip("no cpu cgroup controller")
    yield path
    remove_cgroup(path)


@pytest.fixture
def full_tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "full-ckpt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], check=True)
    try:
        with open(mnt / "filler", "wb") as f:  # fill it to the last block
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_the_cpu_throttled_node_and_only_it_fails_against_the_median(tmp_path, half_cpu):
    store = str(tmp_path / "tg.db")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    paths = {node: "checkpoint=%s" % ckpt for node in NODES}
    for node in NODES:
        done = diag(store, "--node-id", node, "--path", paths[node])
        assert done.returncode in (0, 1), done.stdout + done.stderr
    remeasure_flagged(store, paths)
    rc, healthy = shown(store)
    assert rc == 0 and all(n["healthy"] for n in healthy.values()), healthy

    throttled = diag(store, "--node-id", "node-2", "--path", "checkpoint=%s" % ckpt, cgroup=half_cpu)
    assert throttled.returncode == 1, throttled.stdout + throttled.stderr
    assert "node node-2 (quick suite): FAIL" in throttled.stdout
    assert "the nodes' median: measuring again" in throttled.stderr  # slow twice before it fails
    remeasure_flagged(store, paths, keep=("node-2",))
    rc, nodes = shown(store)
    assert rc == 1
    assert [n for n, v in nodes.items() if not v["healthy"]] == ["node-2"], nodes
    compute = [f for f in nodes["node-2"]["figures"] if f["name"] == "compute_gflops"][0]
    assert not compute["ok"] and compute["nodes_in_median"] == 4
    assert 0.3 < compute["value"] / compute["median"] < 0.7, compute
    assert "of the median" in compute["failure"] and "(min 70 %)" in compute["failure"]
    # The others' compute is within reach of the median, so nothing else of theirs fails.
    for name in ("node-0", "node-1", "node-3"):
        assert nodes[name]["failures"] == [], nodes[name]
    text = diag(store, "--show")
    assert "failing: node-2" in text.stdout, text.stdout


# Serial: four nodes' figures are judged against their median, and only the
# full disk's node may fail; other tests' bursts swung another node's (seen:
# a second node flagged on a busy machine).
@pytest.mark.serial
def test_the_node_whose_checkpoint_disk_is_full_fails_the_disk_test(tmp_path, full_tmpfs):
    store = str(tmp_path / "tg.db")
    paths = {}
    for node in NODES:
        ckpt = tmp_path / ("ckpt-" + node)
        ckpt.mkdir()
        paths[node] = "checkpoint=%s" % (full_tmpfs if node == "node-1" else str(ckpt))
        done = diag(store, "--node-id", node, "--path", paths[node])
        assert done.returncode in (0, 1), done.stdout + done.stderr
        assert node != "node-1" or done.returncode == 1
    remeasure_flagged(store, paths, keep=("node-1",))
    rc, nodes = shown(store)
    assert rc == 1
    assert [n for n, v in nodes.items() if not v["healthy"]] == ["node-1"], nodes
    failed = {f["name"]: f for f in nodes["node-1"]["figures"] if not f["ok"]}
    # Its disk figures fail, and only its. (The compute figures of four
    # nodes measured in turn on this 2-core VM swing by 30 %: a compute flag
    # beside them is noise, not what this test is about.)
    disk = {name for name in failed if name.startswith("disk_")}
    assert disk == {"disk_write_mbps:checkpoint", "disk_read_mbps:checkpoint", "disk_free_gib:checkpoint"}, failed
    assert all(name in disk or name in ("compute_gflops", "memory_gbps") for name in failed), failed
    assert "No space left on device" in failed["disk_write_mbps:checkpoint"]["error"]
    assert full_tmpfs in failed["disk_write_mbps:checkpoint"]["error"]
    assert os.listdir(full_tmpfs) == ["filler"]  # the probe left nothing behind


def test_diag_without_a_store_judges_by_floors_and_stale_records_are_not_compared(tmp_path):
    done = subprocess.run([TRAINGUARD, "diag", "--no-store", "--node-id", "solo", "--path",
                           "scratch=%s" % tmp_path, "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["nodes_compared"] == 1 and report["nodes"][0]["node"] == "solo"
    names = [f["name"] for f in report["nodes"][0]["figures"]]
    assert names == ["compute_gflops", "memory_gbps", "gemm_known_answer_mismatches", "disk_write_mbps:scratch",
                     "disk_read_mbps:scratch",
                     "disk_free_gib:scratch"]
    # A floor an operator raises above what this machine does fails the node.
    done = subprocess.run([TRAINGUARD, "diag", "--no-store", "--path", "scratch=%s" % tmp_path,
                           "--floor", "compute_gflops=1e9"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "below the floor" in done.stdout, done.stdout
    store = str(tmp_path / "tg.db")
    assert diag(store, "--node-id", "old", "--path", "scratch=%s" % tmp_path).returncode == 0
    done = diag(store, "--show", "--json", "--max-age", "0")  # every record is older than now
    assert json.loads(done.stdout)["nodes"] == [] and json.loads(done.stdout)["stale_records_ignored"] == 1


@pytest.mark.parametrize("args, says", [
    (["--path", "checkpoint"], "--path 'checkpoint' is not ROLE=DIR"),
    (["--path", "=/tmp"], "is not ROLE=DIR"),
    (["--floor", "gpu_tflops=3"], "unknown figure 'gpu_tflops'"),
    (["--fraction", "compute_gflops=half"], "'half' is not a non-negative number"),
    (["--fraction", "compute_gflops"], "is not KIND=NUMBER"),
])
def test_bad_diag_input_is_named(tmp_path, args, says):
    done = diag(str(tmp_path / "tg.db"), *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert not (tmp_path / "tg.db").exists()  # refused before anything ran or was written


def test_show_without_a_store_says_so(tmp_path):
    done = diag(str(tmp_path / "missing.db"), "--show")
    assert done.returncode == 2 and "no store at" in done.stderr, done.stderr
