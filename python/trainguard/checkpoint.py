"""Two-phase checkpointing for PyTorch (format: docs/checkpoint_format.md).

    ckpt = trainguard.Checkpointer("checkpoints", keep_last=3)
    restored = ckpt.load_latest()               # None, or (step, state)
    ...
    ckpt.save(step, {"model": model.state_dict(), "optim": opt.state_dict(), "step": step})
    ...
    ckpt.wait()                                 # before exit

With `save_every` the Checkpointer also says when to save: `ckpt.due(step)`,
on every rank, every step (`save_every=N`: every N steps; "auto": the
interval of the controller's checkpoint plan, docs/checkpoint_policy.md).
With "auto" on a node that keeps memory copies, `due` also picks the tier:
most saves go to node memory alone, every Nth to storage, as the plan says
(`save` takes the tier `due` named for that step; `save(step, state,
tier="memory")` asks for it directly).

A save to memory alone (docs/checkpoint_format.md) is committed once every
rank has written it: the ranks agree on that at the next `due`, `save` or
`wait`, a collective every rank passes at the same point. `load_latest`
restores the newest step every rank can restore from either tier: its own
node's memory, a copy fetched from its peer's (docs/restart.md), or storage.

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

Every rank must create the Checkpointer and call `save` for every checkpoint,
in the same order (as with torch.distributed.checkpoint). Each save is
identified by an attempt nonce that the ranks agree on when the Checkpointer
is created (rank 0 draws it and broadcasts it; at the first save if
torch.distributed is initialized only later) and a save counter, and a commit binds exactly that save's parts, so a
restart that saves a step again never mixes its parts with those of the run
before. Restores make every rank read the same save of a step.
"""

import hashlib
import os
import pickle
import sys
import warnings

from . import _core
from ._save_schedule import SaveSchedule

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


def _collective_device(group=None):
    """Where tensors for collectives on `group` must live: NCCL takes only CUDA tensors."""
    import torch

    dist = _dist()
    if dist is not None and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _reduced(values, largest=False):
    """Whole numbers reduced over every rank of the job (elementwise MIN, or
    MAX with `largest`); as they are on one rank or without torch.distributed."""
    values = [int(v) for v in values]
    dist = _dist()
    if dist is None or dist.get_world_size() == 1 or not values:
        return values
    import torch

    t = torch.tensor(values, dtype=torch.int64, device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX if largest else dist.ReduceOp.MIN)
    return [int(v) for v in t.tolist()]


def _save_key(attempt, sequence):
    """A 62-bit number naming one save, equal on every rank that read the same save."""
    digest = hashlib.blake2b(("%s-%d" % (attempt, sequence)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


class Checkpointer:
    """Saves and restores checkpoints of one job in `directory` (shared by all ranks)."""

    def __init__(self, directory, keep_last=3, replicated=True, process_group=None,
                 overflow="block", writer_threads=4, copy_threads=4, commit_timeout=600.0,
                 read_threads=4, save_every=None):
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
        # The node's memory copies (docs/restart.md): a directory the agent owns.
        self.memory_dir = os.environ.get("TRAINGUARD_MEMORY_CHECKPOINTS", "")
        memory_keep = int(os.environ.get("TRAINGUARD_MEMORY_CHECKPOINTS_KEEP", "1") or 1)
        # where the newest load read this rank's part: "memory" (the node's own copy), "peer memory of
        # NODE" (a copy fetched from the node that held it, docs/restart.md) or "storage"
        self.last_source = ""
        self._engine = _core.CheckpointEngine(self.directory, keep_last, copy_threads,
                                              writer_threads, overflow, float(commit_timeout), True,
                                              self.memory_dir, memory_keep)
        self.last_error = ""
        self.bytes_read = 0
        self._told = set()  # steps already named as skipped
        self._attempt = None      # agreed by all ranks, here or at the first save
        self._sequence = 0        # saves so far, skipped ones included: equal on every rank
        self._memory_pending = 0  # saves to memory alone not yet agreed on
        self._due = (None, None)  # (step, tier) of the newest due() that said to save
        self._said_no_memory = False
        self._memory_everywhere = None  # every rank's node keeps memory copies (agreed with the attempt)
        try:
            self.schedule = SaveSchedule(save_every, self.rank, self._schedule_from_rank0, _core.checkpoint_plan_ms,
                                         self._persist_times, bool(self.memory_dir))
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        if dist is not None:
            self._agreed_attempt()

    def due(self, step):
        """Whether to save after `step`: the same answer on every rank. Call it
        on every rank at every step (it measures the step time and, with
        save_every="auto", agrees the interval with the other ranks at its
        third call and at every save)."""
        self._settle()
        try:
            tier = self.schedule.due(int(step))
        except ValueError as e:
            raise CheckpointError(str(e)) from None
        if tier:
            tier = tier if tier in ("memory", "storage") else "storage"
            self._due = (int(step), tier)
        return tier

    def _persist_times(self):
        stats = self._engine.stats()
        return stats["last_persist_s"], stats["last_memory_persist_s"]

    def _schedule_from_rank0(self, values):
        return self._from_rank0(values, "save_every=\"auto\" with %d ranks needs torch.distributed to be "
                                        "initialized before due() is called: the ranks agree on the interval "
                                        "through it" % self.world_size)

    def _from_rank0(self, values, needs):
        """Rank 0's whole numbers (a tuple), on every rank of the job; `needs`
        is the error when torch.distributed is not there to agree through."""
        values = tuple(int(v) for v in values)
        if self.world_size == 1:
            return values
        if _dist() is None:
            raise CheckpointError(needs)
        import torch

        t = torch.tensor(values, dtype=torch.int64, device=_collective_device())
        _dist().broadcast(t, src=0)
        return tuple(int(v) for v in t.tolist())

    def _settle(self):
        """Commits the saves to memory alone every rank wrote, and drops the
        others: a collective, at the same point on every rank (the next due,
        save or wait after such a save)."""
        if not self._memory_pending:
            return
        self._memory_pending = 0
        settled = self._engine.settle_memory()  # waits for the one being written
        everywhere = [1 if ok else 0 for (_, _, _, ok) in settled]
        why = "not every rank wrote it"
        if self.world_size > 1 and settled and _dist() is None:
            why = "torch.distributed was shut down before the ranks agreed on it"
            # The process group is gone (destroyed before wait()): nothing to
            # agree through, so no rank may count these saves.
            everywhere = [0] * len(settled)
        elif self.world_size > 1:
            everywhere = _reduced(everywhere)
        for (step, attempt, sequence, _), every in zip(settled, everywhere):
            err = self._engine.commit_memory(step, attempt, sequence, bool(every))
            if err:
                self.last_error = err
            if not every and self.rank == 0:
                print("trainguard: checkpoint of step %d to node memory dropped: %s" % (step, why),
                      file=sys.stderr, flush=True)

    # ---- saving --------------------------------------------------------

    def save(self, step, state, tier=None):
        """Phase 1: snapshot `state` into host memory; returns False if the save
        was skipped because the previous one is still persisting (overflow="skip").
        `tier`: "storage" or "memory" (node memory alone); None: the tier
        due() named for this step, else storage. Without node memory copies
        (not under trainguard, or --memory-checkpoints 0) every save goes to
        storage."""
        if tier not in (None, "memory", "storage"):
            raise CheckpointError("tier=%r: \"memory\", \"storage\" or None" % (tier,))
        if tier is None:
            tier = self._due[1] if self._due[0] == int(step) else "storage"
        attempt = self._agreed_attempt()  # with it, whether every rank's node keeps memory copies
        if tier == "memory" and not self._memory_everywhere:
            # Every rank takes the same tier, or their agreements would not match.
            if not self._said_no_memory and self.rank == 0:
                self._said_no_memory = True
                print("trainguard: %s keeps no memory copies of checkpoints: saves to node memory go to storage"
                      % ("this node" if not self.memory_dir else "another rank's node"), file=sys.stderr, flush=True)
            tier = "storage"
        self._settle()
        flat = []
        skeleton = _flatten(state, "", flat)
        keep = []   # the tensors whose memory is read until save() returns
        specs = []
        devices = []
        for name, t in flat:
            t = t.detach()
            if not t.is_contiguous():
                t = t.contiguous()
            keep.append(t)
            if t.is_cuda and t.device not in devices:
                devices.append(t.device)
            specs.append((name, _dtype_name(t), list(t.shape), t.data_ptr(),
                          t.numel() * t.element_size(), t.is_cuda))
        blob = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
        sequence = self._sequence
        self._sequence += 1
        # The snapshot of CUDA tensors waits for the work queued on the
        # current stream (the values the training loop sees), not for all of
        # the GPU; tensors on further devices are waited for here.
        stream = 0
        if devices:
            import torch

            stream = torch.cuda.current_stream(devices[0]).cuda_stream
            for d in devices[1:]:
                torch.cuda.current_stream(d).synchronize()
        memory_only = tier == "memory"
        done = self._engine.save(int(step), self.rank, self.world_size, self.group, specs, blob,
                                 attempt, sequence, stream, memory_only)
        if memory_only:
            self._memory_pending += 1
        self.schedule.saved(int(step), tier)
        return done

    def _agreed_attempt(self):
        """A nonce naming this run of the job, the same on every rank: rank 0
        draws it and broadcasts it when the Checkpointer is made (or, if
        torch.distributed was not initialized then, on the first save)."""
        if self._attempt is not None:
            return self._attempt
        nonce, = self._from_rank0((int.from_bytes(os.urandom(8), "little") >> 1,),
                                  "a checkpoint of %d ranks needs torch.distributed to be initialized before "
                                  "the first save: the ranks agree on the save's identity through it"
                                  % self.world_size)
        self._attempt = "%016x" % nonce
        # Saves to memory alone only where every rank's node keeps memory
        # copies (an agent that could not make its store has none).
        self._memory_everywhere = bool(_reduced([1 if self.memory_dir else 0])[0])
        self.schedule.memory_tier = self._memory_everywhere
        return self._attempt

    def wait(self):
        """Waits until every save is durable and committed (or abandoned).
        Returns True if all went well; else False, with the reason in
        `last_error` and on stderr. Training may go on either way. A
        collective where saves to memory alone await their agreement: every
        rank calls it."""
        self._settle()
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
        """Complete steps (committed, every part present), newest first."""
        try:
            return [c["step"] for c in _core.list_checkpoints(self.directory) if c["complete"]]
        except RuntimeError:
            return []

    def load_latest(self):
        """Restores the newest checkpoint every rank can read and verify, from
        storage or from node memory (saves to memory alone: the node's own
        copy, or one fetched from its peer). Returns (step, state), or None if
        there is none. A step that is corrupt or unreadable on any rank, or
        that some rank's node memory does not hold, is skipped, with a
        warning naming the problem, in favour of the one before it; if no
        stored step is usable, CheckpointError says why, rather than letting
        the job silently start again from scratch."""
        _core.mark_startup(3)  # restore marks for the restart's terms (before the first step only)
        try:
            listed = _core.list_checkpoints(self.directory)
        except RuntimeError:
            listed = []
        stored = {c["step"] for c in listed if c["complete"]}
        unusable = [c for c in listed if c["problem"]]
        in_memory = {}  # step -> (attempt, sequence) of its newest save to memory alone
        if self.memory_dir:
            for step, attempt, sequence in _core.memory_saves(self.memory_dir, self.rank):
                in_memory.setdefault(step, (attempt, sequence))
        # After replicas diverged or a NaN (docs/sdc.md) the controller allows
        # no checkpoint saved after the last good step: it may hold corrupt state.
        at_most = os.environ.get("TRAINGUARD_RESUME_AT_MOST", "")
        if at_most.lstrip("-").isdigit() and int(at_most) >= 0:
            newer = sorted(s for s in stored | set(in_memory) if s > int(at_most))
            why = os.environ.get("TRAINGUARD_RESUME_AT_MOST_WHY", "") or \
                "the last at which the replicas' parameters agreed"
            if newer and self.rank == 0:
                print("trainguard: checkpoint(s) of step %s skipped: saved after step %d, %s"
                      % (", ".join(str(s) for s in newer), int(at_most), why), file=sys.stderr, flush=True)
            stored = {s for s in stored if s <= int(at_most)}
            in_memory = {s: v for s, v in in_memory.items() if s <= int(at_most)}
        if not stored and not in_memory and unusable:
            raise CheckpointError("%s holds no usable checkpoint, but %d step(s) with a commit "
                                  "that cannot be used (%s); refusing to start from scratch"
                                  % (self.directory, len(unusable), unusable[0]["problem"]))
        candidates = stored | set(in_memory)
        reasons = []
        tried_stored = 0
        while True:
            step = self._newest_everywhere(candidates)
            if step is None:
                break
            candidates.discard(step)
            self._say_skipped(unusable, step)
            if self._on_every_rank(step in stored):
                tried_stored += 1
                state = self._try_load(step)
            else:
                state = self._try_load(step, memory_save=in_memory.get(step, ()))
            if state is not None:
                _core.mark_startup(4)
                _core.resumed_from(step)
                self.schedule.restored(step)
                from . import _autoinstrument

                _autoinstrument.resumed_at(step)
                return step, state
            reasons.append("step %d: %s" % (step, self.last_error))
        if tried_stored:
            raise CheckpointError("none of the %d complete checkpoints in %s is usable (%s)"
                                  % (tried_stored, self.directory, "; ".join(reasons)))
        if reasons and self.rank == 0:
            print("trainguard: no checkpoint to restore: storage holds none, and no save to node memory is "
                  "whole on every rank (%s)" % "; ".join(reasons), file=sys.stderr, flush=True)
        return None

    def _newest_everywhere(self, candidates):
        """The newest of every rank's candidate steps (each rank has its own
        memory), or None when no rank has one left."""
        newest = _reduced([max(candidates, default=-1)], largest=True)[0]
        return None if newest < 0 else newest

    def _on_every_rank(self, flag):
        return bool(_reduced([1 if flag else 0])[0])

    def _say_skipped(self, unusable, loading):
        """Every checkpoint newer than the one about to be loaded that is not
        complete (a missing manifest, a truncated or missing data file) is
        named with its reason, once per job (rank 0), on stderr, where the
        agent's scan records it as an event."""
        if self.rank != 0:
            return
        for c in unusable:
            if c["step"] > loading and c["step"] not in self._told:
                self._told.add(c["step"])
                print("trainguard: checkpoint of step %d skipped: %s: %s" % (
                    c["step"], c["path"], c["problem"]), file=sys.stderr, flush=True)

    def load(self, step):
        """Restores exactly `step`; raises CheckpointError if it is unusable."""
        state = self._try_load(int(step), quiet=False)
        if state is None:
            raise CheckpointError("checkpoint of step %d is unusable: %s" % (step, self.last_error))
        return state

    def _agree(self, ok, key):
        """True if every rank read its part without error, and all of them
        from the same save (`key`)."""
        dist = _dist()
        if dist is None or self.world_size == 1:
            return ok
        import torch

        v = torch.tensor([1 if ok else 0, key, -key], dtype=torch.int64, device=_collective_device())
        dist.all_reduce(v, op=dist.ReduceOp.MIN)
        lowest, highest = int(v[1].item()), -int(v[2].item())
        if int(v[0].item()) == 1 and lowest != highest:
            self.last_error = "the ranks read different saves of this step (re-saved meanwhile)"
            return False
        return bool(v[0].item())

    def _fits(self, manifest):
        if manifest["world_size"] != self.world_size or manifest["replica_group"] != self.group:
            raise CheckpointError(
                "saved by %d ranks in replica group %s; this job has %d ranks in %s"
                % (manifest["world_size"], manifest["replica_group"], self.world_size, self.group))

    def _try_load(self, step, quiet=True, memory_save=None):
        """This rank's part of `step` from storage (its memory copy where it
        verifies), or with `memory_save` ((attempt, sequence), () for none
        here) from the save to memory alone; then the ranks agree and the
        state is assembled."""
        import torch

        reason = ""
        local = manifest = None
        key = 0
        try:
            if memory_save is not None:
                manifest, local = self._from_memory_save(step, memory_save)
                size = manifest["hi"] - manifest["lo"]
            else:
                manifest = _core.read_manifest(self.directory, step, self.rank)
                self._fits(manifest)
                size = manifest["hi"] - manifest["lo"]
                local = self._from_memory(step, manifest, size)
                if local is None:
                    local = torch.empty(max(size, 1), dtype=torch.uint8)
                    _core.read_stored_range(self.directory, step, self.rank, manifest["attempt"],
                                            manifest["sequence"], local.data_ptr(), size, self.read_threads)
                    self.last_source = "storage"
            key = _save_key(manifest["attempt"], manifest["sequence"])
            self.bytes_read += size
        except (RuntimeError, CheckpointError) as e:
            reason = str(e)
        self.last_error = ""
        ok = self._agree(not reason, key)
        if not ok:
            self.last_error = reason or self.last_error or "unusable on another rank"
            msg = "checkpoint of step %d unusable on rank %d: %s" % (step, self.rank, self.last_error)
            if not reason:
                msg = "checkpoint of step %d: %s" % (step, self.last_error)
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

    def _from_memory_save(self, step, save):
        """(manifest, this rank's range) of a save to memory alone, mapped and
        verified against its own commit and manifest."""
        import torch

        if not save:
            raise CheckpointError("this node's memory holds no save of step %d of rank %d (a node that is "
                                  "new, and whose peer's copy was not fetched)" % (step, self.rank))
        manifest, mapped, problem = _core.map_memory_save(self.memory_dir, step, self.rank, save[0], save[1],
                                                          self.read_threads)
        if manifest is None:
            raise CheckpointError("its save to node memory: %s" % problem)
        self._fits(manifest)
        self.last_source = "memory" if not mapped.origin else "peer memory of %s" % mapped.origin
        if len(mapped) == 0:
            return manifest, torch.empty(1, dtype=torch.uint8)
        return manifest, torch.frombuffer(mapped, dtype=torch.uint8)  # keeps the mapping alive

    def _from_memory(self, step, manifest, size):
        """This rank's range from the node's memory copy, mapped (no copy) and
        verified in place against the stored manifest; None (having said
        why, when a copy was there) to read storage instead."""
        if not self.memory_dir or size == 0:
            return None
        import torch

        mapped, problem = _core.map_memory_copy(self.directory, step, self.rank, manifest["attempt"],
                                                manifest["sequence"], self.memory_dir, self.read_threads)
        if mapped is None:
            if problem:
                print("trainguard: checkpoint of step %d: the node's memory copy of rank %d not used: %s; "
                      "read from storage" % (step, self.rank, problem), file=sys.stderr, flush=True)
            return None
        self.last_source = "memory" if not mapped.origin else "peer memory of %s" % mapped.origin
        return torch.frombuffer(mapped, dtype=torch.uint8)  # keeps the mapping alive

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
        device = _collective_device(self.process_group)
        sizes = torch.tensor([manifest["hi"] - manifest["lo"]], dtype=torch.int64, device=device)
        dist.all_reduce(sizes, op=dist.ReduceOp.MAX, group=self.process_group)
        chunk = max(int(sizes.item()), 1)
        padded = torch.zeros(chunk, dtype=torch.uint8, device=device)
        n = manifest["hi"] - manifest["lo"]
        padded[:n] = local[:n].to(device)
        full = torch.empty(chunk * len(group), dtype=torch.uint8, device=device)
        parts = list(full.split(chunk))
        dist.all_gather(parts, padded, group=self.process_group)
        return full[:total].cpu()
