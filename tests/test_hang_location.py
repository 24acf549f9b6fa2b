"""Issue 8: hangs of an unmodified model-parallel script (8 ranks, 2 tp x 2 pp
x 2 dp, groups made with new_group, no `import trainguard`) are located in
the job's layout from the ranks' journals of communication operations:
`trainguard hang --json` names the rank the others wait for, its coordinates,
and what each waiting rank waits in."""

import json
import os
import subprocess

from conftest import PYTHON, TRAINGUARD, Job

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tp_pp_dp.py")
HANG_TIMEOUT = 3


def coords(rank):
    # tests/tp_pp_dp.py: rank = tp + 2 * dp + 4 * pp
    return {"tp": rank % 2, "dp": (rank // 2) % 2, "pp": rank // 4}


def run(tmp_path, job_id, *faults, restarts):
    job = Job(tmp_path, job_id, [PYTHON, SCRIPT, *faults], nnodes=4, nproc=2,
              flags=["--hang-timeout", str(HANG_TIMEOUT), "--max-restarts", str(restarts),
                     "--no-progress-restarts", "10", "--stop-grace", "1"])
    assert job.wait(timeout=300) == 0, job.output()[-4000:]
    return job


def hang(job, incident, as_json=True):
    argv = [TRAINGUARD, "hang", "--store", job.store, job.job_id, str(incident)]
    out = subprocess.run(argv + (["--json"] if as_json else []), capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) if as_json else out.stdout


def test_each_stopped_rank_is_named_with_its_coordinates_and_its_waiters(tmp_path, no_leftovers):
    # One stopped rank per generation, stopped at different points of the step;
    # the fourth generation runs to the end.
    victims = {1: (5, "before-dp"), 2: (2, "before-tp"), 3: (6, "sigstop"), 4: (0, "before-send")}
    faults = []
    for incident, (rank, where) in victims.items():
        faults += ["--stop", "%d:%s:%d" % (rank, where, incident - 1)]
    job = run(tmp_path, "tp-pp-dp", *faults, restarts=len(victims))
    failures = {e["detail"]["incident"]: e for e in job.events("failure")}
    attributions = {e["detail"]["incident"]: e for e in job.events("attribution")}
    assert sorted(failures) == sorted(victims)
    for incident, (victim, where) in victims.items():
        failure = failures[incident]
        assert failure["detail"]["failure_kind"] == "hang"
        assert failure["detail"]["detection_ms"] <= (HANG_TIMEOUT + 5) * 1000
        assert attributions[incident]["detail"]["culprit_ranks"] == [victim], (where, attributions[incident])
        h = hang(job, incident)
        loc = h["location"]
        assert loc["roots"][0] == victim, (where, loc["explanation"])
        assert {d["name"] for d in loc["layout"]} == {"tp", "pp", "dp"}
        ranks = {r["rank"]: r for r in loc["ranks"]}
        assert ranks[victim]["coords"] == coords(victim), where
        assert ranks[victim]["state"] == ("stopped" if where == "sigstop" else "computing"), where
        waiters = [r for r in ranks.values() if victim in r["waits_for"]]
        assert waiters, (where, loc["explanation"])
        for w in waiters:
            assert w["state"] == "waiting" and w["op"] in ("all_reduce", "send", "recv"), w
            assert w["seq"] >= 1 and w["age_ms"] >= 0
        name = "rank %d (tp%d pp%d dp%d)" % (victim, coords(victim)["tp"], coords(victim)["pp"],
                                             coords(victim)["dp"])
        assert loc["explanation"][0].startswith(name), loc["explanation"]
        text = hang(job, incident, as_json=False)
        assert name + " on node%d: ROOT" % (victim // 2) in text, text


def test_a_rank_that_issues_another_collective_is_desynchronised(tmp_path, no_leftovers):
    job = run(tmp_path, "desync", "--desync", "3:0", restarts=1)
    loc = hang(job, 1)["location"]
    assert loc["desynchronized"] == [3], loc["explanation"]
    assert loc["roots"][0] == 3
    assert any(s.startswith("rank 3 (tp1 pp0 dp1) issued broadcast") and "desynchronised" in s
               for s in loc["explanation"]), loc["explanation"]
    attribution = job.events("attribution")[0]["detail"]
    assert attribution["culprit_ranks"] == [3]
    assert attribution["rule"] == "user-desync-collectives", attribution


def grid_cells(text):
    """The rank numbers in the text's layout grid, by the grid's own lines."""
    cells = []
    in_grid = False
    for line in text.splitlines():
        if line.startswith("layout ("):
            in_grid = True
            continue
        if in_grid and line.startswith("  ") and "\t" in line and not line.strip().startswith("rank"):
            for cell in line.split("\t")[1:]:
                if cell.strip() and cell.strip() != "-":
                    cells.append(int(cell.split()[0]))
        elif in_grid and line and not line.startswith(("pp", "   ", "  ")):
            in_grid = False
    return cells


def test_a_pipeline_of_send_recv_on_the_world_group_is_a_dimension(tmp_path, no_leftovers):
    # rank = tp + 2 * pp + 4 * dp, the stages talk on the world group: no
    # pipeline group says where the pipeline is; rank 2 (stage 1) stops.
    job = run(tmp_path, "world-pipeline", "--order", "tpd", "--pipeline-on-world",
              "--stop", "2:before-dp:0", restarts=1)
    h = hang(job, 1)
    loc = h["location"]
    assert [(d["name"], d["size"], d["stride"]) for d in loc["layout"]] == \
        [("tp", 2, 1), ("pp", 2, 2), ("dp", 2, 4)], loc["layout"]
    ranks = {r["rank"]: r for r in loc["ranks"]}
    assert sorted(ranks) == list(range(8))
    for r in range(8):
        assert ranks[r]["coords"] == {"tp": r % 2, "pp": (r // 2) % 2, "dp": r // 4}, ranks[r]
    assert loc["roots"][0] == 2, loc["explanation"]
    assert h["culprit_ranks"] == [2] and h["culprit_nodes"] == ["node1"], h
    assert job.events("attribution")[0]["detail"]["culprit_nodes"] == ["node1"]
    text = hang(job, 1, as_json=False)
    assert sorted(grid_cells(text)) == list(range(8)), text
    assert "rank 2 (tp0 pp1 dp0) on node1: ROOT" in text, text


def test_a_stalled_rank_of_plain_ddp_is_the_one_culprit_everywhere(tmp_path, no_leftovers):
    """torch 1.13 journals no DDP bucket: the rank outside communication
    while its peers wait in backward is the culprit at detection, in the
    incident, `trainguard hang`, /api/v1/hang, /api/v1/incidents and the
    report, and only its node is named. Rank 1 is neither the first nor the
    last rank, so noticing order cannot pass for blame."""
    from test_api import get
    from conftest import api_url, wait_for
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_ddp.py")
    job = Job(tmp_path, "ddp-stall",
              [PYTHON, script, "--steps", "400", "--step-delay", "0.05", "--sleep-rank", "1",
               "--sleep-at-step", "5", "--ckpt", str(tmp_path / "ck.pt"), "--out", str(tmp_path / "sum.txt")],
              flags=["--hang-timeout", str(HANG_TIMEOUT), "--heartbeat-interval", "0.5",
                     "--stop-grace", "1"])
    url = api_url(job)
    wait_for(lambda: job.events("attribution") or job.proc.poll() is not None, 120, "the hang's attribution")
    api_hang = get(url, "/api/v1/hang")
    api_incidents = get(url, "/api/v1/incidents")
    assert job.wait(timeout=300) == 0, job.output()[-3000:]
    failure = job.events("failure")[0]
    assert failure["detail"]["failure_kind"] == "hang"
    assert failure["rank"] == 1 and "; culprit: rank 1 on node0" in failure["message"], failure["message"]
    attribution = job.events("attribution")[0]
    assert attribution["detail"]["culprit_ranks"] == [1], attribution
    assert attribution["detail"]["culprit_nodes"] == ["node0"], attribution
    assert attribution["detail"]["culprit_evidence"], attribution
    h = hang(job, 1)
    for view in (h, api_hang):
        assert (view["culprit_rank"], view["culprit_ranks"], view["culprit_nodes"]) == (1, [1], ["node0"]), view
    assert "culprit: rank 1 on node0" in api_hang["text"], api_hang["text"]
    incidents = api_incidents if isinstance(api_incidents, list) else api_incidents.get("incidents", [])
    assert [(i["culprit_ranks"], i["culprit_nodes"]) for i in incidents] == [([1], ["node0"])], incidents
    report = json.loads(subprocess.run([TRAINGUARD, "report", "--store", job.store, job.job_id, "--json"],
                                       capture_output=True, text=True, timeout=30, check=True).stdout)
    assert [(i["culprit_ranks"], i["culprit_nodes"]) for i in report["incidents"]] == [([1], ["node0"])]
