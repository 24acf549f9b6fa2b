"""Silent data corruption, part 1 (docs/sdc.md), with real DDP ranks: the
instrumentation fingerprints every rank's parameters after optimizer steps
with no change to the script, the controller learns which ranks are
replicas and names the one that silently diverged; its node is evicted and
cordoned, a spare takes its place, the job resumes from a checkpoint saved
before the divergence and ends with the parameters of a plain run. A healthy
job compares its replicas and finds nothing."""

import json
import os
import re
import subprocess

from conftest import EXAMPLE, PYTHON, TRAINGUARD, Job, plain_checksum, plain_example_checksum

STEPS = 200
PLAIN_DDP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_ddp.py")


def progression(first, stride, count):
    """A replica set as the replica_sets event writes an arithmetic progression of ranks."""
    return {"first": first, "stride": stride, "count": count}


def command(tmp_path, *extra):
    return [PYTHON, EXAMPLE, "--steps", str(STEPS), "--ckpt-every", "20", "--step-delay", "0.02",
            "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "sum"), *extra]


def test_a_rank_whose_parameters_silently_diverge_is_named_evicted_and_rolled_back(tmp_path, no_leftovers):
    plain = tmp_path / "plain"
    plain.mkdir()
    reference = plain_example_checksum(plain, STEPS)
    run = tmp_path / "flip"
    run.mkdir()
    job = Job(run, "sdc-flip", command(run, "--flip-at-step", "90", "--crash-rank", "2"), flags=["--spares", "1"])
    assert job.wait(300) == 0, job.output()[-3000:]
    assert [e["detail"]["sets"] for e in job.events("replica_sets") if e["generation"] == 0] == [[progression(0, 1, 4)]]
    found = job.events("replica_divergence")
    assert len(found) == 1, job.event_lines()[-3000:]
    d = found[0]["detail"]
    assert d["diverged"] == [2] and d["nodes"] == ["node1"], d
    assert d["last_agreed_step"] < 91 <= d["step"], d  # the flip follows step 90's update
    assert d["resume_at_most"] == d["last_agreed_step"]
    assert [e["node"] for e in job.events("node_evicted")] == ["node1"]
    attribution = job.events("attribution")[0]["detail"]
    assert attribution["rule"] == "replica-divergence" and attribution["category"] == "gpu_hardware", attribution
    # The newest checkpoint saved no later than the last agreement (one every 20 steps), or an earlier one
    # that retention kept because it was verified (`checkpoint_verified`): never one saved after it, never
    # from scratch.
    resumed = {int(s) for s in re.findall(r"rank \d: resumed from step (\d+)", job.output())}
    verified = [e["detail"]["step"] for e in job.events("checkpoint_verified")]
    assert verified and len(resumed) == 1, (verified, resumed, job.event_lines()[-3000:])
    assert resumed.pop() in {d["last_agreed_step"] // 20 * 20} | {v for v in verified if v <= d["last_agreed_step"]}
    committed = job.events("failure")[0]["detail"]["checkpoint_step"]
    if committed > d["last_agreed_step"]:  # a newer one was committed before the detection: skipped, and said
        assert "saved after step %d, the last at which the replicas' parameters agreed" % d["last_agreed_step"] \
            in job.output()
    assert (run / "sum").read_text().strip() == reference
    nodes = subprocess.run([TRAINGUARD, "nodes", "--store", job.store, "--json"], capture_output=True, text=True,
                           timeout=30)
    assert {n["node"]: n["status"] for n in json.loads(nodes.stdout)}["node1"] == "cordoned"
    assert {n["node"]: n["sdc_devices"] for n in json.loads(nodes.stdout)}["node1"] == \
        {"node1:0": {"confirmed": 1, "suspected": 0}}


def test_a_healthy_job_compares_its_replicas_and_finds_nothing(tmp_path, no_leftovers):
    job = Job(tmp_path, "sdc-healthy", command(tmp_path))
    assert job.wait(300) == 0, job.output()[-3000:]
    assert [e["detail"]["sets"] for e in job.events("replica_sets")] == [[progression(0, 1, 4)]]
    assert not job.events("replica_divergence") and not job.events("failure")


def test_a_tensor_and_pipeline_parallel_job_compares_data_parallel_peers_only(tmp_path, no_leftovers):
    """tests/tp_pp_dp.py --replicated-dp (no trainguard import; weights
    seeded by TP/PP coordinate, as Megatron does): the four pairs of
    data-parallel peers are learned as the replica sets, tensor-parallel
    shards and pipeline stages are never compared, only the last stage's
    ranks check a loss, and nothing is reported."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tp_pp_dp.py")
    job = Job(tmp_path, "sdc-tp-pp-dp", [PYTHON, script, "--steps", "120", "--step-delay", "0.02", "--replicated-dp"],
              nnodes=4, nproc=2)
    assert job.wait(300) == 0, job.output()[-3000:]
    assert [e["detail"]["sets"] for e in job.events("replica_sets")] == \
        [[progression(0, 2, 2), progression(1, 2, 2), progression(4, 2, 2), progression(5, 2, 2)]]
    assert not job.events("replica_divergence") and not job.events("failure")
    assert not job.events("numeric_anomaly") and not job.events("numeric_spike")


def test_a_nan_on_every_rank_is_the_jobs_numerics_and_evicts_nobody(tmp_path, no_leftovers):
    """The script has no NaN guard: it would train on NaN. Every rank's loss
    is NaN at step 50 (every attempt): category numeric, nobody evicted,
    resumed once from before it, and the same again stops the job."""
    job = Job(tmp_path, "nan-all", command(tmp_path, "--silent-nan-at-step", "50", "--nan-ranks", "all",
                                           "--nan-every-attempt"), flags=["--spares", "1"])
    assert job.wait(300) != 0, job.output()[-3000:]
    found = job.events("numeric_anomaly")
    assert len(found) == 2, job.event_lines()[-3000:]
    for e in found:
        d = e["detail"]
        assert d["step"] == 50 and d["all"] and d["ranks"] == [0, 1, 2, 3] and d["resume_at_most"] == 49, d
    attributions = [e["detail"] for e in job.events("attribution")]
    assert [a["category"] for a in attributions] == ["numeric", "numeric"], attributions
    assert not job.events("node_evicted")
    resumed = {int(s) for s in re.findall(r"rank \d: resumed from step (\d+)", job.output())}
    assert resumed and resumed <= {20, 40}, resumed  # never one saved after the NaN, never from scratch
    assert "deterministic" in job.event_lines(), job.event_lines()[-2000:]


def test_a_nan_on_one_rank_names_it_and_a_clean_replay_says_transient(tmp_path, no_leftovers):
    """Rank 2's loss is NaN at step 50 on the first attempt only (a device
    that computed wrong once): rank 2 is named, the job replays from before
    step 50 on the same nodes, the replay is clean: transient, recorded for
    node1, nobody evicted, and the job ends with a plain run's parameters."""
    plain = tmp_path / "plain"
    plain.mkdir()
    reference = plain_example_checksum(plain, STEPS)
    run = tmp_path / "nan"
    run.mkdir()
    job = Job(run, "nan-one", command(run, "--silent-nan-at-step", "50", "--crash-rank", "2"))
    assert job.wait(300) == 0, job.output()[-3000:]
    found = job.events("numeric_anomaly")
    assert len(found) == 1, job.event_lines()[-3000:]
    d = found[0]["detail"]
    assert d["step"] == 50 and not d["all"] and d["ranks"] == [2] and d["nodes"] == ["node1"], d
    confirmation = job.events("sdc_confirmation")
    assert len(confirmation) == 1, job.event_lines()[-3000:]
    c = confirmation[0]["detail"]
    assert c["result"] == "not reproduced" and c["persistence"] == "transient" and c["culprit_ranks"] == [2], c
    assert not job.events("node_evicted")
    assert (run / "sum").read_text().strip() == reference
    nodes = subprocess.run([TRAINGUARD, "nodes", "--store", job.store, "--json"], capture_output=True, text=True,
                           timeout=30)
    node1 = {n["node"]: n for n in json.loads(nodes.stdout)}["node1"]
    assert (node1["status"], node1["sdc_suspected"]) == ("ok", 1), node1
    assert node1["sdc_devices"] == {"node1:0": {"confirmed": 0, "suspected": 1}}, node1  # rank 2 = node1's GPU 0


def test_two_replicas_that_disagree_are_told_apart_by_replay_and_the_faulty_node_is_cordoned(tmp_path,
                                                                                             no_leftovers):
    """Two replicas (2 nodes x 1 rank); whichever rank runs on node0 flips a
    bit after step 90's update on every attempt (a device that always
    computes wrong). No majority: the step is replayed on the same nodes, it
    goes wrong again (persistent), node1 is moved out first (the last
    suspect), the replicas still disagree without it, so node0 is confirmed,
    evicted and cordoned with the evidence and node1 returned; the job ends
    with a plain run's parameters."""
    plain = tmp_path / "plain"
    plain.mkdir()
    reference = plain_example_checksum(plain, STEPS, world=2, nproc=1)
    run = tmp_path / "flip"
    run.mkdir()
    job = Job(run, "sdc-two", command(run, "--flip-at-step", "90", "--flip-on-node", "node0"), nproc=1,
              flags=["--spares", "2"])
    assert job.wait(300) == 0, job.output()[-3000:]
    first = job.events("replica_divergence")
    assert len(first) == 1 and first[0]["detail"]["diverged"] == [] and first[0]["detail"]["replay"], first
    step = first[0]["detail"]["step"]
    confirmed = job.events("sdc_confirmation")
    assert len(confirmed) == 1, job.event_lines()[-3000:]
    c = confirmed[0]["detail"]
    assert c["result"] == "reproduced" and c["persistence"] == "persistent" and c["nodes"] == ["node0"], c
    assert c["step"] == step and c["returned"] == ["node1"], c
    assert [e["node"] for e in job.events("node_evicted")] == ["node1", "node0"]
    assert [e["node"] for e in job.events("node_returned")] == ["node1"]
    assert (run / "sum").read_text().strip() == reference
    nodes = subprocess.run([TRAINGUARD, "nodes", "--store", job.store, "--json"], capture_output=True, text=True,
                           timeout=30)
    status = {n["node"]: n["status"] for n in json.loads(nodes.stdout)}
    assert status["node0"] == "cordoned" and status["node1"] == "ok", status
    assert {n["node"]: n["sdc_confirmed"] for n in json.loads(nodes.stdout)} == {"node0": 1, "node1": 0}
    assert {n["node"]: n["sdc_devices"] for n in json.loads(nodes.stdout)}["node0"] == \
        {"node0:0": {"confirmed": 1, "suspected": 0}}  # the GPU: its local rank


def plain_ddp(tmp, ckpt, *extra):
    (tmp / "ckpt").mkdir(exist_ok=True)
    return [PYTHON, PLAIN_DDP, "--steps", "200", "--ckpt-every", "10", "--step-delay", "0.02",
            "--ckpt", str(tmp / "ckpt" / ckpt), "--out", str(tmp / "sum"), *extra]


def resumed_first_step(job):
    """The first step of generation 1, as the controller recorded it."""
    first = [e for e in job.events("first_step") if e["generation"] == 1]
    assert len(first) == 1, job.event_lines()[-3000:]
    return first[0]["detail"]["first_step"]


def newest_good_save(at_most, every=10):
    """plain_ddp saves after steps every-1, 2*every-1, ...: the newest at or before `at_most`."""
    return (at_most + 1) // every * every - 1


def set_aside_files(ckpt):
    kept = ckpt / ".trainguard-set-aside" / "gen-1"
    return sorted(os.listdir(kept)) if kept.exists() else []


# Which of the script's files exist when the fault is detected depends on
# timing: the NaN (or flip) is seen at the agent's next heartbeat, and the
# script may or may not have saved again by then. The faults below come in a
# step that saves, so a file saved after the bad step is there almost always;
# the assertions hold either way, and test_torch_checkpoints.py pins every
# case of setting aside down on files of known steps.
def test_a_scripts_own_checkpoints_saved_after_a_nan_are_moved_aside_and_it_resumes_from_a_good_one(
        tmp_path, no_leftovers):
    """tests/plain_ddp.py (no trainguard import) saves ckpt/step-N.pt every
    10 steps and resumes from the newest file. Rank 1's loss is NaN at step
    69 (first run only), the step whose end saves step-69.pt: the files saved
    after step 68 are moved aside (kept) before the script looks, it resumes
    from step-59.pt and ends with a plain run's parameters."""
    plain = tmp_path / "plain"
    plain.mkdir()
    reference = plain_checksum(plain, plain_ddp(plain, "step-{step}.pt"))
    run = tmp_path / "nan"
    run.mkdir()
    job = Job(run, "nan-torch-save", plain_ddp(run, "step-{step}.pt", "--nan-at-step", "69", "--die-rank", "1"))
    assert job.wait(300) == 0, job.output()[-3000:]
    d = job.events("numeric_anomaly")[0]["detail"]
    assert d["step"] == 69 and d["ranks"] == [1] and d["resume_at_most"] == 68, d
    assert [e["detail"]["dir"] for e in job.events("torch_checkpoint_dir")] == [str(run / "ckpt")]
    aside = set_aside_files(run / "ckpt")
    assert all(int(re.match(r"step-(\d+)\.pt", f).group(1)) > 68 for f in aside), aside
    moved = [e for e in job.events("log_alert") if e["detail"]["rule"] == "checkpoint-set-aside"]
    assert bool(moved) == bool(aside), (aside, job.event_lines()[-3000:])
    assert resumed_first_step(job) == newest_good_save(68) + 1  # step-59.pt, not the bad step-69.pt
    assert (run / "sum").read_text().strip() == reference
    assert job.events("sdc_confirmation")[0]["detail"]["result"] == "not reproduced"


def test_a_script_that_overwrites_its_one_checkpoint_is_stopped_rather_than_resumed_from_bad_state(
        tmp_path, no_leftovers):
    """The same script keeping one file (ckpt/last.pt, replaced every 10
    steps), NaN at step 69, whose end replaces the file: its only checkpoint
    is then from after the bad step. It is moved aside (kept) and the job
    stops, saying why, rather than resume from NaN state or silently start
    over. Where the NaN was found before the script replaced the file, the
    file is step 59's, good: the job resumes from it and ends as a plain run."""
    run = tmp_path / "nan"
    run.mkdir()
    job = Job(run, "nan-one-file", plain_ddp(run, "last.pt", "--nan-at-step", "69", "--die-rank", "1"))
    rc = job.wait(300)
    d = job.events("numeric_anomaly")[0]["detail"]
    assert d["step"] == 69 and d["resume_at_most"] == 68, d
    # The replay was tried: generation 1 started. (Its ranks may not all have:
    # a rank that refuses to resume stops the generation while a sibling still
    # waits for its standby's imports, a busy machine's usual case.)
    assert [e for e in job.events("ranks_started") if e["generation"] == 1], job.event_lines()[-3000:]
    if set_aside_files(run / "ckpt"):
        assert rc != 0, job.output()[-3000:]
        assert "trainguard: refusing to resume" in job.output()
        assert set_aside_files(run / "ckpt") == ["last.pt"]
        assert not os.path.exists(run / "ckpt" / "last.pt")
        last = job.events("decision")[-1]["message"]
        assert "stop" in last and "checkpoint-no-good-state" in last, job.event_lines()[-3000:]
        assert not os.path.exists(run / "sum")  # never started over and trained to the end
    else:
        assert rc == 0, job.output()[-3000:]
        assert resumed_first_step(job) == newest_good_save(68) + 1
        plain = tmp_path / "plain"
        plain.mkdir()
        assert (run / "sum").read_text().strip() == plain_checksum(plain, plain_ddp(plain, "last.pt"))


def test_a_script_without_trainguard_whose_replica_diverges_resumes_from_its_own_good_checkpoint(
        tmp_path, no_leftovers):
    """tests/plain_ddp.py (no trainguard import, its own torch.save file per
    checkpoint, resumed by torch.load) with one bit of rank 3's parameters
    flipped after step 90 on the first run: rank 3 is named and node1
    evicted, the files saved after the last agreement are moved aside, the
    script resumes from its own newest good file and ends with a plain run's
    parameters."""
    plain = tmp_path / "plain"
    plain.mkdir()
    reference = plain_checksum(plain, plain_ddp(plain, "step-{step}.pt"))
    run = tmp_path / "flip"
    run.mkdir()
    job = Job(run, "flip-torch-save", plain_ddp(run, "step-{step}.pt", "--flip-at-step", "90", "--die-rank", "3"),
              flags=["--spares", "1"])
    assert job.wait(300) == 0, job.output()[-3000:]
    d = job.events("replica_divergence")[0]["detail"]
    assert d["diverged"] == [3] and d["nodes"] == ["node1"] and d["last_agreed_step"] <= 90 < d["step"], d
    assert [e["node"] for e in job.events("node_evicted")] == ["node1"]
    aside = set_aside_files(run / "ckpt")
    assert all(int(re.match(r"step-(\d+)\.pt", f).group(1)) > d["last_agreed_step"] for f in aside), aside
    assert resumed_first_step(job) == newest_good_save(d["last_agreed_step"]) + 1
    assert (run / "sum").read_text().strip() == reference
