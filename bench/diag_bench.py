"""The quick diagnostics suite on this machine, as `trainguard diag` runs it:
ROUNDS rounds of NODES "nodes" (distinct node ids, run one after the other so
that they do not measure each other), each round judged as one job's nodes.

Prints, per figure, the spread over every run (min, median, max, and the
lowest run as a fraction of its round's median: what the fraction-of-median
check sees on healthy nodes), the false positives (healthy nodes flagged), and
the wall time of one quick-suite run beside the baseline of starting the
binary with `--help` in the same run (what the suite adds over launching it).

    /usr/bin/python3 bench/diag_bench.py [--rounds 10] [--nodes 4]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from conftest import TRAINGUARD  # noqa: E402


def timed(cmd):
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return time.monotonic() - start, proc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=4)
    args = ap.parse_args()
    values = {}          # figure -> every value
    lowest_fraction = {}  # figure -> lowest value / its round's median
    flagged = []
    walls = []
    baseline = [timed([TRAINGUARD, "--help"])[0] for _ in range(5)]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            store = os.path.join(tmp, f"round{r}.db")
            ckpt = os.path.join(tmp, "ckpt")
            os.makedirs(ckpt, exist_ok=True)
            for n in range(args.nodes):
                wall, proc = timed([TRAINGUARD, "diag", "--store", store, "--node-id", f"node-{n}",
                                    "--path", f"checkpoint={ckpt}", "--json"])
                walls.append(wall)
            proc = subprocess.run([TRAINGUARD, "diag", "--store", store, "--show", "--json"],
                                  capture_output=True, text=True, timeout=60)
            report = json.loads(proc.stdout)
            per_round = {}
            for node in report["nodes"]:
                if not node["healthy"]:
                    flagged.append((r, node["node"], node["failures"]))
                for f in node["figures"]:
                    values.setdefault(f["name"], []).append(f["value"])
                    per_round.setdefault(f["name"], []).append(f["value"])
            for name, vs in per_round.items():
                med = statistics.median(vs)
                if med > 0:
                    lowest_fraction[name] = min(lowest_fraction.get(name, 1e9), min(vs) / med)
    runs = args.rounds * args.nodes
    print(f"quick diagnostics suite, {args.rounds} rounds x {args.nodes} nodes ({runs} runs) on this machine")
    print(f"{'figure':28s} {'min':>9s} {'median':>9s} {'max':>9s} {'lowest/round median':>20s}")
    for name, vs in values.items():
        print(f"{name:28s} {min(vs):9.2f} {statistics.median(vs):9.2f} {max(vs):9.2f} "
              f"{lowest_fraction.get(name, float('nan')):20.2f}")
    print(f"false positives: {len(flagged)} of {runs} node runs flagged")
    for r, node, failures in flagged:
        print(f"  round {r} {node}: {'; '.join(failures)}")
    print(f"quick suite wall time per node: median {statistics.median(walls):.2f} s, max {max(walls):.2f} s "
          f"(baseline, `trainguard --help`: {statistics.median(baseline) * 1000:.0f} ms)")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
