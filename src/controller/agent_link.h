// AgentLink: one connected agent, as the controller sees it; what a
// transport (transport/grpc_transport.h, the simulator, test doubles)
// implements.
#pragma once

#include "common/clock.h"
#include "proto/protocol.h"

namespace trainguard {

// One connected agent, as the controller sees it. Send must not block.
class AgentLink {
 public:
  virtual ~AgentLink() = default;
  virtual void Send(const v1::ControllerMessage& msg) = 0;
  // Ends the session; the transport reports OnDisconnect afterwards.
  virtual void Close() = 0;
  // When the transport last received anything from the agent, on the
  // controller's monotonic clock, stamped on arrival: however long the
  // message then waits for the controller, the node was alive then. 0:
  // the transport does not say (the controller's own receipt counts).
  virtual Nanos LastHeardMono() const { return 0; }
};

}  // namespace trainguard
