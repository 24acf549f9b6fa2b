"""The GPU known-answer check of the diagnosis round's collective probe
(python/trainguard/_collective_probe.py, docs/sdc.md), run on the CPU
device here: a device that computes right has no mismatched element; one
that flips a bit of one result element has one."""

import os
import sys

import pytest

from conftest import BUILD

sys.path.insert(0, os.path.join(BUILD, "python"))
torch = pytest.importorskip("torch")

from trainguard import _collective_probe  # noqa: E402


def test_a_device_that_computes_right_has_no_mismatch():
    assert _collective_probe.known_answer_mismatches(torch, torch.device("cpu")) == 0


def test_one_wrong_element_is_counted(monkeypatch):
    real = torch.Tensor.__matmul__

    def flipped(a, b):
        out = real(a, b)
        if out.is_floating_point():
            out = out.clone()
            out.view(-1)[5] += 1  # one element computed wrong
        return out

    monkeypatch.setattr(torch.Tensor, "__matmul__", flipped)
    assert _collective_probe.known_answer_mismatches(torch, torch.device("cpu")) == 1  # float32 (no half on CPU)
