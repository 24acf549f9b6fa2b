"""Cost of automatic step counting for scripts that do not import trainguard:
the same small training loop (an MLP, SGD, batch 32) timed uninstrumented and
then with trainguard's optimizer hook (step count, fingerprints) and the
numeric sentinel's backward hook (the loss checked) installed and attached
to a real status page, in the same process; medians of the rounds.

    /usr/bin/python3 bench/autoinstrument_bench.py
"""

import os
import statistics
import sys
import time
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_status_page import make_status_page, recorded_step  # noqa: E402

path = make_status_page()

import torch  # noqa: E402

import trainguard  # noqa: E402
from trainguard import _autoinstrument, _numeric, _phases  # noqa: E402,F401 (the hook polls _phases)

torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(32, 64), torch.randn(32, 1)
STEPS = 300


def loop():
    t = time.perf_counter()
    for _ in range(STEPS):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (time.perf_counter() - t) / STEPS


loop()  # warm up
plain = [loop() for _ in range(3)]
assert trainguard.init(), "could not attach to the benchmark status page"
_autoinstrument._after_import("torch.optim.optimizer", _autoinstrument._hook_optimizer)
_numeric.hook_torch(torch, _autoinstrument.sentinel)
instrumented = []
for _ in range(5):
    instrumented.append(loop())
hook = min(timeit.repeat(lambda: _autoinstrument._on_optimizer_step(opt), number=100_000,
                         repeat=5)) / 100_000
loss = torch.nn.functional.mse_loss(model(x), y)
sentinel = min(timeit.repeat(lambda: _autoinstrument.sentinel().observe("loss", loss), number=100_000,
                             repeat=5)) / 100_000
recorded = recorded_step(path)
os.unlink(path)
assert recorded > 0, "the hook did not record steps"
p, i = statistics.median(plain), statistics.median(instrumented)
print("torch %s; training step (MLP 64-256-1, batch 32, SGD): uninstrumented %.1f us, "
      "instrumented %.1f us (%+.2f %%)" % (torch.__version__, p * 1e6, i * 1e6, (i - p) / p * 100))
print("hook per optimizer step: %.2f us = %.2f %% of the uninstrumented step" % (hook * 1e6, hook / p * 100))
print("numeric sentinel per loss: %.2f us = %.2f %% of the uninstrumented step" % (sentinel * 1e6, sentinel / p * 100))
