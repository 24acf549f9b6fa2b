"""An empty status page as the agent creates it (docs/status_page.md), for
benchmarks that measure the client attached to a real page; and the build's
Python package on sys.path."""

import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.environ.get("TRAINGUARD_BUILD", os.path.join(ROOT, "build")), "python"))


def make_status_page():
    """Creates the page in /dev/shm, points TRAINGUARD_STATUS_PAGE at it, returns its path."""
    from trainguard import _core

    fd, path = tempfile.mkstemp(prefix="trainguard-bench-", dir="/dev/shm")
    os.close(fd)
    _core._create_status_page(path)
    os.environ["TRAINGUARD_STATUS_PAGE"] = path
    return path


def recorded_step(path):
    from trainguard import _core

    return _core._read_status_page(path)["step"]
