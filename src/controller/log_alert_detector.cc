#include "controller/log_alert_detector.h"

#include <nlohmann/json.hpp>

#include "common/json_text.h"
#include "controller/describe.h"

namespace trainguard {

std::optional<Finding> DetectFatalLine(const std::string& node_id, const v1::LogAlert& alert,
                                       std::int64_t rank_step, Nanos now_wall) {
  if (alert.severity() != "fatal") return std::nullopt;
  Finding f;
  f.kind = FindingKind::kFatalLine;
  f.node = node_id;
  f.rank = alert.global_rank();
  f.rank_step = rank_step;
  f.fault_wall = alert.seen_unix_ms() > 0 ? alert.seen_unix_ms() * kMillisecond : now_wall;
  std::string who = alert.global_rank() >= 0
                        ? "rank " + std::to_string(alert.global_rank()) + " on " + node_id
                        : "the kernel of " + node_id;
  f.description = who + " reported a fatal error" + AtStep(rank_step) + ": " + alert.line() +
                  " (rule " + alert.rule_id() + ")";
  f.lines.push_back({alert.global_rank(), node_id, alert.line()});
  // A rank that printed it may still run: its stack says where it was.
  if (alert.global_rank() >= 0) f.capture_stacks_of.push_back(alert.global_rank());
  f.detail_json = nlohmann::json{{"rule", alert.rule_id()},
                                 {"severity", alert.severity()},
                                 {"line", alert.line()},
                                 {"seen_unix_ms", alert.seen_unix_ms()}}
                      .dump(-1, ' ', false, kReplaceBadUtf8);
  return f;
}

}  // namespace trainguard
