"""Issue 25: a journaled operation on CUDA tensors says when its device
reached it. Without a GPU here, the CUDA event is a stand-in whose query()
the test controls; the journal, the status page and the poller are real."""

import os
import subprocess

from conftest import BUILD, PYTHON

SNIPPET = r"""
import sys, threading, time
import trainguard
from trainguard import _comm_journal as cj

assert trainguard.init()
cj._core = trainguard._core

class Event:
    # A CUDA event the test completes: those made while `reached` is set
    # have run on the device.
    reached = threading.Event()
    def __init__(self):
        self.done = False
    def record(self, stream):
        assert stream == ("stream", 0), stream  # the current stream of the tensors' device
        self.done = Event.reached.is_set()
    def query(self):
        return self.done

streams_made = []

class Torch:
    class cuda:
        Event = Event
        @staticmethod
        def current_stream(device=None):
            streams_made.append(device)
            return ("stream", device)
    class _C:
        @staticmethod
        def _cuda_getCurrentStream(device):
            return (7, device, 1)

cj._torch = Torch
slot = trainguard._core.journal_group(0, "world", [0, 1])
# Operation 1: its device reached it. Operation 2: issued behind a kernel
# that never ends, so its start event never runs.
Event.reached.set()
first = trainguard._core.journal_issue(slot, 1, 1, 8, -1, True)
cj._watch_device_start(first, 0)
Event.reached.clear()
second = trainguard._core.journal_issue(slot, 1, 1, 8, -1, True)
cj._watch_device_start(second, 0)
host = trainguard._core.journal_issue(slot, 1, 1, 8, -1)
deadline = time.time() + 10
while cj._pending_starts and len(cj._pending_starts) > 1 and time.time() < deadline:
    time.sleep(0.01)
time.sleep(0.3)  # several polls: the second must stay not started
# The Stream object is built once and found again by torch's raw id.
assert streams_made == [0], streams_made
print("ok")
"""


def test_an_operation_whose_device_never_reached_it_stays_not_started(tmp_path):
    import sys
    sys.path.insert(0, os.path.join(BUILD, "python"))
    from trainguard import _core

    page = "/dev/shm/trainguard-test-device-%d" % os.getpid()
    _core._create_status_page(page)
    try:
        env = dict(os.environ, TRAINGUARD_STATUS_PAGE=page, PYTHONPATH=os.path.join(BUILD, "python"),
                   TRAINGUARD_INSTRUMENT="0")
        out = subprocess.run([PYTHON, "-c", SNIPPET], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "ok" in out.stdout, out.stderr
        ops = _core._read_status_page(page)["ops"]
    finally:
        os.unlink(page)
    assert [(o["on_device"], o["started_ms"] >= 0, o["in_flight"]) for o in ops] == \
        [(True, True, True), (True, False, True), (False, False, True)], ops
