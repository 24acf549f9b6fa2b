"""Automatic instrumentation of ranks that trainguard launches, for scripts
that never import trainguard (the `sitecustomize` beside this package calls
`install()` in every Python rank).

What it does, without touching the script:
- attaches to the rank's status page and registers the stack-dump handler
  (as `trainguard.init()` does);
- keeps the journal of communication operations (_comm_journal), marks
  phases (_phases) and recognises the script's own torch.save checkpoints
  (_torch_checkpoints);
- counts training steps: each `step()` of the job's optimizer is one step
  (the first optimizer that steps; with several, e.g. a GAN's, the others are
  not counted twice). torch >= 2.0: the global optimizer step post-hook;
  torch 1.13: `Optimizer._optimizer_step_code`, which every optimizer's
  `step()` calls when it returns. An explicit `trainguard.step()` in the
  script takes precedence: from its first call the counter stops writing.

torch is never imported here: the hooks go in when the script imports
`torch.optim.optimizer`. Nothing here may break the training process: every
failure leaves the rank uninstrumented, with one line on stderr.
"""

import importlib.abc
import importlib.machinery
import os
import sys
import weakref

_state = {"optimizer": None, "count": 0}


def _on_optimizer_step(optimizer):
    import trainguard

    if trainguard._explicit_steps:
        return
    counted = _state["optimizer"]
    if counted is None or counted() is None:
        _state["optimizer"] = weakref.ref(optimizer)
    elif counted() is not optimizer:
        return
    _state["count"] += 1
    trainguard._core.step(_state["count"] - 1)
    trainguard._phases.poll_device()


def _hook_optimizer(module):
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is not None:  # torch >= 2.0
        register(lambda optimizer, args, kwargs: _on_optimizer_step(optimizer))
        return
    base = module.Optimizer  # torch 1.13: called by every step() wrapper on return
    original = base._optimizer_step_code

    def _optimizer_step_code(self):
        _on_optimizer_step(self)
        return original(self)

    base._optimizer_step_code = _optimizer_step_code


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs the callbacks registered for a module right after it is executed,
    in the order they were registered."""

    def __init__(self):
        self.callbacks = {}  # module name -> [callback]

    def find_spec(self, fullname, path, target=None):
        callbacks = self.callbacks.pop(fullname, None)
        if callbacks is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                for callback in callbacks:
                    _guarded(callback, module)

            def __getattr__(self, name):  # get_source, get_filename, ... as before
                return getattr(loader, name)

        spec.loader = _Loader()
        return spec


_finder = _AfterImport()


def _guarded(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # the training process comes first
        print("trainguard: automatic instrumentation disabled: %r" % (e,), file=sys.stderr)


def _after_import(name, callback):
    if name in sys.modules:
        _guarded(callback, sys.modules[name])
        return
    _finder.callbacks.setdefault(name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def install():
    """Called by sitecustomize in every Python rank trainguard launches."""
    if os.environ.get("TRAINGUARD_INSTRUMENT", "1") == "0":
        return
    if not os.environ.get("TRAINGUARD_STATUS_PAGE"):
        return  # not launched by a trainguard agent
    import trainguard

    if not trainguard.init():
        return
    from trainguard import _comm_journal, _phases, _torch_checkpoints

    _guarded(_phases.hook_gc)

    _after_import("torch.optim.optimizer", _hook_optimizer)
    _after_import("torch.optim.optimizer", _phases.hook_optimizer)
    _after_import("torch", _torch_checkpoints.hook_torch)
    _after_import("torch", _phases.hook_torch)  # the phase wraps the checkpoint hook
    _after_import("torch.utils.data.dataloader", _phases.hook_dataloader)
    _after_import("torch.distributed.distributed_c10d", _comm_journal.hook_distributed)
    # The journal's DDP hook goes in first, so the phase wraps it.
    _after_import("torch.nn.parallel.distributed", _comm_journal.hook_ddp)
    _after_import("torch.nn.parallel.distributed", _phases.hook_ddp_forward)
