// The structure of a failure log, as far as attribution needs it: which
// lines are Python traceback frames and the source they quote (never matched:
// a quoted `raise ValueError("loss is nan")` or a path under /lustre says
// nothing), which are C++ stack frames (matched on their symbol, not their
// library path: a frame in the NCCL watchdog's timeout check means a
// collective timed out), which exceptions ended each traceback and which of
// them caused the others, and the ranks that a launcher's failure summary
// (torchrun's "Root Cause" table) names for its lines, and the driver's Xid
// reports with the GPU and process each names.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "attribution/attribution.h"

namespace trainguard {

enum class LineKind {
  kText,            // anything else: matched as it is
  kTracebackStart,  // "Traceback (most recent call last):"
  kPythonFrame,     // '  File "x.py", line 3, in f'
  kQuotedSource,    // the source line (and caret line) under a Python frame
  kException,       // "ValueError: ..." ending a traceback
  kChainMarker,     // "The above exception was the direct cause of ..."
  kCxxFrame,        // "frame #3: c10d::ProcessGroupNCCL::... + 0x1f (0x7f.. in libtorch.so)"
  kLauncherField,   // "  rank      : 3 (local_rank: 3)" in torchrun's summary
  kLauncherReport,  // the elastic agent's "failed (exitcode: -9) local_rank: 3 (pid: 4711) of binary: ..."
};

struct LineStructure {
  LineKind kind = LineKind::kText;
  std::string match_text;  // what rules see: the line, or the C++ frame's symbol
  int rank = -1;           // from the line's own prefix or its launcher block; -1 unknown
};

struct LogStructure {
  std::vector<LineStructure> lines;  // one per input line
  struct Exception {
    std::size_t line;
    std::string type;      // "ValueError", "torch.distributed.DistBackendError"
    bool caused_others;    // followed by "The above exception was the direct cause" / "During handling"
  };
  std::vector<Exception> exceptions;
  int launcher_root_rank = -1;  // the rank of torchrun's "Root Cause (first observed failure)"
  // The driver's Xid reports: "NVRM: Xid (PCI:0000:db:00): 31, pid=13641, ...".
  struct XidEvent {
    std::size_t line;
    std::string gpu;  // the PCI address
    int xid;
    std::string pid;  // as the driver prints it ("13641", "'<unknown>'"), "" if absent
  };
  std::vector<XidEvent> xids;
};

LogStructure ParseLogStructure(const std::vector<LogLine>& lines);

}  // namespace trainguard
