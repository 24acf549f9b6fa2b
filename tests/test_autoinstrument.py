"""Issue 8: ranks of scripts that never import trainguard are instrumented
automatically (steps counted from the optimizer, the script's own torch.save
checkpoints recognised, stacks capturable), so their hangs are detected and
pinned on the right rank, with the right lost work."""

import json
import os
import re
import subprocess
import sys
import time

from conftest import PYTHON, Job, wait_for

PLAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_ddp.py")
STEPS = 40


def plain(tmp_path, *extra, steps=STEPS):
    return [PYTHON, PLAIN, "--steps", str(steps), "--ckpt", os.path.join(str(tmp_path), "ck.pt"),
            "--out", os.path.join(str(tmp_path), "sum.txt"), *extra]


def checksum(tmp_path):
    with open(os.path.join(str(tmp_path), "sum.txt")) as f:
        return f.read().strip()


def test_a_rank_stuck_in_an_unmodified_script_is_detected_named_and_recovered(tmp_path,
                                                                             no_leftovers):
    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    ref = Job(ref_dir, "plain-ref", plain(ref_dir))
    assert ref.wait() == 0, ref.output()[-3000:]
    # Steps came from the optimizer: 40 optimizer steps, numbered 0..39.
    assert {e["step"] for e in ref.events("rank_exited")} == {STEPS - 1}, ref.events("rank_exited")
    assert ref.events("first_step")

    hang_timeout = 4
    run_dir = tmp_path / "hang"
    run_dir.mkdir()
    job = Job(run_dir, "plain-hang", plain(run_dir, "--step-delay", "0.05", "--sleep-rank", "3",
                                           "--sleep-at-step", "12"),
              flags=["--hang-timeout", str(hang_timeout), "--heartbeat-interval", "0.5"])
    # Rank 3 (node1) stops inside its loop after its optimizer step 11.
    wait_for(lambda: (job.page_step("node1", 3) or -1) >= 11, 90, "step 11 of rank 3")
    stuck_since = time.time()
    assert job.wait() == 0, job.output()[-3000:]
    failure = job.events("failure")[0]
    assert failure["detail"]["failure_kind"] == "hang"
    assert failure["wall_ns"] / 1e9 - stuck_since <= hang_timeout + 5
    attribution = job.events("attribution")[0]
    assert attribution["detail"]["culprit_ranks"] == [3], attribution
    assert attribution["node"] == "node1", attribution    # the culprit's own node
    stacks = {e["rank"]: e["detail"] for e in job.events("stacks")}
    assert "plain_ddp.py" in stacks[3]["python"]          # captured without `import trainguard`
    assert checksum(run_dir) == checksum(ref_dir)
    # The script's own torch.save checkpoints (every 5 steps) are recognised:
    # the failure lost the steps since step 9, and the restarted generation,
    # which loaded that checkpoint, numbers its steps on from 10.
    downtime = job.events("downtime")[0]["detail"]
    assert downtime["checkpoint_step"] == 9, downtime
    assert downtime["failure_step"] == 11 and downtime["lost_steps"] == 2, downtime
    first_steps = {e["generation"]: e["detail"]["first_step"] for e in job.events("first_step")}
    assert first_steps == {0: 0, 1: 10}, first_steps
    assert {e["step"] for e in job.events("rank_exited")} == {STEPS - 1}


def test_instrumentation_keeps_the_users_sitecustomize_and_yields_to_explicit_steps(tmp_path,
                                                                                    no_leftovers):
    site = tmp_path / "usersite"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    script = tmp_path / "steps.py"
    script.write_text(
        "import os, sys, torch\n"
        "print('user sitecustomize:', os.environ.get('USER_SITE_RAN'))\n"
        "p = torch.nn.Parameter(torch.zeros(3))\n"
        "opt = torch.optim.Adam([p])\n"
        "other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)\n"
        "explicit = sys.argv[1] == 'explicit'\n"
        "if explicit:\n"
        "    import trainguard\n"
        "for i in range(7):\n"
        "    p.grad = torch.ones(3)\n"
        "    opt.step()\n"
        "    other.step()\n"   # a second optimizer: not counted again
        "    if explicit:\n"
        "        trainguard.step(100 + i)\n")
    for mode, last_step in (("auto", 6), ("explicit", 106)):
        run = tmp_path / mode
        run.mkdir()
        env_before = dict(os.environ)
        os.environ["PYTHONPATH"] = str(site)
        try:
            job = Job(run, "site-" + mode, [PYTHON, str(script), mode], nnodes=1, nproc=1)
        finally:
            os.environ.clear()
            os.environ.update(env_before)
        assert job.wait() == 0, job.output()[-3000:]
        assert "user sitecustomize: yes" in job.output()
        exits = job.events("rank_exited")
        assert [e["step"] for e in exits] == [last_step], (mode, exits)


def torchrun_variables():
    """The variables torchrun (the installed torch's elastic agent) sets for a worker."""
    import re

    import torch.distributed.elastic.agent.server.local_elastic_agent as agent

    with open(agent.__file__) as f:
        source = f.read()
    keys = set(re.findall(r'"([A-Z][A-Z_]+)": ', source[source.index("def _start_workers"):]))
    assert {"RANK", "MASTER_PORT", "TORCHELASTIC_RUN_ID"} <= keys, keys
    return keys | {"OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE"}  # set by run.py / multiprocessing


def test_no_instrument_leaves_the_environment_as_torchrun_makes_it(tmp_path, no_leftovers):
    script = tmp_path / "env.py"
    script.write_text("import json, os, sys\n"
                      "json.dump(dict(os.environ), open(sys.argv[1] + os.environ['RANK'], 'w'))\n"
                      "print('sitecustomize of trainguard loaded:', 'trainguard' in sys.modules)\n")
    parent = dict(os.environ)
    # torchrun keeps these when the caller has them already.
    expected = torchrun_variables() - {k for k in ("OMP_NUM_THREADS", "NCCL_ASYNC_ERROR_HANDLING")
                                       if k in parent}
    for flags, instrumented in (([], True), (["--no-instrument"], False)):
        run = tmp_path / ("on" if instrumented else "off")
        run.mkdir()
        job = Job(run, "env-" + run.name, [PYTHON, str(script), str(run / "env")], nproc=2,
                  flags=flags)
        assert job.wait() == 0, job.output()[-3000:]
        for rank in range(4):
            with open(str(run / "env") + str(rank)) as f:
                env = json.load(f)
            added = {k for k in env if env[k] != parent.get(k)}
            if instrumented:
                assert {"TRAINGUARD_STATUS_PAGE", "PYTHONPATH"} <= added
                continue
            # Every variable torchrun sets, its error file included, and nothing else.
            assert added == expected, (
                sorted(added - expected), sorted(expected - added))
        assert ("sitecustomize of trainguard loaded: %s" % instrumented) in job.output()


def test_ranks_that_compute_for_twice_the_hang_timeout_between_steps_are_not_hung(tmp_path,
                                                                                  no_leftovers):
    script = tmp_path / "long_eval.py"
    script.write_text(
        "import time, torch\n"
        "p = torch.nn.Parameter(torch.zeros(64, 64))\n"
        "opt = torch.optim.SGD([p], lr=0.1)\n"
        "for step in range(6):\n"
        "    p.grad = torch.ones(64, 64)\n"
        "    opt.step()\n"
        "    if step == 2:  # a long evaluation: no optimizer step, busy CPU\n"
        "        end = time.monotonic() + 6\n"
        "        x = torch.randn(128, 128)\n"
        "        while time.monotonic() < end:\n"
        "            x = torch.tanh(x @ x)\n"
        "print('done')\n")
    job = Job(tmp_path, "long-eval", [PYTHON, str(script)], nnodes=1, nproc=2,
              flags=["--hang-timeout", "3", "--heartbeat-interval", "0.5", "--max-restarts", "0"])
    assert job.wait() == 0, job.output()[-3000:]
    assert not job.events("failure"), job.events("failure")
    assert [e["step"] for e in job.events("rank_exited")] == [5, 5]


def test_a_command_that_stops_using_cpu_and_writing_output_is_stalled(tmp_path, no_leftovers):
    # Not Python: no status page, no steps; only its activity can tell.
    command = ["/bin/sh", "-c", "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; "
                                "echo working done; exec sleep 600"]
    job = Job(tmp_path, "quiet-sh", command, nnodes=1, nproc=1,
              flags=["--hang-timeout", "3", "--heartbeat-interval", "0.5", "--max-restarts", "0"])
    started = time.time()
    rc = job.wait(timeout=60)
    assert rc != 0
    failure = job.events("failure")[0]
    assert failure["detail"]["failure_kind"] == "hang", failure
    assert failure["rank"] == 0
    assert failure["wall_ns"] / 1e9 - started <= 3 + 10   # quiet after well under a second


def test_a_job_without_progress_data_says_so_instead_of_printing_minus_one(tmp_path, no_leftovers):
    import subprocess

    from conftest import TRAINGUARD

    job = Job(tmp_path, "no-steps", ["/bin/sh", "-c", "sleep 0.3; exit 3"], nnodes=1, nproc=1,
              flags=["--max-restarts", "1"])
    assert job.wait() != 0
    out = job.output()
    assert "no progress data" in out, out[-2000:]
    assert "-1" not in "".join(l for l in out.splitlines() if "downtime" in l or "incident" in l)
    assert "restart -" not in out and "at step -1" not in out
    text = subprocess.run([TRAINGUARD, "report", "--store", job.store, "no-steps"],
                          capture_output=True, text=True)
    assert text.returncode == 0, text.stderr
    assert "no progress data" in text.stdout and "ETTR 0.0%" not in text.stdout, text.stdout
    assert "productive (kept step time)" not in text.stdout
    rep = json.loads(subprocess.run([TRAINGUARD, "report", "--store", job.store, "no-steps", "--json"],
                                    capture_output=True, text=True, check=True).stdout)
    assert rep["progress_data"] is False and rep["ettr"] is None


def test_auto_hang_timeout_follows_two_second_steps_without_false_alarms(tmp_path, no_leftovers):
    # 20 steps of 2 s each with --hang-timeout auto: no false alarm (the
    # floor, 5 s, is above a step; the timeout must follow the steps to 10 x
    # the slowest step, 20 s or a little more on a busy machine, and stay
    # there); then rank 1 stops inside its loop and is found within that
    # timeout (+ 5 s). The detector's arithmetic is unit-tested
    # (detectors_test: AutoTimeout*); this is the real pipeline end to end.
    job = Job(tmp_path, "auto-timeout",
              plain(tmp_path, "--step-delay", "2", "--sleep-rank", "1", "--sleep-at-step", "20",
                    steps=21),
              nnodes=1, nproc=2, flags=["--hang-timeout", "auto", "--hang-timeout-floor", "5"])
    assert job.wait(timeout=420) == 0, job.output()[-3000:]
    failures = job.events("failure")
    assert len(failures) == 1, [f["message"] for f in failures]
    f = failures[0]
    assert f["detail"]["failure_kind"] == "hang"
    assert f["detail"]["failure_step"] >= 19, f["message"]      # nothing before the stop
    timeout = re.search(r"longer than ([0-9.]+) s \(--hang-timeout auto\)", f["message"])
    assert timeout, f["message"]
    timeout_ms = float(timeout.group(1)) * 1000
    assert 10 * 2000 <= timeout_ms <= 10 * 3000, f["message"]  # 10 x the slowest step, a 2 s one
    assert f["detail"]["detection_ms"] <= timeout_ms + 5000, (f["message"], f["detail"])
    assert job.events("attribution")[0]["detail"]["culprit_ranks"] == [1]


def test_torch_save_checkpoints_are_recognised_and_resumed_step_numbers_continue(tmp_path):
    from conftest import BUILD

    sys.path.insert(0, os.path.join(BUILD, "python"))
    from trainguard import _core

    page = "/dev/shm/trainguard-test-ckpt-%d" % os.getpid()
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "from trainguard import _core\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "if sys.argv[1] == 'resume':\n"
        "    state = torch.load(sys.argv[2])\n"
        "    opt.load_state_dict(state['opt'])\n"
        "for _ in range(int(sys.argv[3])):\n"
        "    model(torch.randn(2, 4)).sum().backward()\n"
        "    opt.step()\n"
        "torch.save(torch.ones(3), sys.argv[2] + '.other')  # not a training checkpoint\n"
        "if sys.argv[1] == 'save':\n"
        "    torch.save({'model': model.state_dict(), 'opt': opt.state_dict()}, sys.argv[2] + '.tmp')\n"
        "    import os; os.replace(sys.argv[2] + '.tmp', sys.argv[2])\n")
    ckpt = str(tmp_path / "ck.pt")
    env = dict(os.environ, TRAINGUARD_STATUS_PAGE=page, PYTHONPATH=os.path.join(BUILD, "python"))
    try:
        _core._create_status_page(page)
        subprocess.run([PYTHON, str(script), "save", ckpt, "3"], env=env, check=True, timeout=120)
        assert os.getxattr(ckpt, "user.trainguard.step") == b"2"
        assert "user.trainguard.step" not in os.listxattr(ckpt + ".other")
        # A fresh rank that resumes from it numbers its steps on: 3, 4.
        _core._create_status_page(page)
        subprocess.run([PYTHON, str(script), "resume", ckpt, "2"], env=env, check=True, timeout=120)
        assert _core._read_status_page(page)["step"] == 4
        # One that loads nothing starts at 0.
        _core._create_status_page(page)
        subprocess.run([PYTHON, str(script), "fresh", str(tmp_path / "none.pt"), "2"], env=env,
                       check=True, timeout=120)
        assert _core._read_status_page(page)["step"] == 1
    finally:
        if os.path.exists(page):
            os.unlink(page)


def test_ddp_bucket_journaling_is_on_from_torch_2_and_can_be_chosen(tmp_path):
    from conftest import BUILD

    sys.path.insert(0, os.path.join(BUILD, "python"))
    from trainguard import _comm_journal, _core

    os.environ.pop("TRAINGUARD_DDP_JOURNAL", None)
    assert not _comm_journal.ddp_journal_enabled("1.13.0a0+gitunknown")
    assert _comm_journal.ddp_journal_enabled("2.11.0+cu130")
    script = tmp_path / "ddp1.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=os.environ['PORT'], RANK='0', WORLD_SIZE='1')\n"
        "dist.init_process_group('gloo')\n"
        "m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))\n"
        "m(torch.randn(2, 8)).sum().backward()\n"
        # torch 1.13 with a Python comm hook aborts at exit about half the
        # time if the DDP model outlives the interpreter (_comm_journal.py).
        "del m\n"
        "dist.destroy_process_group()\n")
    page = "/dev/shm/trainguard-test-ddp-%d" % os.getpid()
    from conftest import free_port
    counts = {}
    try:
        for choice in ("1", "0"):
            _core._create_status_page(page)
            env = dict(os.environ, TRAINGUARD_STATUS_PAGE=page, TRAINGUARD_DDP_JOURNAL=choice,
                       PORT=str(free_port()), PYTHONPATH=os.path.join(BUILD, "python"))
            subprocess.run([PYTHON, str(script)], env=env, check=True, timeout=120)
            ops = _core._read_status_page(page)["ops"]
            counts[choice] = [o["numel"] for o in ops if o["op"] == "all_reduce"]
    finally:
        if os.path.exists(page):
            os.unlink(page)
    assert counts == {"1": [8 * 4 + 4], "0": []}, counts
