#include "attribution/log_structure.h"

#include <re2/re2.h>

namespace trainguard {

namespace {

// A launcher's line prefix: "[rank3]:", "[default0]:", "[1,3]<stderr>:".
const RE2& PrefixRe() {
  static const RE2 re(R"(^\s*(?:\[[\w.,:-]+\](?:<std(?:out|err)>)?:\s?)+)");
  return re;
}

std::string WithoutPrefix(const std::string& line) {
  // Only a line that opens with '[' (after blanks) can have one.
  const std::size_t first = line.find_first_not_of(" \t");
  if (first == std::string::npos || line[first] != '[') return line;
  re2::StringPiece rest(line);
  if (!RE2::Consume(&rest, PrefixRe())) return line;
  return std::string(rest);
}

bool StartsWith(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

}  // namespace

LogStructure ParseLogStructure(const std::vector<LogLine>& lines) {
  static const RE2 kFrame(R"(^\s*File "[^"]*", line \d+)");
  static const RE2 kException(R"(^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure|Warning|Fault))(?::|$))");
  static const RE2 kCxxFrame(R"(^\s*(?:frame #\d+:|#\d+\s+0x[0-9a-f]+ in)\s*(.*?)(?:\s+\+\s+0x[0-9a-f]+)?(?:\s+\(0x[0-9a-f]+ in [^)]*\))?\s*$)");
  static const RE2 kLauncherRank(R"(^\s*rank\s*:\s*(\d+)\s*\(local_rank)");
  static const RE2 kLauncherBlock(R"(^\s*\[\d+\]:\s*$)");
  static const RE2 kLauncherField(R"(^\s*(time|host|rank|exitcode|error_file|traceback)\s*:)");
  static const RE2 kLauncherReport(R"(\bfailed \(exitcode: -?\d+\) local_rank: \d+ \(pid: \d+\) of binary: )");
  static const RE2 kXid(R"(\bXid \((?:PCI:)?([0-9A-Fa-f:.]+)\):\s*(\d+)\b(?:,\s*pid=([^,\s]+))?)");

  LogStructure out;
  out.lines.resize(lines.size());
  bool in_traceback = false;
  bool after_frame = false;
  bool in_root_cause = false;
  std::size_t block_start = 0;
  bool in_block = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    LineStructure& ls = out.lines[i];
    ls.match_text = lines[i].text;
    ls.rank = lines[i].rank >= 0 ? lines[i].rank : RankFromPrefix(lines[i].text);
    std::string s = WithoutPrefix(lines[i].text);
    {
      std::string gpu, pid;
      int xid = 0;
      if (lines[i].text.find("Xid") != std::string::npos && RE2::PartialMatch(lines[i].text, kXid, &gpu, &xid, &pid)) {
        out.xids.push_back({i, gpu, xid, pid});
      }
    }

    // torchrun's failure summary: "[N]:" opens a block of "field : value" lines.
    if (s.find("Root Cause (first observed failure)") != std::string::npos) in_root_cause = true;
    // (Checked on the raw line: "[N]:" alone looks like a launcher prefix.)
    if (RE2::FullMatch(lines[i].text, kLauncherBlock) || RE2::FullMatch(s, kLauncherBlock)) {
      in_block = true;
      block_start = i;
      continue;
    }
    if (in_block && RE2::PartialMatch(s, kLauncherField)) {
      ls.kind = LineKind::kLauncherField;
      int rank = -1;
      if (RE2::PartialMatch(s, kLauncherRank, &rank)) {
        for (std::size_t k = block_start; k <= i; ++k) out.lines[k].rank = rank;
        if (in_root_cause && out.launcher_root_rank < 0) out.launcher_root_rank = rank;
      } else if (i > 0 && out.lines[i - 1].kind == LineKind::kLauncherField) {
        ls.rank = out.lines[i - 1].rank;  // the fields after "rank :"
      }
      continue;
    }
    in_block = false;
    if (s.find("(exitcode: ") != std::string::npos && RE2::PartialMatch(s, kLauncherReport)) {
      ls.kind = LineKind::kLauncherReport;
      continue;
    }

    if (s.find("Traceback (most recent call last)") != std::string::npos) {
      ls.kind = LineKind::kTracebackStart;
      in_traceback = true;
      after_frame = false;
      continue;
    }
    if (s.find("The above exception was the direct cause of the following exception") !=
            std::string::npos ||
        s.find("During handling of the above exception, another exception occurred") !=
            std::string::npos) {
      ls.kind = LineKind::kChainMarker;
      if (!out.exceptions.empty()) out.exceptions.back().caused_others = true;
      continue;
    }
    if (in_traceback) {
      if (RE2::PartialMatch(s, kFrame)) {
        ls.kind = LineKind::kPythonFrame;
        after_frame = true;
        continue;
      }
      if (after_frame && !s.empty() && (s[0] == ' ' || s[0] == '\t')) {
        ls.kind = LineKind::kQuotedSource;  // the quoted source and its ^^^ markers
        continue;
      }
      std::string type;
      if (RE2::PartialMatch(s, kException, &type)) {
        ls.kind = LineKind::kException;
        out.exceptions.push_back({i, type, false});
        in_traceback = false;
        continue;
      }
      if (!s.empty() && s[0] != ' ') in_traceback = false;  // something else: the traceback is over
    }
    std::string symbol;
    if ((StartsWith(s, "frame #") || StartsWith(s, "#")) && RE2::FullMatch(s, kCxxFrame, &symbol)) {
      ls.kind = LineKind::kCxxFrame;
      ls.match_text = symbol;
    }
  }
  return out;
}

}  // namespace trainguard
