"""Cost of trainguard.step() from Python, attached to a real status page,
beside the cost of calling an empty Python function (the floor of any
Python API) measured in the same run.

    /usr/bin/python3 bench/python_step_bench.py
"""

import os
import struct
import sys
import tempfile
import timeit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.environ.get("TRAINGUARD_BUILD", os.path.join(ROOT, "build")), "python"))

# An empty status page as the agent creates it (docs/status_page.md).
fd, path = tempfile.mkstemp(prefix="trainguard-bench-", dir="/dev/shm")
page = bytearray(4096)
struct.pack_into("<QII", page, 0, 0x5355544154534754, 1, 4096)
struct.pack_into("<q", page, 32, -1)   # step
struct.pack_into("<q", page, 64, -1)   # checkpoint_step
os.write(fd, page)
os.close(fd)
os.environ["TRAINGUARD_STATUS_PAGE"] = path

import trainguard  # noqa: E402

assert trainguard.init(), "could not attach to the benchmark status page"


def empty(n):
    pass


N = 1_000_000
base = min(timeit.repeat("f(1)", globals={"f": empty}, number=N, repeat=5)) / N
step = min(timeit.repeat("s(1)", globals={"s": trainguard.step}, number=N, repeat=5)) / N
raw = min(timeit.repeat("s(1)", globals={"s": trainguard._core.step}, number=N, repeat=5)) / N
with open(path, "rb") as f:
    assert struct.unpack_from("<q", f.read(48), 32)[0] == 1
os.unlink(path)
print("python empty function call (baseline): %7.1f ns" % (base * 1e9))
print("trainguard.step(n)                    : %7.1f ns" % (step * 1e9))
print("trainguard._core.step(n)              : %7.1f ns" % (raw * 1e9))
