#include "controller/fleet_history.h"

#include <set>

#include <nlohmann/json.hpp>

#include "common/json_text.h"

namespace trainguard {

using nlohmann::json;

namespace {

std::string Basename(const std::string& path) { return path.substr(path.rfind('/') + 1); }

json ToJson(const std::vector<PastIncident>& list) {
  json out = json::array();
  for (const auto& p : list) {
    out.push_back({{"job_id", p.job_id}, {"incident", p.incident}, {"node", p.node}, {"rank", p.rank},
                   {"category", p.category}, {"rule", p.rule}, {"step", p.step}});
  }
  return out;
}

// "job a (node3), job b (node5)"
std::string Jobs(const std::vector<PastIncident>& list) {
  std::string out;
  std::set<std::string> said;
  for (const auto& p : list) {
    std::string one = "job " + p.job_id + " (" + p.node + ")";
    if (said.insert(one).second) out += (out.empty() ? "" : ", ") + one;
  }
  return out;
}

}  // namespace

std::string ProgramOf(const std::vector<std::string>& argv) {
  if (argv.empty()) return "";
  if (Basename(argv[0]).rfind("python", 0) != 0) return argv[0];
  for (std::size_t i = 1; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "-m" && i + 1 < argv.size()) return "-m " + argv[i + 1];
    if (a == "-c") return "";  // an inline program has no name to follow
    if (a == "-X" || a == "-W") {
      ++i;  // an interpreter option with a value
      continue;
    }
    if (!a.empty() && a[0] != '-') return a;
  }
  return "";
}

FleetFinding ReadFleetHistory(const Blame& blame, const std::vector<IncidentRecord>& incidents,
                              const FleetQuery& query) {
  FleetFinding f;
  const Attribution& a = blame.attribution;
  auto since_for = [&](const std::string& node) {
    auto it = query.node_since.find(node);
    return it == query.node_since.end() ? query.since : it->second;
  };
  for (const IncidentRecord& r : incidents) {
    if (r.job_id == query.job_id) continue;
    const PastIncident past{r.job_id, r.incident, r.node, r.rank, r.category, r.rule, r.failure_step};
    const bool on_culprit_node = !r.node.empty() && blame.culprit_nodes.count(r.node) > 0;
    // A reading of the learned model alone never makes another one of its
    // readings a node's history: an eviction needs a rule's or a detector's word.
    const bool model_on_model = a.answered_by == "model" && r.rule == kModelRuleId;
    if (on_culprit_node && r.wall_ns > since_for(r.node) && IsHardwareCategory(r.category) && !model_on_model) {
      ++f.hardware_on_node[r.node];
    }
    if (a.rule_id.empty() || r.rule != a.rule_id || r.wall_ns <= query.since) continue;
    auto program = query.program_of_job.find(r.job_id);
    const bool same_program = !query.program.empty() && program != query.program_of_job.end() &&
                              program->second == query.program;
    const bool same_place = same_program && blame.culprit_rank >= 0 && r.rank == blame.culprit_rank &&
                            blame.step >= 0 && r.failure_step == blame.step;
    if (same_place) {
      // The program's own pattern: evidence against the application, and
      // never against the node it happened to run on.
      if (!on_culprit_node) f.same_error_elsewhere.push_back(past);
      continue;
    }
    // A user's code fails wherever it runs; its rules (one per kind of
    // exception, not per exception) say nothing of a node.
    if (on_culprit_node && r.wall_ns > since_for(r.node) && a.category != "user_code" &&
        a.answered_by != "model") {
      f.same_error_on_node.push_back(past);
    }
  }
  return f;
}

std::string FleetFinding::Summary() const {
  if (PointsAtApplication()) {
    const PastIncident& p = same_error_elsewhere.front();
    return "the same " + p.rule + " failure of rank " + std::to_string(p.rank) + " at step " +
           std::to_string(p.step) + " happened in " + Jobs(same_error_elsewhere) +
           " of the same program on other nodes: it follows the program, not the node";
  }
  if (PointsAtNode()) {
    return "the same " + same_error_on_node.front().rule + " failure happened on node " +
           same_error_on_node.front().node + " in " + Jobs(same_error_on_node);
  }
  std::string out;
  for (const auto& [node, count] : hardware_on_node) {
    if (count > 0) {
      out = "node " + node + " had " + std::to_string(count) + " hardware incident(s) in earlier jobs";
    }
  }
  for (const auto& [node, why] : watched_nodes) {
    out += (out.empty() ? "" : "; ") + ("node " + node + " is watched: " + why);
  }
  return out;
}

std::string FleetFinding::EvidenceJson() const {
  return json{{"same_error_on_node", ToJson(same_error_on_node)},
              {"same_error_elsewhere", ToJson(same_error_elsewhere)},
              {"hardware_on_node", hardware_on_node},
              {"watched_nodes", watched_nodes}}
      .dump(-1, ' ', false, kReplaceBadUtf8);
}

}  // namespace trainguard
