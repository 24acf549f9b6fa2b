"""Saves to node memory alone in a supervised job (docs/checkpoint_format.md,
docs/restart.md): the example job, 2 nodes x 2 ranks under trainguard, most
of its saves to node memory alone. A lost node's replacement restores from
the copy its peer kept; a node lost together with its peer (here: both)
sends every rank back to storage. Either way the job ends with a plain
run's parameters."""

import glob
import os
import re
import signal

from conftest import EXAMPLE, PYTHON, Job, alive, plain_example_checksum, wait_for
from test_warm_start import memory_root, sources

STEPS = 600


def stored_steps(ckpt):
    return sorted(int(d.split("-")[1]) for d in os.listdir(ckpt)
                  if d.startswith("step-") and os.path.exists(os.path.join(ckpt, d, "COMMIT.json"))) \
        if os.path.isdir(ckpt) else []


def peer_commits(job, node, ranks):
    """{step: ranks} of the saves to memory alone `node` keeps for its previous node, committed."""
    root = memory_root(job, node)
    found = {}
    for path in glob.glob(os.path.join(root, "peer", "step-*", "*", "rank-*.commit")) if root else []:
        step = int(re.search(r"step-(\d+)", path).group(1))
        rank = int(re.search(r"rank-(\d+)\.commit", path).group(1))
        if rank in ranks:
            found.setdefault(step, set()).add(rank)
    return found


def resumed_steps(job, generation):
    return {e["detail"].get("resumed_step") for e in job.events("first_step") if e["generation"] == generation}


def tiered_job(tmp_path, job_id):
    """A plain run's final parameters, the checkpoint directory, and the
    example job under trainguard saving every 20 steps, every 10th save to
    storage (steps 200, 400), the others to node memory alone."""
    (tmp_path / "plain").mkdir()
    reference = plain_example_checksum(tmp_path / "plain", STEPS)
    ckpt = tmp_path / "ckpt"
    job = Job(tmp_path, job_id,
              [PYTHON, EXAMPLE, "--steps", str(STEPS), "--ckpt-every", "20", "--ckpt-storage-every", "10",
               "--step-delay", "0.02", "--ckpt-dir", str(ckpt), "--out", str(tmp_path / "sum")],
              flags=["--max-restarts", "2", "--heartbeat-interval", "0.5"])
    return reference, ckpt, job


def test_a_lost_node_restores_its_saves_to_memory_alone_from_its_peer(tmp_path, no_leftovers):
    reference, ckpt, job = tiered_job(tmp_path, "tiers-peer")

    def ready():  # node1's ranks' save to memory alone after storage's step 200, whole in node0's memory
        newer = [s for s, ranks in peer_commits(job, "node0", {2, 3}).items() if ranks == {2, 3} and s > 200]
        return bool(newer) and 200 in stored_steps(ckpt)
    wait_for(lambda: ready() or job.proc.poll() is not None, 180, "a save to memory alone kept by node1's peer")
    assert ready(), job.output()[-3000:]
    os.kill(job.agent_pids()["node1"], signal.SIGKILL)
    assert job.wait(300) == 0, job.output()[-3000:]

    assert job.events("node_lost")[0]["node"] == "node1"
    again = [e for e in job.events("ranks_started") if e["generation"] == 1 and e["node"] == "node1"]
    fetched = again[0]["detail"]["memory_restore"]
    assert fetched["problem"] == "" and fetched["files"] == 6, fetched  # data, manifest, commit of ranks 2, 3
    resumed = resumed_steps(job, 1)
    assert len(resumed) == 1 and min(resumed) > 200 and min(resumed) % 200 != 0, resumed  # not a stored step
    assert sources(job, 1) == {0: "memory", 1: "memory", 2: "peer memory of node0", 3: "peer memory of node0"}
    assert (tmp_path / "sum").read_text().strip() == reference


def test_a_node_lost_with_its_peer_sends_every_rank_back_to_storage(tmp_path, no_leftovers):
    reference, ckpt, job = tiered_job(tmp_path, "tiers-both")

    def newer_in_memory():
        steps = [e["step"] for e in job.events("checkpoint_committed") if e["generation"] == 0]
        return 200 in stored_steps(ckpt) and max(steps, default=0) > 200
    wait_for(lambda: newer_in_memory() or job.proc.poll() is not None, 180, "a save to memory alone after step 200")
    assert newer_in_memory(), job.output()[-3000:]
    agents, ranks = job.agent_pids(), job.rank_pids(0)
    for node in ("node0", "node1"):  # both, and their memory with them
        os.kill(agents[node], signal.SIGKILL)
    # The ranks die with their agents (a moment later): what storage holds
    # once they are gone is what the job can resume from.
    wait_for(lambda: not any(alive(pid) for pid in ranks.values()), 60, "generation 0's ranks gone")
    stored = stored_steps(ckpt)[-1]
    assert job.wait(300) == 0, job.output()[-3000:]

    assert resumed_steps(job, 1) == {stored}, (resumed_steps(job, 1), stored)
    assert sources(job, 1) == {0: "storage", 1: "storage", 2: "storage", 3: "storage"}
    assert (tmp_path / "sum").read_text().strip() == reference
