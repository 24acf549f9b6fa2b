"""Cost of trainguard.step() from Python, attached to a real status page,
beside the cost of calling an empty Python function (the floor of any
Python API) measured in the same run.

    /usr/bin/python3 bench/python_step_bench.py
"""

import os
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_status_page import make_status_page, recorded_step  # noqa: E402

path = make_status_page()

import trainguard  # noqa: E402

assert trainguard.init(), "could not attach to the benchmark status page"


def empty(n):
    pass


N = 1_000_000
base = min(timeit.repeat("f(1)", globals={"f": empty}, number=N, repeat=5)) / N
step = min(timeit.repeat("s(1)", globals={"s": trainguard.step}, number=N, repeat=5)) / N
raw = min(timeit.repeat("s(1)", globals={"s": trainguard._core.step}, number=N, repeat=5)) / N
assert recorded_step(path) == 1
os.unlink(path)
print("python empty function call (baseline): %7.1f ns" % (base * 1e9))
print("trainguard.step(n)                    : %7.1f ns" % (step * 1e9))
print("trainguard._core.step(n)              : %7.1f ns" % (raw * 1e9))
