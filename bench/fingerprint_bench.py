"""Cost of a parameter fingerprint (docs/sdc.md) beside the step it follows,
in the same run: a 1 GiB bf16 parameter set (default) on this machine's CPU
(and on a GPU when there is one), an SGD step over it (the step time, the
baseline), the fingerprint, and the K the instrumentation chooses for its
0.5 % budget, with the overhead that gives.

    /usr/bin/python3 bench/fingerprint_bench.py [--gib 1] [--runs 5] [--device cpu|cuda]
"""

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.environ.get("TRAINGUARD_BUILD", os.path.join(ROOT, "build")), "python"))

import torch  # noqa: E402

from trainguard import _core, _fingerprint  # noqa: E402


def timed(fn, device):
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    n = int(args.gib * (1 << 30)) // 2
    chunk = 1 << 26  # 64 Mi elements per tensor, as a model's layers
    params = [torch.nn.Parameter(torch.randn(min(chunk, n - i), dtype=torch.bfloat16, device=args.device))
              for i in range(0, n, chunk)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.SGD(params, lr=1e-3)
    opt.step()
    _fingerprint.fingerprint(_core, opt)
    steps = [timed(opt.step, args.device) for _ in range(args.runs)]
    prints = [timed(lambda: _fingerprint.fingerprint(_core, opt), args.device) for _ in range(args.runs)]
    step_s, cost_s = statistics.median(steps), statistics.median(prints)
    need = max(cost_s / (0.005 * step_s), _fingerprint.MIN_SPACING_S / step_s, 1.0)
    every = _fingerprint._pow2_at_least(need)
    print("%.2f GiB of bf16 parameters on %s, medians of %d:" % (args.gib, args.device, args.runs))
    print("  baseline: an SGD step over them   %8.4f s" % step_s)
    print("  one fingerprint                   %8.4f s  (%.1f %% of a step, %.2f GiB/s)"
          % (cost_s, 100 * cost_s / step_s, args.gib / cost_s))
    print("  chosen K (0.5 %% budget, >= %.2f s apart): every %d steps -> %.3f %% overhead"
          % (_fingerprint.MIN_SPACING_S, every, 100 * cost_s / (every * step_s)))


if __name__ == "__main__":
    main()
