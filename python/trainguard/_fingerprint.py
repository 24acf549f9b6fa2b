"""Fingerprints of a rank's parameters for the controller's replica check
(docs/sdc.md), taken by the instrumentation after optimizer steps, with no
change to the script.

A fingerprint is XXH3 over the raw bytes of every parameter of the optimizer
that counts the steps, in its order: one flipped bit changes it. Parameters
on a GPU are reduced on the device first (a sum of their 32-bit words with
position weights, in int64: a flipped bit changes it) and only that number
comes to the host.

Cadence: after every K-th optimizer step, K a power of two (so ranks that
chose different K still share the multiples of the larger), the smallest
that keeps the fingerprint's cost under TRAINGUARD_FINGERPRINT_BUDGET of the
step time (default 0.005) and fingerprints at least 0.25 s apart (the status
page keeps the newest 16: a heartbeat's worth and more), reached by doubling
(each doubling measured again), lowered in the first 4 fingerprints and
every 64th. TRAINGUARD_FINGERPRINT_EVERY=N fixes K (0: off).
"""

import os
import time

MIN_SPACING_S = 0.25
MAX_EVERY = 1 << 16


def _pow2_at_least(x):
    k = 1
    while k < x and k < MAX_EVERY:
        k <<= 1
    return k


class Fingerprinter:
    def __init__(self, core):
        self.core = core
        fixed = os.environ.get("TRAINGUARD_FINGERPRINT_EVERY", "")
        self.fixed = int(fixed) if fixed.isdigit() else None
        self.budget = float(os.environ.get("TRAINGUARD_FINGERPRINT_BUDGET", "0.005") or 0.005)
        self.every = self.fixed if self.fixed is not None else 1
        # A replay confirming a disagreement (docs/sdc.md) needs this step's fingerprint whatever K is.
        at = os.environ.get("TRAINGUARD_FINGERPRINT_AT", "")
        self.forced = {int(at)} if at.isdigit() else set()
        self.last_step_at = None
        self.step_s = None  # a running mean of the step time
        self.cost_s = None
        self.taken = 0

    def after_step(self, optimizer, step):
        now = time.perf_counter()
        if self.last_step_at is not None:
            dt = now - self.last_step_at
            self.step_s = dt if self.step_s is None else 0.9 * self.step_s + 0.1 * dt
        self.last_step_at = now
        if step not in self.forced and (not self.every or step % self.every):
            return
        t0 = time.perf_counter()
        value = fingerprint(self.core, optimizer)
        self.core.report_fingerprint(step, value)
        cost = time.perf_counter() - t0
        # The least it took: a fingerprint taken while the process was
        # descheduled (a busy node) must not stretch K past the rest of a
        # run (a CI run's 10 ms outlier made K 512 and hid a divergence).
        self.cost_s = cost if self.cost_s is None else min(self.cost_s, cost)
        self.taken += 1
        if self.fixed is None and self.step_s:
            self.every = next_every(self.every, self.cost_s, self.step_s, self.budget, self.taken)
        self.last_step_at = time.perf_counter()  # the fingerprint is not the step's time


def next_every(every, cost_s, step_s, budget, taken):
    """K after the `taken`-th fingerprint. It grows at most twofold from one
    fingerprint to the next, so each step up is measured again: a first
    fingerprint taken while the process was descheduled (a restart's first
    seconds on a busy node, its standbys importing beside it) made K 512 in
    one go and no fingerprint followed in a 200-step run. It shrinks only
    while the first few are taken and every 64th after (no flapping)."""
    target = _pow2_at_least(max(cost_s / (budget * step_s), MIN_SPACING_S / step_s, 1.0))
    if target > every:
        return min(target, 2 * max(every, 1))
    if target < every and (taken <= 4 or taken % 64 == 0):
        return target
    return every


def fingerprint(core, optimizer):
    import torch

    host = []
    device_sums = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            t = p.detach()
            if t.numel() == 0:
                continue
            if t.is_cuda:
                words = t.contiguous().view(-1).view(torch.uint8)
                pad = (-words.numel()) % 4
                if pad:
                    words = torch.cat([words, words.new_zeros(pad)])
                w = words.view(torch.int32).to(torch.int64)
                weights = torch.arange(1, w.numel() + 1, device=w.device, dtype=torch.int64)
                device_sums.append((w * weights).sum())
            else:
                t = t.contiguous()
                host.append((t.data_ptr(), t.numel() * t.element_size()))
                host.append(t)  # keeps a contiguous copy alive until hashed
    buffers = [b for b in host if isinstance(b, tuple)]
    if device_sums:
        sums = torch.stack(device_sums).cpu().contiguous()
        buffers.append((sums.data_ptr(), sums.numel() * 8))
        host.append(sums)
    return core.fingerprint(buffers)
