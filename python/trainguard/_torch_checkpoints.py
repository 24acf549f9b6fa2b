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

File systems without user extended attributes (some network file systems)
keep neither: the checkpoint still counts as committed, but a restarted
generation numbers its steps from 0 again.
"""

import os
from collections.abc import Mapping

XATTR = "user.trainguard.step"
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
        result = original_save(obj, f, *args, **kwargs)
        try:
            count = _autoinstrument._state["count"]
            path = _path(f)
            if (path is not None and count > 0 and not trainguard._explicit_steps
                    and _is_training_checkpoint(obj)):
                step = count - 1
                core.checkpoint_committed(step)
                try:
                    os.setxattr(path, XATTR, str(step).encode())
                except OSError:
                    pass  # no user xattrs here: the step is not kept with the file
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
