"""trainguard client for training scripts.

Report progress to the trainguard agent that launched this process::

    import trainguard
    trainguard.init()
    for step in range(start, steps):
        with trainguard.phase("forward"):
            ...
        trainguard.step(step)

Every call is a cheap write into shared memory and never blocks. Without an
agent (the script runs under plain torchrun or python) every call is a no-op.
"""

import contextlib
import faulthandler
import os
import signal

from . import _core

__all__ = ["init", "attached", "step", "phase", "timer", "checkpoint_committed", "add_checkpoint_overhead",
           "checkpoint_plan", "shutdown",
           "Checkpointer", "CheckpointError"]

_STACKS_READY_MARKER = "trainguard-stacks-ready"
_stacks_file = None
_step_counter = -1
_explicit_steps = False   # the script reports steps itself: automatic counting stops
_counts_own_overhead = False  # the script reports its saves' blocking itself: torch.save's is not timed


def init():
    """Attach to the agent. Returns True under trainguard, False otherwise.

    Also registers a faulthandler on SIGUSR1 that dumps the Python stacks of
    all threads into the file the agent reads before it kills a hung rank.
    """
    global _stacks_file
    attached = _core.init()
    path = os.environ.get("TRAINGUARD_STACKS_FILE")
    if attached and path and _stacks_file is None:
        try:
            _stacks_file = open(path, "a", buffering=1)
            faulthandler.register(signal.SIGUSR1, file=_stacks_file, all_threads=True)
            _stacks_file.write("%s pid=%d\n" % (_STACKS_READY_MARKER, os.getpid()))
            _stacks_file.flush()
        except OSError:
            _stacks_file = None  # stacks are a nicety; training goes on
    return attached


def attached():
    return _core.attached()


def checkpoint_plan():
    """The controller's checkpoint plan (docs/checkpoint_policy.md), for
    scripts that save on their own: {"memory_interval_s": ...,
    "storage_interval_s": ...}, seconds between saves to node memory and to
    storage; None with no plan yet or not under trainguard. It changes as
    the job's failures and saves are measured: read it again from time to
    time. trainguard.Checkpointer(save_every="auto") follows it by itself."""
    memory_ms, storage_ms = _core.checkpoint_plan_ms()
    if memory_ms <= 0 and storage_ms <= 0:
        return None
    return {"memory_interval_s": memory_ms / 1000.0, "storage_interval_s": storage_ms / 1000.0}


def step(n=None):
    """Record that step `n` finished (default: one more than the last call)."""
    global _step_counter, _explicit_steps
    if _step_counter == -1 and not _explicit_steps:
        from . import _autoinstrument

        _autoinstrument.record_imports()
    _explicit_steps = True
    _step_counter = _step_counter + 1 if n is None else int(n)
    _core.step(_step_counter)
    from . import _phases

    _phases.poll_device()


@contextlib.contextmanager
def phase(name):
    """Name the phase the training loop is in while the block runs, and time
    it (per step, on every rank; `trainguard heatmap` and `trainguard trace`
    show it). The phase that was set before comes back after the block; a
    phase inside another pauses it, so each interval is counted once."""
    from . import _phases

    previous = _phases.current()
    if _phases._core is None:
        _phases._core = _core
    _phases._set(name)
    try:
        yield
    finally:
        _phases._set(previous)


timer = phase  # `with trainguard.timer("tokenize"):` reads as what it does


def checkpoint_committed(step):
    """Record that the checkpoint of `step` is durable (lost work is counted from it)."""
    _core.checkpoint_committed(int(step))


def add_checkpoint_overhead(seconds):
    """Count `seconds` the training loop spent blocked saving a checkpoint
    (trainguard.Checkpointer does this itself; for torch.save and the like).
    Once per save: each call counts one save. A script that calls it is
    taken to count all its saves, and torch.save is no longer timed for it."""
    global _counts_own_overhead
    _counts_own_overhead = True
    _core.add_checkpoint_overhead(int(seconds * 1e9))


def shutdown():
    _core.shutdown()


from .checkpoint import Checkpointer, CheckpointError  # noqa: E402
