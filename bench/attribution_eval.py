"""Accuracy and calibration of `trainguard attribute` on real failure logs.

Runs the command on every log of a labelled JSONL file (default: the shared
dev set, ../shared/data/failure-logs/dev.jsonl, quoted verbatim from public
bug reports), twice: with the learned model (as shipped) and with the rules
alone (--no-model). Prints, per split of the file (a corpus with splits) and
for the whole: the accuracy of both per category and overall, beside two
baselines from the same run (always the most frequent label; a naive
first-match keyword list), how the model's answers fared, the confusion
matrix, the calibration table with its expected calibration error, and what
an action floor (--min-confidence) would act on: how many answers reach it,
how many of those are right with the 95 % Wilson interval's lower bound,
and how many recommend evicting a node and rest on a hardware-labelled log.
Rows with a `date` (the corpus) are also split chronologically: the newest
--chrono-test logs (default 150) are reported apart, all of them and those
never read for rule work or training (split held_out or unread).
With --healthy FILE (output of healthy runs, label "none"): how many of
those got a finding at all, a hardware one, or an eviction, per split.
With --multi: multi-failure logs built from pairs of the file's real logs
(multi_failure_pairs below), the cascade appended to its cause and, apart,
interleaved with it from halfway through and from the start, scored on the
cause and on the cascade's lines kept as linked symptoms.

    /usr/bin/python3 bench/attribution_eval.py [--data FILE] [--healthy FILE] [--multi] [--show-misses]
"""

import argparse
import collections
import json
import math
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from chrono_split import CHRONO_TEST, chrono_test  # noqa: E402
BUILD = os.environ.get("TRAINGUARD_BUILD", os.path.join(ROOT, "build"))
CATEGORIES = ["gpu_hardware", "network", "node_failure", "storage", "comm_hang", "cuda_software",
              "oom", "numeric", "user_code", "other"]
CALIBRATION_BINS = 5
# The precision-coverage curve: 0.5 is the default of --min-confidence.
MIN_CONFIDENCES = (0.0, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)


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


def attribute_all(paths, extra):
    """`trainguard attribute --json --each` over the files, one process for all: an answer per file."""
    out = subprocess.run([os.path.join(BUILD, "trainguard"), "attribute", "--json", "--each", *extra, *paths],
                         capture_output=True, text=True, check=True)
    answers = [json.loads(line) for line in out.stdout.splitlines()]
    if len(answers) != len(paths):
        sys.exit("trainguard attribute --each gave %d answers for %d logs" % (len(answers), len(paths)))
    return answers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "failure-logs", "dev.jsonl"))
    ap.add_argument("--healthy", help="healthy output (label none): no finding is the right answer")
    ap.add_argument("--multi", action="store_true", help="also score multi-failure logs built from pairs")
    ap.add_argument("--show-misses", action="store_true")
    ap.add_argument("--chrono-test", type=int, default=CHRONO_TEST,
                    help="the newest N dated logs form the chronological held-out part")
    args = ap.parse_args()
    records = [json.loads(l) for l in open(args.data) if l.strip()]
    healthy = [json.loads(l) for l in open(args.healthy) if l.strip()] if args.healthy else []
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, rec in enumerate(records + healthy):
            paths.append(os.path.join(tmp, "%d.log" % i))
            with open(paths[-1], "w") as f:
                f.write(rec["log"])
        for rec, with_model, rules_alone in zip(records + healthy, attribute_all(paths, []),
                                                attribute_all(paths, ["--no-model"])):
            rec["with_model"], rec["rules_alone"] = with_model, rules_alone
    splits = sorted({r.get("split", "") for r in records} - {""})
    if splits:  # a corpus with splits: report each part apart, then the whole
        for split in splits:
            evaluate([r for r in records if r.get("split") == split], "%s [split %s]" % (args.data, split),
                     args.show_misses)
            print()
    evaluate(records, args.data, args.show_misses)
    dated = sorted((r for r in records if r.get("date")), key=lambda r: (r["date"], r["id"]))
    if len(dated) > args.chrono_test:
        newer = dated[-args.chrono_test:]
        older_read = [r for r in dated[:-args.chrono_test] if r.get("split") == "read"]
        print("\nchronological split: the %d newest logs, %s to %s, against %d older (%s to %s)"
              % (len(newer), newer[0]["date"], newer[-1]["date"], len(dated) - len(newer), dated[0]["date"],
                 dated[-len(newer) - 1]["date"]))
        print("(the rules were written from the read split and the model trained on it: %d of the newest were read,"
              " %d of the older)" % (sum(r.get("split") == "read" for r in newer), len(older_read)))
        print()
        evaluate(newer, "the newest %d" % len(newer), args.show_misses, brief=True)
        # The chronological held-out part: the same count of the newest logs
        # that no rule was written from, the model never saw and the rules'
        # calibration left out (scripts/chrono_split.py).
        unseen = chrono_test(records, args.chrono_test)
        print()
        evaluate(unseen, "the newest %d never read (held out or unread), %s to %s"
                 % (len(unseen), unseen[0]["date"], unseen[-1]["date"]), args.show_misses, brief=True)
    if healthy:
        print()
        precision(healthy, args.healthy)
    if args.multi:
        print()
        multi_failure(records, args.show_misses)


def interleave(cause, cascade, start):
    """The lines of two logs merged as a job log merges its ranks' output by
    time: the cause's lines spread evenly over [0, 1), the cascade's over
    [start, start + 1); ties go to the cause."""
    a, b = cause.split("\n"), cascade.split("\n")
    timed = [(i / len(a), 0, i, l) for i, l in enumerate(a)] + \
            [(start + j / len(b), 1, j, l) for j, l in enumerate(b)]
    return "\n".join(l for *_, l in sorted(timed))


def multi_failure_pairs(records, seed=20261127, start=None):
    """A job log with a cause and then its cascade: every log whose label is a
    cause (not comm_hang, not other) followed, as a later part of the same job
    log, by the lines of a real collective-timeout log (label comm_hang) drawn
    with `seed`. The right answer is the first log's label; the timeouts are
    its symptoms. (Real logs rarely share a timestamp format, so "later" is
    the order of the lines, as a merged job log puts a cascade after its cause.)
    With `start` (0-1), the two are interleaved instead: the cascade's lines
    begin that far into the cause's (interleave above), so cascade lines may
    come before the cause's own failure lines."""
    rng = random.Random(seed)
    hangs = [r for r in records if r["label"] == "comm_hang"]
    pairs = []
    for r in records:
        if r["label"] in ("comm_hang", "other") or not hangs:
            continue
        h = rng.choice(hangs)
        log = r["log"] + "\n" + h["log"] if start is None else interleave(r["log"], h["log"], start)
        pairs.append({"id": r["id"] + "+" + h["id"], "label": r["label"], "split": r.get("split", ""),
                      "log": log, "cascade": h["log"]})
    return pairs


def multi_failure(records, show_misses):
    multi_failure_part(records, show_misses, None,
                       "a cause, then a real collective-timeout log as its cascade")
    for start, when in ((0.5, "from halfway through"), (0.0, "from the start")):
        print()
        multi_failure_part(records, show_misses, start,
                           "a cause and a real collective-timeout log interleaved, the cascade " + when)


def multi_failure_part(records, show_misses, start, title):
    pairs = multi_failure_pairs(records, start=start)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i, p in enumerate(pairs):
            paths.append(os.path.join(tmp, "multi%d.log" % i))
            with open(paths[-1], "w") as f:
                f.write(p["log"])
        for p, got in zip(pairs, attribute_all(paths, [])):
            p["got"] = got
    by_id = {r["id"]: r for r in records}
    print("%d multi-failure logs (%s)" % (len(pairs), title))
    for split in sorted({p["split"] for p in pairs}):
        part = [p for p in pairs if p["split"] == split]
        # Pairs whose cause the attribution reads right on its own: does the cascade change that?
        alone_right = [p for p in part if by_id[p["id"].split("+")[0]]["with_model"]["category"] == p["label"]]
        right = [p for p in alone_right if p["got"]["category"] == p["label"]]
        linked = [p for p in right if any(e["role"] == "symptom" and e["category"] == "comm_hang"
                                          for e in p["got"]["evidence"])]
        print("  %-9s %3d pairs; of the %d whose cause is read right alone: cause kept %d (%.1f%%), "
              "timeouts linked as symptoms %d" % (split or "all", len(part), len(alone_right), len(right),
                                                 100.0 * len(right) / max(len(alone_right), 1), len(linked)))
        if show_misses:
            for p in alone_right:
                if p not in right:
                    print("  multi miss %s: label %s, answered %s (rule %s)"
                          % (p["id"], p["label"], p["got"]["category"], p["got"]["rule"]))


def precision(records, name):
    """Healthy output: any category other than `other`, or any rule or model answer, is a false finding."""
    print("%d healthy logs from %s: false findings" % (len(records), name))
    for split in sorted({r.get("split", "") for r in records}):
        part = [r for r in records if r.get("split", "") == split]
        for key, title in (("with_model", "with the model"), ("rules_alone", "rules alone")):
            found = [r for r in part if r[key]["answered_by"] != "none"]
            print("  %-9s %-15s %2d/%d answered (%s), hardware %d, eviction %d"
                  % (split or "all", title, len(found), len(part),
                     ", ".join("%s:%s" % (r["id"], r[key]["rule"]) for r in found) or "none",
                     sum(r[key]["hardware"] for r in found), sum(r[key]["action"] == "evict_node" for r in found)))


def calibration(records):
    """Rows (low, high, answers, right, mean confidence) and the expected calibration error."""
    bins = collections.defaultdict(list)
    for r in records:
        got = r["with_model"]
        b = min(int(got["confidence"] * CALIBRATION_BINS), CALIBRATION_BINS - 1)
        bins[b].append((got["confidence"], got["category"] == r["label"]))
    rows, ece = [], 0.0
    for b in range(CALIBRATION_BINS):
        if bins[b]:
            n = len(bins[b])
            right = sum(ok for _, ok in bins[b])
            mean = sum(c for c, _ in bins[b]) / n
            rows.append((b / CALIBRATION_BINS, (b + 1) / CALIBRATION_BINS, n, right, mean))
            ece += n / len(records) * abs(right / n - mean)
    return rows, ece


def wilson_lower(right, n, z=1.96):
    """The lower bound of the Wilson score interval (95 % for z = 1.96) of a
    proportion right/n: what the point figure guarantees on this many logs."""
    if n == 0:
        return 0.0
    p = right / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - spread) / (1 + z * z / n)


def acting_curve(records):
    """Per confidence floor: the answers an action would follow, how many are
    right (with the 95 % lower bound), and the evictions recommended."""
    total = len(records)
    print("\nacting on confidence (--min-confidence C): the answers an action would follow")
    print("  %-5s %17s %9s %11s %28s" % ("C", "answers >= C", "right", "95% lower", "evictions (hardware label)"))
    for floor in MIN_CONFIDENCES:
        acted = [r for r in records if r["with_model"]["confidence"] >= floor]
        ok = sum(r["with_model"]["category"] == r["label"] for r in acted)
        evict = [r for r in acted if r["with_model"]["action"] == "evict_node"]
        print("  %-5.2f %9d (%5.1f%%) %8.1f%% %10.1f%% %18d (%d)"
              % (floor, len(acted), 100.0 * len(acted) / max(total, 1), 100.0 * ok / max(len(acted), 1),
                 100.0 * wilson_lower(ok, len(acted)), len(evict),
                 sum(r["label"] in ("gpu_hardware", "network", "node_failure", "storage") for r in evict)))


def evaluate(records, name, show_misses, brief=False):
    total = len(records)
    right = lambda key: [r for r in records if r[key]["category"] == r["label"]]
    with_model, alone = right("with_model"), right("rules_alone")
    majority = max(collections.Counter(r["label"] for r in records).values())
    keyword = sum(1 for r in records if first_keyword(r["log"]) == r["label"])
    print("%d logs from %s" % (total, name))
    print("%-14s %5s %12s %12s" % ("category", "logs", "with model", "rules alone"))
    for c in CATEGORIES:
        of = [r for r in records if r["label"] == c]
        if of:
            print("%-14s %5d %11.0f%% %11.0f%%" % (c, len(of), 100.0 * sum(r in with_model for r in of) / len(of),
                                                  100.0 * sum(r in alone for r in of) / len(of)))
    print("overall: with the model %.1f%% (%d/%d), rules alone %.1f%% (%d/%d)"
          % (100.0 * len(with_model) / total, len(with_model), total, 100.0 * len(alone) / total, len(alone), total))
    print("baselines: the most frequent label %.1f%%, first keyword match %.1f%%"
          % (100.0 * majority / total, 100.0 * keyword / total))
    if brief:
        rows, ece = calibration(records)
        print("calibration: " + "; ".join("%.1f-%.1f %d right %.1f%% (mean %.2f)" % (lo, hi, n, 100.0 * ok / n, mean)
                                          for lo, hi, n, ok, mean in rows) + "; ECE %.3f" % ece)
        acting_curve(records)
        return
    answered = [r for r in records if r["with_model"]["answered_by"] == "model"]
    fixed = sum(1 for r in answered if r in with_model and r not in alone)
    broke = sum(1 for r in answered if r not in with_model and r in alone)
    print("the model answered %d log(s): %d right (%d the rules had wrong), %d wrong (%d the rules had right)"
          % (len(answered), sum(r in with_model for r in answered), fixed,
             sum(r not in with_model for r in answered), broke))
    hardware = [r for r in answered if r["with_model"]["hardware"]]
    print("model answers of a hardware category: %d, recommending eviction: %d"
          % (len(hardware), sum(r["with_model"]["action"] == "evict_node" for r in answered)))
    print("\nconfusion matrix with the model (rows: label, columns: answer)")
    short = [c[:6] for c in CATEGORIES]
    print("%-14s " % "" + " ".join("%6s" % s for s in short))
    confusion = collections.defaultdict(collections.Counter)
    for r in records:
        confusion[r["label"]][r["with_model"]["category"]] += 1
    for c in CATEGORIES:
        if sum(confusion[c].values()):
            print("%-14s " % c + " ".join("%6s" % (confusion[c][d] or ".") for d in CATEGORIES))
    rows, ece = calibration(records)
    print("\ncalibration with the model: how often an answer of a given confidence was right")
    print("  %-11s %7s %7s %15s" % ("confidence", "answers", "right", "mean confidence"))
    for lo, hi, n, ok, mean in rows:
        print("  %.1f-%.1f     %7d %6.1f%% %15.2f" % (lo, hi, n, 100.0 * ok / n, mean))
    print("  expected calibration error: %.3f" % ece)
    acting_curve(records)
    if show_misses:
        for r in records:
            if r not in with_model:
                got = r["with_model"]
                print("miss %s: label %s, answered %s (rule %s, by %s, confidence %.2f)"
                      % (r["id"], r["label"], got["category"], got["rule"], got["answered_by"], got["confidence"]))


if __name__ == "__main__":
    main()
