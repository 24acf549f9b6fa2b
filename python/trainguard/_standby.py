"""A warm standby rank: an interpreter that has imported what the job's ranks
import and waits to become the next generation's rank.

The agent starts it (after the generation's first step, at low priority) as
`PYTHON [the rank's interpreter options] -c "...; _standby.main()"` with the
previous generation's environment and a control socket on the fd named by
TRAINGUARD_STANDBY_FD. Protocol (SOCK_SEQPACKET, one JSON object a message):

  standby -> agent  {"ready": true, "modules": N, "import_s": S, "rss_kb": K}
                    or {"ready": false, "reason": "..."} (then it exits)
  agent -> standby  {"env": {...}, "cwd": "...", "argv": [...], "orig_argv": [...],
                     "script": path | "module": name}, with the rank's stdout
                    and stderr write ends attached (SCM_RIGHTS)
  standby -> agent  {"ok": true} and it runs the script as `python script.py`
                    (or `-m module`) would; or {"ok": false, "reason": "..."}
                    and it exits: the agent starts the rank cold.

It refuses whenever a warm start could differ from a cold one: a file it
imported, the script, the interpreter or a directory of sys.path changed
since it was made; it has a thread or a CUDA context; it is asked to run
another script than it was made for. It never creates threads itself.
"""

import json
import os
import socket
import sys

_MAX_MESSAGE = 1 << 22


def _send(sock, obj):
    sock.send(json.dumps(obj).encode())


def _stat_key(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def own_directories(script):
    """Where the user's own modules live: the script's directory (for
    `-m`, the working directory)."""
    if script and script != "-m" and not script.startswith("-"):
        return [os.path.dirname(os.path.realpath(script))]
    return [os.getcwd()]


def in_own_directories(module, own):
    """A module of the user's own (below `own`, not an installed package)."""
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return False
    real = os.path.realpath(path)
    if "/site-packages/" in real or "/dist-packages/" in real:
        return False
    return any(real.startswith(d.rstrip(os.sep) + os.sep) for d in own)


def is_own_module(module, own):
    """What a standby never imports: the script's own modules (the user
    edits them), trainguard's, the site hooks."""
    name = getattr(module, "__name__", "") or ""
    if name == "__main__" or name.split(".")[0] in ("trainguard", "sitecustomize", "usercustomize"):
        return True
    return in_own_directories(module, own)


def _import_list(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


def _module_files():
    files = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str):
            files[path] = _stat_key(path)
    return files


def _watched(script):
    """What a warm start depends on: every imported file, the interpreter,
    each sys.path directory (a package installed or removed) and the script."""
    watched = _module_files()
    for path in [sys.executable, os.path.realpath(sys.executable), script] + [p for p in sys.path if p]:
        if path:
            watched[path] = _stat_key(path)
    return watched


def _changed(watched):
    for path, key in watched.items():
        if _stat_key(path) != key:
            return path
    return None


def _threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _cuda_initialized():
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized())
    except Exception:
        return False


def _refusal(order, made_for, watched, python_env):
    target = order.get("script") or ("-m " + order.get("module", ""))
    if target != made_for:
        return "the rank runs %s, the standby was made for %s" % (target, made_for)
    changed = _changed(watched)
    if changed is not None:
        return "%s changed since the standby was made" % changed
    wanted = {k: v for k, v in order["env"].items() if k.startswith("PYTHON")}
    if wanted != python_env:
        differ = sorted(set(wanted.items()) ^ set(python_env.items()))
        return "the interpreter's environment differs (%s)" % differ[0][0]
    threads = _threads()
    if threads != 1:
        return "the standby has %d threads" % threads
    if _cuda_initialized():
        return "the standby has a CUDA context"
    return None


def _become(order, fds):
    """Turn this process into the rank: the streams, the environment, the
    directory and argv that a cold start of the rank would have."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(order["env"])
    os.chdir(order["cwd"])
    sys.argv = list(order["argv"])
    sys.orig_argv = list(order["orig_argv"])


def _instrument():
    try:
        from trainguard import _autoinstrument
    except Exception as e:  # never break the rank
        print("trainguard: automatic instrumentation unavailable: %r" % (e,), file=sys.stderr)
        return
    _autoinstrument.install(warm=True)


def _run_trimmed(run, first_file):
    """Runs the rank; an uncaught exception is reported as a cold start
    reports it, from the script's frames on (the standby's are left out)."""
    try:
        run()
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: B902 - reported as the interpreter would
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != first_file:
            tb = tb.tb_next
        if tb is not None:
            e.__traceback__ = tb  # the interpreter prints the exception's own traceback
        sys.excepthook(type(e), e, e.__traceback__)
        raise SystemExit(1)


def _run_script(path):
    import builtins
    import importlib.machinery

    if not os.path.isabs(path):
        path = os.getcwd() + os.sep + path  # as the interpreter makes it absolute
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    main = sys.modules["__main__"]
    namespace = main.__dict__
    namespace.clear()
    namespace.update(__name__="__main__", __doc__=None, __package__=None,
                     __loader__=importlib.machinery.SourceFileLoader("__main__", path),
                     __spec__=None, __annotations__={}, __builtins__=builtins,
                     __file__=path, __cached__=None)
    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)
    _run_trimmed(lambda: exec(code, namespace), path)


def _run_module(name):
    import runpy

    sys.path[0] = os.getcwd()
    _run_trimmed(lambda: runpy._run_module_as_main(name, alter_argv=True), "<frozen runpy>")


def main():
    fd = int(os.environ.pop("TRAINGUARD_STANDBY_FD"))
    imports = os.environ.pop("TRAINGUARD_STANDBY_IMPORTS")
    made_for = os.environ.pop("TRAINGUARD_STANDBY_TARGET")
    nice = os.environ.pop("TRAINGUARD_STANDBY_NICE", None)
    python_env = {k: v for k, v in os.environ.items() if k.startswith("PYTHON")}
    sock = socket.socket(fileno=fd)
    script = made_for if not made_for.startswith("-m ") else ""
    own = own_directories(script)
    # Imports resolve as the rank's would: its script's directory first.
    sys.path[0] = own[0]
    import time

    t0 = time.monotonic()
    try:
        names = _import_list(imports)
    except OSError as e:
        _send(sock, {"ready": False, "reason": "cannot read the import list: %s" % e})
        return 1
    import importlib

    imported = 0
    for name in names:
        if name in sys.modules:
            continue
        parent = name.rpartition(".")[0]
        try:
            importlib.import_module(name)
            imported += 1
        except BaseException as e:  # noqa: B902 - any failure means not like the rank
            if parent and parent in sys.modules:
                continue  # a name its package registers by hand (aliases, lazy modules)
            _send(sock, {"ready": False, "reason": "import of %s failed: %s: %s"
                         % (name, type(e).__name__, e)})
            return 1
    import_s = time.monotonic() - t0
    for name, module in list(sys.modules.items()):
        if name != "__main__" and not is_own_module(module, []) and in_own_directories(module, own):
            _send(sock, {"ready": False, "reason": "importing pulled in the script's own module %s" % name})
            return 1
    watched = _watched(script)
    if nice is not None:
        try:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, 0, int(nice))
        except OSError as e:
            _send(sock, {"ready": False, "reason": "cannot restore the priority: %s" % e})
            return 1
    rss_kb = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss_kb = int(line.split()[1])
    except OSError:
        pass
    _send(sock, {"ready": True, "modules": imported, "import_s": round(import_s, 3), "rss_kb": rss_kb,
                 "threads": _threads()})
    try:
        data, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 2)
    except OSError:
        return 1
    if not data:
        return 0  # the agent let it go
    order = json.loads(data)
    reason = _refusal(order, made_for, watched, python_env) if len(fds) == 2 else "no streams attached"
    if reason is not None:
        _send(sock, {"ok": False, "reason": reason})
        return 1
    _send(sock, {"ok": True})
    sock.close()
    del sock, watched, names
    _become(order, fds)
    _instrument()
    if "module" in order:
        _run_module(order["module"])
    else:
        _run_script(order["script"])
    return 0
