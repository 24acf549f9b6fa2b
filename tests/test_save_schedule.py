"""When a Checkpointer saves (python/trainguard/_save_schedule.py,
docs/checkpoint_policy.md): every N steps, or the controller's plan turned
into steps by rank 0's step time and agreed by every rank. A unit test of the
rule with fake clocks and a fake broadcast; the job-level checks are in
test_checkpoint_plan_live.py."""

import os
import sys

import pytest

from conftest import BUILD

sys.path.insert(0, os.path.join(BUILD, "python"))

from trainguard._save_schedule import DEFAULT_INTERVAL_S, SaveSchedule  # noqa: E402


class Broadcast:
    """Rank 0's values, in the order it agreed them, handed to the other ranks in the same order."""

    def __init__(self):
        self.sent = []
        self.read = {}

    def agree_for(self, rank):
        def agree(k):
            if rank == 0:
                self.sent.append(k)
                return k
            i = self.read.get(rank, 0)
            self.read[rank] = i + 1
            return self.sent[i]
        return agree


def schedule(rank, bus, step_s, plan=(0, 0), persist_s=(0.0, 0.0), memory_tier=True, save_every="auto"):
    clock = [1000.0 + rank]

    def tick():
        clock[0] += step_s
        return clock[0]

    return SaveSchedule(save_every, rank, bus.agree_for(rank), lambda: plan, lambda: persist_s, memory_tier,
                        clock=tick)


def saves(s, steps, first=1, tiers=None):
    out = []
    for step in range(first, first + steps):
        tier = s.due(step)
        if tier:
            out.append(step)
            if tiers is not None:
                tiers.append(tier)
            s.saved(step, tier if tier in ("memory", "storage") else "storage")
    return out


def test_every_n_steps():
    s = schedule(0, Broadcast(), 0.1, save_every=5)
    assert saves(s, 20) == [5, 10, 15, 20]


@pytest.mark.parametrize("bad", [0, -3, 2.5, "often", True])
def test_a_bad_save_every_is_an_error_naming_it(bad):
    with pytest.raises(ValueError, match="save_every=%s" % repr(bad).replace("(", r"\(")):
        schedule(0, Broadcast(), 0.1, save_every=bad)


def test_due_without_save_every_is_an_error():
    s = schedule(0, Broadcast(), 0.1, save_every=None)
    with pytest.raises(ValueError, match="save_every"):
        s.due(1)


def test_auto_follows_the_memory_interval_and_every_rank_agrees():
    bus = Broadcast()
    # Rank 0 steps in 50 ms, rank 1's clock runs 20 % slower: the plan says 2 s to memory.
    r0 = schedule(0, bus, 0.05, plan=(2000, 30000))
    r1 = schedule(1, bus, 0.06, plan=(2000, 30000))
    got0 = saves(r0, 300)
    got1 = saves(r1, 300)
    assert got0 == got1, (got0, got1)
    assert r0.every == r1.every == 40, (r0.every, r1.every)  # 2 s / 50 ms
    assert got0[:2] == [43, 83], got0  # agreed at the 3rd call (step 3), then every 40 steps


def test_auto_takes_storage_without_memory_copies_and_never_outpaces_the_write():
    bus = Broadcast()
    s = schedule(0, bus, 0.1, plan=(2000, 30000), memory_tier=False)
    saves(s, 10)
    assert s.interval_s == 30 and s.every == 300
    bus = Broadcast()
    s = schedule(0, bus, 0.1, plan=(2000, 30000), persist_s=(5.0, 0.0), memory_tier=False)
    saves(s, 10)
    assert s.interval_s == 30 and s.every == 300  # a write of 5 s binds nothing at 30 s
    s = schedule(0, Broadcast(), 0.1, plan=(2000, 3000), persist_s=(5.0, 0.0), memory_tier=False)
    saves(s, 10)
    assert s.interval_s == 5.0 and s.every == 50  # the newest save's write took 5 s
    s = schedule(0, Broadcast(), 0.1, plan=(2000, 30000), persist_s=(5.0, 3.0))
    saves(s, 10)
    assert s.interval_s == 3.0 and s.every == 30  # its write to node memory took 3 s
    assert s.per_storage == 10  # storage every 30 s


def test_with_memory_copies_every_nth_save_goes_to_storage_the_others_to_memory_alone():
    bus = Broadcast()
    r0 = schedule(0, bus, 0.05, plan=(2000, 10000))
    r1 = schedule(1, bus, 0.07, plan=(0, 0))  # another rank's plan and clock do not matter
    t0, t1 = [], []
    got0, got1 = saves(r0, 500, tiers=t0), saves(r1, 500, tiers=t1)
    assert (got0, t0) == (got1, t1)
    assert r0.every == 40 and r0.per_storage == 5, (r0.every, r0.per_storage)
    assert t0[:10] == ["memory"] * 4 + ["storage"] + ["memory"] * 4 + ["storage"], t0
    # A restore counts afresh: four to memory alone, then one to storage.
    r0.restored(got0[-1])
    t = []
    saves(r0, 400, first=got0[-1] + 1, tiers=t)
    assert t[:5] == ["memory"] * 4 + ["storage"], t


def test_without_memory_copies_or_a_plan_every_save_goes_to_storage():
    t = []
    saves(schedule(0, Broadcast(), 0.05, plan=(2000, 10000), memory_tier=False), 2000, tiers=t)
    assert t and set(t) == {"storage"}, t
    t = []
    s = schedule(0, Broadcast(), 0.5)
    saves(s, 20000, tiers=t)
    assert t and set(t) == {"storage"} and s.per_storage == 1, t


def test_auto_without_a_plan_saves_at_the_default_interval():
    s = schedule(0, Broadcast(), 1.0)
    saves(s, 5)
    assert s.interval_s == DEFAULT_INTERVAL_S and s.every == int(DEFAULT_INTERVAL_S)


def test_a_restored_run_counts_from_the_step_it_restored():
    s = schedule(0, Broadcast(), 0.05, plan=(1000, 0))
    s.restored(80)
    assert saves(s, 100, first=81)[:2] == [100, 120]  # every 20 steps, counted from step 80


def test_a_plan_that_comes_after_the_first_agreement_is_taken_within_a_recheck():
    bus = Broadcast()
    plan = [(0, 0)]
    s = schedule(0, bus, 0.1)
    s._plan = lambda: plan[0]
    assert saves(s, 20) == []  # no plan: the default interval, 18,000 steps
    plan[0] = (3000, 0)
    got = saves(s, 300, first=21)
    assert got[:2] == [103, 133], got  # agreed again at step 103 (100 after step 3): due at once, then every 30


def test_a_new_plan_is_taken_at_the_next_save():
    bus = Broadcast()
    plan = [(2000, 0)]
    clock = [0.0]

    def tick():
        clock[0] += 0.1
        return clock[0]

    s = SaveSchedule("auto", 0, bus.agree_for(0), lambda: plan[0], lambda: (0.0, 0.0), True, clock=tick)
    first = saves(s, 50)
    plan[0] = (5000, 0)
    later = saves(s, 200, first=51)
    assert first == [23, 43], first
    assert later[:2] == [63, 113], later  # the save at 63 agreed 50 steps from then on
