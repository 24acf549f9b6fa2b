"""The collective stages of a diagnosis round, as a job runs them: ROUNDS jobs
of NODES nodes x 2 ranks in racks of 2 (`run --netns --nodes-per-rack 2
--diagnose quick`, a script that does nothing), each with its preflight round.

Prints, per collective figure, the spread over every node run (min, median,
max, and the lowest run as a fraction of its round's median: what the
fraction-of-median check sees on healthy nodes), the false positives (healthy
nodes evicted), and the wall time of each stage per node beside the baseline
of starting the job's Python with `import torch.distributed` in the same run
(what each probe pays before it measures anything). Needs root (namespaces).

    /usr/bin/python3 bench/collective_bench.py [--rounds 10] [--nodes 4]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
from conftest import PYTHON, TRAINGUARD, events  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--nodes", type=int, default=4)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("needs root: the nodes are network namespaces")
        return 2
    baseline = []
    for _ in range(5):
        start = time.monotonic()
        subprocess.run([PYTHON, "-c", "import torch.distributed"], check=True)
        baseline.append(time.monotonic() - start)
    values, lowest, walls, evicted = {}, {}, {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            store = os.path.join(tmp, "r%d.db" % r)
            job = "collectives%d" % r
            done = subprocess.run([TRAINGUARD, "run", "--netns", "--nodes-per-rack", "2", "--nnodes",
                                   str(args.nodes), "--nproc-per-node", "2", "--diagnose", "quick",
                                   "--store", store, "--job-id", job, "--run-dir", os.path.join(tmp, "run%d" % r),
                                   "--", PYTHON, "-c", "pass"], capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                print(done.stderr[-2000:])
                return 1
            per_round = {}
            for e in events(store, job):
                if e["kind"] == "node_evicted":
                    evicted.append((r, e["node"], e["message"]))
                if e["kind"] != "diagnostics" or e["detail"]["stage"] == "suite":
                    continue
                walls.setdefault(e["detail"]["stage"], []).append(e["detail"]["wall_ms"] / 1000)
                for f in e["detail"]["figures"]:
                    if "error" in f:
                        evicted.append((r, e["node"], f["name"] + ": " + f["error"]))
                        continue
                    values.setdefault(f["name"], []).append(f["value"])
                    per_round.setdefault(f["name"], []).append(f["value"])
            for name, vs in per_round.items():
                lowest[name] = min(lowest.get(name, 1e9), min(vs) / statistics.median(vs))
    runs = args.rounds * args.nodes
    print("collective stages of the quick round, %d rounds x %d nodes x 2 ranks, racks of 2 (%d node runs)"
          % (args.rounds, args.nodes, runs))
    print("%-22s %9s %9s %9s %20s" % ("figure (GB/s, busbw)", "min", "median", "max", "lowest/round median"))
    for name, vs in values.items():
        print("%-22s %9.3f %9.3f %9.3f %20.2f" % (name, min(vs), statistics.median(vs), max(vs), lowest[name]))
    print("false positives or errors: %d of %d node runs" % (len(evicted), runs))
    for r, node, why in evicted:
        print("  round %d %s: %s" % (r, node, why))
    for stage, ws in walls.items():
        print("%s stage wall time per node: median %.2f s, max %.2f s" % (stage, statistics.median(ws), max(ws)))
    print("baseline, `%s -c 'import torch.distributed'`: median %.2f s" % (PYTHON, statistics.median(baseline)))
    return 1 if evicted else 0


if __name__ == "__main__":
    sys.exit(main())
