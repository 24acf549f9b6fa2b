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
