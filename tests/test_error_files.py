"""Issue 9, part 3: every rank gets TORCHELASTIC_ERROR_FILE as under torchrun;
what a failing rank recorded there (torch's @record) is evidence for the
attribution and the root cause of the run's failure summary; stderr is kept
apart from stdout in the logs and on the console."""

import os
import subprocess

import pytest

from conftest import PYTHON, TRAINGUARD, events

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "record_failure.py")


@pytest.mark.parametrize("linger", ["0", "2"], ids=["exits-first", "its-peer-exits-first"])
def test_the_error_file_names_the_exception_when_the_output_no_longer_does(tmp_path, no_leftovers, linger):
    store = str(tmp_path / "tg.db")
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [TRAINGUARD, "torchrun", "--standalone", "--nproc_per_node=2", "--max_restarts=0",
         "--rdzv_id=rec", "--store", store, "--run-dir", str(run_dir), "--python", PYTHON, SCRIPT],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=180,
        env=dict(os.environ, FAIL_RANK="1", FAIL_STEP="3", NOISE="40", LINGER_S=linger))
    assert done.returncode == 1, done.stderr[-3000:]     # what Python exits with on an exception

    # The failure is the first failed exit the agent saw: rank 1's, or rank
    # 0's, which lost its connection to rank 1 (rank 1's teardown after the
    # exception can outlast its sockets: seen in CI; with a linger, always).
    # Each carries its own error file; the attribution and the root cause
    # name rank 1 either way.
    evs = events(store, "rec")
    failure = [e for e in evs if e["kind"] == "failure"]
    assert len(failure) == 1 and failure[0]["rank"] in ((0, 1) if linger == "0" else (0,)), failure
    assert "error file" in failure[0]["message"], failure[0]["message"]
    if failure[0]["rank"] == 1:
        assert "corrupt header" in failure[0]["message"], failure[0]["message"]
    # The attribution finds the exception in rank 1's error file, whichever exit came first.
    attribution = [e for e in evs if e["kind"] == "attribution"][0]["detail"]
    assert attribution["category"] == "user_code", attribution
    assert attribution["culprit_ranks"] == [1]
    assert any("corrupt header" in ev["line"] for ev in attribution["evidence"]), attribution
    # Rank 1's error file: type, message, the traceback with its frames. Its
    # exit carries it; or, when rank 1 was still tearing down as the incident
    # stopped it (always with a linger), the stop did, and the attribution
    # keeps it for the root cause.
    exit1 = [e for e in evs if e["kind"] == "rank_exited" and e["rank"] == 1 and e["detail"]["exit_code"] != 0]
    assert len(exit1) <= 1 and (linger == "0" or not exit1), exit1
    error = exit1[0]["detail"]["error_file"] if exit1 else attribution["culprit_error_file"]
    assert error["type"] == "ValueError"
    assert error["message"] == "ValueError: shard 1 of step 3 has a corrupt header (magic 0x0000)"
    assert "in read_shard_header" in error["traceback"] and "in load_shard" in error["traceback"]
    assert error["path"].endswith("errors/rank1.gen0.json")
    if exit1:
        # The rank's last 20 lines are the exit handler's noise only (on
        # stderr, after the traceback): the exception is not among them.
        assert not any("ValueError" in line for line in exit1[0]["detail"]["log_tail"])

    # The failure summary names the root cause with the traceback, as torchrun's does.
    assert "root cause: rank 1 on node0" in done.stderr, done.stderr[-3000:]
    assert "exception:  ValueError: shard 1 of step 3" in done.stderr
    assert 'in read_shard_header' in done.stderr.split("root cause:")[1]

    # stdout and stderr stay apart: in the rank's two log files and on the console.
    logs = run_dir / "node0" / "logs"
    out = (logs / "rank1.stdout.log").read_text()
    err = (logs / "rank1.stderr.log").read_text()
    assert "rank 1 of 2 starting" in out
    assert "Traceback" not in out and "a warning on stderr" not in out and "uploading" not in out
    assert "Traceback (most recent call last)" in err and "rank 1: a warning on stderr" in err
    assert err.index("Traceback") < err.index("uploading run summary part 40/40")
    assert "[rank1]: rank 1 of 2 starting" in done.stdout
    assert "[rank1]: rank 1: a warning on stderr" in done.stderr
    assert "[rank1]: Traceback (most recent call last):" in done.stderr
    assert "a warning on stderr" not in done.stdout and "Traceback" not in done.stdout


def test_error_files_are_per_rank_and_per_attempt(tmp_path, no_leftovers):
    probe = ("import os; print('EF=' + os.environ['TORCHELASTIC_ERROR_FILE']); "
             "import sys; sys.exit(0)")
    done = subprocess.run(
        [TRAINGUARD, "run", "--nnodes", "1", "--nproc-per-node", "2", "--store", str(tmp_path / "tg.db"),
         "--job-id", "ef", "--run-dir", str(tmp_path / "run"), "--", PYTHON, "-c", probe],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = sorted(line.split("EF=")[1] for line in done.stdout.splitlines() if "EF=" in line)
    assert seen == [str(tmp_path / "run" / "node0" / "errors" / ("rank%d.gen0.json" % r)) for r in (0, 1)]
