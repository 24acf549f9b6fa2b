"""Issue 9 (first part): `trainguard run` / `trainguard torchrun` take
torchrun's command line with torchrun's meanings. The table holds command
lines in the forms the PyTorch tutorials and public launch scripts use, with
only `torchrun` replaced."""

import json
import os
import subprocess

import pytest

from conftest import TRAINGUARD

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "ddp_tutorial_style.py")

# (arguments after `trainguard`, nnodes, nproc per node, max restarts, job id, command tail)
# Command tails name what runs after the interpreter (scripts run under Python).
TABLE = [
    (["torchrun", "--standalone", "--nproc_per_node=4", SCRIPT, "50", "10"],
     1, 4, 3, "", [SCRIPT, "50", "10"]),
    (["torchrun", "--standalone", "--nproc-per-node=2", SCRIPT, "--", "--lr", "0.1"],
     1, 2, 3, "", [SCRIPT, "--", "--lr", "0.1"]),
    (["torchrun", "--nnodes=1", "--nproc_per_node=2", SCRIPT, "--epochs", "20"],
     1, 2, 3, "", [SCRIPT, "--epochs", "20"]),
    (["torchrun", "--nnodes=1", "--max_restarts=0", "--rdzv_id=456", "--rdzv_backend=c10d",
      "--nproc_per_node=cpu", "--rdzv_endpoint=localhost:29403", "-m", "json.tool", "--help"],
     1, os.cpu_count(), 0, "456", ["-m", "json.tool", "--help"]),
    (["torchrun", "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--standalone", "--nnodes=1",
      "--nproc-per-node=1", SCRIPT, "--batch_size", "4"],
     1, 1, 3, "", [SCRIPT, "--batch_size", "4"]),
    (["torchrun", "--nproc_per_node=8", "--nnodes=1", "--node_rank=0", "--master_addr=localhost",
      "--master_port=22222", SCRIPT, "--epochs", "20", "--pre-trained"],
     1, 8, 3, "", [SCRIPT, "--epochs", "20", "--pre-trained"]),
    (["torchrun", "--nnodes=1:2", "--nproc-per-node", "auto", "--max-restarts", "2", SCRIPT],
     2, os.cpu_count(), 2, "", [SCRIPT]),                 # elastic: 2 nodes here, down to 1
    (["run", "--nnodes", "2", "--nproc-per-node", "2", "--", "/bin/echo", "hi"],
     2, 2, 3, "", ["/bin/echo", "hi"]),
    (["run", "--no-python", "--nproc_per_node", "3", "/bin/echo", "--nnodes", "5"],
     1, 3, 3, "", ["/bin/echo", "--nnodes", "5"]),
    (["torchrun", "--role", "trainer", "--log_dir", "/tmp/tg-logs", "--rdzv_id", "r1", "-r", "3",
      "-t", "3", "--local_ranks_filter", "0", "--monitor_interval", "1", SCRIPT],
     1, 1, 3, "r1", [SCRIPT]),
]


def dry_run(args):
    out = subprocess.run([TRAINGUARD, *args[:1], "--dry-run", *args[1:]], capture_output=True,
                         text=True, timeout=30)
    return out


@pytest.mark.parametrize("args,nnodes,nproc,restarts,job_id,tail", TABLE)
def test_torchrun_command_lines_mean_what_they_mean_to_torchrun(args, nnodes, nproc, restarts,
                                                                job_id, tail):
    out = dry_run(args)
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert (job["nnodes"], job["nproc_per_node"], job["max_restarts"]) == (nnodes, nproc, restarts)
    assert job["world_size"] == nnodes * nproc
    assert job["job_id"] == job_id
    assert job["master_addr"] == "127.0.0.1"
    if tail[0].startswith("/bin/"):
        assert job["command"] == tail                      # a program runs as it is
    else:
        assert job["command"][1:] == tail                  # under the interpreter
        assert "python" in os.path.basename(job["command"][0])
    # Options that do not apply are accepted with a note, never silently.
    for flag, words in (("--master_port", "MASTER_PORT"), ("--local_ranks_filter", "every rank"),
                        ("--nnodes=1:2", "goes on with fewer (down to 1)"), ("-r", "log file")):
        if flag in args:
            assert words in out.stderr, out.stderr
    if "--role" in args:
        assert job["env"]["ROLE_NAME"] == "trainer"
        assert job["run_dir"] == "/tmp/tg-logs/r1"


@pytest.mark.parametrize("args,message", [
    (["torchrun", "--nnodes=2", "--node_rank=2", "--rdzv_endpoint=10.9.9.9:29400", SCRIPT],
     "a node rank is less than the number of nodes"),
    (["torchrun", "--nproc_per_node=two", SCRIPT], "expected a number, auto, cpu or gpu"),
    (["torchrun", "--nnodes=3:2", SCRIPT], "MIN is larger than MAX"),
    (["torchrun", "--bogus", SCRIPT], "--bogus"),
    (["torchrun", "--nproc_per_node=2", "missing_script.py"], "script not found: missing_script.py"),
    (["torchrun", "--python", "/nonexistent/python", SCRIPT], "/nonexistent/python"),
])
def test_what_trainguard_cannot_do_is_an_error_that_names_it(args, message):
    out = dry_run(args)
    assert out.returncode == 2
    assert message in out.stderr, out.stderr


# Multi-node lines (the same on every host but for --node_rank): the rendezvous
# endpoint every host names, and this host's node rank.
MULTI_HOST = [
    (["torchrun", "--nnodes=2", "--nproc_per_node=8", "--node_rank=1", "--rdzv_id=456",
      "--rdzv_backend=c10d", "--rdzv_endpoint=10.9.9.9:29603", SCRIPT, "50", "10"],
     2, 8, "10.9.9.9:29603", 1),
    (["torchrun", "--nproc-per-node=4", "--nnodes=4", "--node-rank=3", "--master-addr=10.1.2.3",
      "--master-port=1234", SCRIPT],
     4, 4, "10.1.2.3:1234", 3),
    (["torchrun", "--nnodes=2", "--node_rank=0", "--master_addr=host-a", SCRIPT],
     2, 1, "host-a:29500", 0),                         # torchrun's default master port
    (["torchrun", "--nnodes=1:4", "--nproc_per_node=2", "--rdzv_endpoint=head-node", SCRIPT],
     4, 2, "head-node:29400", -1),                     # elastic: up to 4 hosts, at least 1
    (["torchrun", "--nnodes=3", "--rdzv_endpoint=head-node", SCRIPT],
     3, 1, "head-node:29400", -1),                     # torchrun's default rendezvous port
]


@pytest.mark.parametrize("args,nnodes,nproc,rendezvous,node_rank", MULTI_HOST)
def test_multi_node_command_lines_name_the_rendezvous_and_the_node_rank(args, nnodes, nproc,
                                                                        rendezvous, node_rank):
    out = dry_run(args)
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert (job["nnodes"], job["nproc_per_node"], job["world_size"]) == (nnodes, nproc, nnodes * nproc)
    assert (job["rendezvous"], job["node_rank"]) == (rendezvous, node_rank)
    assert job["min_nnodes"] == (1 if "--nnodes=1:4" in args else nnodes)
    if rendezvous:
        assert "one host of %d" % nnodes in out.stderr


def test_a_tutorial_style_script_runs_with_its_torchrun_line(tmp_path, no_leftovers):
    out = tmp_path / "world.txt"
    argv = [TRAINGUARD, "torchrun", "--standalone", "--nproc_per_node=2", "--rdzv_id=tut", "--max-restarts=0",
            "--run-dir", str(tmp_path / "run"), SCRIPT, "6", "2"]
    env = dict(os.environ, TUTORIAL_OUT=str(out), TRAINGUARD_PYTHON="/usr/bin/python3")
    # Three times: the DDP model lives until the interpreter exits, which is
    # where torch 1.13 aborted or hung in about half of the runs while a
    # Python DDP comm hook was installed (see _comm_journal.ddp_journal_enabled).
    for attempt in range(3):
        if (tmp_path / "snapshot.pt").exists():
            os.unlink(str(tmp_path / "snapshot.pt"))
        store = ["--store", str(tmp_path / ("tg%d.db" % attempt))]
        done = subprocess.run(argv[:2] + store + argv[2:], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, (attempt, done.stderr[-3000:])
        assert out.read_text().split() == ["2", "tut", "0"], done.stderr[-3000:]
        assert (tmp_path / "snapshot.pt").exists()
