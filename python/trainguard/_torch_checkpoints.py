"""Checkpoints the script writes itself with torch.save, recognised without
the script's help, so that lost work and step numbers stay right across
restarts of scripts that never import trainguard.

- When torch.save writes a training checkpoint (a mapping holding an
  optimizer's state_dict, or a model state under "model", "state_dict",
  "model_state_dict" or "module") to a path while steps are counted
  automatically, the step it follows is reported as a committed checkpoint
  and stored with the file, in the extended attribute `user.trainguard.step`
  (it follows the file through an atomic rename, which keeps the inode).
- When torch.load reads a file that carries that attribute before this
  process has counted a step, the automatic step counter resumes after the
  stored step, so a restarted generation numbers its steps as the first one
  did.

- The time torch.save of a training checkpoint took is the rank's checkpoint
  overhead, one save each (unless the script reports its own with
  trainguard.add_checkpoint_overhead): the controller measures a save's cost
  from it for its checkpoint plan, and the report says what the interval cost.
- Every training checkpoint's directory goes into the rank's ledger
  (TRAINGUARD_SAVE_LEDGER, a line per directory), for the controller: after
  silent data corruption or a NaN, the next generation moves the files
  saved after the last good step aside before the script looks for its
  newest (`set_aside`, docs/sdc.md). A script that reports its own steps
  (trainguard.step) has its files marked with its step too.

File systems without user extended attributes (some network file systems)
keep neither: the checkpoint still counts as committed, but a restarted
generation numbers its steps from 0 again, and its files cannot be judged
on a rollback (said so, left in place).
"""

import os
import time
from collections.abc import Mapping

XATTR = "user.trainguard.step"
SET_ASIDE = ".trainguard-set-aside"
_ledgered = set()
_MODEL_KEYS = ("model", "state_dict", "model_state_dict", "module")


def _is_training_checkpoint(obj):
    if not isinstance(obj, Mapping):
        return False
    for key, value in obj.items():
        if isinstance(value, Mapping) and "state" in value and "param_groups" in value:
            return True
        if key in _MODEL_KEYS and isinstance(value, Mapping):
            return True
    return "state" in obj and "param_groups" in obj


def _path(f):
    return os.fspath(f) if isinstance(f, (str, bytes, os.PathLike)) else None


def hook_torch(torch):
    from trainguard import _autoinstrument
    import trainguard

    core = trainguard._core
    original_save, original_load = torch.save, torch.load

    def save(obj, f, *args, **kwargs):
        began = time.perf_counter_ns()
        result = original_save(obj, f, *args, **kwargs)
        took = time.perf_counter_ns() - began
        try:
            count = _autoinstrument._state["count"]
            path = _path(f)
            if path is not None and _is_training_checkpoint(obj):
                # The training loop waited for the save: checkpoint overhead,
                # from which the controller measures a save's cost (its plan,
                # the report's interval cost). Not where the script counts
                # its own (trainguard.add_checkpoint_overhead): once only.
                if not trainguard._counts_own_overhead:
                    core.add_checkpoint_overhead(took)
                step = None
                if trainguard._explicit_steps:
                    step = trainguard._step_counter
                elif count > 0:
                    step = count - 1
                    core.checkpoint_committed(step)
                if step is not None and step >= 0:
                    try:
                        os.setxattr(path, XATTR, str(step).encode())
                    except OSError:
                        pass  # no user xattrs here: the step is not kept with the file
                _ledger(os.path.dirname(os.path.abspath(path)))
        except Exception:
            pass  # the script's save succeeded; recognising it is a bonus
        return result

    def load(f, *args, **kwargs):
        core.mark_startup(3)  # restore marks: ignored after the first step
        result = original_load(f, *args, **kwargs)
        core.mark_startup(4)
        try:
            path = _path(f)
            if path is not None and _autoinstrument._state["count"] == 0:
                step = int(os.getxattr(path, XATTR).decode())
                if step >= 0 and _is_training_checkpoint(result):
                    core.resumed_from(step)
                    if not trainguard._explicit_steps:
                        _autoinstrument.resumed_at(step)
        except (OSError, ValueError):
            pass
        return result

    for wrapper, original in ((save, original_save), (load, original_load)):
        wrapper.__wrapped__ = original
        wrapper.__name__ = original.__name__
        wrapper.__doc__ = original.__doc__
    torch.save, torch.load = save, load


def _ledger(directory):
    ledger = os.environ.get("TRAINGUARD_SAVE_LEDGER")
    if not ledger or directory in _ledgered or "\n" in directory:
        return
    _ledgered.add(directory)
    with open(ledger, "a") as f:
        f.write(directory + "\n")


def _file_step(path):
    try:
        return int(os.getxattr(path, XATTR).decode())
    except (OSError, ValueError):
        return None


def set_aside(at_most, directories, generation, say, depth=3):
    """Moves the script's checkpoint files saved after step `at_most` (by
    their recorded step) out of the way, into DIR/.trainguard-set-aside/
    gen-G/ with the same relative path: kept, never deleted, so that the
    script's own resume logic finds the newest good one. Returns the files
    moved, and counts of good ones (at or before `at_most`), ones with no
    recorded step, and ones set aside (now or by an earlier rollback) after
    `at_most`; says what it did. Every rank may run it at
    once: a file another rank moved first is skipped."""
    moved, good, unknown, aside = [], 0, 0, 0
    for directory in directories:
        if not os.path.isdir(directory):
            continue
        for root, dirs, files in os.walk(directory):
            dirs[:] = [d for d in dirs if d != SET_ASIDE
                       and os.path.relpath(os.path.join(root, d), directory).count(os.sep) < depth]
            for name in files:
                path = os.path.join(root, name)
                step = _file_step(path)
                if step is None:
                    unknown += 1
                    continue
                if step <= at_most:
                    good += 1
                    continue
                target = os.path.join(directory, SET_ASIDE, "gen-%d" % generation, os.path.relpath(path, directory))
                try:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    os.rename(path, target)
                    moved.append("%s (step %d)" % (path, step))
                except FileNotFoundError:
                    pass  # another rank moved it first
        # Counted after the moves: files another rank moved while this one looked are there by now.
        for root, _, files in os.walk(os.path.join(directory, SET_ASIDE)):
            aside += sum(1 for name in files if (_file_step(os.path.join(root, name)) or -1) > at_most)
    if moved:
        say("trainguard: moved aside %d torch.save checkpoint(s) saved after step %d, the last good one, "
            "kept in %s: %s" % (len(moved), at_most, SET_ASIDE, ", ".join(moved)))
    return moved, good, unknown, aside
