"""Corroborate before evicting (docs/attribution.md, "Corroboration"): an
unmodified DDP script whose rank prints a GPU error and dies. What its rank
printed alone makes its node a suspect: diagnosed alone, then restarted on;
the same GPU failing so again later evicts it. A node whose driver reported
an Xid for that GPU (NVML, here the stand-in src/agent/fake_nvml.cc) is
evicted at once (tests/test_attribution.py)."""

import os

from conftest import FAKE_NVML, PYTHON, Job, wait_for

PLAIN_DDP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_ddp.py")


def plain_job(tmp_path, job_id, die_line, *, spares=0, steps=400):
    trigger = tmp_path / "die"
    job = Job(tmp_path, job_id,
              [PYTHON, PLAIN_DDP, "--steps", str(steps), "--step-delay", "0.03", "--ckpt", str(tmp_path / "ck.pt"),
               "--out", str(tmp_path / "sum.txt"), "--die-rank", "1", "--die-when", str(trigger), "--die-again",
               "--die-line", die_line],
              nnodes=2, nproc=1, flags=["--spares", str(spares)] if spares else [],
              env={"TRAINGUARD_NVML_LIBRARY": FAKE_NVML})  # GPUs that report no error
    return job, trigger


def decisions(job):
    return [e["detail"] for e in job.events("decision")]


def test_a_bare_launch_failure_once_is_diagnosed_and_restarted_and_again_on_the_same_gpu_evicts(
        tmp_path, no_leftovers):
    job, trigger = plain_job(tmp_path, "launch", "RuntimeError: CUDA error: unspecified launch failure", spares=1)
    try:
        wait_for(lambda: (job.page_step("node1", 1) or -1) >= 10 or job.proc.poll() is not None, 120, "step 10")
        trigger.write_text("1")
        wait_for(lambda: decisions(job) or job.proc.poll() is not None, 120, "the first decision")
        first = job.events("attribution")[0]["detail"]
        assert first["category"] == "gpu_hardware" and first["rule"] == "gpu-launch-failure", first
        assert decisions(job)[0]["decision"] == "restart", decisions(job)
        assert first["suspected_nodes"] == ["node1"], first
        assert first["corroboration"]["unsupported"] == ["node1"], first
        assert "suspected, diagnosing it" in decisions(job)[0]["reason"]
        # node1 alone is diagnosed (the job diagnoses nothing routinely), then the job restarts on it.
        rounds = wait_for(lambda: job.events("diagnosis_started") or job.proc.poll() is not None, 60,
                          "the suspect's diagnosis")
        assert rounds and rounds[0]["detail"]["nodes"] == ["node1"], rounds
        assert rounds[0]["detail"]["mode"] == "quick", rounds
        failed_at = first["failure_step"]
        wait_for(lambda: (job.page_step("node1", 1) or -1) >= failed_at + 20 or job.proc.poll() is not None, 120,
                 "generation 1 past step %d" % (failed_at + 20))
        assert not job.events("node_evicted"), job.events("node_evicted")
        # The same GPU fails the same way, later in the run: its node goes, the spare takes over.
        trigger.write_text("2")
        wait_for(lambda: len(decisions(job)) >= 2 or job.proc.poll() is not None, 120, "the second decision")
        assert decisions(job)[1]["decision"] == "evict_node", decisions(job)
        assert "failed so before at another step" in decisions(job)[1]["reason"], decisions(job)[1]
        assert job.wait(timeout=300) == 0, job.output()[-3000:]
        assert [e["node"] for e in job.events("node_evicted")] == ["node1"]
        assert [e["node"] for e in job.events("spare_promoted")] == ["node2"]
    finally:
        job.end()


def test_a_log_claiming_an_ecc_error_on_a_node_with_clean_gpus_is_diagnosed_not_evicted(tmp_path, no_leftovers):
    job, trigger = plain_job(tmp_path, "ecc", "RuntimeError: CUDA error: uncorrectable ECC error encountered",
                             steps=120)
    try:
        wait_for(lambda: (job.page_step("node1", 1) or -1) >= 10 or job.proc.poll() is not None, 120, "step 10")
        trigger.write_text("1")
        assert job.wait(timeout=300) == 0, job.output()[-3000:]
        a = job.events("attribution")[0]["detail"]
        assert a["category"] == "gpu_hardware" and a["rule"] == "gpu-ecc-uncorrectable", a
        # The stand-in NVML read node1's GPUs: no uncorrected ECC count, no Xid.
        assert a["corroboration"]["unsupported"] == ["node1"], a
        assert decisions(job)[0]["decision"] == "restart", decisions(job)
        assert [r["detail"]["nodes"] for r in job.events("diagnosis_started")] == [["node1"]]
        assert not job.events("node_evicted")
        assert job.events("job_succeeded")
    finally:
        job.end()
