"""Acceptance tests of issue 3 with real processes, PyTorch and gloo:
deduplicated DDP checkpoints, and the faults that must not lose a checkpoint."""

import json
import os
import subprocess

import pytest

from conftest import BUILD, PYTHON, TRAINGUARD, free_port

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt_worker.py")


def run_ranks(world, *args, timeout=120):
    """Starts `world` ranks of ckpt_worker.py with the torchrun environment;
    returns (exit codes, parsed last JSON line of each rank or None, stderr)."""
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=os.path.join(BUILD, "python"))
        env.pop("TRAINGUARD_STATUS_PAGE", None)
        procs.append(subprocess.Popen([PYTHON, WORKER, *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    codes, outs, errs = [], [], []
    for p in procs:
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        codes.append(p.returncode)
        lines = [l for l in out.splitlines() if l.startswith("{")]
        outs.append(json.loads(lines[-1]) if lines else None)
        errs.append(err)
    return codes, outs, errs


def steps_on_disk(d):
    r = subprocess.run([TRAINGUARD, "ckpt", "ls", "--json", d], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def committed_save_dir(d, step):
    """The directory of the save that step's COMMIT.json names."""
    entry = next(c for c in steps_on_disk(d) if c["step"] == step)
    assert entry["committed"], entry
    return os.path.join(entry["path"], entry["save"])


def test_ddp_replicas_write_and_read_the_state_once(tmp_path):
    d = str(tmp_path / "ck")
    numel = 1 << 20  # 4 MiB of float32 plus small tensors
    codes, outs, errs = run_ranks(4, "--dir", d, "--mode", "save", "--steps", "10", "--numel", str(numel))
    assert codes == [0] * 4, errs
    written = [o["stats"]["bytes_written"] for o in outs]
    state_bytes = numel * 4
    assert state_bytes <= sum(written) < state_bytes * 1.01
    assert max(written) < state_bytes / 4 * 1.01 + 4096   # each replica wrote about 1/4
    listing = steps_on_disk(d)
    assert listing[0]["step"] == 10 and listing[0]["committed"]
    assert listing[0]["bytes"] == sum(written)
    codes, outs, errs = run_ranks(4, "--dir", d, "--mode", "load", "--numel", str(numel))
    assert codes == [0] * 4, errs
    assert all(o["step"] == 10 and o["matches"] for o in outs)
    assert state_bytes <= sum(o["bytes_read"] for o in outs) < state_bytes * 1.01


def test_kill9_during_phase2_leaves_the_previous_checkpoint_complete(tmp_path):
    d = str(tmp_path / "ck")
    numel = 32 << 20  # 128 MiB: phase 2 is still running when the rank dies
    codes, outs, errs = run_ranks(2, "--dir", d, "--mode", "save", "--steps", "10,20",
                                  "--numel", str(numel), "--kill-at-step", "20", "--kill-rank", "1",
                                  "--commit-timeout", "3")
    assert codes[1] == -9
    by_step = {c["step"]: c for c in steps_on_disk(d)}
    assert by_step[10]["committed"]
    assert 20 not in by_step or not by_step[20]["committed"]
    codes, outs, errs = run_ranks(2, "--dir", d, "--mode", "load", "--numel", str(numel))
    assert codes == [0, 0], "\n".join(errs)
    assert all(o["step"] == 10 and o["matches"] for o in outs)


def test_a_flipped_byte_is_detected_reported_and_restore_falls_back(tmp_path):
    d = str(tmp_path / "ck")
    codes, _, errs = run_ranks(2, "--dir", d, "--mode", "save", "--steps", "10,20", "--numel", "100000")
    assert codes == [0, 0], "\n".join(errs)
    shard = os.path.join(committed_save_dir(d, 20), "rank-00001.data")
    with open(shard, "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0x01]))
    verify = subprocess.run([TRAINGUARD, "ckpt", "verify", d, "20"], capture_output=True, text=True)
    assert verify.returncode != 0 and "checksum mismatch" in verify.stdout + verify.stderr
    assert "rank-00001.data" in verify.stdout + verify.stderr
    codes, outs, errs = run_ranks(2, "--dir", d, "--mode", "load", "--numel", "100000")
    assert codes == [0, 0], "\n".join(errs)
    assert all(o["step"] == 10 and o["matches"] for o in outs)
    assert "checksum mismatch" in errs[1] and "falling back" in errs[1]


def test_a_missing_rank_shard_makes_the_checkpoint_incomplete_and_skipped(tmp_path):
    d = str(tmp_path / "ck")
    codes, _, errs = run_ranks(2, "--dir", d, "--mode", "save", "--steps", "10,20", "--numel", "1000")
    assert codes == [0, 0], "\n".join(errs)
    os.remove(os.path.join(committed_save_dir(d, 20), "rank-00000.json"))
    verify = subprocess.run([TRAINGUARD, "ckpt", "verify", d, "20"], capture_output=True, text=True)
    assert verify.returncode != 0 and "manifest of rank 0 is missing" in verify.stdout + verify.stderr
    codes, outs, errs = run_ranks(2, "--dir", d, "--mode", "load", "--numel", "1000")
    assert codes == [0, 0], "\n".join(errs)
    assert all(o["step"] == 10 and o["matches"] for o in outs)
    # Skipped, but not without a word: rank 0 names the step, where and why.
    said = [l for l in errs[0].splitlines() if "checkpoint of step 20 skipped" in l]
    assert len(said) == 1 and "manifest of rank 0 is missing" in said[0], errs[0]
    assert "skipped" not in errs[1]


def test_a_truncated_data_file_is_skipped_and_named(tmp_path):
    d = str(tmp_path / "ck")
    codes, _, errs = run_ranks(2, "--dir", d, "--mode", "save", "--steps", "10,20", "--numel", "1000")
    assert codes == [0, 0], "\n".join(errs)
    shard = os.path.join(committed_save_dir(d, 20), "rank-00001.data")
    os.truncate(shard, os.path.getsize(shard) // 2)
    codes, outs, errs = run_ranks(2, "--dir", d, "--mode", "load", "--numel", "1000")
    assert codes == [0, 0], "\n".join(errs)
    assert all(o["step"] == 10 and o["matches"] for o in outs)
    said = [l for l in errs[0].splitlines() if "checkpoint of step 20 skipped" in l]
    assert len(said) == 1 and shard in said[0] and "has the wrong size" in said[0], errs[0]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_disk_full_is_a_clear_error_and_training_goes_on(tmp_path):
    d = tmp_path / "small"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(d)], check=True)
    try:
        numel = 5 << 20  # 20 MiB per checkpoint: the second one does not fit beside the first
        codes, outs, errs = run_ranks(1, "--dir", str(d), "--mode", "save", "--steps", "10,20,30",
                                      "--numel", str(numel), "--replicated", "1")
        assert codes == [0], errs
        saves = {s["step"]: s for s in outs[0]["saves"]}
        assert saves[10]["ok"]
        assert not saves[20]["ok"] and "No space left on device" in saves[20]["error"]
        assert outs[0]["stats"]["failed"] >= 1   # and the job went on to step 30
        assert "No space left on device" in errs[0]
        by_step = {c["step"]: c for c in steps_on_disk(str(d))}
        assert by_step[10]["committed"] and not by_step.get(20, {}).get("committed", False)
        codes, outs, errs = run_ranks(1, "--dir", str(d), "--mode", "load", "--numel", str(numel))
        assert codes == [0] and outs[0]["step"] == 10 and outs[0]["matches"], errs
    finally:
        subprocess.run(["umount", str(d)], check=True)


def test_python_api_round_trips_dtypes_modules_optimizers_and_values(tmp_path):
    script = r'''
import collections, sys, torch, trainguard
ck = trainguard.Checkpointer(sys.argv[1], keep_last=2)
assert ck.load_latest() is None
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
opt = torch.optim.Adam(model.parameters())
model(torch.randn(3, 8)).sum().backward()
opt.step()
Point = collections.namedtuple("Point", "x y")
dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64]
state = {"model": model.state_dict(), "opt": opt.state_dict(),
         "tensors": {str(d): (torch.arange(12) % 2).to(d).reshape(3, 4) for d in dtypes},
         "strided": torch.arange(20.).reshape(4, 5)[:, 1:3],   # not contiguous
         "empty": torch.zeros(0, 7), "scalar": torch.tensor(3.5),
         "values": [1, "two", Point(3, torch.ones(2))], "step": 11}
assert ck.save(11, state) and ck.wait()
step, got = ck.load_latest()
assert step == 11 and got["step"] == 11 and got["values"][:2] == [1, "two"]
assert isinstance(got["values"][2], Point) and torch.equal(got["values"][2].y, torch.ones(2))
for d in dtypes:
    t = got["tensors"][str(d)]
    assert t.dtype == d and torch.equal(t, state["tensors"][str(d)]), d
assert torch.equal(got["strided"], state["strided"]) and got["empty"].shape == (0, 7)
assert got["scalar"].shape == () and got["scalar"].item() == 3.5
model2 = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
model2.load_state_dict(got["model"])
opt2 = torch.optim.Adam(model2.parameters())
opt2.load_state_dict(got["opt"])
for a, b in zip(model.parameters(), model2.parameters()):
    assert torch.equal(a, b)
assert str(opt2.state_dict()) == str(opt.state_dict())
print("ok")
'''
    env = dict(os.environ, PYTHONPATH=os.path.join(BUILD, "python"))
    env.pop("TRAINGUARD_STATUS_PAGE", None)
    r = subprocess.run([PYTHON, "-c", script, str(tmp_path / "ck")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_shard_groups_store_each_distinct_shard_once(tmp_path):
    """4 ranks, 2 distinct shards (ranks {0,2} and {1,3} hold the same state):
    the directory holds 2 x the state, and each rank restores its own shard."""
    d = str(tmp_path / "ck")
    numel = 1 << 18
    codes, outs, errs = run_ranks(4, "--dir", d, "--mode", "save", "--steps", "5", "--numel",
                                  str(numel), "--shard-groups", "2")
    assert codes == [0] * 4, errs
    written = sum(o["stats"]["bytes_written"] for o in outs)
    assert 2 * numel * 4 <= written < 2 * numel * 4 * 1.02
    codes, outs, errs = run_ranks(4, "--dir", d, "--mode", "load", "--numel", str(numel),
                                  "--shard-groups", "2")
    assert codes == [0] * 4, errs
    assert all(o["step"] == 5 and o["matches"] for o in outs), outs


def test_no_usable_checkpoint_is_an_error_not_a_silent_fresh_start(tmp_path):
    d = str(tmp_path / "ck")
    codes, _, errs = run_ranks(2, "--dir", d, "--mode", "save", "--steps", "10", "--numel", "1000")
    assert codes == [0, 0], "\n".join(errs)
    # A job of another size cannot use them: it must say so.
    codes, outs, errs = run_ranks(1, "--dir", d, "--mode", "load", "--numel", "1000")
    assert codes[0] != 0
    assert "none of the 1 complete checkpoints" in errs[0] and "saved by 2 ranks" in errs[0]


def test_a_restart_that_saves_a_step_again_never_commits_the_crashed_attempts_parts(tmp_path):
    """Issue 7: rank 0 dies before its part of step 30, ranks 1-3 wrote theirs;
    the restart saves step 30 again with another state, rank 0 first. The
    commit must wait for the restart's own parts: never a mix."""
    d = str(tmp_path / "ck")
    numel = 1 << 16
    codes, _, errs = run_ranks(4, "--dir", d, "--mode", "save", "--steps", "10,20,30",
                               "--numel", str(numel), "--die-before-step", "30", "--kill-rank", "0",
                               "--commit-timeout", "2")
    assert codes[0] == -9
    by_step = {c["step"]: c for c in steps_on_disk(d)}
    assert by_step[20]["complete"] and not by_step[30]["committed"]
    assert by_step[30]["manifests"] == 3          # the crashed attempt's parts of step 30
    codes, outs, errs = run_ranks(4, "--dir", d, "--mode", "save", "--steps", "30", "--numel",
                                  str(numel), "--offset", "500", "--rank0-first-at", "30")
    assert codes == [0] * 4, errs
    assert all(o["saves"][0]["ok"] for o in outs), outs
    listing = steps_on_disk(d)
    step30 = next(c for c in listing if c["step"] == 30)
    assert step30["complete"] and step30["manifests"] == 4
    assert len([n for n in os.listdir(step30["path"]) if n.startswith("save-")]) == 1  # debris gone
    verify = subprocess.run([TRAINGUARD, "ckpt", "verify", d, "30"], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    codes, outs, errs = run_ranks(4, "--dir", d, "--mode", "load", "--numel", str(numel),
                                  "--offset", "500")
    assert codes == [0] * 4, errs
    # Every tensor and value is the restart's: the whole state equals the
    # restart's state and no other attempt's.
    assert all(o["step"] == 30 and o["matches"] and o["matches_offsets"] == [500] for o in outs), outs
