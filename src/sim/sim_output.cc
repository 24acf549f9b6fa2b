#include "sim/sim_output.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

namespace trainguard {

using nlohmann::json;

namespace {

std::string Fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

std::string Pad(std::string s, size_t w, bool right = false) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

std::string Escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else if (c == '"') o += "&quot;";
    else o += c;
  }
  return o;
}

std::string Csv(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string o = "\"";
  for (char c : s) o += c == '"' ? std::string("\"\"") : std::string(1, c);
  return o + "\"";
}

}  // namespace

std::string CheckpointLine(const SimParams& p, const SimResult& r) {
  std::string o = p.checkpoint_policy == "auto" ? "auto (the controller's plan)" : "fixed";
  o += r.memory_interval_s > 0 ? ", memory every " + Fmt("%.0f", r.memory_interval_s) + " s" : ", no memory tier";
  o += ", storage every " + Fmt("%.0f", r.storage_interval_s) + " s (" + Fmt("%g", p.persist_s) + " s to write); " +
       std::to_string(r.saves) + " saves, " + std::to_string(r.storage_restores) + " restart(s) from storage";
  if (p.checkpoint_policy == "auto" && !r.plan.empty()) o += "; last plan: " + r.plan;
  return o;
}

std::string SimText(const SimParams& p, const FailureModel& m, const SimResult& r) {
  const DowntimeReport& d = r.report;
  const int nodes = p.gpus / p.gpus_per_node;
  std::string o;
  o += "trainguard sim: " + std::to_string(p.gpus) + " GPUs (" + std::to_string(nodes) + " nodes x " +
       std::to_string(p.gpus_per_node) + "), " + Fmt("%.1f", p.days) + " days, failure model " + m.name + ", seed " +
       std::to_string(p.seed) + "\n";
  o += "  costs: step " + Fmt("%g", p.step_s) + " s, checkpoint every " + Fmt("%g", p.checkpoint_interval_s) +
       " s blocking " + Fmt("%g", p.checkpoint_blocked_s) + " s, restart " + Fmt("%g", p.LaunchS(nodes)) +
       (p.LaunchS(nodes) != p.restart_s
            ? " s (" + Fmt("%g", p.restart_s) + " s + imports " + Fmt("%g", p.import_s_per_node * nodes) +
                  " s + store " + Fmt("%g", p.store_s_per_rank * p.gpus) + " s + NCCL " +
                  Fmt("%g", p.nccl_init_s_per_rank * p.gpus) + " s)"
            : std::string(" s")) +
       ", shutdown " + Fmt("%g", p.shutdown_s) + " s, hang timeout " + Fmt("%g", p.hang_timeout_s) + " s, spares " +
       std::to_string(p.spares) + ", replacement " +
       (p.replacement_s < 0 ? std::string("none") : Fmt("%g", p.replacement_s) + " s") + ", diagnose " + p.diagnose +
       "\n";
  o += "  checkpoints: " + CheckpointLine(p, r) + "\n";
  if (!r.finished) o += "\nthe simulation cannot finish: " + r.why_not + "\n";
  const double days = d.wall_s / 86400;
  o += "\nETTR " + Fmt("%.1f", 100 * d.ettr) + " %  (productive " + Fmt("%.2f", d.productive_s / 86400) + " of " +
       Fmt("%.2f", days) + " days)";
  if (r.sdc_redone_s > 0 || r.slowed_s > 0) {
    o += "; goodput " + Fmt("%.1f", 100 * r.ettr_true) + " %, counting " +
         (r.sdc_redone_s > 0 && r.slowed_s > 0 ? "work on corrupted state, redone, and the time slow nodes cost"
          : r.sdc_redone_s > 0                 ? "work on corrupted state, redone"
                                               : "the time slow nodes cost");
  }
  o += "\n";
  int incidents = static_cast<int>(d.incidents.size());
  o += "failures: " + std::to_string(r.faults) + " drawn (" + Fmt("%.1f", days > 0 ? r.faults / days : 0) +
       " a day), " + std::to_string(incidents) + " incidents, " + std::to_string(d.restarts) + " restarts, " +
       std::to_string(r.false_alarms) + " false alarms, " + std::to_string(r.replacements) +
       " nodes brought by the scheduler\n";
  if (r.faults_on_spares > 0) {
    o += "idle spares: " + std::to_string(r.faults_on_spares) + " faults drawn, " + std::to_string(r.spares_lost) +
         " hosts lost (replaced), " + std::to_string(r.spares_broken) + " left broken until promoted\n";
  }
  if (r.slowdowns > 0) {
    int visible = 0, named = 0;
    std::vector<double> soon;
    for (const auto& s : r.slowdown_list) {
      if (!s.in_job || !s.visible) continue;
      ++visible;
      if (s.named_s >= 0) {
        ++named;
        soon.push_back(s.named_s);
      }
    }
    std::sort(soon.begin(), soon.end());
    o += "stragglers: " + std::to_string(r.slowdowns) + " slowdowns drawn, " + std::to_string(r.slowdowns_in_job) +
         " on nodes of the job (" + std::to_string(visible) + " in the node's compute, the rest in every node's "
         "collectives); the job ran slowed " + Fmt("%.2f", r.slow_s / 3600) + " h, costing " +
         Fmt("%.2f", r.slowed_s / 3600) + " h; named " + std::to_string(named) + " of " + std::to_string(visible) +
         (soon.empty() ? std::string() : ", median " + Fmt("%.0f", soon[soon.size() / 2]) + " s after it began") +
         ", " + std::to_string(r.named_wrongly) + " healthy nodes named; action " + p.straggler_action + "\n";
  }
  if (r.mtbf_s > 0) {
    o += "checkpoint interval: the first-order model (job MTBF " + Fmt("%.0f", r.mtbf_s) +
         " s as this run saw it, its downtime per failure) gives " + Fmt("%.1f", 100 * r.model_ettr) +
         " % at the interval the saves followed, " + Fmt("%.1f", 100 * r.optimum_ettr) + " % at Daly's optimum (" +
         Fmt("%.0f", r.optimum_interval_s) + " s)\n";
  }
  o += "\nwhere the time went (hours), as `trainguard report` accounts it\n";
  auto row = [&](const std::string& name, double s) {
    o += "  " + Pad(name, 34) + Pad(Fmt("%.2f", s / 3600), 10, true) + Pad(Fmt("%.2f %%", d.wall_s > 0 ? 100 * s / d.wall_s : 0), 10, true) + "\n";
  };
  row("productive", d.productive_s);
  row("startup (launch -> first step)", d.startup_s);
  row("lost work (" + std::to_string(d.lost_steps) + " steps)", d.lost_s);
  row("detection", d.detection_s);
  row("shutdown", d.shutdown_s);
  row("restart (stopped -> first step)", d.restart_s);
  row("checkpoint overhead", d.checkpoint_s);
  row("tail", d.tail_s);
  row("wall", d.wall_s);
  o += "\nby cause (injected)           drawn incid. evict hw-ok  detect(s/inc) lost(h)  restart(h)\n";
  for (const auto& c : r.categories) {
    if (c.injected == 0 && c.incidents == 0) continue;
    o += "  " + Pad(c.name, 28) + Pad(std::to_string(c.injected), 6, true) + Pad(std::to_string(c.incidents), 6, true) +
         Pad(std::to_string(c.evictions), 6, true) + Pad(std::to_string(c.hardware_agrees), 6, true) +
         Pad(Fmt("%.1f", c.incidents > 0 ? c.detection_s / c.incidents : 0), 14, true) +
         Pad(Fmt("%.2f", c.lost_s / 3600), 9, true) + Pad(Fmt("%.2f", c.restart_s / 3600), 11, true) + "\n";
  }
  o += "  (hw-ok: incidents whose attribution said hardware or software as the injected cause was)\n";
  o += "\ntime in each controller state (hours):";
  for (const auto& [state, s] : r.state_s) o += " " + state + " " + Fmt("%.2f", s / 3600);
  o += "\n";
  o += "\nspeed: " + Fmt("%.1f", r.sim_s / 86400) + " simulated days in " + Fmt("%.1f", r.real_s) + " s (" +
       Fmt("%.0f", r.real_s > 0 ? r.sim_s / r.real_s : 0) + "x real time), CPU " + Fmt("%.1f", r.cpu_s) +
       " s: simulation and controller " + Fmt("%.1f", r.sim_cpu_s) + " s, store " + Fmt("%.1f", r.cpu_s - r.sim_cpu_s) +
       " s; " +
       std::to_string(r.messages) + " agent messages, " + std::to_string(r.commands) + " controller messages, " +
       std::to_string(r.events_stored) + " events stored\n";
  return o;
}

json SimJson(const SimParams& p, const FailureModel& m, const SimResult& r) {
  json cats = json::array();
  for (const auto& c : r.categories) {
    cats.push_back({{"name", c.name}, {"hardware", c.hardware}, {"injected", c.injected}, {"incidents", c.incidents},
                    {"evictions", c.evictions}, {"hardware_agrees", c.hardware_agrees},
                    {"detection_s", c.detection_s}, {"lost_s", c.lost_s}, {"shutdown_s", c.shutdown_s},
                    {"restart_s", c.restart_s}});
  }
  return {{"gpus", p.gpus},
          {"nodes", p.gpus / p.gpus_per_node},
          {"days", p.days},
          {"seed", p.seed},
          {"failure_model", m.name},
          {"finished", r.finished},
          {"why_not", r.why_not},
          {"ettr", r.report.ettr},
          {"goodput", r.ettr_true},
          {"stragglers", {{"action", p.straggler_action},
                          {"slowdowns", r.slowdowns},
                          {"slowdowns_in_job", r.slowdowns_in_job},
                          {"slow_s", r.slow_s},
                          {"slowed_s", r.slowed_s},
                          {"named", r.stragglers_named},
                          {"named_wrongly", r.named_wrongly}}},
          {"checkpoints", {{"policy", p.checkpoint_policy},
                           {"memory_interval_s", r.memory_interval_s},
                           {"storage_interval_s", r.storage_interval_s},
                           {"saves", r.saves},
                           {"storage_restores", r.storage_restores},
                           {"plan", r.plan},
                           {"mtbf_s", r.mtbf_s},
                           {"optimum_interval_s", r.optimum_interval_s},
                           {"optimum_ettr", r.optimum_ettr},
                           {"model_ettr", r.model_ettr}}},
          {"report", ReportJson(r.report)},
          {"by_cause", cats},
          {"false_alarms", r.false_alarms},
          {"faults", r.faults},
          {"faults_while_down", r.faults_while_down},
          {"faults_on_spares", r.faults_on_spares},
          {"spares_lost", r.spares_lost},
          {"spares_broken", r.spares_broken},
          {"replacements", r.replacements},
          {"sdc_redone_s", r.sdc_redone_s},
          {"state_s", r.state_s},
          {"speed", {{"sim_s", r.sim_s}, {"real_s", r.real_s}, {"cpu_s", r.cpu_s}, {"sim_cpu_s", r.sim_cpu_s}, {"store_cpu_s", r.cpu_s - r.sim_cpu_s}, {"ratio", r.real_s > 0 ? r.sim_s / r.real_s : 0},
                     {"messages", r.messages}, {"commands", r.commands}, {"events_stored", r.events_stored}}}};
}

std::string SweepCsv(const std::vector<SweepPoint>& points) {
  std::string o;
  if (points.empty()) return o;
  for (const auto& [k, v] : points.front().swept) o += Csv(k) + ",";
  // Downtime terms are named apart from the parameters (restart_s is both).
  o += "finished,ettr,productive_s,wall_s,lost_work_s,detection_time_s,shutdown_time_s,restart_time_s,"
       "checkpoint_overhead_s,startup_time_s,incidents,false_alarms,failures_per_day,real_s\n";
  for (const auto& pt : points) {
    const DowntimeReport& d = pt.result.report;
    for (const auto& [k, v] : pt.swept) o += Csv(v) + ",";
    double days = d.wall_s / 86400;
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%s,%.5f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%.1f,%zu,%d,%.2f,%.1f\n",
                  pt.result.finished ? "true" : "false", d.ettr, d.productive_s, d.wall_s, d.lost_s, d.detection_s,
                  d.shutdown_s, d.restart_s, d.checkpoint_s, d.startup_s, d.incidents.size(), pt.result.false_alarms,
                  days > 0 ? pt.result.faults / days : 0, pt.result.real_s);
    o += buf;
  }
  return o;
}

std::string SweepSvg(const std::vector<SweepPoint>& points, const std::string& title) {
  // Series: the other swept values; x: GPUs (log10); y: ETTR %.
  std::map<std::string, std::vector<std::pair<double, double>>> series;
  double xmin = 1e18, xmax = 0, ymin = 100, ymax = 0;
  for (const auto& pt : points) {
    std::string key;
    for (const auto& [k, v] : pt.swept) {
      if (k != "gpus") key += (key.empty() ? "" : ", ") + k + "=" + v;
    }
    if (key.empty()) key = "ETTR";
    double x = pt.params.gpus, y = 100 * pt.result.report.ettr;
    series[key].push_back({x, y});
    xmin = std::min(xmin, x);
    xmax = std::max(xmax, x);
    ymin = std::min(ymin, y);
    ymax = std::max(ymax, y);
  }
  const double W = 760, H = 440, L = 70, R = 220, T = 40, B = 60;
  double lx0 = std::log10(std::max(1.0, xmin)), lx1 = std::log10(std::max(xmax, xmin * 1.0001));
  if (lx1 - lx0 < 0.1) lx1 = lx0 + 0.1;
  double y0 = std::floor(std::min(ymin, 100.0) / 5) * 5, y1 = 100;
  if (y1 - y0 < 5) y0 = y1 - 5;
  auto X = [&](double x) { return L + (std::log10(x) - lx0) / (lx1 - lx0) * (W - L - R); };
  auto Y = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Fmt("%.0f", W) + "\" height=\"" +
                  Fmt("%.0f", H) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o += "<text x=\"" + Fmt("%.0f", L) + "\" y=\"24\" font-size=\"14\">" + Escape(title) + "</text>\n";
  for (double y = y0; y <= y1 + 1e-9; y += (y1 - y0) / 5) {
    o += "<line x1=\"" + Fmt("%.1f", L) + "\" x2=\"" + Fmt("%.1f", W - R) + "\" y1=\"" + Fmt("%.1f", Y(y)) + "\" y2=\"" +
         Fmt("%.1f", Y(y)) + "\" stroke=\"#ddd\"/>\n";
    o += "<text x=\"" + Fmt("%.1f", L - 8) + "\" y=\"" + Fmt("%.1f", Y(y) + 4) + "\" text-anchor=\"end\">" +
         Fmt("%.0f", y) + " %</text>\n";
  }
  for (double e = std::ceil(lx0 * 2 - 1e-9) / 2; e <= lx1 + 1e-9; e += 0.5) {
    double x = std::pow(10, e);
    o += "<text x=\"" + Fmt("%.1f", X(x)) + "\" y=\"" + Fmt("%.1f", H - B + 18) + "\" text-anchor=\"middle\">" +
         (x >= 1000 ? Fmt(x < 10000 ? "%.1fK" : "%.0fK", x / 1000) : Fmt("%.0f", x)) + "</text>\n";
  }
  o += "<text x=\"" + Fmt("%.1f", (L + W - R) / 2) + "\" y=\"" + Fmt("%.1f", H - 16) +
       "\" text-anchor=\"middle\">GPUs (log scale)</text>\n";
  o += "<text x=\"16\" y=\"" + Fmt("%.1f", (T + H - B) / 2) + "\" transform=\"rotate(-90 16 " +
       Fmt("%.1f", (T + H - B) / 2) + ")\" text-anchor=\"middle\">ETTR</text>\n";
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  int i = 0;
  for (auto& [key, pts] : series) {
    std::sort(pts.begin(), pts.end());
    const char* color = colors[i % 8];
    std::string path;
    for (const auto& [x, y] : pts) {
      path += (path.empty() ? "M" : " L") + Fmt("%.1f", X(x)) + "," + Fmt("%.1f", Y(y));
      o += "<circle cx=\"" + Fmt("%.1f", X(x)) + "\" cy=\"" + Fmt("%.1f", Y(y)) + "\" r=\"3\" fill=\"" + color + "\"/>\n";
    }
    o += "<path d=\"" + path + "\" fill=\"none\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    o += "<text x=\"" + Fmt("%.1f", W - R + 10) + "\" y=\"" + Fmt("%.1f", T + 14 + 16 * i) + "\" fill=\"" + color +
         "\">" + Escape(key) + "</text>\n";
    ++i;
  }
  return o + "</svg>\n";
}

std::string BarsSvg(const std::vector<EttrBar>& cs, const std::string& title) {
  const int row = 26, left = 430, width = 360, top = 40;
  const int h = top + row * static_cast<int>(cs.size()) + 30;
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(left + width + 80) +
                  "\" height=\"" + std::to_string(h) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o += "<text x=\"10\" y=\"20\" font-size=\"14\">" + Escape(title) + "</text>\n";
  for (std::size_t i = 0; i < cs.size(); ++i) {
    const double e = std::clamp(cs[i].ettr, 0.0, 1.0);
    const int y = top + row * static_cast<int>(i);
    o += "<text x=\"10\" y=\"" + std::to_string(y + 15) + "\">" + Escape(cs[i].label) + "</text>\n";
    o += "<rect x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(y + 3) + "\" width=\"" +
         std::to_string(static_cast<int>(e * width)) + "\" height=\"16\" fill=\"" +
         (cs[i].kept ? "#2a7ab0" : "#a8c8e0") + "\"/>\n";
    o += "<text x=\"" + std::to_string(left + static_cast<int>(e * width) + 5) + "\" y=\"" + std::to_string(y + 15) +
         "\">" + Fmt("%.1f %%", 100 * e) + "</text>\n";
  }
  o += "<text x=\"10\" y=\"" + std::to_string(h - 8) + "\">goodput of each candidate: ETTR less the time slow nodes cost and work redone after corruption (dark: kept)</text>\n</svg>\n";
  return o;
}


}  // namespace trainguard
