// HttpApi's endpoints (docs/api.md): one table, one member each. /api/v1
// lists what the table lists.
#include <httplib.h>

#include <chrono>
#include <limits>

#include "api/api_views.h"
#include "api/dashboard_assets.h"
#include "api/http_api.h"
#include "api/job_metrics.h"
#include "api/prometheus_text.h"
#include "common/job_secret.h"
#include "common/json_text.h"
#include "report/downtime_report.h"
#include "report/hang_view.h"
#include "report/timing_views.h"
#include "store/node_cordon.h"

namespace trainguard {

using nlohmann::json;

namespace {

constexpr const char* kJson = "application/json";

void Reply(httplib::Response& res, const json& body, int status = 200) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), kJson);
}

void ReplyError(httplib::Response& res, int status, const std::string& message) {
  Reply(res, {{"error", message}}, status);
}

int HttpStatusOf(const Status& s) {
  switch (s.code()) {
    case StatusCode::kNotFound: return 404;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kFailedPrecondition: return 409;
    default: return 500;
  }
}

// An integer query parameter, or `fallback` when absent. False (and a 400
// answered) when it is there and not an integer.
bool IntParam(const httplib::Request& req, httplib::Response& res, const char* name, std::int64_t fallback,
              std::int64_t* out) {
  *out = fallback;
  if (!req.has_param(name)) return true;
  const std::string text = req.get_param_value(name);
  try {
    std::size_t used = 0;
    *out = std::stoll(text, &used);
    if (used == text.size()) return true;
  } catch (const std::exception&) {
  }
  ReplyError(res, 400, std::string("query parameter ") + name + "='" + text + "' is not an integer");
  return false;
}

std::string RequestBodyField(const httplib::Request& req, const char* field) {
  if (req.body.empty()) return req.has_param(field) ? req.get_param_value(field) : "";
  json body = json::parse(req.body, nullptr, false);
  if (!body.is_object()) return "";
  auto it = body.find(field);
  return it != body.end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

const std::vector<HttpApi::Endpoint>& HttpApi::Endpoints() {
  static const std::vector<Endpoint> table = {
      {"GET", "/healthz", "", &HttpApi::Healthz},
      {"GET", "/api/v1", "", &HttpApi::Index},
      {"GET", "/api/v1/job", "GET /api/v1/job", &HttpApi::Job},
      {"GET", "/api/v1/nodes", "GET /api/v1/nodes", &HttpApi::Nodes},
      {"GET", "/api/v1/ranks", "GET /api/v1/ranks", &HttpApi::Ranks},
      {"GET", "/api/v1/incidents", "GET /api/v1/incidents", &HttpApi::Incidents},
      {"GET", "/api/v1/downtime", "GET /api/v1/downtime", &HttpApi::Downtime},
      {"GET", "/api/v1/events", "GET /api/v1/events?after=ID&limit=N", &HttpApi::Events},
      {"GET", "/api/v1/events/stream", "GET /api/v1/events/stream", &HttpApi::EventStream},
      {"GET", "/api/v1/diagnostics", "GET /api/v1/diagnostics", &HttpApi::Diagnostics},
      {"GET", "/api/v1/stragglers", "GET /api/v1/stragglers", &HttpApi::Stragglers},
      {"GET", "/api/v1/hang", "GET /api/v1/hang?incident=N", &HttpApi::Hang},
      {"GET", "/api/v1/timings", "GET /api/v1/timings?steps=A:B", &HttpApi::Timings},
      {"GET", "/api/v1/trace", "GET /api/v1/trace?steps=A:B", &HttpApi::Trace},
      {"GET", "/api/v1/heatmap", "GET /api/v1/heatmap?phase=P&ranks=1&gpu=FIGURE&format=svg|html",
       &HttpApi::HeatmapPicture},
      {"GET", "/metrics", "GET /metrics", &HttpApi::Metrics},
      {"POST", "/api/v1/cancel", "POST /api/v1/cancel", &HttpApi::CancelJob},
      {"POST", R"(/api/v1/nodes/([A-Za-z0-9._:-]+)/cordon)", "POST /api/v1/nodes/NODE/cordon", &HttpApi::Cordon},
      {"POST", R"(/api/v1/nodes/([A-Za-z0-9._:-]+)/uncordon)", "POST /api/v1/nodes/NODE/uncordon",
       &HttpApi::Uncordon},
  };
  return table;
}

void HttpApi::Route() {
  httplib::Server& s = *server_;
  for (const Endpoint& e : Endpoints()) {
    auto handler = [this, h = e.handler](const httplib::Request& req, httplib::Response& res) { (this->*h)(req, res); };
    if (std::string_view(e.method) == "POST") {
      s.Post(e.path, handler);
    } else {
      s.Get(e.path, handler);
    }
  }
  // The dashboard (web/dashboard): one page over this API.
  for (const DashboardAsset& asset : DashboardAssets()) {
    auto serve = [&asset](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-cache");
      res.set_content(reinterpret_cast<const char*>(asset.data), asset.size, asset.content_type);
    };
    s.Get(asset.path, serve);
    if (std::string(asset.path) == "/index.html") s.Get("/", serve);
  }
}

std::optional<JobRecord> HttpApi::JobRow() {
  auto jobs = store_->Jobs();
  if (!jobs.ok()) return std::nullopt;
  for (const auto& j : *jobs) {
    if (j.job_id == controller_->config().job_id) return j;
  }
  return std::nullopt;
}

StatusOr<DowntimeReport> HttpApi::LiveReport(const JobSnapshot& snap) {
  const std::string& job_id = controller_->config().job_id;
  auto events = store_->Events(job_id);
  if (!events.ok()) return events.status();
  LiveJob live = LiveJobOf(snap);
  return ComputeReport(job_id, *events, &live);
}

bool HttpApi::Authorized(const httplib::Request& req, httplib::Response& res) {
  if (options_.token.empty()) {
    ReplyError(res, 403, "actions are off: this controller has no job secret");
    return false;
  }
  const std::string auth = req.get_header_value("Authorization");
  const std::string prefix = "Bearer ";
  if (auth.rfind(prefix, 0) != 0) {
    res.set_header("WWW-Authenticate", "Bearer");
    ReplyError(res, 401, "this action needs the job's secret: Authorization: Bearer SECRET (the job's secret file)");
    return false;
  }
  if (!SecretMatches(options_.token, auth.substr(prefix.size()))) {
    ReplyError(res, 403, "the job's secret is wrong");
    return false;
  }
  return true;
}

void HttpApi::Healthz(const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); }

void HttpApi::Index(const httplib::Request&, httplib::Response& res) {
  json listed = json::array();
  for (const Endpoint& e : Endpoints()) {
    if (*e.listed != '\0') listed.push_back(e.listed);
  }
  Reply(res, {{"endpoints", listed}});
}

void HttpApi::Job(const httplib::Request&, httplib::Response& res) {
  JobSnapshot snap = controller_->Snapshot();
  auto record = JobRow();
  auto report = LiveReport(snap);
  Reply(res, JobJson(snap, record ? &*record : nullptr, report.ok() ? &*report : nullptr));
}

void HttpApi::Nodes(const httplib::Request&, httplib::Response& res) {
  JobSnapshot snap = controller_->Snapshot();
  auto health = store_->ListNodeHealth();
  auto diagnostics = store_->LatestDiagnostics();
  if (!health.ok() || !diagnostics.ok()) {
    ReplyError(res, 500, (!health.ok() ? health.status() : diagnostics.status()).message());
    return;
  }
  Reply(res, {{"nodes", NodesJson(snap, *health, *diagnostics)}});
}

void HttpApi::Ranks(const httplib::Request&, httplib::Response& res) {
  Reply(res, {{"ranks", RanksJson(controller_->Snapshot())}});
}

void HttpApi::Downtime(const httplib::Request&, httplib::Response& res) {
  auto report = LiveReport(controller_->Snapshot());
  if (!report.ok()) return ReplyError(res, HttpStatusOf(report.status()), report.status().message());
  Reply(res, ReportJson(*report));
}

void HttpApi::Incidents(const httplib::Request&, httplib::Response& res) {
  JobSnapshot snap = controller_->Snapshot();
  auto report = LiveReport(snap);
  if (!report.ok()) return ReplyError(res, HttpStatusOf(report.status()), report.status().message());
  Reply(res, {{"incidents", report->incidents}, {"incident_open", snap.incident_open}});
}

void HttpApi::Events(const httplib::Request& req, httplib::Response& res) {
  std::int64_t after = 0, limit = 0;
  if (!IntParam(req, res, "after", 0, &after) || !IntParam(req, res, "limit", 1000, &limit)) return;
  if (limit < 1 || limit > 10000) return ReplyError(res, 400, "limit must be 1..10000");
  auto events = store_->EventsAfter(controller_->config().job_id, after, static_cast<int>(limit));
  if (!events.ok()) return ReplyError(res, 500, events.status().message());
  json list = json::array();
  for (const Event& e : *events) list.push_back(EventJson(e));
  Reply(res, {{"events", list}, {"next_after", events->empty() ? after : events->back().id}});
}

// Server-sent events: every event after `after` (or Last-Event-ID), then
// each new one as it is recorded; ends with an "end" event when the
// controller stops serving (after the job ended, every event sent).
void HttpApi::EventStream(const httplib::Request& req, httplib::Response& res) {
  const std::string job_id = controller_->config().job_id;
  std::int64_t after = 0;
  if (!IntParam(req, res, "after", 0, &after)) return;
  if (req.has_header("Last-Event-ID")) {
    try {
      after = std::stoll(req.get_header_value("Last-Event-ID"));
    } catch (const std::exception&) {
      return ReplyError(res, 400, "Last-Event-ID is not an event id");
    }
  }
  if (streams_.fetch_add(1) >= options_.max_streams) {
    streams_.fetch_sub(1);
    return ReplyError(res, 503, "too many live streams (" + std::to_string(options_.max_streams) + ")");
  }
  res.set_header("Cache-Control", "no-cache");
  // plain=1: events without their kind as the SSE type (a browser's
  // EventSource then gets every one as a "message").
  const bool typed = !(req.has_param("plain") && req.get_param_value("plain") != "0");
  auto cursor = std::make_shared<std::int64_t>(after);
  auto quiet_since = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job_id, cursor, quiet_since, typed](std::size_t, httplib::DataSink& sink) {
        // Read before the store: once stopping, nothing is recorded after.
        const bool stopping = stopping_.load();
        auto events = store_->EventsAfter(job_id, *cursor, 500);
        if (!events.ok()) return false;
        for (const Event& e : *events) {
          std::string frame = "id: " + std::to_string(e.id) + (typed ? "\nevent: " + e.kind : std::string()) + "\ndata: " +
                              EventJson(e).dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
          if (!sink.write(frame.data(), frame.size())) return false;
          *cursor = e.id;
        }
        if (!events->empty()) {
          *quiet_since = std::chrono::steady_clock::now();
          return true;
        }
        if (stopping) {
          // The controller process is going: what it recorded is all in
          // the store, and this read found nothing newer.
          std::string end = "event: end\ndata: {}\n\n";
          sink.write(end.data(), end.size());
          sink.done();
          return true;
        }
        for (Nanos slept = 0; slept < options_.stream_poll && !stopping_.load(); slept += 10 * kMillisecond) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (std::chrono::steady_clock::now() - *quiet_since > std::chrono::seconds(15)) {
          const std::string keepalive = ": keepalive\n\n";  // proxies close idle connections
          if (!sink.write(keepalive.data(), keepalive.size())) return false;
          *quiet_since = std::chrono::steady_clock::now();
        }
        return true;
      },
      [this](bool) { streams_.fetch_sub(1); });
}

void HttpApi::Diagnostics(const httplib::Request&, httplib::Response& res) {
  JobSnapshot snap = controller_->Snapshot();
  auto diagnostics = store_->LatestDiagnostics();
  if (!diagnostics.ok()) return ReplyError(res, 500, diagnostics.status().message());
  json out = json::array();
  for (const auto& d : *diagnostics) {
    bool ours = d.job_id == snap.job_id;
    for (const auto& n : snap.nodes) ours |= n.node_id == d.node;
    if (!ours) continue;
    json figures = json::parse(d.figures_json, nullptr, false);
    out.push_back({{"node", d.node},
                   {"unix_ms", d.wall_ns / kMillisecond},
                   {"mode", d.mode},
                   {"job_id", d.job_id},
                   {"figures", figures.is_discarded() ? json::array() : figures}});
  }
  Reply(res, {{"diagnostics", out}});
}

void HttpApi::Stragglers(const httplib::Request&, httplib::Response& res) {
  const std::string& job_id = controller_->config().job_id;
  JobSnapshot snap = controller_->Snapshot();
  auto events = store_->Events(job_id);
  if (!events.ok()) return ReplyError(res, 500, events.status().message());
  Reply(res, StragglersJson(snap, *events));
}

void HttpApi::Hang(const httplib::Request& req, httplib::Response& res) {
  const std::string& job_id = controller_->config().job_id;
  std::int64_t incident = 0;
  if (!IntParam(req, res, "incident", 0, &incident)) return;
  auto events = store_->Events(job_id);
  if (!events.ok()) return ReplyError(res, 500, events.status().message());
  auto hang = FindHang(job_id, *events, static_cast<int>(incident));
  if (!hang.ok()) return ReplyError(res, HttpStatusOf(hang.status()), hang.status().message());
  json found = *hang;
  found["text"] = HangText(*hang);  // as `trainguard hang` prints it
  Reply(res, found);
}

// Steps A:B; by default the newest 20. At most 1000 steps at once.
bool HttpApi::StepRange(const httplib::Request& req, httplib::Response& res, std::int64_t* from, std::int64_t* to) {
  if (!req.has_param("steps")) {
    std::int64_t newest = controller_->Snapshot().max_step;
    *to = newest < 0 ? 0 : newest;
    *from = *to - 19;
    return true;
  }
  auto range = ParseStepRange(req.get_param_value("steps"));
  if (!range.ok()) {
    ReplyError(res, 400, "steps: " + range.status().message());
    return false;
  }
  std::tie(*from, *to) = *range;
  return true;
}

void HttpApi::Timings(const httplib::Request& req, httplib::Response& res) {
  const std::string& job_id = controller_->config().job_id;
  std::int64_t from = 0, to = 0;
  if (!StepRange(req, res, &from, &to)) return;
  if (from == std::numeric_limits<std::int64_t>::min() || to - from >= 1000) {
    return ReplyError(res, 400, "steps: at most 1000 steps at once (A:B with B - A < 1000)");
  }
  auto rows = store_->StepTimings(job_id, from, to);
  if (!rows.ok()) return ReplyError(res, 500, rows.status().message());
  Reply(res, {{"from", from}, {"to", to}, {"timings", TimingsJson(*rows)}});
}

void HttpApi::Trace(const httplib::Request& req, httplib::Response& res) {
  const std::string& job_id = controller_->config().job_id;
  auto range = ParseStepRange(req.has_param("steps") ? req.get_param_value("steps") : "");
  if (!range.ok()) return ReplyError(res, 400, "steps: " + range.status().message());
  auto trace = TraceJson(store_, job_id, range->first, range->second);
  if (!trace.ok()) return ReplyError(res, HttpStatusOf(trace.status()), trace.status().message());
  res.set_header("Content-Disposition", "attachment; filename=\"" + job_id + "-trace.json\"");
  res.set_content(*trace, kJson);
}

void HttpApi::HeatmapPicture(const httplib::Request& req, httplib::Response& res) {
  const std::string& job_id = controller_->config().job_id;
  HeatmapOptions h;
  h.phase = req.has_param("phase") ? req.get_param_value("phase") : "";
  h.ranks = req.has_param("ranks") && req.get_param_value("ranks") != "0";
  h.gpu = req.has_param("gpu") ? req.get_param_value("gpu") : "";
  if (!IntParam(req, res, "window", 0, &h.window)) return;
  const std::string format = req.has_param("format") ? req.get_param_value("format") : "svg";
  if (format != "svg" && format != "html") return ReplyError(res, 400, "format must be svg or html");
  h.html = format == "html";
  auto picture = Heatmap(store_, job_id, h);
  if (!picture.ok()) return ReplyError(res, HttpStatusOf(picture.status()), picture.status().message());
  res.set_content(*picture, h.html ? "text/html; charset=utf-8" : "image/svg+xml");
}

void HttpApi::Metrics(const httplib::Request&, httplib::Response& res) {
  const std::string& job_id = controller_->config().job_id;
  JobSnapshot snap = controller_->Snapshot();
  // The store may be away (a PostgreSQL restart): the controller's own
  // figures, the store's health among them, are served without the
  // report's, which need the stored events.
  auto report = LiveReport(snap);
  if (!report.ok()) report = DowntimeReport{};
  std::vector<NodePhaseTime> phases;
  if (snap.max_step >= 0) {
    if (auto rows = store_->StepTimings(job_id, snap.max_step - 9, snap.max_step); rows.ok()) {
      phases = MeanPhaseTimes(*rows);
    }
  }
  auto text = PrometheusText(JobMetrics(snap, *report, phases));
  if (!text.ok()) {
    res.status = 500;
    res.set_content("# " + text.status().message() + "\n", "text/plain");
    return;
  }
  res.set_content(*text, kPrometheusContentType);
}

void HttpApi::CancelJob(const httplib::Request& req, httplib::Response& res) {
  if (!Authorized(req, res)) return;
  if (controller_->finished()) return ReplyError(res, 409, "the job has ended already");
  std::string reason = RequestBodyField(req, "reason");
  controller_->Cancel("cancelled through the API from " + req.remote_addr + (reason.empty() ? "" : ": " + reason));
  Reply(res, {{"cancelled", true}});
}

void HttpApi::Cordon(const httplib::Request& req, httplib::Response& res) { NodeAction(req, res, true); }

void HttpApi::Uncordon(const httplib::Request& req, httplib::Response& res) { NodeAction(req, res, false); }

void HttpApi::NodeAction(const httplib::Request& req, httplib::Response& res, bool cordon) {
  if (!Authorized(req, res)) return;
  const std::string node = req.matches[1];
  const std::string reason = RequestBodyField(req, "reason");
  const std::string by = "API client " + req.remote_addr;
  const Nanos now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  auto was = cordon ? CordonNodeInStore(store_, node, by, reason, now)
                    : UncordonNodeInStore(store_, node, by, reason, now);
  if (!was.ok()) return ReplyError(res, HttpStatusOf(was.status()), was.status().message());
  Reply(res, {{"node", node},
              {"status", cordon ? "cordoned" : "ok"},
              {"was", was->status.empty() ? "ok" : was->status},
              {"by", by}});
}

}  // namespace trainguard
