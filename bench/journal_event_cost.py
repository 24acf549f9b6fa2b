"""Where the issue cost of a journaled NCCL all_reduce goes, on a GPU (one
rank): the direct call, the journaled call as shipped, without the device-start
event, with the device events as they were before the cached stream (the old
journal: end event only), without any CUDA event; then the parts (CUDA event
creation, record, current stream, the journal's own entry). Microseconds per
operation: the best of 7 interleaved repeats of 2,000 calls for the calls, of 5
for the parts. Needs the module built with CUDA (TRAINGUARD_PY).

    python3 bench/journal_event_cost.py
"""
import os
import time
import timeit

from one_nccl_rank import start

_core, page = start(29534)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from trainguard import _comm_journal as cj  # noqa: E402

t1 = torch.ones(1, device="cuda")
raw = cj._plain["all_reduce"]


def settle():
    torch.cuda.synchronize()
    deadline = time.time() + 10
    while (cj._pending_events or cj._pending_starts) and time.time() < deadline:
        time.sleep(0.01)


def per_op(fn, n=2000):
    fn()
    best = float("inf")
    for _ in range(5):
        settle()
        best = min(best, timeit.timeit(fn, number=n) / n)
    return best * 1e6


shipped = (cj._watch_device_start, cj._watch_device, cj._device_event, cj._reuse)
old_pool = []


def old_device_event(device=None):
    """The device event before this change: torch.cuda.current_stream() built
    anew by Event.record() for every event, one pool of at most 1,024."""
    with cj._pending_lock:
        event = old_pool.pop() if old_pool else None
    if event is None:
        event = torch.cuda.Event()
    event.record()
    return event


def old_reuse(device, event):
    if len(old_pool) < 1024:
        old_pool.append(event)


def setup(start, end, device_event, reuse):
    def apply():
        cj._watch_device_start, cj._watch_device, cj._device_event, cj._reuse = start, end, device_event, reuse
    return apply


no_start = lambda token, device=None: None  # noqa: E731
no_end = lambda token, device=None: _core.journal_complete(token)  # noqa: E731
variants = [
    ("direct all_reduce", setup(*shipped), lambda: raw(t1)),
    ("journaled, as shipped (start + end events)", setup(*shipped), lambda: dist.all_reduce(t1)),
    ("journaled, end event only", setup(no_start, shipped[1], *shipped[2:]), lambda: dist.all_reduce(t1)),
    ("journaled, start + end, events as before this change", setup(shipped[0], shipped[1], old_device_event, old_reuse),
     lambda: dist.all_reduce(t1)),
    ("journaled, end only, event as before (the old journal)", setup(no_start, shipped[1], old_device_event, old_reuse),
     lambda: dist.all_reduce(t1)),
    ("journaled, no CUDA event (the wrapper alone)", setup(no_start, no_end, *shipped[2:]), lambda: dist.all_reduce(t1)),
]
best = [float("inf")] * len(variants)
for _ in range(7):  # interleaved, so that drift of the machine touches every variant alike
    for i, (_, apply, fn) in enumerate(variants):
        apply()
        fn()
        settle()
        best[i] = min(best[i], timeit.timeit(fn, number=2000) / 2000 * 1e6)
setup(*shipped)()
rows = [(name, us) for (name, _, _), us in zip(variants, best)]
ev = torch.cuda.Event()
ev.record()
s = torch.cuda.current_stream()
slot = cj._slot(dist.distributed_c10d, None)
rows += [("  torch.cuda.Event()", per_op(torch.cuda.Event)),
         ("  event.record()", per_op(ev.record)),
         ("  torch.cuda.current_stream()", per_op(torch.cuda.current_stream)),
         ("  event.record(stream)", per_op(lambda: ev.record(s))),
         ("  torch._C._cuda_getCurrentStream(0)", per_op(lambda: torch._C._cuda_getCurrentStream(0))),
         ("  event.query()", per_op(ev.query)),
         ("  cached stream (_current_stream)", per_op(lambda: cj._current_stream(0))),
         ("  pooled _device_event(0)", per_op(lambda: cj._reuse(0, cj._device_event(0)))),
         ("  journal_issue + journal_complete", per_op(
             lambda: _core.journal_complete(_core.journal_issue(slot, 1, 1, 1, -1, True)))),
         ("  _slot + _describe", per_op(lambda: (cj._slot(dist.distributed_c10d, None), cj._describe(t1))))]
print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), torch.cuda.get_device_name())
for name, us in rows:
    print("%-58s %8.2f us" % (name, us))
dist.destroy_process_group()
os.unlink(page)
