// The commands that read what a job left behind: `events`, `report`,
// `hang`, `ckpt ls|verify` and `attribute`.
#include <limits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>

#include "attribution/attribution.h"
#include "attribution/log_features.h"
#include "attribution/log_structure.h"
#include "cli/cli_support.h"
#include "cli/commands.h"
#include "report/hang_view.h"
#include "report/timing_views.h"
#include "report/downtime_report.h"
#include "report/fleet_report.h"
#include "common/json_text.h"
#include "store/event_store.h"
#include "trainguard/checkpoint.h"

namespace trainguard {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Opens the store and resolves the job ("" = the newest); prints the error.
}  // namespace

namespace {

int ShowFleetReport(const EventsOptions& o) {
  if (!o.job_id.empty()) {
    std::fprintf(stderr, "trainguard: error: report --fleet covers every job; it takes no job id\n");
    return 2;
  }
  if (!IsPostgresUrl(o.store) && !fs::exists(o.store)) {
    std::fprintf(stderr, "trainguard: error: no store at %s (use --store PATH)\n", StoreDisplayName(o.store).c_str());
    return 2;
  }
  auto store = OpenEventStore(o.store);
  if (!store.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", store.status().message().c_str());
    return 2;
  }
  auto jobs = (*store)->Jobs();
  auto incidents = (*store)->IncidentsOnNode("");
  if (!jobs.ok() || !incidents.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", (!jobs.ok() ? jobs.status() : incidents.status()).message().c_str());
    return 2;
  }
  FleetReport report = ComputeFleetReport(*jobs, *incidents);
  if (o.json) {
    std::cout << FleetReportJson(report).dump(2, ' ', false, kReplaceBadUtf8) << "\n";
  } else {
    std::cout << FleetReportText(report);
  }
  return 0;
}

}  // namespace

int ShowReport(const EventsOptions& o) {
  if (o.fleet) return ShowFleetReport(o);
  std::unique_ptr<EventStore> store;
  std::string job_id;
  if (!OpenJob(o, &store, &job_id)) return 2;
  auto events = store->Events(job_id);
  if (!events.ok() || events->empty()) {
    std::fprintf(stderr, "trainguard: error: no events for job %s in %s\n", job_id.c_str(),
                 StoreDisplayName(o.store).c_str());
    return 2;
  }
  auto report = ComputeReport(job_id, *events);
  if (!report.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", report.status().message().c_str());
    return 2;
  }
  if (o.json) {
    std::cout << ReportJson(*report).dump(2, ' ', false, kReplaceBadUtf8) << "\n";
  } else {
    std::cout << ReportText(*report);
  }
  return 0;
}

int ShowHang(const HangOptions& o) {
  std::unique_ptr<EventStore> store;
  std::string job_id;
  if (!OpenJob(o.stored, &store, &job_id)) return 2;
  auto events = store->Events(job_id);
  if (!events.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", events.status().message().c_str());
    return 2;
  }
  auto hang = FindHang(job_id, *events, o.incident);
  if (!hang.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", hang.status().message().c_str());
    return 1;
  }
  if (o.stored.json) {
    std::cout << hang->dump(2, ' ', false, kReplaceBadUtf8) << "\n";
  } else {
    std::cout << HangText(*hang);
  }
  return 0;
}

namespace {

bool WriteFile(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "trainguard: error: cannot write %s\n", path.c_str());
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

bool EndsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

int WriteTrace(const TraceOptions& o) {
  auto range = ParseStepRange(o.steps);
  if (!range.ok()) {
    std::fprintf(stderr, "trainguard: error: --steps %s\n", range.status().message().c_str());
    return 2;
  }
  const auto [from, to] = *range;
  std::unique_ptr<EventStore> store;
  std::string job_id;
  if (!OpenJob(o.stored, &store, &job_id)) return 2;
  auto trace = TraceJson(store.get(), job_id, from, to);
  if (!trace.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", trace.status().message().c_str());
    return 1;
  }
  if (!WriteFile(o.out, *trace)) return 1;
  std::fprintf(stderr, "trainguard: wrote the trace of job %s to %s (open it in https://ui.perfetto.dev or chrome://tracing)\n",
               job_id.c_str(), o.out.c_str());
  return 0;
}

int WriteHeatmap(const HeatmapCommandOptions& o) {
  HeatmapOptions h;
  h.phase = o.phase;
  h.ranks = o.ranks;
  h.window = o.window;
  h.gpu = o.gpu;
  if (EndsWith(o.out, ".html") || EndsWith(o.out, ".htm")) {
    h.html = true;
  } else if (!EndsWith(o.out, ".svg")) {
    std::fprintf(stderr, "trainguard: error: -o %s: the heatmap is written as FILE.svg or FILE.html\n", o.out.c_str());
    return 2;
  }
  std::unique_ptr<EventStore> store;
  std::string job_id;
  if (!OpenJob(o.stored, &store, &job_id)) return 2;
  auto picture = Heatmap(store.get(), job_id, h);
  if (!picture.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", picture.status().message().c_str());
    return 1;
  }
  if (!WriteFile(o.out, *picture)) return 1;
  std::fprintf(stderr, "trainguard: wrote the heatmap of job %s to %s\n", job_id.c_str(), o.out.c_str());
  return 0;
}

int ShowEvents(const EventsOptions& o) {
  std::unique_ptr<EventStore> store;
  std::string job_id;
  if (!OpenJob(o, &store, &job_id)) return 2;
  auto events = store->Events(job_id);
  if (!events.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", events.status().message().c_str());
    return 2;
  }
  if (events->empty()) {
    std::fprintf(stderr, "trainguard: error: no events for job %s in %s\n", job_id.c_str(),
                 StoreDisplayName(o.store).c_str());
    return 2;
  }
  if (o.json) {
    json out = json::array();
    for (const auto& e : *events) {
      json detail = json::parse(e.detail_json, nullptr, false);
      out.push_back({{"id", e.id}, {"job_id", e.job_id}, {"time_unix_ns", e.wall_ns},
                     {"kind", e.kind}, {"node", e.node}, {"rank", e.rank},
                     {"generation", e.generation}, {"step", e.step}, {"message", e.message},
                     {"detail", detail.is_discarded() ? json(e.detail_json) : detail}});
    }
    std::cout << out.dump(2, ' ', false, kReplaceBadUtf8) << "\n";
    return 0;
  }
  std::printf("job %s (%zu events)\n", job_id.c_str(), events->size());
  for (const auto& e : *events) {
    std::time_t secs = static_cast<std::time_t>(e.wall_ns / kSecond);
    char when[32];
    std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", std::gmtime(&secs));
    std::printf("%s.%03lld  gen %-2lld %-20s %s\n", when,
                static_cast<long long>((e.wall_ns % kSecond) / kMillisecond),
                static_cast<long long>(e.generation), e.kind.c_str(), e.message.c_str());
  }
  return 0;
}

int ListCheckpointsCommand(const CkptOptions& o) {
  auto list = ListCheckpoints(o.dir);
  if (!list.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", list.status().message().c_str());
    return 2;
  }
  if (o.json) {
    json out = json::array();
    for (const auto& c : *list) {
      out.push_back({{"step", c.step}, {"path", c.path}, {"committed", c.committed},
                     {"complete", c.complete}, {"problem", c.problem}, {"save", c.save},
                     {"world_size", c.world_size}, {"manifests", c.manifests}, {"bytes", c.bytes}});
    }
    std::cout << out.dump(2, ' ', false, kReplaceBadUtf8) << "\n";
    return 0;
  }
  std::printf("%-14s %-10s %6s %10s %14s  %s\n", "STEP", "STATE", "RANKS", "MANIFESTS", "BYTES",
              "SAVE");
  for (const auto& c : *list) {
    const char* state = c.complete             ? "complete"
                        : c.committed          ? "DAMAGED"
                        : !c.problem.empty()   ? "UNREADABLE"
                                               : "INCOMPLETE";
    std::printf("%-14lld %-10s %6d %10d %14llu  %s\n", static_cast<long long>(c.step), state,
                c.world_size, c.manifests, static_cast<unsigned long long>(c.bytes),
                c.save.c_str());
    if (!c.problem.empty()) std::printf("  %s\n", c.problem.c_str());
  }
  if (list->empty()) std::printf("(no checkpoints in %s)\n", o.dir.c_str());
  return 0;
}

int VerifyCheckpointsCommand(const CkptOptions& o) {
  auto list = ListCheckpoints(o.dir);
  if (!list.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", list.status().message().c_str());
    return 2;
  }
  std::vector<std::int64_t> steps;
  for (const auto& c : *list) {
    if (o.step < 0 || c.step == o.step) steps.push_back(c.step);
  }
  if (steps.empty()) {
    std::fprintf(stderr, "trainguard: error: no checkpoint %s in %s\n",
                 o.step < 0 ? "at all" : ("of step " + std::to_string(o.step)).c_str(), o.dir.c_str());
    return 2;
  }
  int bad = 0;
  for (std::int64_t step : steps) {
    Status s = VerifyCheckpoint(o.dir, step);
    if (s.ok()) {
      std::printf("step %lld: OK (complete, every checksum verified)\n", static_cast<long long>(step));
    } else {
      ++bad;
      std::printf("step %lld: BAD\n", static_cast<long long>(step));
      std::string msg = s.message();
      for (size_t pos = 0, next; pos < msg.size(); pos = next + 1) {
        next = msg.find('\n', pos);
        if (next == std::string::npos) next = msg.size();
        std::printf("  %s\n", msg.substr(pos, next - pos).c_str());
      }
    }
  }
  return bad == 0 ? 0 : 1;
}

json AttributionJson(const Attribution& a) {
  json evidence = json::array();
  for (const auto& e : a.evidence) {
    evidence.push_back({{"rank", e.rank}, {"node", e.node}, {"rule", e.rule_id},
                        {"category", e.category}, {"role", e.role}, {"line", e.line}});
  }
  return {{"category", a.category},        {"rule", a.rule_id},           {"role", a.role},
          {"description", a.description},  {"hardware", a.hardware},
          {"persistence", a.persistence},  {"action", a.action},
          {"culprit_ranks", a.culprit_ranks}, {"culprit_nodes", a.culprit_nodes},
          {"confidence", a.confidence},    {"raw_confidence", a.raw_confidence},
          {"answered_by", a.answered_by},  {"summary", a.summary},
          {"model", json::parse(ModelReadingJson(a))},         {"evidence", evidence}};
}

namespace {

// One log file's lines ("-": stdin), its rank from its name (rankN), appended to `lines`.
bool ReadLogLines(const std::string& file, std::vector<LogLine>* lines) {
  static const std::regex kRankInName("rank[-_]?([0-9]+)");
  std::ifstream in;
  std::istream* src = &std::cin;
  if (file != "-") {
    in.open(file);
    if (!in) {
      std::fprintf(stderr, "trainguard: error: cannot read %s\n", file.c_str());
      return false;
    }
    src = &in;
  }
  std::smatch m;
  std::string name = fs::path(file).filename().string();
  int rank = std::regex_search(name, m, kRankInName) ? std::stoi(m[1]) : -1;
  std::string line;
  while (std::getline(*src, line)) lines->push_back({rank, "", line});
  return true;
}

}  // namespace

int AttributeCommand(const AttributeOptions& o) {
  auto rules = LoadRulesFor(o.extra_rules);
  if (!rules.ok()) {
    std::fprintf(stderr, "trainguard: error: %s\n", rules.status().message().c_str());
    return 2;
  }
  if (o.no_model) rules->set_model(nullptr);
  if (o.each) {
    for (const auto& file : o.files) {
      std::vector<LogLine> lines;
      if (!ReadLogLines(file, &lines)) return 2;
      const json out = o.features ? json(LogFeatures(lines, ParseLogStructure(lines)))
                                  : AttributionJson(Attribute(*rules, lines));
      std::cout << out.dump(-1, ' ', false, kReplaceBadUtf8) << "\n";
    }
    return 0;
  }
  std::vector<LogLine> lines;
  for (const auto& file : o.files) {
    if (!ReadLogLines(file, &lines)) return 2;
  }
  if (o.features) {
    std::cout << json(LogFeatures(lines, ParseLogStructure(lines))).dump(-1, ' ', false, kReplaceBadUtf8) << "\n";
    return 0;
  }
  Attribution a = Attribute(*rules, lines);
  if (o.json) {
    std::cout << AttributionJson(a).dump(2, ' ', false, kReplaceBadUtf8) << "\n";
    return 0;
  }
  std::printf("category:   %s (%s, %s)\n", a.category.c_str(), a.hardware ? "hardware" : "software",
              a.persistence.c_str());
  std::printf("confidence: %.2f\n", a.confidence);
  std::printf("action:     %s\n", a.action.c_str());
  std::string culprits;
  for (int r : a.culprit_ranks) culprits += (culprits.empty() ? "rank " : ", rank ") + std::to_string(r);
  std::printf("culprit:    %s\n", culprits.empty() ? "unknown" : culprits.c_str());
  std::printf("why:        %s\n", a.summary.c_str());
  if (!a.evidence.empty()) std::printf("evidence:\n");
  for (const auto& e : a.evidence) {
    std::printf("  [%s%s] %s\n      (%s: %s)\n", e.role.c_str(),
                e.rank >= 0 ? (", rank " + std::to_string(e.rank)).c_str() : "", e.line.c_str(),
                e.rule_id.c_str(), e.category.c_str());
  }
  return 0;
}

}  // namespace trainguard
