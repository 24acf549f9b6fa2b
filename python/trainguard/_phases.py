"""Phases a rank is in, marked without the script's help: "data" (waiting
for the DataLoader), "forward" (a DDP model's forward), "backward",
"optimizer", "checkpoint save" (torch.save) and "gc" (a full collection of
Python's garbage collector, generation 2). Outside them the phase is whatever it was before
(usually none). The agent reports the phase and how long the rank has been
in it; a hang report says "rank 3 was in backward for 41 s".

Every phase is also timed (the client writes each interval into the status
page's timing ring; docs/status_page.md). When the rank uses CUDA, the
forward, backward and optimizer phases are timed on the device too, with
CUDA events recorded on the current stream and read back when they are done
(`Event.query()`, never a synchronisation): see DeviceTimer.
"""

import collections
import gc
import os
import threading

_local = threading.local()  # .phase: the phase this thread set last
_core = None
_device_timer = None  # a DeviceTimer once CUDA is in use


def _set(name):
    _local.phase = name
    _core.set_phase(name)


def current():
    return getattr(_local, "phase", "")


class DeviceTimer:
    """Device time of phases from pairs of CUDA events. `begin` records an
    event on the current stream; `end` records the closing one and queues
    the pair; `poll` (each step, and after each `end`) takes the pairs whose
    closing event has completed, in order, and records their elapsed time.
    Events are reused, so the steady state allocates nothing; at most
    `max_pending` pairs wait (more are not timed, and counted in
    `skipped`)."""

    def __init__(self, torch, core, max_pending=256):
        self._torch = torch
        self._core = core
        self._pending = collections.deque()
        self._free = []
        self._max_pending = max_pending
        self.skipped = 0

    def _event(self):
        if self._free:
            return self._free.pop()
        return self._torch.cuda.Event(enable_timing=True)

    def begin(self, name):
        if len(self._pending) >= self._max_pending:
            self.poll()
            if len(self._pending) >= self._max_pending:
                self.skipped += 1
                return None
        event = self._event()
        event.record()
        return (name, event, self._core.monotonic_ns(), self._core.last_step())

    def end(self, token):
        if token is None:
            return
        event = self._event()
        event.record()
        self._pending.append((token, event))
        self.poll()

    def poll(self):
        while self._pending and self._pending[0][1].query():
            (name, start, start_ns, after_step), end = self._pending.popleft()
            millis = start.elapsed_time(end)
            self._core.record_device_time(name, start_ns, int(millis * 1e6), after_step)
            self._free.append(start)
            self._free.append(end)


def _device_timer_now():
    """The DeviceTimer, once the rank has initialised CUDA itself (trainguard
    never initialises it)."""
    global _device_timer
    if _device_timer is not None or os.environ.get("TRAINGUARD_CUDA_TIMERS", "1") == "0":
        return _device_timer
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        _device_timer = DeviceTimer(torch, _core)
    return _device_timer


_DEVICE_TIMED = ("forward", "backward", "optimizer")


def poll_device():
    """Each step: record the device times that are ready."""
    if _device_timer is not None:
        _device_timer.poll()


def _on_gc(stage, info):
    # Full collections only: young-generation ones (hundreds a step in a loop
    # that allocates) take microseconds each and would flood the timing ring;
    # they stay inside the phase they interrupt.
    if info.get("generation") != 2:
        return
    try:
        if stage == "start":
            _local.before_gc = current()
            _set("gc")
        else:
            _set(getattr(_local, "before_gc", ""))
    except Exception:  # at interpreter exit the module may be half torn down
        pass


def hook_gc():
    """Python's garbage-collection pauses become phase "gc"."""
    global _core
    import trainguard

    _core = trainguard._core
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


def phased(name, fn):
    """`fn`, running in phase `name`; the previous phase comes back after."""

    def wrapper(*args, **kwargs):
        previous = getattr(_local, "phase", "")
        if previous == name:
            return fn(*args, **kwargs)
        _set(name)
        device = _device_timer_now() if name in _DEVICE_TIMED else None
        token = device.begin(name) if device is not None else None
        try:
            return fn(*args, **kwargs)
        finally:
            if token is not None:
                device.end(token)
            _set(previous)

    wrapper.__wrapped__ = fn
    for attr in ("__name__", "__qualname__", "__doc__", "__module__"):
        try:
            setattr(wrapper, attr, getattr(fn, attr))
        except (AttributeError, TypeError):
            pass
    wrapper._trainguard_phase = name
    return wrapper


def _replace(owner, attr, name):
    fn = getattr(owner, attr, None)
    if fn is not None and not getattr(fn, "_trainguard_phase", None):
        setattr(owner, attr, phased(name, fn))


def hook_torch(torch):
    """After `import torch`: backward and torch.save."""
    global _core
    import trainguard

    _core = trainguard._core
    _replace(torch.autograd, "backward", "backward")
    _replace(torch, "save", "checkpoint save")


def hook_dataloader(module):
    _replace(module._BaseDataLoaderIter, "__next__", "data")


def hook_ddp_forward(module):
    _replace(module.DistributedDataParallel, "forward", "forward")


def hook_optimizer(module):
    """Each optimizer's step() runs in phase "optimizer"."""
    if hasattr(module, "register_optimizer_step_pre_hook"):  # torch >= 2.0
        module.register_optimizer_step_pre_hook(lambda opt, args, kwargs: _set("optimizer"))
        module.register_optimizer_step_post_hook(lambda opt, args, kwargs: _set(""))
        return
    base = module.Optimizer  # torch 1.13: wraps each class's step() once, in __init__
    original = base._hook_for_profile

    def _hook_for_profile(self):
        original(self)
        cls = self.__class__
        if not getattr(cls.step, "_trainguard_phase", None):
            step = phased("optimizer", cls.step)
            step.hooked = True
            cls.step = step

    base._hook_for_profile = _hook_for_profile
