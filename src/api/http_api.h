// HttpApi: the controller's HTTP side (docs/api.md). JSON for the job, its
// nodes, ranks, incidents, events (with a live stream), downtime, stragglers,
// hangs and timings; /metrics in the Prometheus text format; actions (cancel,
// cordon, uncordon) for callers with the job's token. Everything it serves
// comes from a controller snapshot and the store: it never holds the
// controller's mutex beyond taking a snapshot, and never blocks the job.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "controller/job_controller.h"
#include "report/downtime_report.h"
#include "store/event_store.h"
#include "trainguard/status.h"

namespace httplib {
class Server;
struct Request;
struct Response;
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
  // One endpoint: its method and path (a regular expression for the ones
  // that take a node), the line /api/v1 lists for it ("" for none), and the
  // member that answers it (http_api_routes.cc).
  using Handler = void (HttpApi::*)(const httplib::Request&, httplib::Response&);
  struct Endpoint {
    const char* method;  // "GET" or "POST"
    const char* path;
    const char* listed;
    Handler handler;
  };
  static const std::vector<Endpoint>& Endpoints();
  // Registers every endpoint of the table, and the dashboard's files.
  void Route();

  void Index(const httplib::Request& req, httplib::Response& res);
  void Healthz(const httplib::Request& req, httplib::Response& res);
  void Job(const httplib::Request& req, httplib::Response& res);
  void Nodes(const httplib::Request& req, httplib::Response& res);
  void Ranks(const httplib::Request& req, httplib::Response& res);
  void Downtime(const httplib::Request& req, httplib::Response& res);
  void Incidents(const httplib::Request& req, httplib::Response& res);
  void Events(const httplib::Request& req, httplib::Response& res);
  void EventStream(const httplib::Request& req, httplib::Response& res);
  void Diagnostics(const httplib::Request& req, httplib::Response& res);
  void Stragglers(const httplib::Request& req, httplib::Response& res);
  void Hang(const httplib::Request& req, httplib::Response& res);
  void Timings(const httplib::Request& req, httplib::Response& res);
  void Trace(const httplib::Request& req, httplib::Response& res);
  void HeatmapPicture(const httplib::Request& req, httplib::Response& res);
  void Metrics(const httplib::Request& req, httplib::Response& res);
  void CancelJob(const httplib::Request& req, httplib::Response& res);
  void Cordon(const httplib::Request& req, httplib::Response& res);
  void Uncordon(const httplib::Request& req, httplib::Response& res);

  // The job's row in the store (nullopt: not there or the store is away).
  std::optional<JobRecord> JobRow();
  // The downtime report up to now (or to the job's end).
  StatusOr<DowntimeReport> LiveReport(const JobSnapshot& snap);
  // Whether the request carries the job's secret; answers 401/403 if not.
  bool Authorized(const httplib::Request& req, httplib::Response& res);
  // Steps A:B of ?steps=, by default the newest 20; false (400 answered) if bad.
  bool StepRange(const httplib::Request& req, httplib::Response& res, std::int64_t* from, std::int64_t* to);
  void NodeAction(const httplib::Request& req, httplib::Response& res, bool cordon);

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
