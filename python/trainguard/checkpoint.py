"""Two-phase checkpointing for PyTorch (format: docs/checkpoint_format.md).

    ckpt = trainguard.Checkpointer("checkpoints", keep_last=3)
    restored = ckpt.load_latest()               # None, or (step, state)
    ...
    ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict(), "step": step})
    ...
    ckpt.wait()                                 # before exit

`save` returns once the state is copied to host memory (phase 1); writing,
checksums, fsync and the commit happen in the background (phase 2). A
checkpoint becomes visible only when every rank's part is durable; then the
step is reported to trainguard, which counts lost work from it.

State: nested dicts, lists and tuples of tensors (CPU, or CUDA in a CUDA
build with a GPU) and any picklable values. With `replicated=True` (DDP:
every rank holds the same state) the ranks write the state once in total,
each about 1/world of it, and `load` reads it once and exchanges the parts
over the default process group. For state that is identical only within
groups of ranks (ZeRO/FSDP shard groups replicated across data-parallel
ranks), pass `replicated=[ranks holding the same state as this one]` and
`process_group=` a process group of exactly those ranks; `replicated=False`
means every rank's state is its own.
"""

import io
import os
import pickle
import sys
import warnings

from . import _core

__all__ = ["Checkpointer", "CheckpointError"]


class CheckpointError(RuntimeError):
    pass


class _Slot:
    """Stands for the tensor with this index in the pickled skeleton."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __reduce__(self):
        return (_Slot, (self.index,))


def _flatten(obj, path, out):
    import torch

    if isinstance(obj, torch.Tensor):
        out.append((path or "tensor", obj))
        return _Slot(len(out) - 1)
    if isinstance(obj, dict):
        rebuilt = type(obj)() if type(obj) is not dict else {}
        for k, v in obj.items():
            rebuilt[k] = _flatten(v, "%s/%s" % (path, k) if path else str(k), out)
        return rebuilt
    if isinstance(obj, (list, tuple)):
        items = [_flatten(v, "%s/%d" % (path, i) if path else str(i), out) for i, v in enumerate(obj)]
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*items)
        return type(obj)(items)
    return obj


def _unflatten(obj, tensors):
    if isinstance(obj, _Slot):
        return tensors[obj.index]
    if isinstance(obj, dict):
        rebuilt = type(obj)() if type(obj) is not dict else {}
        for k, v in obj.items():
            rebuilt[k] = _unflatten(v, tensors)
        return rebuilt
    if isinstance(obj, (list, tuple)):
        items = [_unflatten(v, tensors) for v in obj]
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*items)
        return type(obj)(items)
    return obj


def _dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def _dist():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist
    return None


class Checkpointer:
    """Saves and restores checkpoints of one job in `directory` (shared by all ranks)."""

    def __init__(self, directory, keep_last=3, replicated=True, process_group=None,
                 overflow="block", writer_threads=4, copy_threads=4, commit_timeout=600.0,
                 read_threads=4):
        self.directory = os.path.abspath(directory)
        self.read_threads = read_threads
        dist = _dist()
        self.rank = dist.get_rank() if dist else int(os.environ.get("RANK", 0))
        self.world_size = dist.get_world_size() if dist else int(os.environ.get("WORLD_SIZE", 1))
        if replicated is True:
            self.group = list(range(self.world_size))
        elif replicated is False or replicated is None:
            self.group = [self.rank]
        else:
            self.group = sorted(int(r) for r in replicated)
            if self.rank not in self.group or len(set(self.group)) != len(self.group) \
                    or self.group[0] < 0 or self.group[-1] >= self.world_size:
                raise CheckpointError("replicated=%r must list distinct ranks of this job including "
                                      "this rank (%d)" % (replicated, self.rank))
            if len(self.group) > 1 and process_group is None:
                raise CheckpointError("replicated=<list of ranks> needs process_group= "
                                      "a process group of exactly those ranks")
        self.process_group = process_group
        if not dist and len(self.group) > 1:
            raise CheckpointError("replicated checkpoints of %d ranks need torch.distributed "
                                  "to be initialized first" % len(self.group))
        self._engine = _core.CheckpointEngine(self.directory, keep_last, copy_threads,
                                              writer_threads, overflow, float(commit_timeout), True)
        self.last_error = ""
        self.bytes_read = 0

    # ---- saving --------------------------------------------------------

    def save(self, step, state):
        """Phase 1: snapshot `state` into host memory; returns False if the save
        was skipped because the previous one is still persisting (overflow="skip")."""
        flat = []
        skeleton = _flatten(state, "", flat)
        keep = []   # the tensors whose memory is read until save() returns
        specs = []
        for name, t in flat:
            t = t.detach()
            if not t.is_contiguous():
                t = t.contiguous()
            keep.append(t)
            specs.append((name, _dtype_name(t), list(t.shape), t.data_ptr(),
                          t.numel() * t.element_size(), t.is_cuda))
        blob = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
        return self._engine.save(int(step), self.rank, self.world_size, self.group, specs, blob)

    def wait(self):
        """Waits until every save is durable and committed (or abandoned).
        Returns True if all went well; else False, with the reason in
        `last_error` and on stderr. Training may go on either way."""
        err = self._engine.wait()
        if err:
            self.last_error = err
            warnings.warn("trainguard checkpoint: " + err, RuntimeWarning)
            return False
        return True

    def stats(self):
        return self._engine.stats()

    def close(self):
        self.wait()

    # ---- restoring -----------------------------------------------------

    def steps(self):
        """Committed steps, newest first."""
        try:
            return [c["step"] for c in _core.list_checkpoints(self.directory) if c["committed"]]
        except RuntimeError:
            return []

    def load_latest(self):
        """Restores the newest checkpoint every rank can read and verify.
        Returns (step, state), or None if the directory holds no complete
        checkpoint. A step that is corrupt or unreadable on any rank is
        skipped, with a warning naming the problem, in favour of the one
        before it; if none is usable, CheckpointError says why, rather than
        letting the job silently start again from scratch."""
        steps = self.steps()
        reasons = []
        for step in steps:
            state = self._try_load(step)
            if state is not None:
                return step, state
            reasons.append("step %d: %s" % (step, self.last_error))
        if steps:
            raise CheckpointError("none of the %d complete checkpoints in %s is usable (%s)"
                                  % (len(steps), self.directory, "; ".join(reasons)))
        return None

    def load(self, step):
        """Restores exactly `step`; raises CheckpointError if it is unusable."""
        state = self._try_load(int(step), quiet=False)
        if state is None:
            raise CheckpointError("checkpoint of step %d is unusable: %s" % (step, self.last_error))
        return state

    def _agree(self, ok):
        dist = _dist()
        if dist is None or self.world_size == 1:
            return ok
        import torch

        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def _try_load(self, step, quiet=True):
        import torch

        reason = ""
        local = manifest = None
        try:
            manifest = _core.read_manifest(self.directory, step, self.rank)
            if manifest["world_size"] != self.world_size or manifest["replica_group"] != self.group:
                raise CheckpointError(
                    "saved by %d ranks in replica group %s; this job has %d ranks in %s"
                    % (manifest["world_size"], manifest["replica_group"], self.world_size, self.group))
            size = manifest["hi"] - manifest["lo"]
            local = torch.empty(max(size, 1), dtype=torch.uint8)
            _core.read_stored_range(self.directory, step, self.rank, local.data_ptr(), size,
                                    self.read_threads)
            self.bytes_read += size
        except (RuntimeError, CheckpointError) as e:
            reason = str(e)
        ok = self._agree(not reason)
        if not ok:
            self.last_error = reason or "unusable on another rank"
            msg = "checkpoint of step %d unusable on rank %d: %s" % (step, self.rank, self.last_error)
            if not reason:
                msg = "checkpoint of step %d unusable on another rank" % step
            if quiet:
                warnings.warn("trainguard: %s; falling back to an older one" % msg, RuntimeWarning)
                print("trainguard: %s; falling back to an older one" % msg, file=sys.stderr, flush=True)
            return None
        stream = self._assemble(manifest, local)
        blob = stream[manifest["blob_offset"]:manifest["blob_offset"] + manifest["blob_nbytes"]]
        skeleton = pickle.loads(blob.numpy().tobytes())
        tensors = []
        for t in manifest["tensors"]:
            raw = stream[t["offset"]:t["offset"] + t["nbytes"]]
            dtype = getattr(torch, t["dtype"])
            tensors.append(raw.view(dtype).reshape(t["shape"]))
        state = _unflatten(skeleton, tensors)
        try:
            from . import checkpoint_committed

            checkpoint_committed(step)
        except Exception:  # reporting is best effort
            pass
        return state

    def _assemble(self, manifest, local):
        """The group's whole stream: this rank's part plus the others' parts,
        exchanged over the process group (each part was read once)."""
        import torch

        group = manifest["replica_group"]
        total = manifest["total_bytes"]
        if len(group) == 1:
            return local[:total]
        # Every member's range is `chunk` bytes but the last (see layout.h).
        dist = _dist()
        sizes = torch.tensor([manifest["hi"] - manifest["lo"]], dtype=torch.int64)
        dist.all_reduce(sizes, op=dist.ReduceOp.MAX, group=self.process_group)
        chunk = max(int(sizes.item()), 1)
        padded = torch.zeros(chunk, dtype=torch.uint8)
        n = manifest["hi"] - manifest["lo"]
        padded[:n] = local[:n]
        full = torch.empty(chunk * len(group), dtype=torch.uint8)
        parts = list(full.split(chunk))
        dist.all_gather(parts, padded, group=self.process_group)
        return full[:total]
