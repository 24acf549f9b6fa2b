"""Acceptance tests of issue 4: attribution and decisions end to end with the
example DDP job, and `trainguard attribute` on saved logs."""

import concurrent.futures
import json
import os
import subprocess

import pytest

from conftest import EXAMPLE, PYTHON, TRAINGUARD, Job, events, gpu_fault_env, wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEPS = 40


def example(tmp_path, *extra):
    return [PYTHON, EXAMPLE, "--steps", str(STEPS), "--ckpt-every", "5",
            "--ckpt-dir", os.path.join(str(tmp_path), "ckpt"), *extra]


def detail(job, kind, i=0):
    return job.events(kind)[i]["detail"]


def test_a_deterministic_bug_stops_after_its_first_repeat(tmp_path, no_leftovers):
    job = Job(tmp_path, "bug", example(tmp_path, "--raise-at-step", "17"), flags=["--max-restarts", "5"])
    assert job.wait() == 1
    decisions = [e["detail"]["decision"] for e in job.events("decision")]
    assert decisions == ["restart", "stop"]
    assert detail(job, "attribution")["category"] == "user_code"
    assert detail(job, "attribution")["culprit_ranks"] == [1]
    out = job.output()
    assert "deterministic" in out and "after 1 restart(s)" in out


def test_a_nan_loss_is_numeric(tmp_path, no_leftovers):
    job = Job(tmp_path, "nan", example(tmp_path, "--nan-at-step", "12"), flags=["--max-restarts", "3"])
    assert job.wait() == 1
    a = detail(job, "attribution")
    assert a["category"] == "numeric" and a["culprit_ranks"] == [1]
    assert any("loss is nan" in e["line"] for e in a["evidence"])


def test_a_hung_rank_is_named_not_the_ranks_waiting_for_it(tmp_path, no_leftovers):
    job = Job(tmp_path, "hang", example(tmp_path, "--hang-at-step", "12", "--crash-rank", "2",
                                        "--step-delay", "0.02"),
              flags=["--hang-timeout", "4", "--heartbeat-interval", "0.5"])
    assert job.wait() == 0, job.output()[-2000:]
    a = detail(job, "attribution")
    assert a["category"] == "comm_hang"
    assert a["culprit_ranks"] == [2], a
    assert job.events("attribution")[0]["rank"] == 2


def test_a_gpu_off_the_bus_evicts_and_cordons_its_node_until_an_operator_returns_it(tmp_path, no_leftovers):
    job = Job(tmp_path, "xid", example(tmp_path, "--xid-at-step", "9", "--crash-rank", "3"),
              env=gpu_fault_env(tmp_path))
    assert job.wait() == 0, job.output()[-2000:]
    a = detail(job, "attribution")
    assert a["category"] == "gpu_hardware" and a["hardware"]
    assert a["culprit_ranks"] == [3] and a["culprit_nodes"] == ["node1"]
    assert detail(job, "decision")["decision"] == "evict_node"
    # What the rank printed is corroborated by what the driver said of its GPU.
    assert any("Xid 79" in s for s in a["corroboration"]["support"]["node1"]), a["corroboration"]
    evicted = job.events("node_evicted")
    assert [e["node"] for e in evicted] == ["node1"]
    assert evicted[0]["detail"]["by"] == "controller of job xid"
    assert evicted[0]["detail"]["evidence"]["category"] == "gpu_hardware"
    # Without spares, a new node (node2) took group rank 1 and the job went on.
    registered = {e["node"]: e["detail"]["group_rank"] for e in job.events("node_registered")}
    assert registered.get("node2") == 1, registered
    # The next job on the same store does not use node1: it is cordoned.
    nxt = Job(tmp_path, "next", [PYTHON, "-c", "pass"], nnodes=2, nproc=1)
    assert nxt.wait() == 0
    assert sorted(e["node"] for e in nxt.events("node_registered")) == ["node0", "node2"]
    assert "node node1 is cordoned" in nxt.output()
    # `trainguard nodes` shows it with who evicted it and why; `trainguard
    # uncordon` returns it, and the job after that uses it again.
    nodes = json.loads(subprocess.run([TRAINGUARD, "nodes", "--store", job.store, "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    node1 = [n for n in nodes if n["node"] == "node1"][0]
    assert node1["status"] == "cordoned" and node1["hardware_incidents_counting"] == 1, nodes
    # The driver's Xid came first (said at once), then the eviction.
    assert [(h["action"], h["by"]) for h in node1["history"]] == [("gpu-errors", "controller of job xid"),
                                                                  ("evict", "controller of job xid")]
    assert node1["history"][1]["evidence"]["rule"] == a["rule"]
    cleared = subprocess.run([TRAINGUARD, "uncordon", "--store", job.store, "node1", "--reason", "GPU reseated"],
                             capture_output=True, text=True)
    assert cleared.returncode == 0 and "cleared" in cleared.stdout, cleared.stderr
    nodes = json.loads(subprocess.run([TRAINGUARD, "nodes", "--store", job.store, "--json"],
                                      capture_output=True, text=True, check=True).stdout)
    node1 = [n for n in nodes if n["node"] == "node1"][0]
    assert node1["status"] == "ok" and node1["hardware_incidents_counting"] == 0, nodes
    assert [h["action"] for h in node1["history"]] == ["gpu-errors", "evict", "uncordon"]
    assert node1["history"][2]["reason"] == "GPU reseated" and node1["history"][2]["by"].startswith("operator ")
    after = Job(tmp_path, "after", [PYTHON, "-c", "pass"], nnodes=2, nproc=1)
    assert after.wait() == 0
    assert sorted(e["node"] for e in after.events("node_registered")) == ["node0", "node1"]
    unknown = subprocess.run([TRAINGUARD, "uncordon", "--store", job.store, "node9"],
                             capture_output=True, text=True)
    assert unknown.returncode == 1 and "node9 has no record" in unknown.stderr


def test_attribute_command_on_saved_rank_logs(tmp_path):
    for r in range(4):
        (tmp_path / ("rank%d.log" % r)).write_text(
            "[E ProcessGroupNCCL.cpp:737] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.\n")
    (tmp_path / "rank2.log").write_text("kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    files = [str(tmp_path / ("rank%d.log" % r)) for r in range(4)]
    r = subprocess.run([TRAINGUARD, "attribute", "--json", *files], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    a = json.loads(r.stdout)
    assert a["category"] == "gpu_hardware" and a["culprit_ranks"] == [2] and a["action"] == "evict_node"
    text = subprocess.run([TRAINGUARD, "attribute", *files], capture_output=True, text=True).stdout
    assert "gpu_hardware" in text and "rank 2" in text and "fallen off the bus" in text


def test_attribute_rejects_a_bad_rule_file(tmp_path):
    bad = tmp_path / "site.json"
    bad.write_text('{"format": "trainguard-attribution-rules", "version": 1, "rules": '
                   '[{"id": "x", "category": "disk", "pattern": "y", "priority": 5}]}')
    log = tmp_path / "a.log"
    log.write_text("hello\n")
    r = subprocess.run([TRAINGUARD, "attribute", "--rules", str(bad), str(log)], capture_output=True, text=True)
    assert r.returncode == 2 and "unknown category 'disk'" in r.stderr and str(bad) in r.stderr


def test_report_of_a_job_with_two_failures_accounts_for_the_wall_time(tmp_path, no_leftovers):
    import signal
    import time

    started = time.time()
    command = example(tmp_path, "--crash-at-step", "12", "--step-delay", "0.04")
    command[command.index("--steps") + 1] = "70"
    job = Job(tmp_path, "two", command)
    # Second failure: kill -9 of rank 2 once the restarted generation is past step 30.
    wait_for(lambda: len(job.rank_pids(generation=1)) == 4, 90, "the restart")
    wait_for(lambda: any((job.page_step(n, 2) or -1) >= 30 for n in ("node0", "node1")),
             90, "step 30 after the restart")
    os.kill(job.rank_pids(generation=1)[2], signal.SIGKILL)
    assert job.wait() == 0, job.output()[-2000:]
    measured = time.time() - started
    r = subprocess.run([TRAINGUARD, "report", "--store", job.store, "two", "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["state"] == "SUCCEEDED" and rep["restarts"] == 2 and len(rep["incidents"]) == 2
    terms = rep["downtime"]
    total = sum(terms[k] for k in ("startup_s", "lost_work_s", "detection_s", "shutdown_s",
                                   "restart_s", "tail_s", "checkpoint_overhead_s"))
    assert terms["checkpoint_overhead_s"] > 0
    # The job's span as the store recorded it (creation to end); the test's
    # own clock also holds `trainguard run` starting and exiting, which
    # takes a few hundred ms on a loaded machine, so it bounds the span.
    stamps = {e["kind"]: e["wall_ns"] for e in job.events() if e["kind"] in ("job_created", "job_succeeded")}
    span = (stamps["job_succeeded"] - stamps["job_created"]) / 1e9
    assert span <= measured
    assert abs(total - (span - rep["productive_s"])) <= 0.02 * span, (total, span, measured, rep)
    # The crash at step 12 threw away the steps since checkpoint 10; the kill may land on a checkpoint.
    assert rep["incidents"][0]["lost_steps"] >= 1 and rep["incidents"][1]["lost_steps"] >= 0
    assert 0 < rep["ettr"] < 1
    text = subprocess.run([TRAINGUARD, "report", "--store", job.store, "two"], capture_output=True, text=True)
    assert "where the time went" in text.stdout and "#2" in text.stdout


def test_attribute_generalizes_to_common_failure_texts(tmp_path):
    """Typical failure texts written for this test (not the shared dev set):
    each must get its category."""
    cases = [json.loads(l) for l in open(os.path.join(os.path.dirname(__file__), "data",
                                                       "attribution_cases.jsonl"))]
    wrong = []
    for i, case in enumerate(cases):
        log = tmp_path / ("case%d.log" % i)
        log.write_text(case["log"] + "\n")
        r = subprocess.run([TRAINGUARD, "attribute", "--json", str(log)], capture_output=True, text=True)
        got = json.loads(r.stdout)["category"]
        if got != case["label"]:
            wrong.append((case["label"], got, case["log"][:80]))
    assert not wrong, wrong


CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "failure-logs", "corpus.jsonl")


@pytest.fixture(scope="module")
def corpus_answers(tmp_path_factory):
    """Every corpus log with what `trainguard attribute --json` answered, once
    for the tests that read them."""
    return _attribute_jsonl(CORPUS, tmp_path_factory.mktemp("corpus"))


def test_the_project_corpus_of_real_logs_stays_above_the_goal(corpus_answers):
    """tests/data/failure-logs/corpus.jsonl: real logs from public threads, a
    random third of each batch held out from rule writing and training; the
    rest of batch 10 and all of batch 11 not read yet (`unread`). The issue's goal is >= 95 % on
    logs not read (not met: see docs/attribution.md). The read part is held
    at 95 %; the held-out and unread parts at their measured 157/191 and
    119/138 (with the learned model), so that no rule or model change loses a
    log unseen. Every row is dated (the chronological split of
    bench/attribution_eval.py)."""
    assert len(corpus_answers) >= 40
    assert all(r.get("date") for r, _ in corpus_answers)
    for split in ("held_out", "read", "unread"):
        part = [(r, a) for r, a in corpus_answers if r["split"] == split]
        right = sum(a["category"] == r["label"] for r, a in part)
        floor = {"read": 0.95, "held_out": 157 / 191, "unread": 119 / 138}[split]
        assert right >= floor * len(part) - 1e-9, (split, right, len(part))


def _attribute_texts(texts, tmp_path):
    """`trainguard attribute --json` of each text: `--each` over a share of
    them in each of one process per core (the answers in the texts' order)."""
    paths = []
    for i, text in enumerate(texts):
        paths.append(str(tmp_path / ("%d.log" % i)))
        with open(paths[-1], "w") as f:
            f.write(text + "\n")
    workers = os.cpu_count() or 1
    share = max(1, -(-len(paths) // workers))

    def run(part):
        got = subprocess.run([TRAINGUARD, "attribute", "--json", "--each", *part], capture_output=True, text=True)
        assert got.returncode == 0, got.stderr
        answers = [json.loads(line) for line in got.stdout.splitlines()]
        assert len(answers) == len(part), (len(answers), len(part))
        return answers

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return [a for part in pool.map(run, [paths[i:i + share] for i in range(0, len(paths), share)]) for a in part]


def _attribute_jsonl(path, tmp_path):
    records = [json.loads(l) for l in open(path)]
    return list(zip(records, _attribute_texts([r["log"] for r in records], tmp_path)))


def test_healthy_output_gets_no_hardware_finding_no_eviction_and_no_model_answer(tmp_path):
    """tests/data/failure-logs/healthy.jsonl: the output of healthy training
    runs quoted from public threads (NCCL's INFO lines, loss-scale overflows
    that dynamic scaling handles, launcher banners, warnings). Both splits:
    nothing in them may be read as a hardware fault, recommend an eviction,
    or get a category from the learned model."""
    data = os.path.join(os.path.dirname(__file__), "data", "failure-logs", "healthy.jsonl")
    wrong = [(r["id"], a["category"], a["rule"]) for r, a in _attribute_jsonl(data, tmp_path)
             if a["hardware"] or a["action"] == "evict_node" or a["answered_by"] == "model"]
    assert not wrong, wrong


def test_the_models_answers_on_the_corpus_never_recommend_more_than_a_restart(corpus_answers):
    answered = [(r["id"], a) for r, a in corpus_answers if a["answered_by"] == "model"]
    assert answered  # it does answer some (8 measured), so the checks below check something
    for rid, a in answered:
        assert a["action"] == "restart" and a["rule"] == "learned-model", (rid, a)
        assert a["model"]["deciding"], (rid, a)  # it says which features decided


def test_the_shipped_model_was_trained_on_the_corpus_as_it_is():
    """The model file records the sha256 of its training data (the read
    split of the corpus and of the healthy set): a change to either without
    retraining fails here at once (the slow test below retrains)."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from train_attribution_model import data_hash
    data = os.path.join(ROOT, "tests", "data", "failure-logs")
    read = [r for name in ("corpus.jsonl", "healthy.jsonl") for r in map(json.loads, open(os.path.join(data, name)))
            if r.get("split") == "read"]
    model = json.load(open(os.path.join(ROOT, "rules", "attribution_model.json")))
    assert model["trained_on"]["sha256"] == data_hash(read)
    assert model["trained_on"]["logs"] == len(read)


@pytest.mark.slow
def test_the_shipped_model_is_what_retraining_gives():
    """Retraining is deterministic: the same corpus and the same trainguard
    give rules/attribution_model.json byte for byte (and a change to the
    corpus or the features without retraining fails here)."""
    r = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "scripts", "train_attribution_model.py"), "--check",
                        "--trainguard", TRAINGUARD], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_bad_model_file_is_an_error_naming_it_and_none_means_rules_alone(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("CUDA out of memory. Tried to allocate 2.00 GiB\n")
    bad = tmp_path / "model.json"
    bad.write_text('{"format": "trainguard-attribution-model", "version": 1}')
    r = subprocess.run([TRAINGUARD, "attribute", str(log)], capture_output=True, text=True,
                       env=dict(os.environ, TRAINGUARD_MODEL=str(bad)))
    assert r.returncode == 2 and str(bad) in r.stderr, r.stderr
    r = subprocess.run([TRAINGUARD, "attribute", "--json", str(log)], capture_output=True, text=True,
                       env=dict(os.environ, TRAINGUARD_MODEL="none"))
    assert r.returncode == 0 and json.loads(r.stdout)["category"] == "oom"


@pytest.mark.parametrize("start,floor", [
    pytest.param(None, 0.98, id="appended"),
    pytest.param(0.5, 0.97, id="interleaved-from-halfway"),
    pytest.param(0.0, 0.97, id="interleaved-from-the-start", marks=pytest.mark.slow)])
def test_a_cause_and_its_cascade_in_one_log_keep_the_cause_and_link_the_timeouts(tmp_path, corpus_answers,
                                                                                start, floor):
    """Multi-failure logs built from pairs of the corpus's real logs
    (bench/attribution_eval.py, multi_failure_pairs): a cause and a real
    collective-timeout log as its cascade, appended or merged line by line as
    by time with the cascade starting halfway through the cause or with it.
    Where the cause alone is read right, the cascade must not change the
    answer (measured: 460, 458 and 458 of 468; the misses are causes only
    the model reads, whose telling lines a timeout precedes, and a node
    loss the rules read as one) and the timeouts
    are kept as its symptoms wherever the cascade alone is read as timeouts
    (measured: all; two of the corpus's comm_hang logs hold no line a rule
    reads as a timeout)."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from attribution_eval import multi_failure_pairs
    records = {r["id"]: (r, a) for r, a in corpus_answers}
    def timeouts(a):
        return any(e["role"] == "symptom" and e["category"] == "comm_hang" for e in a["evidence"])
    kept = linkable = linked = 0
    pairs = [p for p in multi_failure_pairs([r for r, _ in records.values()], start=start)
             if records[p["id"].split("+")[0]][1]["category"] == p["label"]]  # the cause alone is read right
    alone_right = len(pairs)
    for p, a in zip(pairs, _attribute_texts([p["log"] for p in pairs], tmp_path)):
        cascade = p["id"].split("+")[1]
        if a["category"] == p["label"]:
            kept += 1
            if timeouts(records[cascade][1]):
                linkable += 1
                linked += timeouts(a)
    assert alone_right >= 300 and kept >= floor * alone_right, (alone_right, kept)
    assert linkable >= 250 and linked >= 0.95 * linkable, (linkable, linked)


# Serial: which of two ranks failed first (rank 1 exits, rank 0's gloo then
# loses its peer) is read from the times their agents saw the exits; an agent
# starved of CPU by other tests sees its rank's exit late.
@pytest.mark.serial
def test_a_hardware_reading_of_the_model_alone_restarts_and_evicts_nothing(tmp_path, no_leftovers):
    """A live job whose failing rank prints a GPU complaint no rule names: the
    learned model reads it as gpu_hardware, and the job restarts on the same
    nodes (the model recommends a restart at most); nothing is evicted or
    cordoned, and the incident is kept as the node's history."""
    script = os.path.join(os.path.dirname(__file__), "gpu_words_then_exit.py")
    job = Job(tmp_path, "gpuwords", [PYTHON, script], nnodes=2, nproc=1)
    assert job.wait() == 0, job.output()[-2000:]
    a = detail(job, "attribution")
    assert a["category"] == "gpu_hardware" and a["answered_by"] == "model" and a["rule"] == "learned-model", a
    assert a["recommended_action"] == "restart" and a["model"]["deciding"], a
    assert detail(job, "decision")["decision"] == "restart"
    assert job.events("node_evicted") == []
    nodes = json.loads(subprocess.run([TRAINGUARD, "nodes", "--store", job.store, "--json"],
                                      capture_output=True, text=True).stdout)
    assert all(n["status"] != "cordoned" for n in nodes), nodes
