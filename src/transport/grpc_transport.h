// gRPC adapters for the agent <-> controller stream (docs/protocol.md).
// The logic lives in JobController and Agent; these classes only move
// messages. One bidirectional stream per agent.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "agent/agent.h"
#include "controller/job_controller.h"
#include "transport/controller_inbox.h"
#include "trainguard/status.h"

namespace trainguard {

// TLS for the stream: the controller's certificate chain and key (PEM
// files). Empty: no TLS.
struct TlsServerFiles {
  std::string cert;
  std::string key;
};

// Serves the Controller service and feeds a JobController. Sessions run on
// gRPC's asynchronous (callback) API: a small pool of gRPC's threads reads and
// writes every session, stamps each message's arrival on `clock` (the
// controller's) and queues it in a ControllerInbox; one dispatcher thread
// hands the inbox to the controller (controller_inbox.h).
// Thread safety: Start/Shutdown from one thread.
class GrpcControllerServer {
 public:
  using Stats = ControllerInbox::Stats;
  explicit GrpcControllerServer(JobController* controller, Clock* clock = RealClock::Get());
  ~GrpcControllerServer();
  // Listens on `address` ("HOST:PORT", port 0 = any free port), with TLS
  // when `tls` names files (errors name them).
  Status Start(const std::string& address, const TlsServerFiles& tls = {});
  int port() const;
  // Ends all sessions and stops serving, waiting at most `deadline_ms`.
  void Shutdown(int deadline_ms);
  Stats stats() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The agent's side: connects, then pumps controller messages into an Agent.
// Thread safety: Send may be called from any thread.
class GrpcControllerLink final : public ControllerLink {
 public:
  GrpcControllerLink();
  ~GrpcControllerLink() override;
  // Connects to `address` within `timeout_ms`; errors name the address.
  // `address` may list several controllers of one job ("H1:P1,H2:P2": a
  // leader and its standbys, docs/standby.md): each is tried in turn, and
  // the one that takes the session (a standby does not listen) is kept.
  // `cancelled`, if given, is asked every 200 ms and ends the wait when true.
  // With `tls_ca` (a PEM file of the certificates that signed the
  // controller's), over TLS; the controller's certificate must name the
  // host of `address`.
  Status Connect(const std::string& address, int timeout_ms,
                 const std::function<bool()>& cancelled = nullptr, const std::string& tls_ca = "");
  // Starts delivering messages to `agent` (OnCommand / OnLinkLost).
  void Attach(Agent* agent);
  bool Send(const v1::AgentMessage& msg) override;
  // A new session on the same channel (gRPC reconnects it), read into the
  // same agent; with several addresses, the next one when this one does not
  // answer within `timeout`. Called by the agent after it was told the
  // session was lost.
  bool Reconnect(Nanos timeout) override;
  void Abandon(const std::string& why) override;
  void Close();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trainguard
