#include "alerts/alert_publisher.h"

#include <nlohmann/json.hpp>

#include "common/json_text.h"

namespace trainguard {

std::string AlertPublisher::AlertKind(const std::string& k) {
  if (k == "failure") return "incident";
  if (k == "attribution") return "attribution";
  if (k == "decision") return "decision";
  if (k == "node_evicted") return "eviction";
  if (k == "straggler") return "straggler";
  if (k == "job_succeeded" || k == "job_failed") return "job_end";
  return "";
}

std::string AlertPublisher::AlertJson(const Event& e, const std::string& alert_kind) {
  nlohmann::json detail = nlohmann::json::parse(e.detail_json, nullptr, false);
  if (detail.is_discarded()) detail = nlohmann::json::object();
  nlohmann::json j = {{"alert", alert_kind},
                      {"job", e.job_id},
                      {"event", e.kind},
                      {"time_unix_ms", e.wall_ns / kMillisecond},
                      {"node", e.node},
                      {"rank", e.rank},
                      {"generation", e.generation},
                      {"step", e.step},
                      {"message", e.message},
                      {"text", "[trainguard] job " + e.job_id + ": " + e.message},
                      {"detail", detail}};
  return j.dump(-1, ' ', false, kReplaceBadUtf8);
}

void AlertPublisher::OnEvent(const Event& e) {
  std::string kind = AlertKind(e.kind);
  if (kind.empty()) return;
  std::string body = AlertJson(e, kind);
  for (WebhookSender* s : senders_) s->Post(body);
}

}  // namespace trainguard
