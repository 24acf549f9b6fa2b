"""Where the time goes: phase timers, stragglers, the trace and the heatmap,
with real DDP jobs on gloo (scripts that do not import trainguard)."""

import json
import os
import subprocess
import time

import pytest

from conftest import EXAMPLE, PYTHON, TRAINGUARD, Job, cpu_cgroup, remove_cgroup, wait_for

HERE = os.path.dirname(os.path.abspath(__file__))


def run_cli(*argv):
    done = subprocess.run([TRAINGUARD, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def validate_trace(path):
    """Checks the Chrome trace-event format: every event well formed, flows
    paired, one named process per rank with a sort index. Returns the doc."""
    with open(path) as f:
        doc = json.load(f)
    events = doc["traceEvents"]
    assert events
    flows = {}
    names, sort_index = {}, {}
    for e in events:
        assert e["ph"] in ("X", "M", "s", "f", "i"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["name"], str) and e["name"], e
        if e["ph"] == "X":
            assert isinstance(e["ts"], int) and e["ts"] >= 0, e
            assert isinstance(e["dur"], int) and e["dur"] >= 0, e
            assert e["cat"] in ("step", "phase", "gc", "device", "comm", "storage"), e
        elif e["ph"] == "i":
            assert e["cat"] == "storage" and e["s"] == "t" and isinstance(e["ts"], int) and e["ts"] >= 0, e
        elif e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], []).append(e)
            if e["ph"] == "f":
                assert e["bp"] == "e"
        elif e["name"] == "process_name":
            names[e["pid"]] = e["args"]
        elif e["name"] == "process_sort_index":
            sort_index[e["pid"]] = e["args"]["sort_index"]
    for fid, pair in flows.items():
        assert all(x["pid"] in names for x in pair)
        assert sorted(x["ph"] for x in pair) == ["f", "s"], pair
        s = next(x for x in pair if x["ph"] == "s")
        f = next(x for x in pair if x["ph"] == "f")
        slack = max(names[s["pid"]]["clock_error_us"], 0) + max(names[f["pid"]]["clock_error_us"], 0)
        assert s["pid"] != f["pid"] and s["ts"] <= f["ts"] + slack, pair
    ranks = {e["pid"] for e in events if e["ph"] == "X"}
    assert set(names) == ranks and set(sort_index) == ranks
    assert sorted(sort_index.values()) == list(range(len(ranks)))
    return doc, names, sort_index, flows


@pytest.fixture
def slow_cpu():
    if os.geteuid() != 0:
        pytest.skip("a CPU quota needs root")
    # 0.3 of a CPU in every 10 ms: with four ranks sharing this machine's two
    # cores, the throttled rank computes 25-50 % slower than the others.
    path = cpu_cgroup("trainguard-straggler-%d" % os.getpid(), 0.3, period=10000)
    if path is None:
        pytest.skip("no cpu cgroup controller")
    yield path
    remove_cgroup(path)


def test_a_throttled_node_is_named_the_compute_straggler_and_drawn_so(tmp_path, slow_cpu, no_leftovers):
    # A threshold of 15 %: healthy nodes of this 2-core VM have had 3 windows
    # up to 12 % slow in a run (CI); the default's margin is measured by
    # bench/straggler_bench.py, not here.
    job = Job(tmp_path, "slow", [PYTHON, EXAMPLE, "--steps", "150", "--hidden", "512", "--batch", "128",
                                 "--ckpt-dir", str(tmp_path / "ckpt")], nnodes=4, nproc=1,
              flags=["--straggler-threshold", "0.15"])
    wait_for(lambda: job.rank_pids(0).get(2), 60, "rank 2 to start")
    with open(os.path.join(slow_cpu, "cgroup.procs" if os.path.exists(os.path.join(slow_cpu, "cgroup.procs"))
                           else "tasks"), "w") as f:
        f.write(str(job.rank_pids(0)[2]))
    assert job.wait(timeout=300) == 0, job.output()[-3000:]

    found = job.events("straggler")
    assert found, "no straggler named:\n" + "\n".join(e["message"] for e in job.events())
    assert {e["node"] for e in found} == {"node2"}, [e["message"] for e in found]
    first = found[0]
    assert first["detail"]["signal"] == "compute", first
    assert first["detail"]["slowdown"] >= 0.15, first
    # Its cause, from node2's heartbeats against the others': the quota.
    assert "its ranks' cgroup was throttled by its CPU quota" in first["detail"]["cause"], first
    assert "cause: node2 its ranks' cgroup was throttled" in first["message"], first
    print("named after step %d: %s" % (first["detail"]["last_step"], first["message"]))
    # Every naming says which phase grew and why (or that nothing shows why),
    # and keeps the first naming's first step; a clear comes after it.
    for e in found:
        assert e["detail"]["phase"] in ("forward", "backward", "optimizer"), e
        assert e["detail"]["cause"], e
        assert e["detail"]["first_step"] == first["detail"]["first_step"], (e, first)
    for c in job.events("straggler_cleared"):
        assert c["detail"]["first_step"] > first["detail"]["last_step"], (c, first)
    # The generation learned its own baseline and said so, once.
    baseline = job.events("straggler_baseline")
    assert len(baseline) == 1 and "learned over steps" in baseline[0]["message"], baseline

    heatmap = tmp_path / "heatmap.svg"
    run_cli("heatmap", "--store", job.store, job.job_id, "-o", str(heatmap))
    svg = heatmap.read_text()
    assert svg.startswith("<svg") and svg.count('<g class="row') == 4, svg[:500]
    assert svg.count('<g class="row straggler"') == 1 and 'data-row="node2"' in svg.split('<g class="row straggler"')[1][:40]
    html = tmp_path / "forward.html"
    run_cli("heatmap", "--store", job.store, job.job_id, "--phase", "forward", "--window", "25", "-o", str(html))
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "steps 0-24" in page and "compute straggler" in page

    trace = tmp_path / "trace.json"
    run_cli("trace", "--store", job.store, job.job_id, "--steps", "50:60", "-o", str(trace))
    doc, names, _, _ = validate_trace(trace)
    steps = {e["args"]["step"] for e in doc["traceEvents"] if e.get("cat") == "step"}
    assert steps == set(range(50, 61)), steps
    phases = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "phase"}
    assert {"forward", "backward", "optimizer"} <= phases, phases
    assert all(a["clock_error_us"] >= 0 for a in names.values()), names


def test_the_trace_groups_ranks_by_layout_and_pairs_pipeline_sends(tmp_path, no_leftovers):
    job = Job(tmp_path, "layout", [PYTHON, os.path.join(HERE, "tp_pp_dp.py"), "--steps", "40"], nnodes=4, nproc=2)
    assert job.wait(timeout=300) == 0, job.output()[-3000:]
    layout = job.events("layout")
    assert layout and {d["name"] for d in layout[0]["detail"]["layout"]} == {"tp", "pp", "dp"}, layout
    trace = tmp_path / "trace.json"
    run_cli("trace", "--store", job.store, job.job_id, "-o", str(trace))
    doc, names, sort_index, flows = validate_trace(trace)
    # rank = tp + 2 dp + 4 pp: ordered by replica, then stage, then tensor rank.
    order = sorted(sort_index, key=sort_index.get)
    assert order == [0, 1, 4, 5, 2, 3, 6, 7], order
    assert "(dp0 pp1 tp1)" in names[5]["name"], names[5]
    assert flows, "no send/recv flows"
    for pair in flows.values():
        s = next(x for x in pair if x["ph"] == "s")
        f = next(x for x in pair if x["ph"] == "f")
        assert abs(s["pid"] - f["pid"]) == 4, pair  # between pipeline stages
    ops = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "comm"}
    assert {"all_reduce", "send", "recv"} <= ops, ops


def test_garbage_collection_pauses_are_a_phase_of_their_own(tmp_path, no_leftovers):
    job = Job(tmp_path, "gc", [PYTHON, os.path.join(HERE, "gc_pauses.py"), "--steps", "30"], nnodes=1, nproc=2)
    assert job.wait(timeout=180) == 0, job.output()[-3000:]
    trace = tmp_path / "trace.json"
    run_cli("trace", "--store", job.store, job.job_id, "-o", str(trace))
    doc, _, _, _ = validate_trace(trace)
    gc = [e for e in doc["traceEvents"] if e.get("cat") == "gc"]
    total = {r: sum(e["dur"] for e in gc if e["pid"] == r) for r in (0, 1)}
    # Both ranks have Python's own full collections; rank 1's are far longer.
    assert total[1] > 2 * total[0], total
    assert max(e["dur"] for e in gc if e["pid"] == 1) >= 20000, total  # tens of ms
    heatmap = tmp_path / "gc.svg"
    run_cli("heatmap", "--store", job.store, job.job_id, "--ranks", "-o", str(heatmap))
    svg = heatmap.read_text()
    assert ">gc<" in svg, svg[:800]
    row1 = svg.split('data-row="node0/rank 1"')[1].split("</g>")[0]
    assert "gc: " in row1


def step_times(store, job_id, generation, first_step=0):
    """Median step time (µs) across ranks, per step, of one generation."""
    import sqlite3
    import statistics

    db = sqlite3.connect(store)
    per = {}
    for step, dur in db.execute("SELECT step, duration_us FROM step_timings WHERE job_id=? AND generation=? "
                                "AND step>=?", (job_id, generation, first_step)):
        per.setdefault(step, []).append(dur)
    db.close()
    return [statistics.median(v) for _, v in sorted(per.items())]


def test_with_evict_a_spare_replaces_the_straggler_and_the_pace_comes_back(tmp_path, slow_cpu, no_leftovers):
    import statistics

    args = ["--steps", "200", "--hidden", "512", "--batch", "128", "--ckpt-every", "20"]
    ref = tmp_path / "ref"
    ref.mkdir()
    reference = Job(ref, "ref", [PYTHON, EXAMPLE, *args, "--ckpt-dir", str(ref / "ckpt")], nnodes=4, nproc=1)
    assert reference.wait(timeout=300) == 0, reference.output()[-3000:]
    healthy = statistics.median(step_times(reference.store, "ref", 0, 20))

    run = tmp_path / "evict"
    run.mkdir()
    job = Job(run, "evict", [PYTHON, EXAMPLE, *args, "--ckpt-dir", str(run / "ckpt")], nnodes=4, nproc=1,
              flags=["--straggler-action", "evict", "--spares", "1", "--max-restarts", "2"])
    wait_for(lambda: job.rank_pids(0).get(2), 60, "rank 2 to start")
    with open(os.path.join(slow_cpu, "cgroup.procs" if os.path.exists(os.path.join(slow_cpu, "cgroup.procs"))
                           else "tasks"), "w") as f:
        f.write(str(job.rank_pids(0)[2]))
    assert job.wait(timeout=400) == 0, job.output()[-3000:]

    found = [e for e in job.events("straggler") if e["detail"]["evict"]]
    assert found and found[0]["node"] == "node2", [e["message"] for e in job.events("straggler")]
    evicted = job.events("node_evicted")
    assert [e["node"] for e in evicted] == ["node2"], evicted
    assert job.events("spare_promoted")
    decision = job.events("decision")[0]["detail"]
    assert decision["decision"] == "evict_node", decision
    slow = statistics.median(step_times(job.store, "evict", 0, 10))
    after = statistics.median(step_times(job.store, "evict", 1, found[0]["detail"]["last_step"] + 10))
    print("step time: healthy %.1f ms, with the straggler %.1f ms, after the eviction %.1f ms"
          % (healthy / 1000, slow / 1000, after / 1000))
    assert slow > healthy * 1.03, (healthy, slow)
    # The pace comes back: at least three quarters of what the straggler cost.
    # (Against a fixed 5 % of the reference run, another job minutes
    # earlier, it failed 1 run in a few: this machine's step times drift by
    # that much between jobs.)
    assert after < slow and after - healthy <= 0.25 * (slow - healthy), (healthy, slow, after)


def test_with_two_nodes_the_slow_nodes_ranks_are_judged_and_the_node_is_evicted(tmp_path, slow_cpu, no_leftovers):
    """Issue 21: with fewer than 3 nodes the detector judges ranks; the
    eviction is its typed verdict, not a sentence a rule parses back (which
    missed "node1/rank 2 is a compute straggler"). 2 nodes x 2 ranks of a
    script that does not import trainguard; node1's ranks share a throttled
    CPU; the spare takes node1's place."""
    plain = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_ddp.py")
    job = Job(tmp_path, "two", [PYTHON, plain, "--steps", "400", "--hidden", "256", "--batch", "256",
                                "--ckpt-every", "20", "--ckpt", str(tmp_path / "ck.pt"), "--out", str(tmp_path / "out")],
              nnodes=2, nproc=2,
              flags=["--straggler-action", "evict", "--straggler-threshold", "0.15", "--spares", "1",
                     "--max-restarts", "2"])
    pids = wait_for(lambda: len(job.rank_pids(0)) == 4 and job.rank_pids(0), 60, "the ranks to start")
    procs = os.path.join(slow_cpu, "cgroup.procs" if os.path.exists(os.path.join(slow_cpu, "cgroup.procs"))
                         else "tasks")
    for rank in (2, 3):  # node1's ranks
        with open(procs, "w") as f:
            f.write(str(pids[rank]))
    assert job.wait(timeout=400) == 0, job.output()[-3000:]
    found = [e for e in job.events("straggler") if e["detail"]["evict"]]
    assert found and found[0]["node"] == "node1", [e["message"] for e in job.events("straggler")]
    assert "/rank " in found[0]["message"], found[0]["message"]  # judged rank by rank
    assert [e["node"] for e in job.events("node_evicted")] == ["node1"], job.events("node_evicted")
    attribution = job.events("attribution")[0]["detail"]
    assert attribution["rule"] == "straggler-compute" and attribution["culprit_nodes"] == ["node1"], attribution
    assert job.events("decision")[0]["detail"]["decision"] == "evict_node"
    assert [e["node"] for e in job.events("spare_promoted")] == ["node2"], job.events("spare_promoted")


def test_trace_and_heatmap_say_clearly_what_is_wrong(tmp_path, no_leftovers):
    job = Job(tmp_path, "short", [PYTHON, EXAMPLE, "--steps", "5", "--ckpt-dir", str(tmp_path / "ckpt")],
              nnodes=1, nproc=1)
    assert job.wait(timeout=120) == 0, job.output()[-3000:]

    def fails(*argv):
        done = subprocess.run([TRAINGUARD, *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, done.stdout
        return done.stderr

    assert "has no step timings for steps 100..200" in fails("trace", "--store", job.store, "short", "--steps",
                                                              "100:200", "-o", str(tmp_path / "t.json"))
    assert "--steps 'x:y' is not A:B" in fails("trace", "--store", job.store, "--steps", "x:y", "-o",
                                               str(tmp_path / "t.json"))
    assert "FILE.svg or FILE.html" in fails("heatmap", "--store", job.store, "-o", str(tmp_path / "h.png"))
    assert "has no job nosuchjob (its newest: short)" in fails("heatmap", "--store", job.store, "nosuchjob", "-o",
                                                        str(tmp_path / "h.svg"))
    assert not os.path.exists(tmp_path / "t.json") and not os.path.exists(tmp_path / "h.svg")
    # Steps 0-4 of a one-rank job: a trace that is still valid.
    run_cli("trace", "--store", job.store, "-o", str(tmp_path / "ok.json"))
    validate_trace(tmp_path / "ok.json")
