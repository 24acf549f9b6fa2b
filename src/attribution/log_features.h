// The features a learned model reads from a failure log: what its lines say,
// in words and word pairs, plus the shape the structure-aware parse found
// (the exceptions that ended its tracebacks, the Python files and functions
// its frames name). Only lines that say something went wrong are read (the
// failure words of log_features.cc, or the parse's exceptions and C++
// frames): routine output is alike in failed and healthy runs. Of a
// launcher's failure summary only an exit code other than 1 ("exit:-9") and
// a traceback field's words are read: its headings, hosts and times are the
// same whatever failed.
// trainguard's own lines ("trainguard: ...") are left to the rules. Quoted
// source is not read (a quoted
// `raise ValueError("loss is nan")` says nothing), nor lines that are mostly
// binary. The one implementation of them: the training script
// (scripts/train_attribution_model.py) reads them from `trainguard attribute
// --features`, so training and the attribution path see the same features.
#pragma once

#include <string>
#include <vector>

#include "attribution/attribution.h"
#include "attribution/log_structure.h"

namespace trainguard {

// The last lines of a log are where a failure is told; a log is read from
// this many lines before its end, each line up to kFeatureLineBytes.
constexpr std::size_t kFeatureLines = 2000;
constexpr std::size_t kFeatureLineBytes = 1000;

// Distinct features, sorted: "w:<word>", "b:<word> <word>" (adjacent words
// of a line), "exc:<type>" (every exception), "final:<type>" (an exception
// that caused no other), "py:<file>" and "fn:<function>" (Python frames).
// Words are lowercased; numbers of up to 3 digits stay (an Xid, a status, an
// exit code), longer ones and hex go. (Pieces of words, character 4-grams,
// were tried and left out: on the corpus they lowered the cross-validated
// accuracy, 0.754 against 0.764, and made healthy "loss" lines read as
// numeric failures.)
std::vector<std::string> LogFeatures(const std::vector<LogLine>& lines, const LogStructure& structure);

}  // namespace trainguard
