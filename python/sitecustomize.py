"""trainguard's sitecustomize, on the PYTHONPATH of the ranks trainguard
launches: runs the sitecustomize this one shadows (the user's or the
distribution's), then instruments the rank (trainguard/_autoinstrument.py).
Does nothing else, and nothing at all outside trainguard."""


def _run_shadowed_sitecustomize():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _instrument():
    try:
        from trainguard import _autoinstrument
    except Exception as e:  # never break the rank
        import sys

        print("trainguard: automatic instrumentation unavailable: %r" % (e,), file=sys.stderr)
        return
    _autoinstrument.install()


_run_shadowed_sitecustomize()
_instrument()
del _run_shadowed_sitecustomize, _instrument
