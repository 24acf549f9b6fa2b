"""The docs name only what exists: every file path they give, every option
of a `trainguard` command line they show, every event kind docs/events.md
lists, and every doc the commands' --help points to. (Issue 21: the docs
had drifted from the code.)"""

import glob
import os
import re
import subprocess

from conftest import ROOT, TRAINGUARD

DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
COMMANDS = ["run", "controller", "agent", "events", "report", "hang", "nodes", "cordon", "uncordon", "diag",
            "attribute", "ckpt", "status", "trace", "heatmap", "sim"]
PATH = re.compile(r"(?<![/\w.])((?:src|docs|tests|bench|scripts|rules|python|examples|include|web)/[A-Za-z0-9_./-]*[A-Za-z0-9_])")


def help_text():
    text = ""
    for argv in [[]] + [[c] for c in COMMANDS] + [["ckpt", "ls"], ["ckpt", "verify"]]:
        done = subprocess.run([TRAINGUARD, *argv, "--help"], capture_output=True, text=True)
        text += done.stdout + done.stderr
    return text


def test_every_path_a_doc_or_help_names_exists():
    missing = []
    sources = [(os.path.basename(d), open(d).read()) for d in DOCS] + [("--help", help_text())]
    for name, text in sources:
        for path in set(PATH.findall(text)):
            if not os.path.exists(os.path.join(ROOT, path)) and not glob.glob(os.path.join(ROOT, path) + "*"):
                missing.append((name, path))
    assert not missing, missing


def test_every_option_of_a_trainguard_command_line_in_the_docs_exists():
    known = set(re.findall(r"(--[a-z][a-z0-9-]+)", help_text()))
    unknown = []
    for d in DOCS:
        for span in re.findall(r"`((?:build/)?trainguard [^`\n]+)`", open(d).read()) + \
                re.findall(r"\n((?:build/)?trainguard [^\n]+)", open(d).read()):
            for option in re.findall(r"(?<![\w-])(--[a-z][a-z0-9_-]*)", span.split(" -- ")[0]):
                if option.replace("_", "-") not in known:
                    unknown.append((os.path.basename(d), option, span[:80]))
    assert not unknown, unknown


def test_the_event_kinds_of_docs_events_are_the_controllers_table():
    done = subprocess.run([TRAINGUARD, "events", "--kinds"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    doc = open(os.path.join(ROOT, "docs", "events.md")).read()
    assert done.stdout in doc, "docs/events.md's table of kinds is stale: paste `build/trainguard events --kinds`"


def test_every_event_kind_is_recorded_somewhere():
    header = open(os.path.join(ROOT, "src", "controller", "event_kind.h")).read()
    kinds = re.findall(r"^  (k[A-Za-z]+),$", header.split("enum class EventKind {")[1].split("};")[0], re.M)
    assert len(kinds) > 40, kinds
    sources = ""
    for path in glob.glob(os.path.join(ROOT, "src", "**", "*.cc"), recursive=True):
        if not path.endswith("_test.cc") and not path.endswith("event_kind.cc"):
            sources += open(path).read()
    never = [k for k in kinds if "EventKind::" + k not in sources]
    assert not never, never


def test_the_reference_of_knobs_is_what_the_table_says():
    done = subprocess.run([TRAINGUARD, "knobs"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with open(os.path.join(ROOT, "docs", "reference.md")) as f:
        assert f.read() == done.stdout, "docs/reference.md is stale: build/trainguard knobs > docs/reference.md"
