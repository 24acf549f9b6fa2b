// The job's knobs, defined once. Each row names a JobConfig member, the
// command-line flag that sets it (none for the few that are fixed), its
// kind, the values it accepts, its help and — from JobConfig{} — its
// default. From this one table come: the options of `run`, `torchrun` and
// `controller` (cli/main.cc), their parsing and checks, the `knobs` object
// of the job_created record (docs/events.md) and docs/reference.md
// (`trainguard knobs`; tests/test_docs.py checks it is current).
//
// Pure data and pure functions; thread-safe (the table is immutable).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "controller/job_config.h"
#include "trainguard/status.h"

namespace trainguard {

enum class KnobKind {
  kCount,    // a whole number
  kSeconds,  // seconds (fractions allowed), kept as Nanos
  kRatio,    // a real number (0.07 = 7 %)
  kChoice,   // one of `choices`
  kFlag,     // on when given (no value)
};

struct Knob {
  std::string name;   // snake_case: the key in job_created's `knobs`, the docs' name
  std::string flags;  // CLI11 spelling ("--max-restarts,--max_restarts"); "" = not settable
  KnobKind kind = KnobKind::kCount;
  std::string help;   // one sentence; the default is added where shown
  double min = 0;     // kCount, kSeconds, kRatio: the smallest value accepted ...
  bool min_exclusive = false;  // ... or the value it must exceed
  double max = 1e18;
  std::vector<std::string> choices;  // kChoice
  std::string special;               // a word accepted besides a number ("auto"), "" if none
  // The member's value as text, the way the flag takes it ("300", "0.07", "auto").
  std::function<std::string(const JobConfig&)> get;
  // Sets the member from a value already checked (a number, a choice, or `special`).
  std::function<void(JobConfig*, const std::string&)> put;

  // The first of `flags` ("--max-restarts"), "" if none.
  std::string Flag() const;
};

// Every knob, in the order the docs list them.
const std::vector<Knob>& JobKnobs();

// Checks `text` against the knob and sets it. InvalidArgument naming the flag
// and what it accepts ("--missed-heartbeats: '0' must be at least 1").
Status SetKnob(const Knob& knob, const std::string& text, JobConfig* config);

// {"max_restarts": 3, "hang_timeout_s": 300, ...}: every knob's value, numbers
// as numbers (seconds as seconds), for the job_created record.
std::string KnobsJson(const JobConfig& config);

// docs/reference.md: one table of every knob (flag, default, accepted, what).
std::string KnobsMarkdown();

}  // namespace trainguard
