"""What counting a rank's file opens costs (docs/detection.md): the module's
C audit hook is added at trainguard.init(); from then on the interpreter
builds the arguments of every audited event. Times an audited event that
does nothing else (sys._getframe) and an open()+close() of a file, before
and after the hook, in the same process.

    /usr/bin/python3 bench/audit_hook_bench.py
"""
import os
import sys
import tempfile
import timeit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "python"))
from trainguard import _core  # noqa: E402

page = "/dev/shm/tg-audit-hook-bench-%d" % os.getpid()
_core._create_status_page(page)
os.environ["TRAINGUARD_STATUS_PAGE"] = page
fd, path = tempfile.mkstemp()
os.close(fd)


def per_call_ns(fn, number):
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9


def measure():
    return (per_call_ns(sys._getframe, 200000), per_call_ns(lambda: id(path), 200000),
            per_call_ns(lambda: open(path).close(), 20000))


try:
    frame0, id0, open0 = measure()
    assert _core.init()
    counted0 = _core._read_status_page(page)["files_opened"]
    frame1, id1, open1 = measure()
    counted = _core._read_status_page(page)["files_opened"] - counted0
    print("%-44s %10s %10s" % ("ns per call", "no hook", "hook"))
    print("%-44s %10.0f %10.0f" % ("sys._getframe() (an audited event)", frame0, frame1))
    print("%-44s %10.0f %10.0f" % ("lambda: id(x) (an audited event)", id0, id1))
    print("%-44s %10.0f %10.0f" % ("open() + close() of a file", open0, open1))
    print("opens counted while timing: %d" % counted)
finally:
    os.unlink(page)
    os.unlink(path)
