#!/usr/bin/env python3
"""Runs a test command and fails if it left anything behind on this machine.

    leftovers.py [--ignore NAME ...] -- COMMAND [ARG ...]

Before COMMAND it records what exists; after it, it lists what exists now
and did not then: entries of /tmp and /dev/shm, mount points, network
namespaces, network interfaces of this namespace, cgroups (two levels under
each hierarchy, v1 or v2), and processes. For processes it becomes a child
subreaper (prctl PR_SET_CHILD_SUBREAPER): whatever COMMAND started and did
not end (a daemon that forked away, an orphaned rank) is reparented to it and
is found as its descendant, while processes of the machine's own are not
counted. Leftover processes are listed, then killed. Exit status: COMMAND's
when it failed, else 1 when anything was left, else 0 (docs/testing.md,
"Hygiene")."""

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36

# Machine state that a first use makes once and that stays by design, not a
# test's: `ip netns add` turns /run/netns into a mount point of its own the
# first time it runs on a machine (iproute2), and leaves it for the next.
MACHINE_STATE = {"mounts": {"/run/netns"}}


def _entries(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _mounts():
    points = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                points.append(line.split()[4])
    except OSError:
        pass
    return sorted(points)


def _cgroups():
    found = []
    root = "/sys/fs/cgroup"
    for top in [root] + [os.path.join(root, d) for d in _entries(root)]:
        if not os.path.isdir(top) or os.path.islink(top):
            continue
        for child in _entries(top):
            path = os.path.join(top, child)
            if not os.path.isdir(path) or os.path.islink(path):
                continue
            found.append(path)
            for grandchild in _entries(path):
                if os.path.isdir(os.path.join(path, grandchild)):
                    found.append(os.path.join(path, grandchild))
    return sorted(set(found))


def snapshot():
    return {
        "tmp": _entries("/tmp"),
        "shm": _entries("/dev/shm"),
        "mounts": _mounts(),
        "netns": _entries("/run/netns"),
        "links": _entries("/sys/class/net"),
        "cgroups": _cgroups(),
    }


def left_behind(before, after, ignore=()):
    """{what: [items]} that exist in `after` but not in `before`."""
    out = {}
    for key in before:
        known = set(before[key]) | MACHINE_STATE.get(key, set())
        new = [x for x in after[key] if x not in known and os.path.basename(x) not in ignore]
        if new:
            out[key] = new
    return out


def processes():
    """(pid, the fields of /proc/PID/stat after the command's name, command
    line) of every live process (tests/conftest.py uses it too)."""
    for pid in _entries("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        yield int(pid), fields, cmd


def _descendants():
    """(pid, command line) of this process's live descendants."""
    parent_of, command = {}, {}
    for pid, rest, cmd in processes():
        if rest[0] in ("Z", "X"):
            continue
        parent_of[pid] = int(rest[1])
        command[pid] = cmd
    me, found = os.getpid(), []
    for pid in parent_of:
        up, seen = parent_of[pid], 0
        while up > 1 and up != me and seen < 1000:
            up, seen = parent_of.get(up, 0), seen + 1
        if up == me and pid != me:
            found.append((pid, command[pid]))
    return sorted(found)


def _reap():
    """Collects orphans that ended (they are this subreaper's children)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ignore", action="append", default=[],
                        help="a /tmp or /dev/shm entry name the caller owns and removes itself")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run")
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("leftovers: cannot become a child subreaper (errno %d)" % ctypes.get_errno(), file=sys.stderr)
        return 2
    before = snapshot()
    child = subprocess.Popen(command)
    # As init would: every orphan that ends is collected at once, so that a
    # test that waits for a killed process to be gone (kill(pid, 0) failing)
    # does not find it a zombie of ours. The command's own status ends the wait.
    rc = None
    while rc is None:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            rc = child.poll() or 0
            break
        except KeyboardInterrupt:  # the command gets the terminal's SIGINT itself
            continue
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            rc = 128 - code if code < 0 else code
            child.returncode = rc
    # Processes still exiting (a test's last kill) get a moment, bounded.
    deadline = time.monotonic() + 10
    while True:
        _reap()
        procs = _descendants()
        if not procs or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    found = left_behind(before, snapshot(), args.ignore)
    if procs:
        found["processes"] = ["%d %s" % (pid, cmd[:200]) for pid, cmd in procs]
        for pid, _ in procs:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        _reap()
    if not found:
        print("leftovers: none (/tmp, /dev/shm, processes, mounts, netns, links, cgroups)")
        return rc
    print("leftovers: the run left these behind:")
    for key, items in found.items():
        for item in items:
            print("  %-9s %s" % (key, item))
    return rc or 1


if __name__ == "__main__":
    sys.exit(main())
