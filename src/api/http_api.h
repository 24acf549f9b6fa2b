// HttpApi: the controller's HTTP side (docs/api.md). JSON for the job, its
// nodes, ranks, incidents, events (with a live stream), downtime, stragglers,
// hangs and timings; /metrics in the Prometheus text format; actions (cancel,
// cordon, uncordon) for callers with the job's token. Everything it serves
// comes from a controller snapshot and the store: it never holds the
// controller's mutex beyond taking a snapshot, and never blocks the job.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "controller/job_controller.h"
#include "store/event_store.h"
#include "trainguard/status.h"

namespace httplib {
class Server;
}

namespace trainguard {

struct HttpApiOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0: any free port
  // Actions need "Authorization: Bearer SECRET" with the job's secret
  // (common/job_secret.h); "" refuses every action.
  std::string token;
  int max_streams = 8;        // live event streams at once (each holds a thread)
  Nanos stream_poll = 250 * kMillisecond;
};

class HttpApi {
 public:
  HttpApi(EventStore* store, HttpApiOptions options);
  ~HttpApi();
  HttpApi(const HttpApi&) = delete;
  HttpApi& operator=(const HttpApi&) = delete;

  // Binds the address (an error names it). Requests wait until Serve.
  Status Bind();
  // Serves `controller`'s job from a thread of its own. After Bind.
  void Serve(JobController* controller);
  // Bind, then Serve.
  Status Start(JobController* controller);
  // Ends the live streams and stops serving. Idempotent.
  void Stop();
  int port() const { return port_; }
  // http://HOST:PORT (a wildcard host is given as this machine's loopback).
  std::string url() const;

 private:
  void Route();

  JobController* controller_ = nullptr;
  EventStore* const store_;
  const HttpApiOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::string host_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> serving_ended_{false};  // the server's loop returned
  std::atomic<int> streams_{0};
};

}  // namespace trainguard
