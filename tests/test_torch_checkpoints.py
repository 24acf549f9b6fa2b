"""Setting aside a script's own torch.save checkpoints after a rollback
(python/trainguard/_torch_checkpoints.py, docs/sdc.md), on real files with
their recorded steps in the `user.trainguard.step` extended attribute: which
files move, which stay, what is counted, and the refusal to resume when only
bad files are left. The end-to-end runs in test_sdc.py show it in a job; which
files a job has written when its fault is detected depends on timing there,
so every case is pinned down here."""

import os
import subprocess
import sys

from conftest import BUILD, PYTHON

sys.path.insert(0, os.path.join(BUILD, "python"))

from trainguard import _torch_checkpoints  # noqa: E402

XATTR = _torch_checkpoints.XATTR


def saved(path, step):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"checkpoint of step %d" % step if step is not None else b"not ours")
    if step is not None:
        os.setxattr(path, XATTR, str(step).encode())
    return path


def test_files_saved_after_the_last_good_step_move_aside_and_the_rest_stay(tmp_path):
    ckpt = tmp_path / "ckpt"
    saved(str(ckpt / "step-49.pt"), 49)
    saved(str(ckpt / "step-59.pt"), 59)
    saved(str(ckpt / "step-69.pt"), 69)
    saved(str(ckpt / "sub" / "step-79.pt"), 79)
    saved(str(ckpt / "notes.txt"), None)  # no recorded step: left alone
    said = []
    moved, good, unknown, aside = _torch_checkpoints.set_aside(59, [str(ckpt)], 1, said.append)
    assert sorted(moved) == sorted(["%s (step 69)" % (ckpt / "step-69.pt"), "%s (step 79)" % (ckpt / "sub" / "step-79.pt")])
    assert (good, unknown, aside) == (2, 1, 2)
    assert sorted(os.listdir(ckpt)) == [".trainguard-set-aside", "notes.txt", "step-49.pt", "step-59.pt", "sub"]
    kept = ckpt / ".trainguard-set-aside" / "gen-1"
    assert (kept / "step-69.pt").read_bytes() == b"checkpoint of step 69"  # kept, never deleted
    assert os.getxattr(kept / "sub" / "step-79.pt", XATTR) == b"79"     # with its step
    assert len(said) == 1 and "moved aside 2 torch.save checkpoint(s) saved after step 59" in said[0], said


def test_a_second_rank_finds_nothing_left_to_move_and_counts_what_is_aside(tmp_path):
    ckpt = tmp_path / "ckpt"
    saved(str(ckpt / "step-59.pt"), 59)
    saved(str(ckpt / "step-69.pt"), 69)
    _torch_checkpoints.set_aside(59, [str(ckpt)], 1, lambda line: None)
    said = []
    moved, good, unknown, aside = _torch_checkpoints.set_aside(59, [str(ckpt)], 1, said.append)
    assert (moved, good, unknown, aside) == ([], 1, 0, 1) and said == []


def test_a_directory_that_does_not_exist_is_skipped(tmp_path):
    assert _torch_checkpoints.set_aside(5, [str(tmp_path / "never")], 1, lambda line: None) == ([], 0, 0, 0)


def resume(ckpt, at_most):
    env = dict(os.environ, TRAINGUARD_RESUME_AT_MOST=str(at_most), TRAINGUARD_TORCH_CHECKPOINT_DIRS=str(ckpt),
               TORCHELASTIC_RESTART_COUNT="1", RANK="0", PYTHONPATH=os.path.join(BUILD, "python"))
    code = "from trainguard import _autoinstrument; _autoinstrument._set_aside_bad_checkpoints(); print('resumes')"
    return subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_a_rank_whose_only_checkpoint_is_bad_refuses_to_resume_and_keeps_it(tmp_path):
    """One file, overwritten every save, last written after the bad step:
    the rank stops (exit 3) saying why, rather than resume from bad state or
    silently start over; the file is kept aside."""
    ckpt = tmp_path / "ckpt"
    saved(str(ckpt / "last.pt"), 69)
    r = resume(ckpt, 68)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "trainguard: refusing to resume" in r.stderr and "resumes" not in r.stdout, r.stderr
    assert not (ckpt / "last.pt").exists()
    assert (ckpt / ".trainguard-set-aside" / "gen-1" / "last.pt").exists()


def test_a_rank_with_a_good_checkpoint_left_resumes(tmp_path):
    ckpt = tmp_path / "ckpt"
    saved(str(ckpt / "step-59.pt"), 59)
    saved(str(ckpt / "step-69.pt"), 69)
    r = resume(ckpt, 68)
    assert r.returncode == 0 and r.stdout.strip() == "resumes", r.stdout + r.stderr
    assert sorted(os.listdir(ckpt)) == [".trainguard-set-aside", "step-59.pt"]


def test_a_rank_whose_only_checkpoint_is_good_resumes_from_it(tmp_path):
    """The same one-file script when the fault was found before its next
    save: its file is from before the bad step and stays."""
    ckpt = tmp_path / "ckpt"
    saved(str(ckpt / "last.pt"), 59)
    r = resume(ckpt, 68)
    assert r.returncode == 0 and r.stdout.strip() == "resumes", r.stdout + r.stderr
    assert os.listdir(ckpt) == ["last.pt"]
