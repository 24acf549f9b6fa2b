#!/usr/bin/env python3
"""What a test run left behind on this machine.

    leftovers.py snapshot FILE          records what exists now
    leftovers.py check FILE [--ignore NAME ...]
                                        lists what exists now and did not then;
                                        exit 1 if anything

It compares, before and after the run: entries of /tmp and /dev/shm, live
processes (pid and start time; kernel threads and zombies aside), mount
points, network namespaces, network interfaces of this namespace, and
cgroups (two levels under each hierarchy, v1 or v2). A test that needs any of
these makes and removes its own; whatever outlives the run is a bug of the
test or of trainguard's cleanup (docs/testing.md, "Hygiene")."""

import argparse
import json
import os
import sys


def _entries(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _processes():
    """pid -> (start time, command line) of live user-space processes."""
    found = {}
    for pid in _entries("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                rest = f.read().rsplit(")", 1)[1].split()
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        state, start = rest[0], rest[19]
        if not cmd or state in ("Z", "X"):  # a kernel thread, or a process already gone
            continue
        found[pid] = (start, cmd)
    return found


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
        "processes": _processes(),
        "mounts": _mounts(),
        "netns": _entries("/run/netns"),
        "links": _entries("/sys/class/net"),
        "cgroups": _cgroups(),
    }


def _ancestors():
    """This process and the ones above it: they started after the snapshot."""
    mine, pid = set(), os.getpid()
    while pid > 1:
        mine.add(str(pid))
        try:
            with open("/proc/%d/stat" % pid) as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return mine


# Machine state that a first use makes once and that stays by design, not a
# test's: `ip netns add` turns /run/netns into a mount point of its own the
# first time it runs on a machine (iproute2), and leaves it for the next.
MACHINE_STATE = {"mounts": {"/run/netns"}}


def left_behind(before, after, ignore=()):
    """{what: [items]} that exist in `after` but not in `before`."""
    out = {}
    for key in ("tmp", "shm", "mounts", "netns", "links", "cgroups"):
        known = set(before[key]) | MACHINE_STATE.get(key, set())
        new = [x for x in after[key] if x not in known and os.path.basename(x) not in ignore]
        if new:
            out[key] = new
    mine = _ancestors()
    procs = []
    for pid, (start, cmd) in sorted(after["processes"].items(), key=lambda p: int(p[0])):
        was = before["processes"].get(pid)
        if pid in mine or (was is not None and was[0] == start):
            continue
        procs.append("%s %s" % (pid, cmd[:200]))
    if procs:
        out["processes"] = procs
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("snapshot", "check"))
    parser.add_argument("file")
    parser.add_argument("--ignore", action="append", default=[],
                        help="a /tmp or /dev/shm entry name the caller owns and removes itself")
    args = parser.parse_args()
    if args.action == "snapshot":
        with open(args.file, "w") as f:
            json.dump(snapshot(), f)
        return 0
    with open(args.file) as f:
        before = json.load(f)
    # Processes still exiting (a test's last kill) get a moment, bounded.
    import time
    deadline = time.monotonic() + 10
    while True:
        found = left_behind(before, snapshot(), args.ignore)
        if not found.get("processes") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if not found:
        print("leftovers: none (/tmp, /dev/shm, processes, mounts, netns, links, cgroups)")
        return 0
    print("leftovers: the run left these behind:")
    for key, items in found.items():
        for item in items:
            print("  %-9s %s" % (key, item))
    return 1


if __name__ == "__main__":
    sys.exit(main())
