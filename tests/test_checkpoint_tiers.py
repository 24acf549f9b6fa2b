"""Saves to node memory alone (docs/checkpoint_format.md, "Saves to memory
alone"): real ranks (gloo) of tests/ckpt_worker.py, each "node" a memory
directory of its own. A step written as 20m goes to node memory alone.

What must hold: a save to memory alone counts only once every rank wrote it;
a restore takes the newest step every rank can restore, from memory or from
storage, never a mix; whatever is lost, damaged or half done, the state
restored is exactly one save's."""

import glob
import os
import shutil

from test_checkpoint import run_ranks, steps_on_disk


def memory_files(root, node, step):
    return sorted(os.path.relpath(p, root) for p in
                  glob.glob(os.path.join(root, "node%d" % node, "step-%012d" % step, "*", "*")))


def save(tmp_path, steps, *extra, world=2):
    d, m = str(tmp_path / "ckpt"), str(tmp_path / "memory")
    codes, outs, errs = run_ranks(world, "--dir", d, "--memory-root", m, "--mode", "save", "--steps", steps,
                                  "--numel", "4096", *extra)
    return d, m, codes, outs, errs


def load(d, m, *extra, world=2):
    codes, outs, errs = run_ranks(world, "--dir", d, "--memory-root", m, "--mode", "load", "--numel", "4096",
                                  *extra)
    assert codes == [0] * world, errs
    return outs, errs


def test_saves_to_memory_alone_commit_on_every_rank_and_the_newest_is_restored_from_memory(tmp_path):
    d, m, codes, outs, errs = save(tmp_path, "10,20m,30m")
    assert codes == [0, 0], errs
    assert all(s["ok"] for o in outs for s in o["saves"]), outs
    # Storage holds only the save to storage; each node's memory holds the
    # others, with a commit beside each rank's data and manifest.
    assert [c["step"] for c in steps_on_disk(d)] == [10]
    for node in (0, 1):
        names = [os.path.basename(p) for p in memory_files(m, node, 30)]
        assert names == ["rank-%05d.commit" % node, "rank-%05d.data" % node, "rank-%05d.json" % node], names
        assert len(memory_files(m, node, 20)) == 3, "keep 1, and one more: the peer may lag a commit"
        assert memory_files(m, node, 10) == [], "the save to storage left memory"
    assert all(o["stats"]["memory_commits"] == 2 for o in outs), outs
    outs, _ = load(d, m)
    assert [(o["step"], o["matches"], o["source"]) for o in outs] == [(30, True, "memory")] * 2, outs


def test_a_node_whose_memory_is_lost_makes_every_rank_restore_from_storage(tmp_path):
    d, m, codes, _, errs = save(tmp_path, "10,20m,30m")
    assert codes == [0, 0], errs
    shutil.rmtree(os.path.join(m, "node1"))  # the node is gone, and its copies with it
    outs, errs = load(d, m)
    assert [(o["step"], o["matches"], o["source"]) for o in outs] == [(10, True, "storage")] * 2, outs
    assert "holds no save of step 30 of rank 1" in errs[1], errs[1]


def test_a_save_to_memory_one_rank_could_not_write_is_dropped_on_every_rank(tmp_path):
    d, m, codes, outs, errs = save(tmp_path, "10,20m,30m", "--block-memory-step", "30", "--kill-rank", "1")
    assert codes == [0, 0], errs
    assert not outs[1]["saves"][2]["ok"], outs[1]
    assert "to node memory dropped: not every rank wrote it" in errs[0], errs[0]
    assert memory_files(m, 0, 30) == [], "rank 0's part of a save rank 1 lacks is removed"
    outs, _ = load(d, m)
    assert [(o["step"], o["matches"], o["source"]) for o in outs] == [(20, True, "memory")] * 2, outs


def test_a_rank_killed_before_the_ranks_agreed_leaves_the_save_uncommitted(tmp_path):
    d, m, codes, _, errs = save(tmp_path, "10,20m,30m", "--kill-at-step", "30", "--kill-rank", "1")
    assert codes[1] == -9, codes
    # Both ranks wrote step 30 whole, but no rank committed it.
    for node in (0, 1):
        assert not any(p.endswith(".commit") for p in memory_files(m, node, 30)), memory_files(m, node, 30)
    outs, _ = load(d, m)
    assert [(o["step"], o["matches"]) for o in outs] == [(20, True)] * 2, outs


def test_a_commit_one_rank_did_not_write_makes_every_rank_take_the_step_before(tmp_path):
    # As if rank 1 died between the agreement and writing its commit.
    d, m, codes, _, errs = save(tmp_path, "10,20m,30m")
    assert codes == [0, 0], errs
    commit = next(p for p in memory_files(m, 1, 30) if p.endswith(".commit"))
    os.unlink(os.path.join(m, commit))
    outs, _ = load(d, m)
    assert [(o["step"], o["matches"], o["source"]) for o in outs] == [(20, True, "memory")] * 2, outs


def test_a_flipped_byte_in_a_save_to_memory_falls_back_to_the_step_before_on_every_rank(tmp_path):
    d, m, codes, _, errs = save(tmp_path, "10,20m,30m")
    assert codes == [0, 0], errs
    data = os.path.join(m, memory_files(m, 0, 30)[1])
    with open(data, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x40]))
    outs, errs = load(d, m)
    assert [(o["step"], o["matches"], o["source"]) for o in outs] == [(20, True, "memory")] * 2, outs
    assert "checksum mismatch" in errs[0], errs[0]


def test_a_step_saved_to_memory_again_by_a_later_attempt_restores_that_attempts_save_whole(tmp_path):
    d, m, codes, _, errs = save(tmp_path, "10,20m,30m")
    assert codes == [0, 0], errs
    # A later attempt (other values) saves step 30 again, then dies during its next save.
    codes, _, errs = run_ranks(2, "--dir", d, "--memory-root", m, "--mode", "save", "--steps", "30m,40m",
                               "--numel", "4096", "--offset", "500", "--kill-at-step", "40", "--kill-rank", "1")
    assert codes[1] == -9, codes
    outs, _ = load(d, m, "--offset", "500")
    assert [(o["step"], o["matches"], o["matches_offsets"]) for o in outs] == [(30, True, [500])] * 2, outs


def test_when_one_ranks_node_keeps_no_memory_copies_every_rank_saves_to_storage(tmp_path):
    d, m, codes, outs, errs = save(tmp_path, "10,20m,30m", "--no-memory-rank", "1")
    assert codes == [0, 0], errs
    assert all(s["ok"] for o in outs for s in o["saves"]), outs
    assert sorted(c["step"] for c in steps_on_disk(d)) == [10, 20, 30]
    assert "another rank's node keeps no memory copies" in errs[0], errs[0]


def test_without_node_memory_a_save_to_memory_goes_to_storage(tmp_path):
    d = str(tmp_path / "ckpt")
    codes, outs, errs = run_ranks(2, "--dir", d, "--mode", "save", "--steps", "10,20m", "--numel", "4096")
    assert codes == [0, 0], errs
    assert sorted(c["step"] for c in steps_on_disk(d)) == [10, 20]
    assert "keeps no memory copies of checkpoints: saves to node memory go to storage" in errs[0], errs[0]
