#include "report/fleet_report.h"

#include <algorithm>
#include <sstream>
#include <tuple>

#include "controller/fleet_history.h"

namespace trainguard {

using nlohmann::json;

namespace {

std::vector<FleetCount> Sorted(std::map<std::string, FleetCount>& by_key) {
  std::vector<FleetCount> out;
  for (auto& [key, c] : by_key) {
    c.key = key;
    out.push_back(std::move(c));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const FleetCount& a, const FleetCount& b) { return a.incidents > b.incidents; });
  return out;
}

std::string Join(const std::set<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

std::string Categories(const std::map<std::string, int>& categories) {
  std::string out;
  for (const auto& [c, n] : categories) out += (out.empty() ? "" : ", ") + c + " " + std::to_string(n);
  return out;
}

json CountsJson(const std::vector<FleetCount>& counts) {
  json out = json::array();
  for (const auto& c : counts) {
    out.push_back({{"key", c.key}, {"incidents", c.incidents}, {"jobs", c.jobs}, {"nodes", c.nodes},
                   {"categories", c.categories}});
  }
  return out;
}

}  // namespace

FleetReport ComputeFleetReport(const std::vector<JobRecord>& jobs, const std::vector<IncidentRecord>& incidents) {
  FleetReport r;
  r.jobs = static_cast<int>(jobs.size());
  std::map<std::string, std::string> program_of;
  for (const auto& j : jobs) {
    json config = json::parse(j.config_json, nullptr, false);
    std::vector<std::string> argv;
    if (config.is_object() && config.contains("argv") && config["argv"].is_array()) {
      for (const auto& a : config["argv"]) argv.push_back(a.is_string() ? a.get<std::string>() : "");
    }
    program_of[j.job_id] = ProgramOf(argv);
  }
  std::map<std::string, FleetCount> by_category, by_node, by_job;
  std::map<std::tuple<std::string, std::string>, FleetPattern> on_node;  // (node, rule)
  std::map<std::tuple<std::string, std::string, int, std::int64_t>, FleetPattern> in_program;
  for (const IncidentRecord& i : incidents) {
    ++r.incidents;
    for (auto* c : {&by_category[i.category], &by_job[i.job_id]}) {
      ++c->incidents;
      c->jobs.insert(i.job_id);
      if (!i.node.empty()) c->nodes.insert(i.node);
      ++c->categories[i.category];
    }
    if (!i.node.empty()) {
      FleetCount& n = by_node[i.node];
      ++n.incidents;
      n.jobs.insert(i.job_id);
      ++n.categories[i.category];
    }
    if (i.rule.empty()) continue;
    if (!i.node.empty() && i.category != "user_code") {
      FleetPattern& p = on_node[{i.node, i.rule}];
      p.points_to = "node";
      p.rule = i.rule;
      p.category = i.category;
      p.node = i.node;
      p.jobs.insert(i.job_id);
      p.nodes.insert(i.node);
    }
    const std::string& program = program_of[i.job_id];
    if (!program.empty() && i.rank >= 0 && i.failure_step >= 0) {
      FleetPattern& p = in_program[{program, i.rule, i.rank, i.failure_step}];
      p.points_to = "program";
      p.rule = i.rule;
      p.category = i.category;
      p.program = program;
      p.rank = i.rank;
      p.step = i.failure_step;
      p.jobs.insert(i.job_id);
      if (!i.node.empty()) p.nodes.insert(i.node);
    }
  }
  r.by_category = Sorted(by_category);
  r.by_node = Sorted(by_node);
  r.by_job = Sorted(by_job);
  // A program's pattern needs other nodes; a node's pattern other jobs.
  for (auto& [key, p] : in_program) {
    if (p.jobs.size() >= 2 && p.nodes.size() >= 2) r.recurring.push_back(p);
  }
  for (auto& [key, p] : on_node) {
    if (p.jobs.size() >= 2) r.recurring.push_back(p);
  }
  return r;
}

std::string FleetReportText(const FleetReport& r) {
  std::ostringstream out;
  out << r.incidents << " incident(s) in " << r.jobs << " job(s)\n";
  if (!r.recurring.empty()) {
    out << "\nrecurring across jobs:\n";
    for (const auto& p : r.recurring) {
      if (p.points_to == "node") {
        out << "  node " << p.node << ": " << p.category << " (" << p.rule << ") in " << p.jobs.size()
            << " jobs (" << Join(p.jobs) << "): the node\n";
      } else {
        out << "  " << p.program << ": " << p.category << " (" << p.rule << ") of rank " << p.rank << " at step "
            << p.step << " in " << p.jobs.size() << " jobs (" << Join(p.jobs) << ") on nodes " << Join(p.nodes)
            << ": the program\n";
      }
    }
  }
  auto table = [&](const char* title, const std::vector<FleetCount>& counts, bool nodes_column) {
    if (counts.empty()) return;
    out << "\n" << title << "\n";
    for (const auto& c : counts) {
      out << "  " << c.key << ": " << c.incidents << " incident(s) in " << c.jobs.size() << " job(s)";
      if (nodes_column && !c.nodes.empty()) out << " on " << c.nodes.size() << " node(s)";
      out << "; " << Categories(c.categories) << "\n";
    }
  };
  table("by category:", r.by_category, true);
  table("by node:", r.by_node, false);
  table("by job:", r.by_job, true);
  return out.str();
}

json FleetReportJson(const FleetReport& r) {
  json recurring = json::array();
  for (const auto& p : r.recurring) {
    json one = {{"points_to", p.points_to}, {"rule", p.rule}, {"category", p.category}, {"jobs", p.jobs},
                {"nodes", p.nodes}};
    if (p.points_to == "node") {
      one["node"] = p.node;
    } else {
      one["program"] = p.program;
      one["rank"] = p.rank;
      one["step"] = p.step;
    }
    recurring.push_back(one);
  }
  return {{"jobs", r.jobs},
          {"incidents", r.incidents},
          {"recurring", recurring},
          {"by_category", CountsJson(r.by_category)},
          {"by_node", CountsJson(r.by_node)},
          {"by_job", CountsJson(r.by_job)}};
}

}  // namespace trainguard
