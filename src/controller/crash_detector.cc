#include "controller/crash_detector.h"
#include "common/json_text.h"

#include <nlohmann/json.hpp>

#include "controller/describe.h"

namespace trainguard {

Nanos FailedAt(const v1::RankExited& exited) {
  return (exited.last_words_unix_ms() > 0 ? exited.last_words_unix_ms() : exited.exit_unix_ms()) *
         kMillisecond;
}

std::optional<Finding> DetectCrash(const std::string& node_id, const v1::RankExited& exited,
                                   Nanos now_wall) {
  const v1::RankStatus& r = exited.rank();
  if (r.exit_code() == 0 && r.term_signal() == 0) return std::nullopt;
  Finding f;
  f.kind = FindingKind::kRankFailed;
  f.exit_code = r.exit_code();
  f.signal = r.term_signal();
  f.node = node_id;
  f.rank = r.global_rank();
  f.rank_step = r.step();
  f.fault_wall = exited.exit_unix_ms() > 0 ? exited.exit_unix_ms() * kMillisecond : now_wall;
  std::string what = "rank " + std::to_string(r.global_rank()) + " on " + node_id + " " +
                     DescribeExit(r) + AtStep(r.step());
  f.description = what;
  // The error file names the exception exactly; the output's last line may be
  // anything (a traceback's last frame, a logger's shutdown line).
  if (exited.has_error() && !exited.error().message().empty()) {
    f.description += "; " + exited.error().message() + " (from its error file)";
  } else if (exited.log_tail_size() > 0) {
    f.description += "; last output: " + exited.log_tail(exited.log_tail_size() - 1);
  }
  // The node's kernel messages come first: they usually happened first.
  for (const auto& line : exited.kernel_lines()) f.lines.push_back({-1, node_id, line});
  std::vector<std::string> tail(exited.log_tail().begin(), exited.log_tail().end());
  for (const auto& line : tail) f.lines.push_back({r.global_rank(), node_id, line});
  if (exited.has_error()) {
    for (const auto& line : RankErrorLines(exited.error(), tail)) {
      f.lines.push_back({r.global_rank(), node_id, line});
    }
  }
  f.lines.push_back({r.global_rank(), node_id, "trainguard: " + what});
  nlohmann::json d = RankJson(r);
  d["exit_code"] = r.exit_code();
  d["signal"] = r.term_signal();
  d["log_tail"] = tail;
  if (exited.has_error()) d["error_file"] = RankErrorJson(exited.error());
  if (exited.kernel_lines_size() > 0) {
    d["kernel_lines"] =
        std::vector<std::string>(exited.kernel_lines().begin(), exited.kernel_lines().end());
  }
  f.detail_json = d.dump(-1, ' ', false, kReplaceBadUtf8);
  return f;
}

}  // namespace trainguard
