// AlertPublisher: turns the controller's events into alerts for webhooks:
// each incident (the failure), its attribution and decision, each eviction,
// each straggler finding, and the job's end. One JSON object per alert
// (docs/alerts.md), with a "text" line that chat receivers show as is.
#pragma once

#include <string>
#include <vector>

#include "alerts/webhook_sender.h"
#include "controller/event_listener.h"

namespace trainguard {

class AlertPublisher final : public EventListener {
 public:
  explicit AlertPublisher(std::vector<WebhookSender*> senders) : senders_(std::move(senders)) {}
  void OnEvent(const Event& event) override;

  // The alert kind of an event ("" = not alerted on).
  static std::string AlertKind(const std::string& event_kind);
  static std::string AlertJson(const Event& event, const std::string& alert_kind);

 private:
  std::vector<WebhookSender*> senders_;
};

}  // namespace trainguard
