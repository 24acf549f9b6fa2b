#include "report/timing_views.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "common/gpu_reasons.h"
#include "common/json_text.h"
#include "common/stats.h"
#include "store/step_timing_text.h"

namespace trainguard {

using nlohmann::json;

namespace {

// The newest "layout" event's coordinates by rank, and the dims' names.
std::map<int, std::map<std::string, int>> LayoutCoords(const std::vector<Event>& events) {
  std::map<int, std::map<std::string, int>> coords;
  for (auto it = events.rbegin(); it != events.rend(); ++it) {
    if (it->kind != "layout") continue;
    json d = json::parse(it->detail_json, nullptr, false);
    if (!d.is_object() || !d.contains("ranks")) continue;
    for (const auto& r : d["ranks"]) {
      if (r.contains("rank") && r.contains("coords") && r["coords"].is_object()) {
        for (auto c = r["coords"].begin(); c != r["coords"].end(); ++c) {
          if (c.value().is_number_integer()) coords[r["rank"].get<int>()][c.key()] = c.value().get<int>();
        }
      }
    }
    break;
  }
  return coords;
}

int Coord(const std::map<std::string, int>& c, const char* name) {
  auto it = c.find(name);
  return it == c.end() ? 0 : it->second;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// Ratio to the column median -> a colour: blue (faster) - white - red (slower).
std::string Colour(double ratio) {
  if (!(ratio > 0)) return "#eeeeee";
  double x = std::clamp(std::log2(ratio) / std::log2(1.5), -1.0, 1.0);  // +-50 % saturates
  int r = 255, g = 255, b = 255;
  if (x > 0) {
    g = b = static_cast<int>(255 * (1 - x));
  } else {
    r = g = static_cast<int>(255 * (1 + x));
  }
  char buf[16];
  std::snprintf(buf, sizeof(buf), "#%02x%02x%02x", r, g, b);
  return buf;
}

}  // namespace

StatusOr<std::pair<std::int64_t, std::int64_t>> ParseStepRange(const std::string& text) {
  std::int64_t from = std::numeric_limits<std::int64_t>::min(), to = std::numeric_limits<std::int64_t>::max();
  if (text.empty()) return std::make_pair(from, to);
  const std::size_t colon = text.find(':');
  auto number = [](const std::string& part, std::int64_t* out) {
    try {
      std::size_t used = 0;
      *out = std::stoll(part, &used);
      return used == part.size();
    } catch (const std::exception&) {
      return false;
    }
  };
  bool ok = colon != std::string::npos;
  if (ok && colon > 0) ok = number(text.substr(0, colon), &from);
  if (ok && colon + 1 < text.size()) ok = number(text.substr(colon + 1), &to);
  if (!ok) return InvalidArgument("'" + text + "' is not A:B, A: or :B");
  return std::make_pair(from, to);
}

namespace {

constexpr int kStorageTrack = 4;

// Phases that wait on storage: the DataLoader's, and checkpoint saves and loads.
bool IsStoragePhase(const std::string& name) { return name == "data" || name.rfind("checkpoint", 0) == 0; }

}  // namespace

StatusOr<std::string> TraceJson(EventStore* store, const std::string& job_id, std::int64_t from, std::int64_t to) {
  auto rows = store->StepTimings(job_id, from, to);
  if (!rows.ok()) return rows.status();
  if (rows->empty()) {
    return NotFound("job " + job_id + " has no step timings for steps " + std::to_string(from) + ".." +
                    (to == std::numeric_limits<std::int64_t>::max() ? std::string("end") : std::to_string(to)));
  }
  auto events = store->Events(job_id);
  if (!events.ok()) return events.status();
  auto coords = LayoutCoords(*events);

  std::int64_t t0 = std::numeric_limits<std::int64_t>::max();
  for (const auto& r : *rows) t0 = std::min(t0, r.start_us);
  json trace = json::array();
  std::map<int, std::pair<std::string, std::int64_t>> ranks;  // rank -> node, clock error
  struct P2p {
    int rank;
    std::int64_t start, end;
  };
  std::map<std::tuple<int, int, std::int32_t, std::int64_t>, P2p> sends, recvs;  // (from, to, group, seq)
  std::int64_t t_end = 0;  // the last step's end, from t0
  for (const auto& r : *rows) {
    ranks[r.rank] = {r.node, std::max(ranks[r.rank].second, r.clock_error_us)};
    std::int64_t base = r.start_us - t0;
    trace.push_back({{"ph", "X"}, {"name", "step " + std::to_string(r.step)}, {"cat", "step"}, {"pid", r.rank},
                     {"tid", 0}, {"ts", base}, {"dur", r.duration_us},
                     {"args", {{"step", r.step}, {"generation", r.generation}}}});
    auto intervals = DecodeIntervals(r.intervals);
    if (!intervals.ok()) return intervals.status();
    for (const TimedInterval& i : *intervals) {
      if (i.kind == kIntervalCpu) continue;  // CPU time spans no wall time: the totals and heatmap have it
      std::int64_t ts = base + i.start_us;
      json e = {{"ph", "X"}, {"name", i.name}, {"pid", r.rank}, {"ts", ts}, {"dur", std::max<std::int64_t>(i.duration_us, 0)}};
      if (IsOperation(i.kind)) {
        e["cat"] = "comm";
        e["tid"] = 3;
        e["args"] = {{"group", i.group_id}, {"seq", i.seq}, {"numel", i.numel}};
        if (i.peer >= 0) e["args"]["peer"] = i.peer;
        if (i.kind == kIntervalSend) sends[{r.rank, i.peer, i.group_id, i.seq}] = {r.rank, ts, ts + i.duration_us};
        if (i.kind == kIntervalRecv) recvs[{i.peer, r.rank, i.group_id, i.seq}] = {r.rank, ts, ts + i.duration_us};
      } else if (i.kind == kIntervalDevice) {
        e["cat"] = "device";
        e["tid"] = 2;
      } else {
        e["cat"] = i.name == "gc" ? "gc" : "phase";
        e["tid"] = 1;
        if (IsStoragePhase(i.name)) {  // also on the rank's storage track
          json wait = e;
          wait["cat"] = "storage";
          wait["tid"] = kStorageTrack;
          if (i.name == "data") wait["name"] = "waiting for data";
          trace.push_back(std::move(wait));
        }
      }
      trace.push_back(std::move(e));
    }
    t_end = std::max(t_end, base + r.duration_us);
  }
  // The storage stalls the job's incidents named, at their fault time on
  // the culprit rank's storage track (within the steps shown).
  const bool open_ended = to == std::numeric_limits<std::int64_t>::max();
  std::map<std::int64_t, std::int64_t> fault_us;  // incident -> fault time
  for (const auto& ev : *events) {
    if (ev.kind != "failure") continue;
    json d = json::parse(ev.detail_json, nullptr, false);
    if (d.is_object() && d.contains("incident") && d.contains("fault_unix_ms")) {
      fault_us[d["incident"].get<std::int64_t>()] = d["fault_unix_ms"].get<std::int64_t>() * 1000;
    }
  }
  for (const auto& ev : *events) {
    if (ev.kind != "attribution") continue;
    json d = json::parse(ev.detail_json, nullptr, false);
    if (!d.is_object() || d.value("category", "") != "storage" || !d.contains("incident")) continue;
    auto fault = fault_us.find(d["incident"].get<std::int64_t>());
    if (fault == fault_us.end()) continue;
    const std::int64_t ts = fault->second - t0;
    if (ts < 0 || (!open_ended && ts > t_end)) continue;
    for (const auto& culprit : d.value("culprit_ranks", json::array())) {
      if (!culprit.is_number_integer() || !ranks.count(culprit.get<int>())) continue;
      trace.push_back({{"ph", "i"}, {"s", "t"}, {"name", "storage stall (" + d.value("rule", "") + ")"},
                       {"cat", "storage"}, {"pid", culprit.get<int>()}, {"tid", kStorageTrack}, {"ts", ts},
                       {"args", {{"incident", d["incident"]}, {"evidence", d.value("culprit_evidence", "")}}}});
    }
  }
  // Flows: each send to its matching receive (the n-th send from a to b
  // pairs with b's n-th receive from a).
  std::int64_t flow_id = 0;
  for (const auto& [key, s] : sends) {
    auto r = recvs.find(key);
    if (r == recvs.end()) continue;
    ++flow_id;
    trace.push_back({{"ph", "s"}, {"name", "send/recv"}, {"cat", "p2p"}, {"id", flow_id}, {"pid", s.rank},
                     {"tid", 3}, {"ts", s.start}});
    trace.push_back({{"ph", "f"}, {"bp", "e"}, {"name", "send/recv"}, {"cat", "p2p"}, {"id", flow_id},
                     {"pid", r->second.rank}, {"tid", 3}, {"ts", std::max(r->second.end - 1, r->second.start)}});
  }
  // Processes in the layout's order: replica, stage, tensor rank, then rank.
  std::vector<int> order;
  for (const auto& [rank, info] : ranks) order.push_back(rank);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const auto& ca = coords[a];
    const auto& cb = coords[b];
    return std::make_tuple(Coord(ca, "dp"), Coord(ca, "pp"), Coord(ca, "tp"), a) <
           std::make_tuple(Coord(cb, "dp"), Coord(cb, "pp"), Coord(cb, "tp"), b);
  });
  for (std::size_t k = 0; k < order.size(); ++k) {
    int rank = order[k];
    std::string where;
    for (const auto& [dim, idx] : coords[rank]) where += (where.empty() ? "" : " ") + dim + std::to_string(idx);
    std::string name = "rank " + std::to_string(rank) + (where.empty() ? "" : " (" + where + ")") + " on " + ranks[rank].first;
    trace.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"tid", 0},
                     {"args", {{"name", name}, {"node", ranks[rank].first}, {"clock_error_us", ranks[rank].second},
                               {"coords", coords[rank]}}}});
    trace.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"tid", 0},
                     {"args", {{"sort_index", static_cast<int>(k)}}}});
    const char* threads[] = {"steps", "phases", "device (CUDA events)", "communication",
                             "storage (waiting for data, checkpoints)"};
    for (int tid = 0; tid <= kStorageTrack; ++tid) {
      trace.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", tid}, {"args", {{"name", threads[tid]}}}});
    }
  }
  json doc = {{"traceEvents", trace},
              {"displayTimeUnit", "ms"},
              {"otherData",
               {{"job", job_id},
                {"origin_unix_us", t0},
                {"clock", "the controller's; each node's offset estimated from clock probes, uncertainty in "
                          "each process's clock_error_us (-1: not yet probed)"}}}};
  return doc.dump(-1, ' ', false, kReplaceBadUtf8);
}

namespace {

struct GpuFigure {
  const char* name;
  const char* unit;
  bool lower_is_worse;
  double scale;  // stored value -> shown value
  std::int64_t GpuSampleRecord::*member;
};

constexpr GpuFigure kGpuFigures[] = {
    {"sm_clock", "MHz", true, 1, &GpuSampleRecord::sm_clock_mhz},
    {"memory_clock", "MHz", true, 1, &GpuSampleRecord::memory_clock_mhz},
    {"temperature", "\xC2\xB0" "C", false, 1, &GpuSampleRecord::temperature_c},
    {"power", "W", false, 1e-3, &GpuSampleRecord::power_mw},
    {"utilization", "%", true, 1, &GpuSampleRecord::utilization_pct},
};

StatusOr<std::string> GpuHeatmap(EventStore* store, const std::string& job_id, const HeatmapOptions& o) {
  const GpuFigure* fig = nullptr;
  std::string names;
  for (const GpuFigure& f : kGpuFigures) {
    names += (names.empty() ? "" : ", ") + std::string(f.name);
    if (o.gpu == f.name) fig = &f;
  }
  if (fig == nullptr) return InvalidArgument("--gpu " + o.gpu + ": not a GPU figure (" + names + ")");
  auto rows = store->GpuSamples(job_id, std::numeric_limits<Nanos>::min(), std::numeric_limits<Nanos>::max());
  if (!rows.ok()) return rows.status();
  if (rows->empty()) {
    return NotFound("job " + job_id + " has no GPU series (its nodes reported no GPU, or --gpu-series-interval was 0)");
  }
  const Nanos t0 = rows->front().wall_ns, t1 = rows->back().wall_ns;
  Nanos step = 0;  // the series' interval: the smallest gap between two of its times
  for (std::size_t i = 1; i < rows->size(); ++i) {
    const Nanos gap = (*rows)[i].wall_ns - (*rows)[i - 1].wall_ns;
    if (gap > 0 && (step == 0 || gap < step)) step = gap;
  }
  const Nanos window = std::max<Nanos>(step > 0 ? step : kSecond, (t1 - t0) / 20 + 1);
  auto column_of = [&](Nanos t) { return static_cast<int>((t - t0) / window); };
  const int columns = column_of(t1) + 1;
  std::map<std::string, std::map<int, std::vector<double>>> cells;     // row -> column -> values
  std::map<std::string, std::map<int, std::int64_t>> reasons;          // row -> column -> throttle bits
  std::map<std::string, std::pair<std::string, int>> order;            // row -> (node, GPU) for sorting
  for (const GpuSampleRecord& g : *rows) {
    const std::string row = g.node + "/gpu " + std::to_string(g.gpu);
    order[row] = {g.node, g.gpu};
    reasons[row][column_of(g.wall_ns)] |= g.throttle_reasons;
    if (g.*(fig->member) >= 0) cells[row][column_of(g.wall_ns)].push_back(static_cast<double>(g.*(fig->member)) * fig->scale);
  }
  std::vector<std::string> row_names;
  for (const auto& [row, key] : order) row_names.push_back(row);
  std::sort(row_names.begin(), row_names.end(), [&](const std::string& a, const std::string& b) { return order[a] < order[b]; });
  std::vector<double> column_median(static_cast<std::size_t>(columns), 0);
  for (int c = 0; c < columns; ++c) {
    std::vector<double> v;
    for (const auto& [row, cols] : cells) {
      auto it = cols.find(c);
      if (it != cols.end()) v.push_back(Median(it->second));
    }
    column_median[static_cast<std::size_t>(c)] = Median(v);
  }
  const int label_w = 150, cell_w = 70, cell_h = 26, top = 70;
  const std::string title = "job " + job_id + ": GPU " + fig->name + " (" + fig->unit + ") by window of " +
                            Fixed(static_cast<double>(window) / kSecond, 0) + " s (colour: against the column's median)";
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    std::to_string(label_w + cell_w * columns + 20) + "\" height=\"" +
                    std::to_string(top + cell_h * static_cast<int>(row_names.size()) + 60) +
                    "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<text x=\"8\" y=\"18\" font-size=\"13\" font-weight=\"bold\">" + Escape(title) + "</text>\n";
  for (int c = 0; c < columns; ++c) {
    svg += "<text class=\"column\" x=\"" + std::to_string(label_w + c * cell_w + 4) + "\" y=\"" +
           std::to_string(top - 8) + "\">+" + Fixed(static_cast<double>(c * window) / kSecond, 0) + " s</text>\n";
  }
  std::vector<std::string> held;  // the throttled rows, for the page
  int y = top;
  for (const std::string& row : row_names) {
    std::int64_t any = 0;
    for (const auto& [c, bits] : reasons[row]) any |= bits;
    const bool throttled = any != 0;
    std::string why;
    for (const std::string& r : ThrottleReasonNames(any)) why += (why.empty() ? "" : ", ") + r;
    if (throttled) held.push_back(row + ": " + why);
    svg += "<g class=\"row" + std::string(throttled ? " throttled" : "") + "\" data-row=\"" + Escape(row) + "\">";
    svg += "<text x=\"8\" y=\"" + std::to_string(y + 17) + "\"" +
           (throttled ? " fill=\"#b00000\" font-weight=\"bold\"" : "") + ">" + Escape(row) +
           (throttled ? " \xE2\x98\x85 " + Escape(why) : "") + "</text>";
    for (int c = 0; c < columns; ++c) {
      const int x = label_w + c * cell_w;
      auto it = cells[row].find(c);
      if (it == cells[row].end()) {
        svg += "<rect x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) + "\" width=\"" +
               std::to_string(cell_w - 2) + "\" height=\"" + std::to_string(cell_h - 2) +
               "\" fill=\"#eeeeee\"><title>no data</title></rect>";
        continue;
      }
      const double v = Median(it->second), m = column_median[static_cast<std::size_t>(c)];
      const double ratio = fig->lower_is_worse ? (v > 0 ? m / v : 0) : (m > 0 ? v / m : 0);
      const std::int64_t bits = reasons[row][c];
      std::string here;
      for (const std::string& r : ThrottleReasonNames(bits)) here += (here.empty() ? "" : ", ") + r;
      svg += "<rect x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) + "\" width=\"" +
             std::to_string(cell_w - 2) + "\" height=\"" + std::to_string(cell_h - 2) + "\" fill=\"" + Colour(ratio) +
             "\"" + (bits != 0 ? " stroke=\"#b00000\" stroke-width=\"1.5\"" : "") + "><title>" + Escape(row) + " +" +
             Fixed(static_cast<double>(c * window) / kSecond, 0) + " s: " + Fixed(v, 0) + " " + fig->unit +
             (here.empty() ? "" : " (throttled: " + Escape(here) + ")") + "</title></rect>";
      svg += "<text x=\"" + std::to_string(x + 6) + "\" y=\"" + std::to_string(y + 17) + "\">" + Fixed(v, 0) + "</text>";
    }
    svg += "</g>\n";
    y += cell_h;
  }
  svg += "<text x=\"8\" y=\"" + std::to_string(y + 24) +
         "\">red: worse than the column's median (saturated at 1.5 x); outlined, \xE2\x98\x85: held down by a "
         "throttle reason</text>\n</svg>\n";
  if (!o.html) return svg;
  std::string html = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + Escape(title) +
                     "</title><style>body{font-family:sans-serif}</style></head><body>\n" + svg +
                     "<h3>Throttled GPUs</h3><ul>";
  for (const std::string& h : held) html += "<li>" + Escape(h) + "</li>";
  html += held.empty() ? "<li>none</li></ul></body></html>\n" : "</ul></body></html>\n";
  return html;
}

}  // namespace

StatusOr<std::string> Heatmap(EventStore* store, const std::string& job_id, const HeatmapOptions& o) {
  if (!o.gpu.empty()) return GpuHeatmap(store, job_id, o);
  auto rows = store->StepTimings(job_id, std::numeric_limits<std::int64_t>::min(),
                                 std::numeric_limits<std::int64_t>::max());
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return NotFound("job " + job_id + " has no step timings");
  auto events = store->Events(job_id);
  if (!events.ok()) return events.status();
  std::map<std::string, std::string> marked;  // row -> the finding's message
  for (const Event& e : *events) {
    if (e.kind != "straggler") continue;
    marked[e.node] = e.message;
    if (e.rank >= 0) marked[e.node + "/rank " + std::to_string(e.rank)] = e.message;
  }
  std::int64_t lo = rows->front().step, hi = rows->back().step;
  std::int64_t window = o.window > 0 ? o.window : std::max<std::int64_t>(1, (hi - lo + 20) / 20);
  // cell values: row -> column -> per-step values (a node's step value is the median of its ranks')
  std::map<std::string, std::map<std::string, std::vector<double>>> cells;
  std::vector<std::string> columns;
  std::set<std::string> seen_columns;
  auto add_column = [&](const std::string& c) {
    if (seen_columns.insert(c).second) columns.push_back(c);
  };
  std::map<std::tuple<std::string, std::string, std::int64_t, std::int64_t>, std::vector<double>> per_step;
  for (const auto& r : *rows) {
    std::string row = o.ranks ? r.node + "/rank " + std::to_string(r.rank) : r.node;
    auto totals = DecodeTotals(r.totals);
    if (!totals.ok()) return totals.status();
    if (o.phase.empty()) {
      add_column("step");
      per_step[{row, "step", r.step, r.generation}].push_back(static_cast<double>(r.duration_us));
      for (const auto& [key, us] : *totals) {
        add_column(key);
        per_step[{row, key, r.step, r.generation}].push_back(static_cast<double>(us));
      }
    } else {
      double v = o.phase == "step" ? static_cast<double>(r.duration_us) : 0;
      for (const auto& [key, us] : *totals) {
        if (key == o.phase) v += static_cast<double>(us);
      }
      std::int64_t w0 = lo + (r.step - lo) / window * window;
      std::string col = "steps " + std::to_string(w0) + "-" + std::to_string(w0 + window - 1);
      add_column(col);
      per_step[{row, col, r.step, r.generation}].push_back(v);
    }
  }
  if (!o.phase.empty()) {
    std::sort(columns.begin(), columns.end(), [](const std::string& a, const std::string& b) {
      return std::stoll(a.substr(6)) < std::stoll(b.substr(6));
    });
  }
  for (auto& [key, v] : per_step) cells[std::get<0>(key)][std::get<1>(key)].push_back(Median(v));
  std::map<std::string, double> column_median;
  for (const auto& c : columns) {
    std::vector<double> v;
    for (auto& [row, cols] : cells) {
      auto it = cols.find(c);
      if (it != cols.end() && !it->second.empty()) v.push_back(Median(it->second));
    }
    column_median[c] = Median(v);
  }
  const int label_w = 190, cell_w = 92, cell_h = 26, top = 70;
  int width = label_w + cell_w * static_cast<int>(columns.size()) + 20;
  int height = top + cell_h * static_cast<int>(cells.size()) + 60;
  std::string title = "job " + job_id + ": " + (o.phase.empty() ? "median per step by phase" : o.phase + " per step, by window of steps") +
                      " (colour: against the column's median)";
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
                    std::to_string(height) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<text x=\"8\" y=\"18\" font-size=\"13\" font-weight=\"bold\">" + Escape(title) + "</text>\n";
  for (std::size_t c = 0; c < columns.size(); ++c) {
    svg += "<text class=\"column\" x=\"" + std::to_string(label_w + static_cast<int>(c) * cell_w + 4) + "\" y=\"" +
           std::to_string(top - 8) + "\">" + Escape(columns[c]) + "</text>\n";
  }
  int y = top;
  for (const auto& [row, cols] : cells) {
    bool straggler = marked.count(row) > 0;
    svg += "<g class=\"row" + std::string(straggler ? " straggler" : "") + "\" data-row=\"" + Escape(row) + "\">";
    svg += "<text x=\"8\" y=\"" + std::to_string(y + 17) + "\"" + (straggler ? " fill=\"#b00000\" font-weight=\"bold\"" : "") +
           ">" + Escape(row) + (straggler ? " \xE2\x98\x85 straggler" : "") + "</text>";
    for (std::size_t c = 0; c < columns.size(); ++c) {
      auto it = cols.find(columns[c]);
      int x = label_w + static_cast<int>(c) * cell_w;
      if (it == cols.end() || it->second.empty()) {
        svg += "<rect x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) + "\" width=\"" + std::to_string(cell_w - 2) +
               "\" height=\"" + std::to_string(cell_h - 2) + "\" fill=\"#eeeeee\"><title>no data</title></rect>";
        continue;
      }
      double v = Median(it->second);
      double ratio = column_median[columns[c]] > 0 ? v / column_median[columns[c]] : 0;
      svg += "<rect x=\"" + std::to_string(x) + "\" y=\"" + std::to_string(y) + "\" width=\"" + std::to_string(cell_w - 2) +
             "\" height=\"" + std::to_string(cell_h - 2) + "\" fill=\"" + Colour(ratio) + "\"" +
             (straggler ? " stroke=\"#b00000\" stroke-width=\"1.5\"" : "") + "><title>" + Escape(row) + " " +
             Escape(columns[c]) + ": " + Fixed(v / 1000, 2) + " ms (" + Fixed(ratio, 2) + " x median)</title></rect>";
      svg += "<text x=\"" + std::to_string(x + 6) + "\" y=\"" + std::to_string(y + 17) + "\">" + Fixed(v / 1000, 1) +
             " ms</text>";
    }
    svg += "</g>\n";
    y += cell_h;
  }
  svg += "<text x=\"8\" y=\"" + std::to_string(y + 24) +
         "\">blue: faster than the column's median; red: slower (saturated at 1.5 x); \xE2\x98\x85: named a straggler</text>\n";
  svg += "</svg>\n";
  if (!o.html) return svg;
  std::string html = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" + Escape(title) +
                     "</title><style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}"
                     ".straggler{color:#b00000;font-weight:bold}</style></head><body>\n";
  html += svg;
  html += "<h3>Stragglers</h3><ul>";
  for (const Event& e : *events) {
    if (e.kind == "straggler" || e.kind == "straggler_cleared" || e.kind == "straggler_baseline" ||
        e.kind == "slow_trend") {
      html += "<li>" + Escape(e.kind) + ": " + Escape(e.message) + "</li>";
    }
  }
  html += "</ul></body></html>\n";
  return html;
}

}  // namespace trainguard
