"""Numeric sentinels (docs/sdc.md): the instrumentation watches every rank's
loss and, where the script computes it, the gradient norm, with no change to
the script, and writes the first anomaly of the process to the status page
for the controller, which compares ranks.

- The loss: the scalar that `backward()` is called on (`loss.backward()`,
  `torch.autograd.backward(loss)`); a non-scalar or an explicit gradient is
  not a loss and is left alone.
- The gradient norm: the value `torch.nn.utils.clip_grad_norm_` returns.
- An anomaly: a NaN or an infinity; or a spike, a magnitude above
  TRAINGUARD_SPIKE_FACTOR (default 10, 0: off) times the largest of the
  first TRAINGUARD_SPIKE_WARMUP (default 100) values seen (Megatron's rule).
- Its step: the step the optimizer is about to complete (the same numbering
  as the fingerprints').

A CPU value is read at once. A CUDA value is copied to pinned memory without
a wait and read at the next observation once its event has completed, so the
training stream is never synchronised (an anomaly is then seen a step late
but filed under its own step).
"""

import math
import os

LOSS_NONFINITE, GRAD_NORM_NONFINITE, LOSS_SPIKE, GRAD_NORM_SPIKE = 1, 2, 3, 4


def _env_float(name, default):
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


class Sentinel:
    def __init__(self, core, step_of):
        self.core = core
        self.step_of = step_of  # () -> the step being computed
        self.factor = _env_float("TRAINGUARD_SPIKE_FACTOR", 10.0)
        self.warmup = int(_env_float("TRAINGUARD_SPIKE_WARMUP", 100))
        self.seen = {"loss": 0, "grad_norm": 0}
        self.peak = {"loss": 0.0, "grad_norm": 0.0}
        self.pending = []  # CUDA: (kind, step, host tensor, event)
        self.reported = set()  # the first NaN/Inf and the first spike are reported

    def observe(self, kind, tensor):
        step = self.step_of()
        if tensor.is_cuda:
            import torch

            self._drain()
            host = torch.empty((), dtype=torch.float64, pin_memory=True)
            host.copy_(tensor.detach().reshape(()), non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self.pending.append((kind, step, host, event))
            return
        self._judge(kind, step, float(tensor.detach()))

    def _drain(self):
        while self.pending and self.pending[0][3].query():
            kind, step, host, _ = self.pending.pop(0)
            self._judge(kind, step, float(host))
        del self.pending[:-4]  # never a backlog: a stream this far behind is seen later

    def _judge(self, kind, step, value):
        if kind == "loss":
            self.core.numeric_observed()
        self.seen[kind] += 1
        anomaly = None
        if not math.isfinite(value):
            anomaly = LOSS_NONFINITE if kind == "loss" else GRAD_NORM_NONFINITE
        elif self.seen[kind] <= self.warmup:
            self.peak[kind] = max(self.peak[kind], abs(value))
        elif self.factor > 0 and self.peak[kind] > 0 and abs(value) > self.factor * self.peak[kind]:
            anomaly = LOSS_SPIKE if kind == "loss" else GRAD_NORM_SPIKE
        spike = anomaly in (LOSS_SPIKE, GRAD_NORM_SPIKE)
        if anomaly is not None and spike not in self.reported:
            self.reported.add(spike)  # the first of each: what follows it is its consequence
            self.core.report_numeric(step, anomaly, value)


def _is_loss(tensors, grad_tensors):
    import torch

    if grad_tensors is not None:
        return None
    t = tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else tensors
    if isinstance(t, torch.Tensor) and t.numel() == 1 and t.is_floating_point():
        return t
    return None


def hook_torch(torch, sentinel_of):
    """After `import torch`: observes losses in torch.autograd.backward (which
    Tensor.backward calls) and the norms clip_grad_norm_ returns."""
    import functools

    backward = torch.autograd.backward
    if not getattr(backward, "_trainguard_numeric", False):

        @functools.wraps(backward)
        def observed_backward(tensors, grad_tensors=None, *args, **kwargs):
            loss = _is_loss(tensors, grad_tensors)
            if loss is not None:
                _safely(lambda: sentinel_of().observe("loss", loss))
            return backward(tensors, grad_tensors, *args, **kwargs)

        observed_backward._trainguard_numeric = True
        torch.autograd.backward = observed_backward


def hook_clip_grad(module, sentinel_of):
    """After `import torch.nn.utils.clip_grad`: the gradient norm it returns."""
    import functools

    clip = module.clip_grad_norm_
    if getattr(clip, "_trainguard_numeric", False):
        return

    @functools.wraps(clip)
    def observed_clip(*args, **kwargs):
        norm = clip(*args, **kwargs)
        _safely(lambda: sentinel_of().observe("grad_norm", norm))
        return norm

    observed_clip._trainguard_numeric = True
    module.clip_grad_norm_ = observed_clip
    import sys

    utils = sys.modules.get("torch.nn.utils")
    if utils is not None and getattr(utils, "clip_grad_norm_", None) is clip:
        utils.clip_grad_norm_ = observed_clip


_off = []


def _safely(fn):
    if _off:
        return
    try:
        fn()
    except Exception as e:  # the training process comes first: one line, then off
        import sys

        _off.append(e)
        print("trainguard: numeric sentinel off: %r" % (e,), file=sys.stderr)
