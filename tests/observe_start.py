"""Writes down, on its first lines, everything a training script can observe
about how it was started, then trains a few DDP steps (gloo) and fails or
ends as told. tests/test_warm_start.py compares what a cold start and a warm
standby show. It never imports trainguard.

    observe_start.py OUT_DIR [--fail-generations N] [--go-dir DIR]

Generation g (TORCHELASTIC_RESTART_COUNT) writes OUT_DIR/gen<g>.rank<r>.json;
while g < N, rank 0 waits for DIR/go<g> (bounded), then raises.
"""
import ctypes
import json
import os
import resource
import signal
import sys

_seen_globals = sorted(globals())
_main_is_this = sys.modules["__main__"].__dict__ is globals()


def _fds():
    fds = {}
    for fd in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue  # the listing's own descriptor
        fds[fd] = target.split(":[")[0]  # pipe:[123] -> pipe
    return fds


def _pdeathsig():
    libc = ctypes.CDLL(None, use_errno=True)
    sig = ctypes.c_int(0)
    libc.prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
    return sig.value


def observe():
    skip = {"TORCHELASTIC_RESTART_COUNT", "MASTER_PORT", "TORCHELASTIC_ERROR_FILE", "TRAINGUARD_STACKS_FILE"}
    handlers = {}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            handlers[int(sig)] = repr(signal.getsignal(sig))
        except (ValueError, OSError):
            pass
    g = globals()
    return {
        "env": {k: v for k, v in os.environ.items() if k not in skip},
        "argv": sys.argv,
        "orig_argv": sys.orig_argv,
        "path": sys.path,
        "flags": repr(sys.flags),
        "executable": sys.executable,
        "warnoptions": sys.warnoptions,
        "file": g["__file__"],
        "spec": repr(g["__spec__"]),
        "name": g["__name__"],
        "package": g["__package__"],
        "loader": type(g["__loader__"]).__name__,
        "cached": g["__cached__"],
        "doc": g["__doc__"] is not None,
        "globals_at_start": _seen_globals,
        "main_module_is_script": _main_is_this,
        "signals": handlers,
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "fds": _fds(),
        "rlimits": {name: resource.getrlimit(getattr(resource, name))
                    for name in dir(resource) if name.startswith("RLIMIT_")},
        "own_process_group": os.getpgrp() == os.getpid(),
        "session_is_agents": os.getsid(0) == os.getsid(os.getppid()),
        "pdeathsig": _pdeathsig(),
        "cwd": os.getcwd(),
        "umask": os.umask(0o22),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "scheduler": os.sched_getscheduler(0),
        "affinity": sorted(os.sched_getaffinity(0)),
        "threads": len(os.listdir("/proc/self/task")),
        "stdout": [sys.stdout.line_buffering, sys.stdout.write_through, sys.stdout.encoding, sys.stdout.isatty()],
        "stderr": [sys.stderr.line_buffering, sys.stderr.encoding],
        "stdin": sys.stdin.isatty(),
    }


def main():
    import argparse
    import time

    seen = observe()
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--fail-generations", type=int, default=0)
    p.add_argument("--go-dir", default="")
    args = p.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ["RANK"])
    generation = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    with open(os.path.join(args.out, "gen%d.rank%d.json" % (generation, rank)), "w") as f:
        json.dump(seen, f, indent=1, sort_keys=True)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.ones(4, 8)).sum().backward()
        opt.step()
    if generation < args.fail_generations:
        go = os.path.join(args.go_dir, "go%d" % generation)
        deadline = time.monotonic() + 120
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.05)
        if rank == 0:
            raise RuntimeError("injected failure in generation %d" % generation)
        time.sleep(120)  # stopped by the restart
    dist.barrier()


if __name__ == "__main__":
    main()
