"""Accuracy and calibration of `trainguard attribute` on real failure logs.

Runs the command on every log of a labelled JSONL file (default: the shared
dev set, ../shared/data/failure-logs/dev.jsonl, quoted verbatim from public
bug reports) and prints the accuracy per category and overall, and the
confusion matrix. Baseline in the same run: always answering the most
frequent category.

    /usr/bin/python3 bench/attribution_eval.py [--data FILE] [--show-misses]
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("TRAINGUARD_BUILD", os.path.join(ROOT, "build"))
CATEGORIES = ["gpu_hardware", "network", "node_failure", "storage", "comm_hang", "cuda_software",
              "oom", "numeric", "user_code", "other"]


# A naive first-match keyword list: the baseline the issue names.
KEYWORDS = [("gpu_hardware", ("xid", "ecc", "fallen off the bus", "nvlink")),
            ("network", ("ib", "infiniband", "rdma", "connection reset", "network")),
            ("node_failure", ("node failure", "node down", "kernel panic", "preempt")),
            ("storage", ("no space", "disk", "i/o error", "quota")),
            ("comm_hang", ("timeout", "timed out", "watchdog")),
            ("cuda_software", ("illegal memory access", "cuda error", "no kernel image")),
            ("oom", ("out of memory", "oom", "killed", "-9")),
            ("numeric", ("nan", "inf", "overflow")),
            ("user_code", ("error:", "exception", "traceback"))]


def first_keyword(log):
    low = log.lower()
    for category, words in KEYWORDS:
        if any(w in low for w in words):
            return category
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "failure-logs", "dev.jsonl"))
    ap.add_argument("--show-misses", action="store_true")
    args = ap.parse_args()
    records = [json.loads(l) for l in open(args.data) if l.strip()]
    splits = sorted({r.get("split", "") for r in records} - {""})
    if splits:  # a corpus with splits: report each part apart, then the whole
        for split in splits:
            evaluate([r for r in records if r.get("split") == split], "%s [split %s]" % (args.data, split),
                     args.show_misses)
            print()
    evaluate(records, args.data, args.show_misses)


def evaluate(records, name, show_misses):
    confusion = collections.defaultdict(collections.Counter)
    misses = []
    by_confidence = collections.defaultdict(lambda: [0, 0])  # bin -> [right, all]
    with tempfile.TemporaryDirectory() as tmp:
        for rec in records:
            path = os.path.join(tmp, rec["id"] + ".log")
            with open(path, "w") as f:
                f.write(rec["log"])
            out = subprocess.run([os.path.join(BUILD, "trainguard"), "attribute", "--json", path],
                                 capture_output=True, text=True, check=True)
            got = json.loads(out.stdout)
            confusion[rec["label"]][got["category"]] += 1
            b = min(int(got["confidence"] * 5), 4)
            by_confidence[b][0] += got["category"] == rec["label"]
            by_confidence[b][1] += 1
            if got["category"] != rec["label"]:
                misses.append((rec["id"], rec["label"], got["category"], got["rule"]))
    total = len(records)
    correct = sum(confusion[c][c] for c in confusion)
    majority = max(collections.Counter(r["label"] for r in records).values())
    print("%d logs from %s" % (total, name))
    print("%-14s %5s %8s" % ("category", "logs", "accuracy"))
    for c in CATEGORIES:
        n = sum(confusion[c].values())
        if n:
            print("%-14s %5d %7.0f%%" % (c, n, 100.0 * confusion[c][c] / n))
    keyword = sum(1 for r in records if first_keyword(r["log"]) == r["label"])
    print("overall: %.1f%% (%d/%d)   baselines: the most frequent label %.1f%%, first keyword match %.1f%%"
          % (100.0 * correct / total, correct, total, 100.0 * majority / total, 100.0 * keyword / total))
    print("\nconfusion matrix (rows: label, columns: answer)")
    short = [c[:6] for c in CATEGORIES]
    print("%-14s " % "" + " ".join("%6s" % s for s in short))
    for c in CATEGORIES:
        if sum(confusion[c].values()):
            print("%-14s " % c + " ".join("%6s" % (confusion[c][d] or ".") for d in CATEGORIES))
    print("\ncalibration: how often an answer of a given confidence was right")
    for b in range(5):
        right, n = by_confidence[b]
        if n:
            print("  confidence %.1f-%.1f: %3d answers, %5.1f%% right" % (b / 5, (b + 1) / 5, n, 100.0 * right / n))
    if show_misses:
        for m in misses:
            print("miss %s: label %s, answered %s (rule %s)" % m)


if __name__ == "__main__":
    main()
