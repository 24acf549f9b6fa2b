"""The journal of communication operations, written without the script's help.

Every collective and point-to-point call of `torch.distributed` goes into the
rank's status page (docs/status_page.md): its process group (an id that is
the same on every rank, and the group's members), a sequence number per group
(per peer and direction for send/recv), the operation, element count and
dtype, when it was issued and when it completed. The agent reads the journal
of a hung rank from outside, so the controller can tell which rank the others
wait for.

How operations are seen:
- the public functions of `torch.distributed` (all_reduce, broadcast, send,
  isend, barrier, ...) are wrapped in `distributed_c10d` as soon as it is
  imported, before `torch.distributed` copies them into its namespace, so
  `dist.all_reduce`, `from torch.distributed import all_reduce` and torch's
  own helpers (all_gather_object, ...) all call the wrapper;
- DDP reduces gradient buckets from C++, past those functions. Every DDP model
  gets, at its first forward, a communication hook that does what DDP does
  without one (torch's own `allreduce_hook` arithmetic: average over the
  model's process group) and journals each bucket's all_reduce like any other,
  on gloo and NCCL alike, on torch 1.13 and 2.x (ddp_allreduce_hook). A hook the
  script registers itself, before or after, is used instead of the default one;
  DDP's built-in hooks are replaced by their Python equivalents.

Completion: a blocking call on CPU tensors is complete when it returns. An
asynchronous call completes with its future (or, where the backend has none,
when the script waits on it). On CUDA tensors a call returns once it is
queued, so completion is a CUDA event recorded behind it, polled by a daemon
thread: an operation stuck on the GPU stays in flight in the journal.

Start on the device: for CUDA tensors a second pooled event is recorded on
the current stream just before the call. Once it has run, the device has
done everything the script queued before the operation, and the journal
marks the operation started (`journal_started`). A rank whose operation was
issued but never started is stuck before the collective (its GPU busy or
hung): the hang locator blames it, not the peers that wait inside.
(PyTorch's Flight Recorder calls an NCCL operation started when an event on
NCCL's own stream, just before the kernel, has run; ours is on the caller's
stream, so it also covers gloo with CUDA tensors, and an operation queued
behind another collective on NCCL's stream counts as started here.)
"""

import collections
import os
import sys
import threading
import weakref

_core = None
_ALL_REDUCE = 1
_tls = threading.local()   # .depth: > 0 inside a journaled call (inner calls are not journaled)
_slots = {}                # id(process group) -> (weak reference, journal slot; -1: not journaled)
_op_codes = {}
_dtype_codes = {}
_pending = []              # (token, done()) for asynchronous operations without a future
_pending_events = collections.deque()  # (token, CUDA event, device) in the order recorded
_pending_starts = collections.deque()  # (token, CUDA event before the operation, device), in order
_event_pools = {}          # device index (None: the current device) -> CUDA events to reuse
_EVENT_POOL_MAX = 4096     # per device; beyond it, completed events are dropped
_streams = {}              # torch's raw id of a current stream -> its torch.cuda.Stream
_torch = None
_pending_lock = threading.Lock()
_poller = None
_waits = {}                # id(Work) -> (Work, token): completed when waited on


def _dtype_code(tensor):
    dtype = tensor.dtype
    code = _dtype_codes.get(dtype)
    if code is None:
        code = _core.dtype_code(str(dtype).replace("torch.", ""))
        _dtype_codes[dtype] = code
    return code


def _device_of(tensor):
    """The CUDA device index of a tensor, or -1 when it is not on one."""
    return tensor.get_device() if tensor.is_cuda else -1


def _describe(tensor):
    """(numel, dtype code, CUDA device index or -1) of a tensor or a list of them."""
    if tensor is None:
        return 0, 0, -1
    if isinstance(tensor, (list, tuple)):
        if not tensor:
            return 0, 0, -1
        numel = 0
        for t in tensor:
            numel += t.numel()
        return numel, _dtype_code(tensor[0]), _device_of(tensor[0])
    return tensor.numel(), _dtype_code(tensor), _device_of(tensor)


def _group_id(c10d, pg, name):
    """An id every rank gives the same group: 0 for the default group, else a
    hash of torch's name for it (names follow creation order, which every
    rank shares because every rank must call new_group)."""
    if pg is c10d._get_default_group():
        return 0
    import zlib

    return 1 + zlib.crc32(name.encode()) % 0x7FFFFFFE


def _slot(c10d, group):
    if group is None:
        group = c10d.GroupMember.WORLD
        if group is None:
            return -1
    cached = _slots.get(id(group))
    if cached is not None and cached[0]() is group:
        return cached[1]
    if group is c10d.GroupMember.NON_GROUP_MEMBER:
        return -1
    slot = -1
    try:
        members = [int(r) for r in c10d.get_process_group_ranks(group)]
        name = getattr(group, "group_name", None)
        if not isinstance(name, str):
            name = c10d._pg_names.get(group, "") if hasattr(c10d, "_pg_names") else ""
        desc = getattr(group, "group_desc", "")
        label = desc if isinstance(desc, str) and desc and not desc.startswith(("default_pg", "undefined")) else ""
        slot = _core.journal_group(_group_id(c10d, group, name), label or name, members)
    except Exception as e:  # a group torch cannot describe is not journaled
        print("trainguard: process group not journaled: %r" % (e,), file=sys.stderr)
    # The cache must not keep the group alive: a process group that outlives
    # destroy_process_group() is torn down during interpreter exit, where
    # gloo aborts the process ("terminate called without an active exception").
    try:
        ref = weakref.ref(group)
    except TypeError:
        return slot  # not weakly referenceable: not cached
    _slots[id(group)] = (ref, slot)
    return slot


def _start_poller():
    global _poller
    if _poller is None:
        _poller = threading.Thread(target=_poll, name="trainguard-journal", daemon=True)
        _poller.start()


def _watch(token, done):
    """Completes `token` once `done()` is true (a Work without a future)."""
    with _pending_lock:
        _pending.append((token, done))
        _start_poller()


def _current_stream(device):
    """The current CUDA stream of `device` (an index; None: the current
    device). torch.cuda.current_stream() builds a new Stream object each time
    (5 us on an H200, most of a journaled operation's cost); torch's raw id of
    the current stream costs 0.1 us, so the Stream objects are kept by it."""
    raw = getattr(getattr(_torch, "_C", None), "_cuda_getCurrentStream", None) if device is not None else None
    if raw is None:
        return _torch.cuda.current_stream(device)
    key = raw(device)  # (id, device, type) on torch 2, an int on torch 1.13
    stream = _streams.get(key)
    if stream is None:
        stream = _torch.cuda.current_stream(device)
        if len(_streams) < 1024:
            _streams[key] = stream
    return stream


def _device_event(device=None):
    """A CUDA event recorded now on the current stream of `device` (events are
    pooled per device)."""
    global _torch
    if _torch is None:
        import torch as _torch_module

        _torch = _torch_module
    stream = _current_stream(device)
    pool = _event_pools.get(device)
    try:
        event = pool.pop()
    except (AttributeError, IndexError):  # no pool yet, or empty
        event = _torch.cuda.Event()
    try:
        event.record(stream)
    except RuntimeError:  # an event of another device (the current one changed)
        event = _torch.cuda.Event()
        event.record(stream)
    return event


def _reuse(device, event):
    pool = _event_pools.setdefault(device, [])
    if len(pool) < _EVENT_POOL_MAX:
        pool.append(event)


def _watch_device(token, device=None):
    """Completes `token` once the current CUDA stream of `device` has run what
    was queued on it so far."""
    event = _device_event(device)
    with _pending_lock:
        _pending_events.append((token, event, device))
        _start_poller()


def _watch_device_start(token, device=None):
    """Marks `token` started once the current CUDA stream of `device` has run
    what was queued on it before the operation: call just before issuing it.
    Where no event can be recorded, it is marked started now: an operation is
    never left looking stuck before its collective for want of an event."""
    if token < 0:
        return
    try:
        event = _device_event(device)
    except Exception:
        _core.journal_started(token)
        return
    with _pending_lock:
        _pending_starts.append((token, event, device))
        _start_poller()


def _ready_prefix(items):
    """How many of (token, event, device) items, in the order recorded, have
    run: the first one still pending stops the scan (later ones may be on
    another stream and done, but they can wait; nothing is ever marked too
    early)."""
    done = 0
    for token, event, _ in items:
        try:
            if not event.query():
                break
        except Exception:
            pass
        done += 1
    return done


def _poll():
    global _poller
    import time

    while True:
        time.sleep(0.05)
        with _pending_lock:
            if not _pending and not _pending_events and not _pending_starts:
                _poller = None  # the next watch starts another
                return
            waiting = list(_pending)
            events = list(_pending_events)
            starts = list(_pending_starts)
        finished = []
        for item in waiting:
            try:
                if item[1]():
                    finished.append(item)
            except Exception:
                finished.append(item)  # a broken handle is not in flight forever
        done_starts = _ready_prefix(starts)
        done_events = _ready_prefix(events)
        with _pending_lock:
            for _ in range(done_starts):
                token, event, device = _pending_starts.popleft()
                _core.journal_started(token)
                _reuse(device, event)
            for item in finished:
                _core.journal_complete(item[0])
                _pending.remove(item)
            for _ in range(done_events):
                token, event, device = _pending_events.popleft()
                _core.journal_complete(token)
                _reuse(device, event)


def _complete_work(token, work, device):
    """Completes `token` when `work` does (`device`: the CUDA device index of
    its tensors, or -1)."""
    try:
        future = work.get_future()
    except Exception:
        future = None  # gloo's send/recv have none in torch 1.13
    if future is not None:
        def done(fut, token=token):
            if device >= 0:
                _watch_device(token, device)
            else:
                _core.journal_complete(token)
        try:
            future.add_done_callback(done)
            return
        except Exception:
            pass
    if len(_waits) > 4096:  # handles never waited on: forget the oldest
        _waits.pop(next(iter(_waits)))
    _waits[id(work)] = (work, token)
    _watch(token, work.is_completed)


def _journaled(c10d, fn, op, tensor_at, peer_at, group_at, async_at):
    """Wraps `fn`; the tensor, peer, group and async_op arguments are found at
    these positions (-1: none) or by the names torch gives them."""
    code = _core.op_code(op)
    p2p = op in ("send", "recv")
    always_async = fn.__name__ in ("isend", "irecv")

    def wrapper(*args, **kwargs):
        if getattr(_tls, "depth", 0):
            return fn(*args, **kwargs)
        token = -1
        device = -1
        try:
            group = kwargs.get("group") if "group" in kwargs else (
                args[group_at] if 0 <= group_at < len(args) else None)
            slot = _slot(c10d, group)
            if slot >= 0 or p2p:
                tensor = args[tensor_at] if 0 <= tensor_at < len(args) else kwargs.get(
                    _TENSOR_NAMES.get(op, "tensor"))
                numel, dtype, device = _describe(tensor)
                peer = -1
                if p2p:
                    peer = args[peer_at] if 0 <= peer_at < len(args) else kwargs.get(
                        "dst" if op == "send" else "src")
                    group_peer = kwargs.get("group_dst" if op == "send" else "group_src")
                    if peer is None and group_peer is not None:  # torch >= 2.6
                        peer = c10d.get_global_rank(group or c10d.GroupMember.WORLD, group_peer)
                    peer = -1 if peer is None else int(peer)
                token = _core.journal_issue(slot, code, dtype, numel, peer, device >= 0)
                if device >= 0:
                    _watch_device_start(token, device)
        except Exception:
            token = -1  # journaling never stands in the way of the call
        _tls.depth = 1
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            if token >= 0:
                _core.journal_complete(token)  # it is no longer in flight
            raise
        finally:
            _tls.depth = 0
        if token >= 0:
            if result is not None and (always_async or kwargs.get("async_op") or
                                       0 <= async_at < len(args) and args[async_at]):
                _complete_work(token, result, device)
            elif device >= 0:
                _watch_device(token, device)
            else:
                _core.journal_complete(token)
        return result

    wrapper.__wrapped__ = fn
    wrapper.__name__ = fn.__name__
    wrapper.__qualname__ = getattr(fn, "__qualname__", fn.__name__)
    wrapper.__doc__ = fn.__doc__
    wrapper._trainguard = True
    return wrapper


_TENSOR_NAMES = {"all_gather": "tensor", "reduce_scatter": "input", "all_to_all": "input_tensor_list"}

# name: (op, tensor index, peer index, group index, async_op index)
_FUNCTIONS = {
    "all_reduce": ("all_reduce", 0, -1, 2, 3),
    "broadcast": ("broadcast", 0, -1, 2, 3),
    "reduce": ("reduce", 0, -1, 3, 4),
    "all_gather": ("all_gather", 1, -1, 2, 3),
    "all_gather_into_tensor": ("all_gather", 1, -1, 2, 3),
    "_all_gather_base": ("all_gather", 1, -1, 2, 3),
    "reduce_scatter": ("reduce_scatter", 1, -1, 3, 4),
    "reduce_scatter_tensor": ("reduce_scatter", 1, -1, 3, 4),
    "_reduce_scatter_base": ("reduce_scatter", 1, -1, 3, 4),
    "all_to_all_single": ("all_to_all", 1, -1, 4, 5),
    "all_to_all": ("all_to_all", 1, -1, 2, 3),
    "barrier": ("barrier", -1, -1, 0, 1),
    "monitored_barrier": ("barrier", -1, -1, 0, -1),
    "gather": ("gather", 0, -1, 3, 4),
    "scatter": ("scatter", 0, -1, 3, 4),
    "send": ("send", 0, 1, 2, -1),
    "recv": ("recv", 0, 1, 2, -1),
    "isend": ("send", 0, 1, 2, -1),
    "irecv": ("recv", 0, 1, 2, -1),
}


def _patch_work_wait(c10d):
    work_type = getattr(c10d, "Work", None)
    if work_type is None:
        import torch

        work_type = torch._C._distributed_c10d.Work
    original = work_type.wait

    def wait(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        entry = _waits.pop(id(self), None)
        if entry is not None and entry[0] is self:
            _core.journal_complete(entry[1])
        return result

    work_type.wait = wait


def hook_distributed(c10d):
    """Wraps torch.distributed's communication functions (called when
    `torch.distributed.distributed_c10d` has been executed)."""
    global _core, _ALL_REDUCE
    import trainguard

    _core = trainguard._core
    _ALL_REDUCE = _core.op_code("all_reduce")
    for name, (op, tensor_at, peer_at, group_at, async_at) in _FUNCTIONS.items():
        fn = getattr(c10d, name, None)
        if fn is None or getattr(fn, "_trainguard", False):
            continue
        _plain[name] = fn
        setattr(c10d, name, _journaled(c10d, fn, op, tensor_at, peer_at, group_at, async_at))
    try:
        _patch_work_wait(c10d)
    except Exception as e:
        print("trainguard: send/recv handles complete only when polled: %r" % (e,), file=sys.stderr)


_ddp_hooked = weakref.WeakKeyDictionary()  # DDP model -> [hook, state] in use
_plain = {}  # name -> torch's own function, before wrapping


def ddp_allreduce_hook(process_group, bucket):
    """DDP's default reduction (torch's `allreduce_hook`: divide by the group's
    size, then all_reduce), journaled with one future callback instead of two."""
    import torch.distributed.distributed_c10d as c10d

    group = process_group if process_group is not None else c10d.GroupMember.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    token = -1
    device = -1
    try:
        slot = _slot(c10d, group)
        numel, dtype, device = _describe(tensor)
        if slot >= 0:
            token = _core.journal_issue(slot, _ALL_REDUCE, dtype, numel, -1, device >= 0)
            if device >= 0:
                _watch_device_start(token, device)
    except Exception:
        token = -1
    all_reduce = _plain.get("all_reduce", c10d.all_reduce)
    _tls.depth = 1
    try:
        work = all_reduce(tensor, group=group, async_op=True)
    except BaseException:
        if token >= 0:
            _core.journal_complete(token)
        raise
    finally:
        _tls.depth = 0

    def done(fut):
        if token >= 0:
            if device >= 0:
                _watch_device(token, device)
            else:
                _core.journal_complete(token)
        return fut.value()[0]

    return work.get_future().then(done)


def ddp_journal_enabled(torch_version):
    """Whether DDP's buckets are journaled through a comm hook.

    On by default from torch 2.0. Off by default on torch 1.x: there, any
    Python DDP comm hook (torch's own `allreduce_hook` registered by hand
    included) makes a process whose DDP model on gloo is still alive at
    interpreter exit abort ("terminate called without an active exception")
    or hang at 100 % CPU in ~ProcessGroupGloo in about half of the runs of
    a tutorial-style script, measured here on torch 1.13. TRAINGUARD_DDP_JOURNAL=1
    or 0 overrides."""
    chosen = os.environ.get("TRAINGUARD_DDP_JOURNAL", "")
    if chosen in ("0", "1"):
        return chosen == "1"
    try:
        return int(str(torch_version).split(".")[0]) >= 2
    except ValueError:
        return False


def hook_ddp(module):
    """Routes DDP's gradient-bucket reductions through `dist.all_reduce`
    (called when `torch.nn.parallel.distributed` has been executed)."""
    import torch

    if not ddp_journal_enabled(torch.__version__):
        return
    ddp = module.DistributedDataParallel
    original_forward = ddp.forward
    original_register = ddp.register_comm_hook
    original_builtin = getattr(ddp, "_register_builtin_comm_hook", None)

    def default_hooks():
        # Imported late: importing it while torch.nn.parallel loads is circular.
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as hooks

        return hooks

    def dispatch(model_ref, bucket):
        hook, state = _ddp_hooked[model_ref()]
        return hook(state, bucket)

    def install(model, hook, state):
        """Registers the dispatcher once per model; (hook, state) is what it calls."""
        first = model not in _ddp_hooked
        _ddp_hooked[model] = [hook, state]
        if first:
            original_register(model, weakref.ref(model), dispatch)

    def forward(self, *args, **kwargs):
        if self not in _ddp_hooked:
            try:
                install(self, ddp_allreduce_hook, self.process_group)
            except Exception as e:
                _ddp_hooked[self] = None
                print("trainguard: DDP gradient reductions not journaled: %r" % (e,), file=sys.stderr)
        return original_forward(self, *args, **kwargs)

    def register_comm_hook(self, state, hook):
        if self in _ddp_hooked and _ddp_hooked[self] is None:
            return original_register(self, state, hook)
        if hasattr(self, "_check_comm_hook"):
            self._check_comm_hook(hook)
        install(self, hook, state)

    def register_builtin_comm_hook(self, comm_hook_type):
        kind = getattr(comm_hook_type, "name", str(comm_hook_type))
        python_hook = {"ALLREDUCE": ddp_allreduce_hook,
                       "FP16_COMPRESS": default_hooks().fp16_compress_hook}.get(kind.split(".")[-1])
        if python_hook is None or (self in _ddp_hooked and _ddp_hooked[self] is None):
            return original_builtin(self, comm_hook_type)
        install(self, python_hook, self.process_group)

    forward.__wrapped__ = original_forward
    ddp.forward = forward
    register_comm_hook.__doc__ = original_register.__doc__
    ddp.register_comm_hook = register_comm_hook
    if original_builtin is not None:
        ddp._register_builtin_comm_hook = register_builtin_comm_hook
