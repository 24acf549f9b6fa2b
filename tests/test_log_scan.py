"""Issue 10, part 4: the agent scans every output line as it arrives. A rank
that prints a fatal GPU line and keeps running gets an incident from that line
at once, with the line as evidence; a warning line is recorded and makes the
node watched. The scripts do not import trainguard."""

import json
import os
import subprocess
import time

from conftest import PYTHON, TRAINGUARD, events

FATAL = ("import os, sys, time\n"
         "if os.environ['RANK'] == '1':\n"
         "    time.sleep(1)\n"
         "    with open(sys.argv[1], 'w') as f: f.write(repr(time.time()))\n"
         "    print('NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.', flush=True)\n"
         "time.sleep(120)   # keeps running, as a rank whose GPU is gone may hang\n")


def test_a_fatal_line_starts_the_incident_at_once_while_the_rank_runs_on(tmp_path, no_leftovers):
    script = tmp_path / "fatal.py"
    script.write_text(FATAL)
    store = str(tmp_path / "tg.db")
    done = subprocess.run(
        [TRAINGUARD, "run", "--nnodes", "1", "--nproc-per-node", "2", "--max-restarts", "0",
         "--hang-timeout", "300", "--store", store, "--job-id", "fatal", "--run-dir", str(tmp_path / "run"),
         "--", PYTHON, str(script), str(tmp_path / "printed_at")],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    printed_at = float((tmp_path / "printed_at").read_text())
    evs = events(store, "fatal")
    failure = [e for e in evs if e["kind"] == "failure"]
    assert len(failure) == 1, [e["kind"] for e in evs]
    f = failure[0]
    assert f["detail"]["failure_kind"] == "fatal_line" and f["rank"] == 1
    assert f["detail"]["rule"] == "gpu-xid-fatal"
    assert "fallen off the bus" in f["detail"]["line"]
    assert f["wall_ns"] / 1e9 - printed_at < 1.0, f["wall_ns"] / 1e9 - printed_at
    attribution = [e for e in evs if e["kind"] == "attribution"][0]["detail"]
    assert attribution["category"] == "gpu_hardware" and attribution["culprit_ranks"] == [1]
    assert any("fallen off the bus" in ev["line"] for ev in attribution["evidence"])
    # The rank was still running when the incident began: no exit came first.
    before = evs[:evs.index(f)]
    assert not [e for e in before if e["kind"] == "rank_exited"], before


def test_a_warning_line_is_recorded_and_the_node_is_watched(tmp_path, no_leftovers):
    script = tmp_path / "warn.py"
    script.write_text("import os\n"
                      "if os.environ['RANK'] == '0':\n"
                      "    print('GPU 0000:3b:00.0: 2 corrected ECC errors (single bit) since boot', flush=True)\n"
                      "    print('GPU 0000:3b:00.0: 3 corrected ECC errors (single bit) since boot', flush=True)\n")
    store = str(tmp_path / "tg.db")
    done = subprocess.run(
        [TRAINGUARD, "run", "--nnodes", "1", "--nproc-per-node", "2", "--store", store, "--job-id", "warn",
         "--run-dir", str(tmp_path / "run"), "--", PYTHON, str(script)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    alerts = [e for e in events(store, "warn") if e["kind"] == "log_alert"]
    assert len(alerts) == 1, alerts            # once per generation, rank and rule
    assert alerts[0]["detail"]["severity"] == "warning" and alerts[0]["detail"]["rule"] == "gpu-ecc-corrected"
    nodes = json.loads(subprocess.run([TRAINGUARD, "nodes", "--store", store, "--json"],
                                      capture_output=True, text=True, timeout=30).stdout)
    node0 = [n for n in nodes if n["node"] == "node0"][0]
    assert node0["status"] == "watch" and "corrected ECC" in node0["reason"], node0


def test_an_operators_fatal_rule_reaches_every_agent(tmp_path, no_leftovers):
    """`--rules FILE` on `run`: the controller sends its scan rules to each
    agent when it registers, so a site's own fatal pattern starts the incident
    from the rank's line as the shipped ones do (before, only the attribution
    after the fact saw operator rules)."""
    rules = tmp_path / "site.json"
    rules.write_text(json.dumps({"format": "trainguard-attribution-rules", "version": 1, "rules": [
        {"id": "site-psu-fault", "category": "gpu_hardware", "priority": 97, "role": "cause",
         "persistence": "persistent", "hardware": True, "action": "evict_node", "scan": "fatal",
         "pattern": "PSU [0-9]+ input lost", "description": "a power supply of the node failed"}]}))
    script = tmp_path / "psu.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['RANK'] == '0':\n"
                      "    time.sleep(1)\n"
                      "    print('bmc: PSU 2 input lost', flush=True)\n"
                      "time.sleep(120)\n")
    store = str(tmp_path / "tg.db")
    done = subprocess.run(
        [TRAINGUARD, "run", "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "0",
         "--hang-timeout", "300", "--rules", str(rules), "--store", store, "--job-id", "psu",
         "--run-dir", str(tmp_path / "run"), "--", PYTHON, str(script)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-3000:]
    failure = [e for e in events(store, "psu") if e["kind"] == "failure"]
    assert len(failure) == 1 and failure[0]["detail"]["failure_kind"] == "fatal_line", failure
    assert failure[0]["detail"]["rule"] == "site-psu-fault" and "PSU 2 input lost" in failure[0]["detail"]["line"]
