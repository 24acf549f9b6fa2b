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
_replaced = []  # warm start: (module dict before its hooks, the module), see _propagate


def record_imports():
    """At the first step: the modules this rank imported, in order, for the
    agent's warm standby of the next start (docs/restart.md). The script's
    own modules are left out: a standby never imports what the user edits."""
    path = os.environ.get("TRAINGUARD_IMPORTS_FILE")
    if not path or _state.get("imports_recorded"):
        return
    _state["imports_recorded"] = True
    try:
        from trainguard import _standby

        own = _standby.own_directories(sys.argv[0] if sys.argv else "")
        names = [name for name, module in list(sys.modules.items())
                 if not _standby.is_own_module(module, own)]
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "w") as f:
            f.write("\n".join(names) + "\n")
        os.replace(tmp, path)
    except Exception as e:  # a standby is a bonus; the rank goes on
        print("trainguard: no warm standby: cannot record the imports: %r" % (e,), file=sys.stderr)


def _on_optimizer_step(optimizer):
    import trainguard

    counted = _state["optimizer"]
    if counted is None or counted() is None:
        _state["optimizer"] = weakref.ref(optimizer)
    elif counted() is not optimizer:
        return
    _state["count"] += 1
    if not trainguard._explicit_steps:  # a script that calls trainguard.step() counts its own
        trainguard._core.automatic_step(_state["count"] - 1)
        if _state["count"] == 1:
            record_imports()
        trainguard._phases.poll_device()
    _guarded(_fingerprint_after, optimizer, completed_step())


def resumed_at(step):
    """The script loaded the checkpoint of `step` (trainguard.Checkpointer or
    a recognised torch.load): the automatic count goes on after it."""
    import trainguard

    if not trainguard._explicit_steps:
        _state["count"] = step + 1


def completed_step():
    """The step the optimizer step that just returned completed, as the
    status page numbers steps: the script's own (trainguard.step(n)) where
    it reports them, else the automatic count's (from 0)."""
    import trainguard

    if trainguard._explicit_steps:
        return trainguard._step_counter + 1  # the script reports it after the optimizer step
    return _state["count"] - 1


def pending_step():
    """The step being computed (its optimizer has not stepped yet)."""
    import trainguard

    if trainguard._explicit_steps:
        return trainguard._step_counter + 1
    return _state["count"]


def sentinel():
    s = _state.get("sentinel")
    if s is None:
        import trainguard
        from trainguard import _numeric

        s = _state["sentinel"] = _numeric.Sentinel(trainguard._core, pending_step)
    return s


def _fingerprint_after(optimizer, step):
    fp = _state.get("fingerprinter")
    if fp is None:
        import trainguard
        from trainguard import _fingerprint

        fp = _state["fingerprinter"] = _fingerprint.Fingerprinter(trainguard._core)
    fp.after_step(optimizer, step)


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
        module = sys.modules[name]
        _replaced.append((dict(vars(module)), module))
        _guarded(callback, module)
        return
    _finder.callbacks.setdefault(name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _propagate():
    """A warm standby imported torch before the hooks went in, so names
    that modules copied from a hooked one (`from .distributed_c10d import
    *`) still hold torch's own functions: give them the hooked ones, as a
    cold start, where the hooks precede every import, has them."""
    swap = {}
    for before, module in _replaced:
        for key, value in vars(module).items():
            old = before.get(key)
            if old is not None and old is not value and callable(old):
                swap[id(old)] = (old, value)
    _replaced.clear()
    if not swap:
        return
    for name, module in list(sys.modules.items()):
        if name == "trainguard" or name.startswith("trainguard."):
            continue  # it keeps torch's own functions to call them
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            hit = swap.get(id(value))
            if hit is not None and hit[0] is value:
                namespace[key] = hit[1]


def _wait_for_store(args, kwargs):
    """env:// rendezvous: rank 0 hosts the TCP store at MASTER_ADDR:MASTER_PORT.
    A rank that asks before it listens is refused and torch retries only a
    second later (measured: 1.0 s of a 1.2 s warm restart), so the others
    wait here, polling every 10 ms, until the store accepts connections."""
    init_method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
    if kwargs.get("store") is not None or init_method not in (None, "env://"):
        return
    rank = kwargs.get("rank", args[4] if len(args) > 4 else -1)
    if rank is None or rank < 0:
        rank = int(os.environ.get("RANK", "0"))
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if rank == 0 or not address or not port:
        return
    import socket
    import time

    deadline = time.monotonic() + 300  # then torch's own wait (and its timeout) takes over
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, int(port)), timeout=1).close()
            return
        except OSError:
            time.sleep(0.01)


def _hook_process_group(c10d):
    """Start-up marks around init_process_group (the restart's process-group term)."""
    import functools
    import trainguard

    original = c10d.init_process_group
    if getattr(original, "_trainguard", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        trainguard._core.mark_startup(1)
        _guarded(_wait_for_store, args, kwargs)
        try:
            return original(*args, **kwargs)
        finally:
            trainguard._core.mark_startup(2)

    init_process_group._trainguard = True
    c10d.init_process_group = init_process_group


def _set_aside_bad_checkpoints():
    """A rollback after silent data corruption or a NaN (docs/sdc.md): the
    script's own torch.save files written after the last good step are moved
    aside before it looks for its newest. Where that leaves it nothing from
    before, it would resume from bad state or silently start over: the rank
    stops instead, saying why."""
    at_most = os.environ.get("TRAINGUARD_RESUME_AT_MOST", "")
    dirs = [d for d in os.environ.get("TRAINGUARD_TORCH_CHECKPOINT_DIRS", "").split("\n") if d]
    if not at_most.isdigit() or not dirs:
        return
    from trainguard import _torch_checkpoints

    def say(line):
        print(line, file=sys.stderr, flush=True)

    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    moved, good, unknown, aside = _torch_checkpoints.set_aside(int(at_most), dirs, generation, say)
    if aside and good == 0:
        if os.environ.get("RANK", "0") != "0":
            import time

            time.sleep(5)  # rank 0, which sees the same files where storage is shared, says it first
        say("trainguard: refusing to resume: every torch.save checkpoint in %s was saved after step %s, "
            "the last good one, and none from before it is left (they are kept in %s); restore a good one "
            "by hand or start over deliberately" % (", ".join(dirs), at_most, _torch_checkpoints.SET_ASIDE))
        os._exit(3)


def install(warm=False):
    """Called by sitecustomize in every Python rank trainguard launches, and
    by a warm standby when it becomes a rank (`warm`: torch and the rest may
    be imported already)."""
    if os.environ.get("TRAINGUARD_INSTRUMENT", "1") == "0":
        return
    if not os.environ.get("TRAINGUARD_STATUS_PAGE"):
        return  # not launched by a trainguard agent
    import trainguard

    if not trainguard.init():
        return
    trainguard._core.mark_startup(0)
    from trainguard import _comm_journal, _numeric, _phases, _torch_checkpoints

    _guarded(_phases.hook_gc)
    _guarded(_set_aside_bad_checkpoints)

    _after_import("torch.optim.optimizer", _hook_optimizer)
    _after_import("torch.optim.optimizer", _phases.hook_optimizer)
    _after_import("torch", _torch_checkpoints.hook_torch)
    _after_import("torch", lambda torch: _numeric.hook_torch(torch, sentinel))  # inside the backward phase
    _after_import("torch.nn.utils.clip_grad", lambda m: _numeric.hook_clip_grad(m, sentinel))
    _after_import("torch", _phases.hook_torch)  # the phase wraps the checkpoint hook
    _after_import("torch.utils.data.dataloader", _phases.hook_dataloader)
    _after_import("torch.distributed.distributed_c10d", _comm_journal.hook_distributed)
    # The journal's DDP hook goes in first, so the phase wraps it.
    _after_import("torch.nn.parallel.distributed", _comm_journal.hook_ddp)
    _after_import("torch.nn.parallel.distributed", _phases.hook_ddp_forward)
    _after_import("torch.distributed.distributed_c10d", _hook_process_group)
    if warm:
        _guarded(_propagate)
