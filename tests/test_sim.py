"""trainguard sim from the command line: the shipped models by name, a model
or parameter file that is wrong refused with the field named, a run that
cannot go on saying why, and a sweep's CSV and SVG."""
import csv
import json
import os
import signal
import subprocess

from conftest import TRAINGUARD, wait_for


def sim(*args):
    return subprocess.run([TRAINGUARD, "sim", *args], capture_output=True, text=True, timeout=300)


def test_a_shipped_model_by_name_gives_ettr_and_its_breakdown():
    r = sim("--gpus", "256", "--days", "3", "--failure-model", "llama3", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["finished"] and j["nodes"] == 32 and 0.5 < j["ettr"] < 1.0
    d = j["report"]["downtime"]
    total = j["report"]["productive_s"] + d["total_s"]
    assert abs(total - j["report"]["wall_s"]) < 1.0, j["report"]
    assert {c["name"] for c in j["by_cause"]} >= {"faulty_gpu", "gpu_hbm3", "software_bug"}
    text = sim("--gpus", "256", "--days", "3").stdout
    assert "ETTR" in text and "where the time went" in text and "x real time" in text


def test_an_unknown_model_or_a_wrong_file_is_refused_naming_what(tmp_path):
    r = sim("--failure-model", "nosuch")
    assert r.returncode == 2 and "no failure model named 'nosuch'" in r.stderr and "llama3" in r.stderr
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps({"name": "m", "source": "s", "categories": [
        {"name": "gpu", "per_1000_node_days": 1, "signals": {"crash": 1}, "exit_code": 1, "persistant": 0.5}]}))
    r = sim("--failure-model", str(bad))
    assert r.returncode == 2 and "categories[0].persistant: unknown field" in r.stderr, r.stderr
    params = tmp_path / "p.json"
    params.write_text(json.dumps({"checkpoint_interval_s": "often"}))
    r = sim("--params", str(params))
    assert r.returncode == 2 and "checkpoint_interval_s: expected a number" in r.stderr, r.stderr
    r = sim("--gpus", "100", "--gpus-per-node", "8")
    assert r.returncode == 2 and "not a whole number of nodes" in r.stderr, r.stderr


def test_a_run_that_cannot_go_on_says_why(tmp_path):
    model = tmp_path / "down.json"
    model.write_text(json.dumps({"name": "down", "source": "this test", "categories": [
        {"name": "host", "hardware": True, "per_1000_node_days": 500, "signals": {"node_down": 1}}]}))
    r = sim("--failure-model", str(model), "--gpus", "64", "--days", "5", "--replacement-s", "-1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cannot finish" in r.stdout and "no spare and no replacement" in r.stdout, r.stdout


def test_a_sweep_writes_a_row_and_a_point_per_run(tmp_path):
    r = sim("--days", "1", "--sweep", "gpus=64,256", "--sweep", "checkpoint_interval_s=600,1800",
            "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(tmp_path / "sim-sweep.csv")))
    assert [(x["gpus"], x["checkpoint_interval_s"]) for x in rows] == [
        ("64", "600"), ("64", "1800"), ("256", "600"), ("256", "1800")]
    assert all(0 < float(x["ettr"]) <= 1 for x in rows)
    svg = (tmp_path / "sim-sweep.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<path") == 2 and "checkpoint_interval_s=600" in svg


def test_the_automatic_checkpoint_policy_follows_the_controllers_plan():
    """--checkpoint-policy auto: the simulated ranks save at the intervals the
    real controller's plan sends, near Daly's optimum for the job's MTBF, and
    lose far less work than the default 30-minute interval."""
    fixed = json.loads(sim("--gpus", "2048", "--days", "4", "--failure-model", "meta_rsc", "--json").stdout)
    r = sim("--gpus", "2048", "--days", "4", "--failure-model", "meta_rsc", "--checkpoint-policy", "auto", "--json")
    assert r.returncode == 0, r.stderr
    auto = json.loads(r.stdout)
    c = auto["checkpoints"]
    assert c["policy"] == "auto" and c["memory_interval_s"] > 0 and "memory every" in c["plan"], c
    assert c["storage_interval_s"] > c["memory_interval_s"], c
    assert abs(c["memory_interval_s"] - c["optimum_interval_s"]) <= 0.2 * c["optimum_interval_s"], c
    assert abs(auto["ettr"] - c["optimum_ettr"]) < 0.02, c
    assert auto["ettr"] > fixed["ettr"], (auto["ettr"], fixed["ettr"])
    assert auto["report"]["downtime"]["lost_work_s"] < fixed["report"]["downtime"]["lost_work_s"] / 4
    assert fixed["checkpoints"]["memory_interval_s"] == 0
    r = sim("--checkpoint-policy", "sometimes")
    assert r.returncode != 0 and "checkpoint-policy" in r.stderr


def test_plan_recommends_settings_that_beat_the_defaults(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    r = subprocess.run([TRAINGUARD, "plan", "--gpus", "1024", "--days", "3", "--failure-model", "meta_rsc",
                        "--out", str(tmp_path), "--json"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TMPDIR=str(temp)))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    knobs = [c["knob"] for c in j["candidates"]]
    assert knobs[0] == "defaults" and {"checkpoints", "spares", "hang timeout", "stragglers"} <= set(knobs), knobs
    # Chosen by goodput (ETTR less what slow nodes cost): the best candidate's.
    assert j["goodput"] >= j["defaults_goodput"] and j["goodput"] == max(c["goodput"] for c in j["candidates"])
    for c in j["candidates"]:
        s = c["sim"]
        slowed = s["stragglers"]["slowed_s"] / s["report"]["wall_s"]
        assert abs(c["goodput"] - (c["ettr"] - slowed - s["sdc_redone_s"] / s["report"]["wall_s"])) < 1e-9, c
    assert "--checkpoint-policy" in j["recommended"] and "--hang-timeout" in j["recommended"]
    assert "--straggler-action" in j["recommended"]
    svg = (tmp_path / "plan.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<rect") == len(j["candidates"])
    assert not os.listdir(temp), "the candidates' stores were left behind"


def test_an_interrupted_run_leaves_no_temporary_store(tmp_path):
    """SIGINT or SIGTERM in the middle of a run: its SQLite store (and the
    -wal, -shm, -journal files) is removed before the signal ends it."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        env = dict(os.environ, TMPDIR=str(tmp_path))
        p = subprocess.Popen([TRAINGUARD, "sim", "--gpus", "100000", "--days", "30"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: [f for f in os.listdir(tmp_path) if f.startswith("trainguard-sim-")] or
                     p.poll() is not None, 60, "the run's store")
            assert p.poll() is None
            p.send_signal(sig)
            assert p.wait(timeout=60) == -sig
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert not os.listdir(tmp_path), os.listdir(tmp_path)
