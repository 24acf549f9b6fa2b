"""The numeric sentinel's own logic (python/trainguard/_numeric.py) with real
torch and a recording stand-in for the status page: which values count as a
loss, NaN/Inf, the spike rule, the first of each reported once."""

import math
import os
import sys

import pytest

from conftest import BUILD  # noqa: E402

sys.path.insert(0, os.path.join(BUILD, "python"))
torch = pytest.importorskip("torch")

from trainguard import _numeric  # noqa: E402


class Page:
    def __init__(self):
        self.reports = []
        self.losses = 0

    def report_numeric(self, step, kind, value):
        self.reports.append((step, kind, value))

    def numeric_observed(self):
        self.losses += 1


def sentinel(monkeypatch, factor="10", warmup="5"):
    monkeypatch.setenv("TRAINGUARD_SPIKE_FACTOR", factor)
    monkeypatch.setenv("TRAINGUARD_SPIKE_WARMUP", warmup)
    page = Page()
    step = {"n": 0}
    return page, step, _numeric.Sentinel(page, lambda: step["n"])


def test_the_first_nan_and_the_first_spike_are_reported_once_each(monkeypatch):
    page, step, s = sentinel(monkeypatch)
    for i, v in enumerate([1.0, 2.0, 1.5, 0.5, 0.7, 3.0, 19.0, 25.0, float("nan"), float("inf")]):
        step["n"] = i
        s.observe("loss", torch.tensor(v))
    assert page.losses == 10
    assert page.reports[0] == (7, _numeric.LOSS_SPIKE, 25.0)  # > 10 x 2.0, the peak of the first five
    assert page.reports[1][:2] == (8, _numeric.LOSS_NONFINITE) and math.isnan(page.reports[1][2])
    assert len(page.reports) == 2


def test_spikes_can_be_turned_off_and_a_grad_norm_is_not_a_loss(monkeypatch):
    page, step, s = sentinel(monkeypatch, factor="0", warmup="1")
    s.observe("grad_norm", torch.tensor(1.0))
    s.observe("grad_norm", torch.tensor(1e9))
    s.observe("grad_norm", torch.tensor(float("-inf")))
    assert page.losses == 0
    assert [r[1] for r in page.reports] == [_numeric.GRAD_NORM_NONFINITE]


def test_backward_and_clip_grad_norm_are_observed_without_changing_what_they_do(monkeypatch):
    page, step, s = sentinel(monkeypatch)
    monkeypatch.setattr(torch.autograd, "backward", torch.autograd.backward)
    clip_module = sys.modules["torch.nn.utils.clip_grad"]
    monkeypatch.setattr(clip_module, "clip_grad_norm_", clip_module.clip_grad_norm_)
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", torch.nn.utils.clip_grad_norm_)
    _numeric.hook_torch(torch, lambda: s)
    _numeric.hook_clip_grad(clip_module, lambda: s)
    w = torch.nn.Parameter(torch.ones(3))
    step["n"] = 4
    loss = (w * float("nan")).sum()
    loss.backward()
    assert page.losses == 1 and page.reports[0][:2] == (4, _numeric.LOSS_NONFINITE)
    norm = torch.nn.utils.clip_grad_norm_([w], 1.0)
    assert math.isnan(float(norm))
    assert [r[1] for r in page.reports] == [_numeric.LOSS_NONFINITE]  # the first NaN only
    # A vector with explicit gradients is not a loss: not observed.
    v = (w * 2)
    v.backward(torch.ones(3))
    assert page.losses == 1
