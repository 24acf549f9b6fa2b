#include "controller/recovery_policy.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "controller/corroboration.h"
#include "controller/describe.h"
#include "controller/fleet_history.h"

#include <nlohmann/json.hpp>

namespace trainguard {

// Failures of the same cause this many steps apart or fewer are "in the
// same place" (a loop: a crash at start-up, a bad batch).
constexpr std::int64_t kSameStepWindow = 10;
constexpr std::size_t kSuspicionsKept = 64;

bool IsHardwareCategory(const std::string& c) {
  return c == "gpu_hardware" || c == "network" || c == "node_failure" || c == "storage";
}

namespace {

// "category|rule|rank|step", the form before signatures were objects. The
// rule may hold '|': rank and step are the last two fields.
std::optional<IncidentSignature> FromOldForm(const std::string& s) {
  const std::size_t step_at = s.rfind('|');
  if (step_at == std::string::npos || step_at == 0) return std::nullopt;
  const std::size_t rank_at = s.rfind('|', step_at - 1);
  const std::size_t rule_at = s.find('|');
  if (rank_at == std::string::npos || rule_at >= rank_at) return std::nullopt;
  IncidentSignature sig;
  sig.category = s.substr(0, rule_at);
  sig.rule = s.substr(rule_at + 1, rank_at - rule_at - 1);
  char* end = nullptr;
  const std::string rank = s.substr(rank_at + 1, step_at - rank_at - 1);
  sig.rank = static_cast<int>(std::strtol(rank.c_str(), &end, 10));
  if (rank.empty() || *end != '\0') return std::nullopt;
  sig.step = std::strtoll(s.c_str() + step_at + 1, &end, 10);
  if (step_at + 1 == s.size() || *end != '\0') return std::nullopt;
  return sig;
}

}  // namespace

std::string PolicyMemory::ToJson() const {
  nlohmann::json sigs = nlohmann::json::array();
  for (const auto& sig : signatures) {
    sigs.push_back({{"category", sig.category}, {"rule", sig.rule}, {"rank", sig.rank}, {"step", sig.step}});
  }
  nlohmann::json sus = nlohmann::json::array();
  for (const auto& s : suspicions) sus.push_back({{"node", s.node}, {"gpu", s.gpu}, {"rule", s.rule}, {"step", s.step}});
  return nlohmann::json{{"signatures", sigs},
                        {"suspicions", sus},
                        {"best_failure_step", best_failure_step},
                        {"best_checkpoint_step", best_checkpoint_step},
                        {"no_progress_incidents", no_progress_incidents}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

StatusOr<PolicyMemory> PolicyMemory::FromJson(const std::string& json_text) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  if (!j.is_object()) return InvalidArgument("policy memory: not a JSON object");
  PolicyMemory m;
  const auto& sigs = j.value("signatures", nlohmann::json::array());
  if (!sigs.is_array()) return InvalidArgument("policy memory: 'signatures' is not an array");
  for (const auto& s : sigs) {
    if (s.is_string()) {
      auto old = FromOldForm(s.get<std::string>());
      if (!old) return InvalidArgument("policy memory: signature '" + s.get<std::string>() + "' is not category|rule|rank|step");
      m.signatures.push_back(*old);
      continue;
    }
    if (!s.is_object() || !s.value("category", nlohmann::json()).is_string() ||
        !s.value("rule", nlohmann::json()).is_string() || !s.value("rank", nlohmann::json()).is_number_integer() ||
        !s.value("step", nlohmann::json()).is_number_integer()) {
      return InvalidArgument("policy memory: a signature is not {category, rule, rank, step}: " + s.dump());
    }
    m.signatures.push_back({s["category"].get<std::string>(), s["rule"].get<std::string>(), s["rank"].get<int>(),
                            s["step"].get<std::int64_t>()});
  }
  const auto& sus = j.value("suspicions", nlohmann::json::array());
  if (!sus.is_array()) return InvalidArgument("policy memory: 'suspicions' is not an array");
  for (const auto& s : sus) {
    if (!s.is_object() || !s.value("node", nlohmann::json()).is_string() ||
        !s.value("gpu", nlohmann::json()).is_number_integer() || !s.value("rule", nlohmann::json()).is_string() ||
        !s.value("step", nlohmann::json()).is_number_integer()) {
      return InvalidArgument("policy memory: a suspicion is not {node, gpu, rule, step}: " + s.dump());
    }
    m.suspicions.push_back(
        {s["node"].get<std::string>(), s["gpu"].get<int>(), s["rule"].get<std::string>(), s["step"].get<std::int64_t>()});
  }
  if (!j.value("best_failure_step", nlohmann::json(-1)).is_number_integer() ||
      !j.value("best_checkpoint_step", nlohmann::json(-1)).is_number_integer() ||
      !j.value("no_progress_incidents", nlohmann::json(0)).is_number_integer()) {
    return InvalidArgument(
        "policy memory: 'best_failure_step', 'best_checkpoint_step' and 'no_progress_incidents' must be integers");
  }
  m.best_failure_step = j.value("best_failure_step", std::int64_t{-1});
  m.best_checkpoint_step = j.value("best_checkpoint_step", std::int64_t{-1});
  m.no_progress_incidents = j.value("no_progress_incidents", 0);
  return m;
}

const char* DecisionName(Decision d) {
  switch (d) {
    case Decision::kStop: return "stop";
    case Decision::kEvict: return "evict_node";
    case Decision::kRestart: return "restart";
  }
  return "restart";
}

std::string Blame::CulpritText() const {
  if (culprit_rank >= 0) return "rank " + std::to_string(culprit_rank) + " on " + culprit_node;
  return culprit_node.empty() ? "unknown" : "node " + culprit_node;
}

namespace {

// A Python stack (faulthandler) that waits inside a collective or autograd's
// reduction, as opposed to one stuck in the user's own code.
bool InCollective(const std::string& python_stack) {
  for (const char* marker : {"torch/distributed/", "torch/autograd/", "torch/nn/parallel/",
                             "in all_reduce", "in barrier", "in broadcast", "in all_gather",
                             "in reduce_scatter", "in wait", "torch/_tensor.py"}) {
    if (python_stack.find(marker) != std::string::npos) return true;
  }
  return false;
}

// The first failure in time matters more than the loudest. If only a symptom
// decided (peers that lost their connection) and the rank that died first
// shows no such symptom itself, its own lines (and the nodes' kernel lines)
// are what explains the incident.
void PreferFirstInTime(const RuleSet& rules, const Incident& inc, Blame* b) {
  Attribution& a = b->attribution;
  if (a.role != "symptom" || inc.exit_times.empty()) return;
  int earliest = std::min_element(inc.exit_times.begin(), inc.exit_times.end(),
                                  [](const auto& x, const auto& y) { return x.second < y.second; })
                     ->first;
  for (const auto& e : a.evidence) {
    if (e.rank == earliest && e.rule_id == a.rule_id) return;
  }
  std::vector<LogLine> own;
  for (const auto& l : inc.lines) {
    if (l.rank == earliest || l.rank < 0) own.push_back(l);
  }
  Attribution first = Attribute(rules, own);
  if (first.culprit_ranks.empty() && first.culprit_nodes.empty()) first.culprit_ranks = {earliest};
  first.evidence.insert(first.evidence.end(), a.evidence.begin(), a.evidence.end());
  b->first_in_time = "rank " + std::to_string(earliest) + " failed first; the " + a.category +
                     " errors of other ranks are symptoms of it";
  a = first;
}

// A hang names the roots of the journals' wait-for graph; without journals,
// the ranks that were not waiting: a stopped process first, else ranks
// whose stack is outside any collective while others wait inside one, else
// what set the hang detector's culprit apart. The timeouts of the waiting
// ranks are symptoms. Nothing sets a rank apart (all wait inside one
// collective): no culprit, rather than the rank that happened to be
// noticed first.
std::vector<int> HangCulprits(const Incident& inc, const Attribution& a, std::string* why) {
  // The journals' wait-for graph, where the ranks kept one, says it best.
  if (!inc.hang_roots.empty()) {
    *why = inc.hang_evidence;
    return inc.hang_roots;
  }
  std::vector<int> stopped, outside, inside;
  for (int r : inc.hung_ranks) {
    auto it = inc.stacks.find(r);
    if (it == inc.stacks.end()) continue;
    if (it->second.first == "T" || it->second.first == "t") stopped.push_back(r);
    if (it->second.second.empty()) continue;
    (InCollective(it->second.second) ? inside : outside).push_back(r);
  }
  std::sort(inside.begin(), inside.end());
  std::sort(outside.begin(), outside.end());
  std::sort(stopped.begin(), stopped.end());
  auto list = [](const std::vector<int>& ranks) {
    std::string s;
    for (std::size_t i = 0; i < ranks.size() && i < 8; ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
    return ranks.size() > 8 ? s + " and " + std::to_string(ranks.size() - 8) + " more" : s;
  };
  if (!stopped.empty()) {
    *why = "rank(s) " + list(stopped) + " stopped (process state T)";
    return stopped;
  }
  if (!inside.empty() && !outside.empty()) {
    *why = "the stack of rank(s) " + list(outside) + " is outside any collective while rank(s) " +
           list(inside) + " wait inside one";
    return outside;
  }
  if (!inc.hang_evidence.empty() && inc.first_rank >= 0) {
    *why = inc.hang_evidence;
    return {inc.first_rank};
  }
  if (a.category != "comm_hang" && !a.culprit_ranks.empty()) {
    *why = "the " + a.category + " lines of rank(s) " + list(a.culprit_ranks);
    return a.culprit_ranks;
  }
  *why = "no rank stands out: every stuck rank captured waits in communication, none is stopped "
         "or elsewhere (the network, or the operation itself)";
  return {};
}

// A detector's verdict as the incident's attribution: taken as it stands,
// whatever the rules say of the incident's lines (they stay as evidence).
Attribution FromVerdict(const DetectorVerdict& v, const Incident& inc) {
  Attribution a;
  a.category = v.category;
  a.rule_id = v.rule_id;
  a.role = "cause";
  a.description = v.description;
  a.hardware = v.hardware;
  a.persistence = v.persistence;
  a.action = !v.action.empty() ? v.action : v.evict_nodes.empty() ? "restart" : "evict_node";
  a.culprit_nodes = v.evict_nodes;
  if (inc.first_rank >= 0) a.culprit_ranks = {inc.first_rank};
  a.confidence = 1.0;  // measured, not read from text
  for (const LogLine& l : inc.verdict_lines) a.evidence.push_back({l.rank, l.node, v.rule_id, v.category, "cause", l.text});
  a.summary = v.category + ": " + v.description;
  return a;
}

}  // namespace

Blame AssignBlame(const RuleSet* rules, const Incident& inc,
                  const std::function<std::string(int)>& node_of_rank) {
  Blame b;
  if (inc.verdict) {
    b.attribution = FromVerdict(*inc.verdict, inc);
  } else if (rules != nullptr) {
    b.attribution = Attribute(*rules, inc.lines);
    PreferFirstInTime(*rules, inc, &b);
  }
  const Attribution& a = b.attribution;
  b.culprit_ranks = a.culprit_ranks;
  if (inc.kind == FindingKind::kHang) {
    b.culprit_ranks = HangCulprits(inc, a, &b.culprit_evidence);
  } else if (b.culprit_ranks.empty() && inc.first_rank >= 0 &&
             (a.culprit_nodes.empty() ||
              std::count(a.culprit_nodes.begin(), a.culprit_nodes.end(), node_of_rank(inc.first_rank)))) {
    // Nothing better known than who failed first; when the evidence names
    // its node only (kernel lines: the OOM killer, an Xid), that rank too.
    b.culprit_ranks = {inc.first_rank};
  }
  // The culprit nodes are the culprit ranks' own: a hang's timeouts, logged
  // by every waiting rank, name every node. Nodes named by node-level lines
  // (the kernel's: an Xid, the OOM killer) or by a detector's verdict join
  // them.
  for (int r : b.culprit_ranks) {
    std::string n = node_of_rank(r);
    if (!n.empty()) b.culprit_nodes.insert(n);
  }
  if (inc.verdict || (b.culprit_ranks.empty() && (inc.kind != FindingKind::kHang || a.hardware))) {
    b.culprit_nodes.insert(a.culprit_nodes.begin(), a.culprit_nodes.end());
  } else {
    for (const auto& e : a.evidence) {
      if (e.rank < 0 && !e.node.empty() && e.category == a.category) b.culprit_nodes.insert(e.node);
    }
  }
  if (b.culprit_nodes.empty() && !inc.first_node.empty() && inc.kind != FindingKind::kHang) {
    b.culprit_nodes.insert(inc.first_node);
  }
  b.culprit_rank = b.culprit_ranks.empty() ? -1 : b.culprit_ranks.front();
  // The culprit rank's own node, not whichever node sorts first among those named.
  if (b.culprit_rank >= 0) b.culprit_node = node_of_rank(b.culprit_rank);
  if (b.culprit_node.empty() && !b.culprit_nodes.empty()) b.culprit_node = *b.culprit_nodes.begin();
  // The step the culprit failed at: what makes a failure deterministic.
  b.step = inc.first_rank_step >= 0 ? inc.first_rank_step : inc.failure_step;
  auto own = inc.rank_steps.find(b.culprit_rank);
  if (b.culprit_rank >= 0 && own != inc.rank_steps.end()) b.step = own->second;
  return b;
}

Verdict RecoveryPolicy::Decide(const Blame& b, const Incident& inc, const FleetFinding& fleet,
                               const Corroboration* corroboration, int culprit_gpu) {
  const Attribution& a = b.attribution;
  Verdict v;
  bool suspect_history = false;
  for (const auto& [node, count] : fleet.hardware_on_node) suspect_history = suspect_history || count > 0;
  suspect_history = suspect_history || !fleet.watched_nodes.empty();
  v.history = fleet.Summary();
  const IncidentSignature signature{a.category, a.rule_id, b.culprit_rank, b.step};
  std::vector<IncidentSignature>& signatures = memory_.signatures;
  bool repeat = std::count(signatures.begin(), signatures.end(), signature) > 0;
  // Related to the incident before: the same culprit rank, or the same
  // cause (category and rule) at about the same step, unless that is a
  // hardware fault, which is of the node that had it (another node's is
  // independent evidence). A loop repeats itself in the same place; at a
  // large job's size, independent faults arrive faster than the job gets
  // back past its last failure (trainguard sim: counted as a loop, they
  // stopped a 100,000-GPU job within hours) and must not count as one.
  bool related = false;
  if (!signatures.empty()) {
    const IncidentSignature& last = signatures.back();
    related = (b.culprit_rank >= 0 && last.rank == b.culprit_rank) ||
              (!IsHardwareCategory(a.category) && last.category == a.category && last.rule == a.rule_id &&
               std::llabs(b.step - last.step) <= kSameStepWindow);
  }
  signatures.push_back(signature);
  // Progress is judged from the second incident on: did the job get further
  // than it ever got before failing, or commit a checkpoint it never had
  // (work kept: where failures come faster than checkpoints, a job that
  // keeps checkpointing is moving, if slowly)?
  bool progress = signatures.size() == 1 || inc.failure_step > memory_.best_failure_step ||
                  inc.checkpoint_step > memory_.best_checkpoint_step;
  memory_.best_failure_step = std::max(memory_.best_failure_step, inc.failure_step);
  memory_.best_checkpoint_step = std::max(memory_.best_checkpoint_step, inc.checkpoint_step);
  memory_.no_progress_incidents = progress ? 0 : related ? memory_.no_progress_incidents + 1 : 1;
  const int no_progress_incidents_ = memory_.no_progress_incidents;
  const std::int64_t best_failure_step_ = memory_.best_failure_step;

  std::string culprit = b.CulpritText();
  // The attribution's own recommendation counts only when it is confident
  // enough; the learned model never recommends more than a restart.
  const bool trusted = a.confidence >= min_confidence_;
  char confidence[16];
  std::snprintf(confidence, sizeof(confidence), "%.2f", a.confidence);
  const std::string untrusted = a.action != "restart" && !trusted
                                    ? std::string(" (its recommendation, ") + a.action + ", needs confidence " +
                                          std::to_string(min_confidence_).substr(0, 4) + "; this one has " +
                                          confidence + ")"
                                    : "";
  if (fleet.PointsAtApplication()) {
    v.decision = Decision::kStop;
    v.why = a.category + " (" + a.rule_id + ") of " + culprit + AtStep(b.step) + ": " + v.history +
            "; restarting or moving it cannot help: " + a.description;
  } else if (a.action == "stop" && repeat && trusted) {
    v.decision = Decision::kStop;
    v.why = "the same " + a.category + " failure (" + a.rule_id + ") of " + culprit +
            AtStep(b.step) +
            " happened again after a restart: it is deterministic, so restarting cannot help; " +
            a.description;
  } else if (no_progress_incidents_ >= no_progress_restarts_) {
    v.decision = Decision::kStop;
    v.why = std::to_string(no_progress_incidents_) +
            " failures in a row without getting past step " + std::to_string(best_failure_step_) +
            ": stopping the restart loop; last: " + a.category + " (" + a.description + ")";
  } else if (inc.verdict && !inc.verdict->evict_nodes.empty()) {
    // A detector measured it (step timings, link counters): its nodes go.
    v.decision = Decision::kEvict;
    v.evict_nodes = inc.verdict->evict_nodes;
    v.why = a.category + " on " + culprit + " (" + a.rule_id + "): evicting node(s) and restarting" +
            (v.history.empty() ? "" : " (" + v.history + ")");
  } else if (!b.culprit_nodes.empty() &&
             (fleet.PointsAtNode() || (suspect_history && (IsHardwareCategory(a.category) || a.category == "other" ||
                                                           a.category == "comm_hang")))) {
    v.decision = Decision::kEvict;
    v.evict_nodes.assign(b.culprit_nodes.begin(), b.culprit_nodes.end());
    v.why = a.category + " on " + culprit + ": evicting node(s) and restarting" +
            (v.history.empty() ? "" : " (" + v.history + ")");
  } else if (!b.culprit_nodes.empty() && a.action == "evict_node" && trusted) {
    if (corroboration == nullptr || !corroboration->log_only || corroboration->unsupported.empty()) {
      v.decision = Decision::kEvict;
      v.evict_nodes.assign(b.culprit_nodes.begin(), b.culprit_nodes.end());
      std::string agree;
      if (corroboration != nullptr && corroboration->log_only) {
        for (const auto& [node, lines] : corroboration->support) agree += (agree.empty() ? "" : "; ") + node + ": " + lines.front();
      }
      v.why = a.category + " on " + culprit + ": evicting node(s) and restarting" +
              (agree.empty() ? "" : " (its own signals agree: " + agree + ")");
    } else {
      DecideOnSuspects(b, *corroboration, culprit_gpu, &v);
    }
  } else {
    v.why = a.category + " on " + culprit + ": restarting" +
            (!untrusted.empty() ? untrusted : a.action == "stop" ? " once to rule out a transient cause" : "");
    if (!trusted && IsHardwareCategory(a.category) && !b.culprit_nodes.empty()) {
      // Undetermined, and the machine plausible: its nodes are diagnosed
      // before the restart (one that fails is evicted), never left unasked.
      v.diagnose_nodes.assign(b.culprit_nodes.begin(), b.culprit_nodes.end());
      v.why += "; undetermined with hardware plausible: diagnosing the node(s) first";
    }
  }
  return v;
}

void RecoveryPolicy::DecideOnSuspects(const Blame& b, const Corroboration& c, int culprit_gpu, Verdict* v) {
  const Attribution& a = b.attribution;
  // Nodes whose own signals agree go; a suspect whose same GPU failed the
  // same way before, at another step, goes too: a fault that strikes one GPU
  // twice at different places is the GPU's. One that strikes at the same
  // step follows the program (the restart-storm guard stops a loop).
  std::vector<std::string> repeated, suspects, same_place;
  for (const auto& node : c.unsupported) {
    bool again = false, here = false;
    for (const auto& s : memory_.suspicions) {
      if (s.node != node || s.rule != a.rule_id || (s.gpu >= 0 && culprit_gpu >= 0 && s.gpu != culprit_gpu)) continue;
      (std::llabs(s.step - b.step) > kSameStepWindow ? again : here) = true;
    }
    (again ? repeated : suspects).push_back(node);
    if (!again && here) same_place.push_back(node);
  }
  for (const auto& [node, lines] : c.support) v->evict_nodes.push_back(node);
  v->evict_nodes.insert(v->evict_nodes.end(), repeated.begin(), repeated.end());
  v->diagnose_nodes = suspects;
  for (const auto& node : suspects) {
    memory_.suspicions.push_back({node, node == b.culprit_node ? culprit_gpu : -1, a.rule_id, b.step});
  }
  if (memory_.suspicions.size() > kSuspicionsKept) {
    memory_.suspicions.erase(memory_.suspicions.begin(),
                             memory_.suspicions.end() - static_cast<std::ptrdiff_t>(kSuspicionsKept));
  }
  auto list = [](const std::vector<std::string>& nodes) {
    std::string s;
    for (const auto& n : nodes) s += (s.empty() ? "" : ", ") + n;
    return s;
  };
  const std::string gpu = culprit_gpu >= 0 ? " (GPU " + std::to_string(culprit_gpu) + ")" : "";
  std::string why = a.category + " (" + a.rule_id + ") of " + b.CulpritText() + gpu + AtStep(b.step) + " from its log alone";
  if (!repeated.empty()) why += "; the same GPU of " + list(repeated) + " failed so before at another step: evicting";
  if (!c.support.empty()) {
    std::vector<std::string> agreed;
    for (const auto& [node, lines] : c.support) agreed.push_back(node + " (" + lines.front() + ")");
    why += "; evicting " + list(agreed) + ", whose own signals agree";
  }
  if (!suspects.empty()) {
    why += "; nothing of " + list(suspects) +
           "'s own agrees (no kernel line, no GPU error in its heartbeats, no hardware history): suspected, "
           "diagnosing it before the restart; the same GPU failing again evicts it";
    if (!same_place.empty()) why += " (it failed so at this step before: that follows the program, not the GPU)";
  }
  v->decision = v->evict_nodes.empty() ? Decision::kRestart : Decision::kEvict;
  v->why = why;
}

}  // namespace trainguard
