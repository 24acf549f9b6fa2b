"""Issue 25: the files a rank opens (its metadata rate), counted by the
interpreter's "open" audit event into the status page, forked data loader
workers included; a process that is not under trainguard counts nothing."""

import os
import subprocess

from conftest import BUILD, PYTHON

SNIPPET = r"""
import os, sys
import trainguard
from trainguard import _core

page = os.environ["TRAINGUARD_STATUS_PAGE"]
names = [os.path.join(sys.argv[1], "f%d" % i) for i in range(50)]
for n in names:
    with open(n, "w") as f:
        f.write("x")
attached = trainguard.init()
before = _core._read_status_page(page)["files_opened"]
for n in names:                 # open(): 50
    with open(n) as f:
        f.read()
for n in names[:10]:            # os.open(): 10
    os.close(os.open(n, os.O_RDONLY))
pid = os.fork()
if pid == 0:                    # a forked loader worker: 30
    for n in names[:30]:
        open(n).close()
    os._exit(0)
os.waitpid(pid, 0)
print(attached, _core._read_status_page(page)["files_opened"] - before)
"""


def run(tmp_path, attach):
    import sys
    sys.path.insert(0, os.path.join(BUILD, "python"))
    from trainguard import _core

    page = "/dev/shm/trainguard-test-opens-%d" % os.getpid()
    _core._create_status_page(page)
    try:
        env = dict(os.environ, TRAINGUARD_STATUS_PAGE=page if attach else "",
                   PYTHONPATH=os.path.join(BUILD, "python"), TRAINGUARD_INSTRUMENT="0")
        snippet = SNIPPET if attach else SNIPPET.replace('os.environ["TRAINGUARD_STATUS_PAGE"]', repr(page))
        out = subprocess.run([PYTHON, "-c", snippet, str(tmp_path)], env=env, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()
    finally:
        os.unlink(page)


def test_every_file_the_rank_and_its_forked_workers_open_is_counted(tmp_path):
    assert run(tmp_path, attach=True) == ["True", "90"]


def test_a_process_not_under_trainguard_counts_nothing(tmp_path):
    assert run(tmp_path, attach=False) == ["False", "0"]
