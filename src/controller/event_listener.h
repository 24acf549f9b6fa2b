// EventListener: told of every event a controller records (alerts, the
// simulator's report).
#pragma once

#include "store/event_store.h"

namespace trainguard {

// Told of every event as the controller records it (alerts). Called with
// the controller's mutex held: must not block or call back into it.
class EventListener {
 public:
  virtual ~EventListener() = default;
  virtual void OnEvent(const Event& event) = 0;
};

}  // namespace trainguard
