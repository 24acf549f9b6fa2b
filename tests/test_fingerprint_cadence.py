"""The fingerprint cadence (python/trainguard/_fingerprint.py, docs/sdc.md):
K follows the cost, climbs by doubling so an outlier is measured again, and
comes back down once the cost is known to be small. A unit test of the rule
with a fake clock and a fake core; the end-to-end checks are test_sdc.py's."""

import os
import sys

from conftest import BUILD  # noqa: E402

sys.path.insert(0, os.path.join(BUILD, "python"))

from trainguard import _fingerprint  # noqa: E402


class FakeCore:
    def __init__(self):
        self.reported = []

    def report_fingerprint(self, step, value):
        self.reported.append(step)


def run(monkeypatch, steps, step_s, cost_of, env=None):
    """Steps 1..steps, each step_s long; a fingerprint at step s costs cost_of(s) seconds."""
    for k in ("TRAINGUARD_FINGERPRINT_EVERY", "TRAINGUARD_FINGERPRINT_BUDGET", "TRAINGUARD_FINGERPRINT_AT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in (env or {}).items():
        monkeypatch.setenv(k, v)
    clock = [100.0]
    monkeypatch.setattr(_fingerprint.time, "perf_counter", lambda: clock[0])
    pending = {}

    def fake_fingerprint(core, optimizer):
        clock[0] += pending["cost"]
        return 0

    monkeypatch.setattr(_fingerprint, "fingerprint", fake_fingerprint)
    core = FakeCore()
    fp = _fingerprint.Fingerprinter(core)
    for step in range(1, steps + 1):
        clock[0] += step_s
        pending["cost"] = cost_of(step)
        fp.after_step(None, step)
    return core.reported, fp


def test_one_slow_first_fingerprint_does_not_stop_the_fingerprints(monkeypatch):
    # 20 ms steps; the first fingerprints take 60 ms (a busy node), then 0.2 ms.
    reported, fp = run(monkeypatch, 200, 0.02, lambda s: 0.06 if s <= 2 else 0.0002)
    assert reported[:3] == [1, 2, 4], reported  # doubling, each measured again
    # Settles where 0.25 s spacing puts it (16 steps of 20 ms), not at 512.
    assert fp.every == 16, (fp.every, reported)
    assert len([s for s in reported if 100 <= s <= 200]) >= 6, reported


def test_a_costly_fingerprint_is_taken_rarely(monkeypatch):
    # 0.1 s steps, 10 ms fingerprints: 0.5 % of the step time needs K >= 20, so 32.
    reported, fp = run(monkeypatch, 2000, 0.1, lambda s: 0.01)
    assert fp.every == 32, (fp.every, reported)
    late = [s for s in reported if s > 1000]
    assert late and all(s % 32 == 0 for s in late), late
    taken_s = 0.01 * len(reported)
    assert taken_s / (2000 * 0.1) < 0.006  # the budget, with the climb's few extra


def test_the_forced_step_and_a_fixed_k_are_kept(monkeypatch):
    reported, fp = run(monkeypatch, 100, 0.02, lambda s: 0.0002,
                       env={"TRAINGUARD_FINGERPRINT_EVERY": "0", "TRAINGUARD_FINGERPRINT_AT": "37"})
    assert reported == [37]
    reported, fp = run(monkeypatch, 20, 0.02, lambda s: 0.5, env={"TRAINGUARD_FINGERPRINT_EVERY": "5"})
    assert reported == [5, 10, 15, 20]
