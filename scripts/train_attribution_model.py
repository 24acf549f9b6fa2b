"""Trains attribution's learned fallback: rules/attribution_model.json.

    /usr/bin/python3 scripts/train_attribution_model.py            # retrain, write the file
    /usr/bin/python3 scripts/train_attribution_model.py --check    # retrain, compare with the shipped file

What it does, deterministically (the same corpus and the same trainguard give
the same file, byte for byte):
  1. Takes the `read` split of tests/data/failure-logs/corpus.jsonl and of
     healthy.jsonl (the output of healthy runs, class "none"; the held-out
     splits are never trained on) and reads each log's features from
     `trainguard attribute --features`, the code the attribution path runs.
  2. Keeps the features of 2 or more training logs; a log's vector is 1 for
     each of its known features, scaled to unit length.
  3. Fits a multinomial logistic regression (scikit-learn, lbfgs), its
     regularization chosen by 5-fold cross-validation on the training logs.
  4. Fits a temperature on the cross-validated (out-of-fold) scores, so the
     probabilities the model reports are calibrated.
  5. Measures the rules' own confidence on the logs never read (splits
     held_out and unread) for `rule_calibration` (by bins of their raw
     confidence, smoothed) and `rule_record` (each answering rule's answers
     and right answers there), leaving out the chronological held-out part
     (scripts/chrono_split.py: the newest 150 logs never read), on which
     the calibration is then tested.
The file records the training data's sha256, so a model says what it learned from.
"""

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from chrono_split import chrono_test  # noqa: E402
# The attribution categories, then "none": text that tells no failure (the
# healthy output of training runs, tests/data/failure-logs/healthy.jsonl).
# The model never answers "none"; it learns from it what routine output says.
CATEGORIES = ["gpu_hardware", "network", "node_failure", "storage", "comm_hang", "cuda_software",
              "oom", "numeric", "user_code", "other", "none"]
MIN_LOGS_PER_FEATURE = 2
C_GRID = [0.3, 1, 3, 10, 30, 100]
FOLDS = 5
SEED = 20261127
ANSWER_FROM = 0.5  # the model answers only when more likely right than wrong
# Upper bounds of the rules' raw confidence bins: no rule (0.2), a symptom
# or contested causes (<0.5), a cause with a rival (<0.8), a clear cause.
RULE_BINS = [0.3, 0.5, 0.8, 1.0]
# A rule's record weighs against its bin as a prior of this many answers
# (log_model.h, CalibrateRule): chosen as 2, before the chronological
# held-out part was scored with records (leave-one-out on the older logs
# never read gave 2 and 4 alike).
RULE_RECORD_WEIGHT = 2


def run_trainguard(binary, args, log_texts, tmp):
    """`trainguard attribute --each ARGS` over the texts, one process for all: a JSON answer per text."""
    paths = []
    for i, text in enumerate(log_texts):
        paths.append(os.path.join(tmp, "log%d" % i))
        with open(paths[-1], "w") as f:
            f.write(text)
    env = dict(os.environ, TRAINGUARD_MODEL="none")
    out = subprocess.run([binary, "attribute", "--each", *args, *paths], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit("trainguard attribute failed: " + out.stderr)
    answers = [json.loads(line) for line in out.stdout.splitlines()]
    if len(answers) != len(paths):
        sys.exit("trainguard attribute --each gave %d answers for %d logs" % (len(answers), len(paths)))
    return answers


def data_hash(records):
    h = hashlib.sha256()
    for r in sorted(records, key=lambda r: r["id"]):
        h.update(json.dumps([r["id"], r["label"], r["log"]], ensure_ascii=False).encode())
    return h.hexdigest()


def design(feature_lists, vocab):
    index = {f: i for i, f in enumerate(vocab)}
    x = np.zeros((len(feature_lists), len(vocab)))
    for row, feats in enumerate(feature_lists):
        known = [index[f] for f in feats if f in index]
        if known:
            x[row, known] = 1.0 / math.sqrt(len(known))
    return x


def fit(x, y, c):
    return LogisticRegression(C=c, max_iter=20000, tol=1e-10).fit(x, y)


def out_of_fold_scores(x, y, c):
    scores = np.zeros((len(y), len(CATEGORIES)))
    for train, test in StratifiedKFold(FOLDS, shuffle=True, random_state=SEED).split(x, y):
        m = fit(x[train], y[train], c)
        part = np.full((len(test), len(CATEGORIES)), -1e9)  # a class absent from a fold: never chosen
        part[:, m.classes_] = m.decision_function(x[test])
        scores[test] = part
    return scores


def nll(scores, y, t):
    z = scores / t
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(y)), y].mean()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=os.path.join(ROOT, "tests", "data", "failure-logs", "corpus.jsonl"))
    ap.add_argument("--healthy", default=os.path.join(ROOT, "tests", "data", "failure-logs", "healthy.jsonl"))
    ap.add_argument("--trainguard", default=os.path.join(os.environ.get("TRAINGUARD_BUILD", os.path.join(ROOT, "build")), "trainguard"))
    ap.add_argument("--out", default=os.path.join(ROOT, "rules", "attribution_model.json"))
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args()
    records = [json.loads(l) for l in open(args.data) if l.strip()]
    healthy = [json.loads(l) for l in open(args.healthy) if l.strip()]
    train = [r for r in records + healthy if r.get("split") == "read"]
    test_ids = {r["id"] for r in chrono_test(records)}
    held = [r for r in records if r.get("split") in ("held_out", "unread") and r["id"] not in test_ids]
    if not train:
        sys.exit("no `read` records in " + args.data)
    with tempfile.TemporaryDirectory() as tmp:
        feats = run_trainguard(args.trainguard, ["--features"], [r["log"] for r in train], tmp)
        rule_answers = run_trainguard(args.trainguard, ["--json", "--no-model"], [r["log"] for r in held], tmp)
    y = np.array([CATEGORIES.index(r["label"]) for r in train])
    count = {}
    for fl in feats:
        for f in fl:
            count[f] = count.get(f, 0) + 1
    vocab = sorted(f for f, n in count.items() if n >= MIN_LOGS_PER_FEATURE)
    x = design(feats, vocab)

    best = None
    for c in C_GRID:
        s = out_of_fold_scores(x, y, c)
        acc = float((s.argmax(axis=1) == y).mean())
        print("C=%-5g cross-validated accuracy %.3f" % (c, acc), file=sys.stderr)
        if best is None or acc > best[0] + 1e-12:
            best = (acc, c, s)
    acc, c, oof = best
    temps = [round(0.1 * k, 2) for k in range(1, 81)]
    temperature = min(temps, key=lambda t: (nll(oof, y, t), t))
    model = fit(x, y, c)
    weights = np.zeros((len(vocab), len(CATEGORIES)))
    bias = np.zeros(len(CATEGORIES))
    if len(model.classes_) != len(CATEGORIES):
        sys.exit("every category needs training logs; missing: " +
                 ", ".join(CATEGORIES[i] for i in range(len(CATEGORIES)) if i not in model.classes_))
    weights[:, model.classes_] = model.coef_.T
    bias[model.classes_] = model.intercept_

    calibration = []
    lo = 0.0
    for hi in RULE_BINS:
        inside = [(a, r) for a, r in zip(rule_answers, held) if lo < a["raw_confidence"] <= hi]
        right = sum(a["category"] == r["label"] for a, r in inside)
        # Smoothed toward the bin's middle: a bin of few answers says little.
        calibration.append([hi, round((right + (lo + hi)) / (len(inside) + 2), 4)])
        lo = hi
    record = {}
    for a, r in zip(rule_answers, held):
        if a.get("rule"):
            rec = record.setdefault(a["rule"], [0, 0])
            rec[0] += 1
            rec[1] += a["category"] == r["label"]

    out = {
        "format": "trainguard-attribution-model",
        "version": 1,
        "model": "multinomial logistic regression over binary features (attribute --features), "
                 "rows scaled to unit length; probabilities = softmax(scores / temperature)",
        "trained_on": {"data": [os.path.relpath(args.data, ROOT), os.path.relpath(args.healthy, ROOT)],
                       "split": "read", "logs": len(train),
                       "sha256": data_hash(train)},
        "regularization_C": c,
        "cross_validated_accuracy": round(acc, 4),
        "temperature": temperature,
        "answer_from": ANSWER_FROM,
        "rule_calibration": calibration,
        "rule_calibration_from": {"split": "held_out and unread", "logs": len(held),
                                  "bins": "raw confidence upper bounds",
                                  "leaving_out": "the chronological held-out part (%d logs)" % len(test_ids)},
        "rule_record": {k: record[k] for k in sorted(record)},
        "rule_record_weight": RULE_RECORD_WEIGHT,
        "classes": CATEGORIES,
        "bias": [round(float(b), 5) for b in bias],
        "features": {f: [round(float(w), 5) for w in weights[i]] for i, f in enumerate(vocab)},
    }
    text = json.dumps(out, sort_keys=False, ensure_ascii=True, indent=None, separators=(",", ":"))
    text = text.replace(',"features":{', ',"features":{\n').replace('],"', '],\n"') + "\n"
    print("%d training logs, %d features, C=%g, cross-validated accuracy %.3f, temperature %.2f"
          % (len(train), len(vocab), c, acc, temperature), file=sys.stderr)
    if args.check:
        shipped = open(args.out).read()
        if shipped != text:
            sys.exit("%s differs from a retrain: run scripts/train_attribution_model.py" % args.out)
        print("%s is what retraining gives" % args.out, file=sys.stderr)
        return
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
