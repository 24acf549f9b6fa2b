#include "attribution/log_features.h"

#include <re2/re2.h>

#include <cctype>
#include <set>

#include "common/utf8.h"

namespace trainguard {

namespace {

constexpr double kMaxNonText = 0.10;  // as the rules: mostly binary lines say nothing
constexpr std::size_t kMaxWord = 40;

bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

bool AllHex(const std::string& w) {
  for (char c : w) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// A word as features see it, or "" to leave it out: numbers of up to 3
// digits stay as they are; longer numbers, hex ("0x7f3a", a hash), and
// single letters go; digit runs inside a word become one "0" ("node0",
// "mlx0_0"), so hosts and devices of one kind read alike.
std::string Normalize(const std::string& raw) {
  if (raw.size() > kMaxWord) return "";
  std::string w;
  for (char c : raw) w += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  bool digits_only = true, any_digit = false;
  for (char c : w) {
    bool d = std::isdigit(static_cast<unsigned char>(c));
    digits_only = digits_only && d;
    any_digit = any_digit || d;
  }
  if (digits_only) return w.size() <= 3 ? w : "";
  if (w.size() == 1) return "";
  if (w.rfind("0x", 0) == 0 || (w.size() >= 8 && any_digit && AllHex(w))) return "";
  if (!any_digit) return w;
  std::string out;
  for (char c : w) {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      if (out.empty() || out.back() != '0') out += '0';
    } else {
      out += c;
    }
  }
  return out;
}

void AddWords(const std::string& text, std::set<std::string>* out) {
  const std::string t = text.substr(0, kFeatureLineBytes);
  std::string prev;
  for (std::size_t i = 0; i < t.size();) {
    if (!IsWordChar(t[i])) {
      ++i;
      continue;
    }
    std::size_t j = i;
    while (j < t.size() && IsWordChar(t[j])) ++j;
    std::string w = Normalize(t.substr(i, j - i));
    i = j;
    if (w.empty()) continue;
    out->insert("w:" + w);
    if (!prev.empty()) out->insert("b:" + prev + " " + w);
    prev = w;
  }
}

// The last component of a dotted exception type.
std::string ShortType(const std::string& type) {
  const std::size_t dot = type.rfind('.');
  return dot == std::string::npos ? type : type.substr(dot + 1);
}

// A line that says something went wrong, in the words logs use for it. Only
// such lines (and the parse's exceptions and C++ frames; launcher fields apart) are
// read: routine output ("step 100 loss 2.31") is the same in failed and
// healthy runs, and a model that read it learned that "loss" means numeric.
const RE2& FailureWords() {
  static const RE2 re(
      R"((?i)error|\berr\b|fail|fatal|abort|exception|traceback|kill|panic|timeout|timed out|\bnan\b|\binf\b|)"
      R"(overflow|cannot|can't|could not|unable|\blost\b|denied|refused|reset|terminat|segmentation|sig(?:segv|bus|abrt|kill|term|int)|)"
      R"(signal|died|dead|exit|crash|out of memory|\boom|warn|xid|\becc\b|hang|stuck|invalid|illegal|unexpected|not found|)"
      R"(no such|corrupt|unreachable|\bdown\b|cancel|preempt|evict|throttl|mismatch|unsupported|unhandled|assert|diverg|)"
      R"(not responding|missed|shutdown|reboot|offline|degraded|retr(?:y|ies)|exceeded|insufficient|too many|no space|quota|)"
      R"(read-only|stale|lagging|pressure|status=)");
  return re;
}

bool ReadsAsFailure(const LineStructure& ls) {
  switch (ls.kind) {
    case LineKind::kException:
    case LineKind::kCxxFrame:
    case LineKind::kTracebackStart:
      return true;
    default:
      return RE2::PartialMatch(ls.match_text.substr(0, kFeatureLineBytes), FailureWords());
  }
}

// The other lines of torchrun's failure summary, the same for every failure:
// its title, headings and the script's "FAILED" line. (The summary's
// exception, ChildFailedError, is read from the parse as exc:/final:.)
const RE2& LauncherBoilerplate() {
  static const RE2 re(
      R"(\s*(?:\S*ChildFailedError:?|Root Cause \(first observed failure\):|Failures:|<NO_OTHER_FAILURES>|)"
      R"(\S+ FAILED|[=-]{8,})\s*)");
  return re;
}

// A field of a launcher's failure summary ("exitcode : -9 (pid: 4711)",
// "traceback : Signal 9 (SIGKILL) received by PID 4711"): every summary has
// the same field names, hosts and times whatever the failure was, so only
// what tells failures apart is read: an exit code other than 1, sign kept
// ("exit:-9", a signal; "exit:2", a usage error; 1 says only that an
// exception ended the process, whatever it was), and a traceback field's
// own words unless it is the summary's pointer to the docs.
void AddLauncherField(const std::string& text, std::set<std::string>* out) {
  static const RE2 kExit(R"(^\s*exitcode\s*:\s*(-?\d+))");
  static const RE2 kTraceback(R"(^\s*traceback\s*:\s*(.*))");
  std::string code, value;
  if (RE2::PartialMatch(text, kExit, &code)) {
    if (code != "1" && code != "0") out->insert("exit:" + code);
  } else if (RE2::PartialMatch(text, kTraceback, &value) && value.find("To enable traceback") == std::string::npos) {
    AddWords(value, out);
  }
}

// The elastic agent's report of a failed worker ("failed (exitcode: -9)
// local_rank: 3 (pid: 4711) of binary: /usr/bin/python3"): like a summary
// field, only an exit code other than 0 and 1 tells failures apart.
void AddLauncherReport(const std::string& text, std::set<std::string>* out) {
  static const RE2 kExit(R"(\(exitcode: (-?\d+)\))");
  std::string code;
  if (RE2::PartialMatch(text, kExit, &code) && code != "1" && code != "0") out->insert("exit:" + code);
}

// A frame of a launcher's own code (torchrun, the elastic agent, accelerate's
// and deepspeed's launch commands), or the exception torchrun ends with: the
// traceback of every failure a launcher reports has them, whatever it was.
bool LauncherFrame(const std::string& text) {
  static const RE2 re(
      R"re(File "[^"]*(?:torch/distributed/(?:elastic/|run\.py|launch\.py|launcher/)|/bin/(?:torchrun|accelerate|deepspeed)"|)re"
      R"re(accelerate/commands/|deepspeed/launcher/))re");
  return RE2::PartialMatch(text, re);
}

bool LauncherException(const std::string& type) { return ShortType(type) == "ChildFailedError"; }

}  // namespace

std::vector<std::string> LogFeatures(const std::vector<LogLine>& lines, const LogStructure& structure) {
  static const RE2 kFrame(R"(File "(?:[^"]*/)?([^"/]+?)(?:\.py)?", line \d+(?:, in (\S+))?)");
  std::set<std::string> out;
  const std::size_t from = lines.size() > kFeatureLines ? lines.size() - kFeatureLines : 0;
  for (std::size_t i = from; i < lines.size(); ++i) {
    const LineStructure& ls = structure.lines[i];
    if (ls.kind == LineKind::kQuotedSource) continue;
    // trainguard's own lines ("trainguard: rank 1 on node1 exited with code
    // 1") are the rules' to read; the logs the model learned from have none.
    if (ls.match_text.rfind("trainguard: ", 0) == 0) continue;
    // NCCL's INFO lines trace its set-up ("Plugin load (libnccl-net.so)
    // returned 2 : ... No such file or directory" in every healthy run
    // without the plugin); what goes wrong it prints at WARN.
    if (ls.match_text.find(" NCCL INFO ") != std::string::npos) continue;
    if (NonTextShare(ls.match_text) > kMaxNonText) continue;
    // A launcher's traceback: its first frame is the launcher's.
    if (ls.kind == LineKind::kTracebackStart && i + 1 < lines.size() &&
        structure.lines[i + 1].kind == LineKind::kPythonFrame && LauncherFrame(lines[i + 1].text)) {
      continue;
    }
    if (ls.kind == LineKind::kPythonFrame) {
      if (LauncherFrame(lines[i].text)) continue;
      std::string file, function;
      if (RE2::PartialMatch(lines[i].text, kFrame, &file, &function)) {
        out.insert("py:" + file);
        if (!function.empty()) out.insert("fn:" + function);
      }
      continue;
    }
    if (ls.kind == LineKind::kLauncherField) {
      AddLauncherField(ls.match_text, &out);
    } else if (ls.kind == LineKind::kLauncherReport) {
      AddLauncherReport(ls.match_text, &out);
    } else if (!RE2::FullMatch(ls.match_text, LauncherBoilerplate()) && ReadsAsFailure(ls)) {
      AddWords(ls.match_text, &out);
    }
  }
  for (const auto& e : structure.exceptions) {
    if (e.line < from || LauncherException(e.type)) continue;
    out.insert("exc:" + ShortType(e.type));
    if (!e.caused_others) out.insert("final:" + ShortType(e.type));
  }
  return {out.begin(), out.end()};
}

}  // namespace trainguard
