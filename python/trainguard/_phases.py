"""Phases a rank is in, marked without the script's help: "data" (waiting
for the DataLoader), "forward" (a DDP model's forward), "backward",
"optimizer" and "checkpoint save" (torch.save). Outside them the phase is
whatever it was before (usually none). The agent reports the phase and how
long the rank has been in it; a hang report says "rank 3 was in backward for
41 s".
"""

import threading

_local = threading.local()  # .phase: the phase this thread set last
_core = None


def _set(name):
    _local.phase = name
    _core.set_phase(name)


def phased(name, fn):
    """`fn`, running in phase `name`; the previous phase comes back after."""

    def wrapper(*args, **kwargs):
        previous = getattr(_local, "phase", "")
        if previous == name:
            return fn(*args, **kwargs)
        _set(name)
        try:
            return fn(*args, **kwargs)
        finally:
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
