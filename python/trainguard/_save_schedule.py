"""When a Checkpointer saves: `Checkpointer(save_every=...)` and `ckpt.due(step)`
(docs/checkpoint_policy.md).

    save_every=N        every N steps (step % N == 0)
    save_every="auto"   the controller's checkpoint plan: its interval in
                        seconds, turned into steps by the step time rank 0
                        measures, agreed by every rank

Every rank must get the same answer for the same step, or the ranks would
save different steps. So the interval in steps (K) is decided by rank 0 and
agreed at points every rank passes at the same step: the third call of
`due` (two step times measured), every save after it, and every
RECHECK_STEPS steps without one (a plan that came or changed meanwhile; a
broadcast of one number). In between, `due` is a pure function of the
step: step - (the newest save, or the step K was first agreed at) >= K.

Two tiers. Where the node keeps memory copies (TRAINGUARD_MEMORY_CHECKPOINTS),
rank 0 takes the plan's interval to node memory for K, and makes every Nth
save one to storage, N = the plan's storage interval / K's (at least 1); the
others go to node memory alone. `due` says which: "memory", "storage" or
False. Without memory copies every save goes to storage at the plan's storage
interval. N is agreed with K. A tier's interval is never shorter than its
newest save's write took (a save sooner would wait for it). With no plan (not
under trainguard, or no plan yet) the interval is DEFAULT_INTERVAL_S, and
every save goes to storage.
"""

import sys
import time

DEFAULT_INTERVAL_S = 1800.0
# Steps whose time rank 0 measures before the first agreement.
MEASURED_BEFORE_AGREEING = 2
# Steps after which K is agreed again without a save in between.
RECHECK_STEPS = 100


def parse_save_every(value):
    """None, a whole number of steps >= 1, or "auto"; anything else is an error naming it."""
    if value is None or value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("save_every=%r: a whole number of steps (1 or more), \"auto\" or None" % (value,))
    return value


class SaveSchedule:
    """`agree(values)` returns rank 0's tuple of whole numbers on every rank (a
    broadcast; identity on one rank); `plan()` returns the plan's (memory_ms,
    storage_ms), 0 = none; `persist_s()` the newest writes' times (to
    storage, to memory alone); `memory_tier` whether the node keeps memory
    copies."""

    def __init__(self, save_every, rank, agree, plan, persist_s, memory_tier, clock=time.monotonic):
        self.save_every = parse_save_every(save_every)
        self.rank = rank
        self._agree = agree
        self._plan = plan
        self._persist_s = persist_s
        self.memory_tier = memory_tier
        self._clock = clock
        self.every = None        # K, agreed ("auto"); None before the first agreement
        self.per_storage = 1     # N: every Nth save goes to storage, the others to memory alone
        self.since_storage = 0   # saves to memory alone since the last to storage (or the restore)
        self.anchor = None       # the step K counts from: the newest save, or where K was agreed
        self.interval_s = None   # what rank 0 aimed at when K was agreed
        self.step_s = None       # rank 0's running mean of the time between due() calls
        self.basis = ""          # why interval_s is what it is (rank 0)
        self._calls = 0
        self._last_call = None
        self._agreed_at = None

    def due(self, step):
        if self.save_every is None:
            raise ValueError("due() needs Checkpointer(save_every=N or \"auto\")")
        if self.save_every != "auto":
            return step % self.save_every == 0
        now = self._clock()
        if self._last_call is not None:
            dt = now - self._last_call
            self.step_s = dt if self.step_s is None else 0.9 * self.step_s + 0.1 * dt
        self._last_call = now
        self._calls += 1
        if self.every is None:
            if self._calls <= MEASURED_BEFORE_AGREEING:
                return False
            self._decide(step, self.anchor if self.anchor is not None else step)
        elif step - self._agreed_at >= RECHECK_STEPS:
            self._decide(step, self.anchor)
        if step - self.anchor < self.every:
            return False
        return "storage" if self.since_storage + 1 >= self.per_storage else "memory"

    def saved(self, step, tier="storage"):
        """After a save of `step` (every rank, in the same order): K counts from it, agreed again."""
        self.since_storage = 0 if tier == "storage" else self.since_storage + 1
        if self.save_every != "auto":
            return
        if self.every is not None or self._calls > MEASURED_BEFORE_AGREEING:
            self._decide(step, step)
        else:
            self.anchor = step  # a save before K was agreed: count from it once it is

    def restored(self, step):
        """The state was restored from `step`: the interval counts from it."""
        if self.anchor is None or step > self.anchor:
            self.anchor = step
        self.since_storage = 0

    def _decide(self, step, anchor):
        k = n = 0
        if self.rank == 0:
            self.interval_s, storage_s = self.planned_intervals_s()
            k = max(1, int(round(self.interval_s / self.step_s))) if self.step_s else 1
            n = max(1, int(round(storage_s / self.interval_s)))
        every, per_storage = (int(v) for v in self._agree((k, n)))
        if self.rank == 0 and (every, per_storage) != (self.every, self.per_storage):
            tiers = "" if per_storage == 1 else ", every %s to storage, the others to node memory alone" % (
                "%dth" % per_storage if per_storage > 3 else {2: "2nd", 3: "3rd"}[per_storage])
            print("trainguard: checkpoint every %d step(s), %.1f s%s: %s"
                  % (every, self.interval_s, tiers, self.basis), file=sys.stderr, flush=True)
        self.every = every
        self.per_storage = per_storage
        self.anchor = anchor
        self._agreed_at = step

    def planned_interval_s(self):
        return self.planned_intervals_s()[0]

    def planned_intervals_s(self):
        """(the interval of saves, that of saves to storage), in seconds."""
        memory_ms, storage_ms = self._plan()
        storage_persist, memory_persist = self._persist_s()
        storage = storage_ms / 1000.0 if storage_ms > 0 else DEFAULT_INTERVAL_S
        if storage_persist and storage_persist > storage:
            storage = storage_persist
        if self.memory_tier and memory_ms > 0:
            interval, self.basis = memory_ms / 1000.0, "the controller's plan, to node memory"
            if memory_persist and memory_persist > interval:
                interval, self.basis = memory_persist, "the newest save's write to node memory took as long"
            if storage_ms <= 0:
                storage = interval  # no plan for storage: every save goes there too
            return min(interval, storage), storage
        if storage_ms > 0:
            self.basis = "the controller's plan, to storage"
        else:
            self.basis = "no checkpoint plan (not under trainguard, or none yet)"
        if storage_persist and storage_persist >= storage and storage_ms > 0:
            self.basis = "the newest save's write to storage took as long"
        return storage, storage
