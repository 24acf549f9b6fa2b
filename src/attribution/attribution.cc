#include "attribution/attribution.h"

#include <re2/re2.h>
#include <re2/set.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "attribution/log_features.h"
#include "attribution/log_structure.h"
#include "common/utf8.h"

namespace trainguard {

using nlohmann::json;

const std::vector<std::string>& AttributionCategories() {
  static const std::vector<std::string> kCategories = {
      "gpu_hardware", "network", "node_failure", "storage", "comm_hang",
      "cuda_software", "oom",    "numeric",      "user_code", "other"};
  return kCategories;
}

// Every rule's pattern in one RE2::Set (case-insensitive ones carry "(?i)"),
// so a line is scanned once whatever the number of rules.
class RuleMatcher {
 public:
  explicit RuleMatcher(const std::vector<Rule>& rules)
      : set_(SetOptions(), RE2::UNANCHORED), rules_(rules) {
    for (const Rule& r : rules) {
      std::string error;
      set_.Add((r.case_sensitive ? "" : "(?i)") + r.pattern, &error);
    }
    compiled_ = set_.Compile();
  }
  std::vector<int> Match(const std::string& text) const {
    std::vector<int> hits;
    RE2::Set::ErrorInfo info;
    if (compiled_ && set_.Match(text, &hits, &info)) {
      std::sort(hits.begin(), hits.end());
      return WithoutExceptions(text, std::move(hits));
    }
    if (compiled_ && info.kind == RE2::Set::kNoError) return {};
    // The set's DFA ran out of memory on this text: rule by rule.
    hits.clear();
    for (size_t i = 0; i < rules_.size(); ++i) {
      if (RE2::PartialMatch(text, *rules_[i].regex)) hits.push_back(static_cast<int>(i));
    }
    return WithoutExceptions(text, std::move(hits));
  }

 private:
  // Drops the hits whose rule's `unless` also matches (checked only on hits).
  std::vector<int> WithoutExceptions(const std::string& text, std::vector<int> hits) const {
    hits.erase(std::remove_if(hits.begin(), hits.end(),
                              [&](int i) {
                                const auto& unless = rules_[i].unless_regex;
                                return unless != nullptr && RE2::PartialMatch(text, *unless);
                              }),
               hits.end());
    return hits;
  }
  static RE2::Options SetOptions() {
    RE2::Options o;
    o.set_log_errors(false);
    o.set_max_mem(256 << 20);
    return o;
  }
  RE2::Set set_;
  std::vector<Rule> rules_;
  bool compiled_ = false;
};

namespace {

// Lines with more than this share of non-text bytes are binary output, not
// messages: they match no rule (random bytes hold "DBE" sooner or later).
constexpr double kMaxNonText = 0.10;

constexpr const char* kRulesFormat = "trainguard-attribution-rules";
constexpr int kRulesVersion = 1;

bool OneOf(const std::string& v, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed) {
    if (v == a) return true;
  }
  return false;
}

}  // namespace

StatusOr<RuleSet> RuleSet::Parse(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, false, /*ignore_comments=*/true);
  if (j.is_discarded()) return InvalidArgument(origin + ": not valid JSON");
  if (!j.is_object() || j.value("format", "") != kRulesFormat) {
    return InvalidArgument(origin + ": not a trainguard rule file (\"format\" must be \"" +
                           kRulesFormat + "\")");
  }
  if (j.value("version", 0) != kRulesVersion) {
    return InvalidArgument(origin + ": rule file version " + std::to_string(j.value("version", 0)) +
                           ", this trainguard reads version " + std::to_string(kRulesVersion));
  }
  if (!j.contains("rules") || !j["rules"].is_array()) {
    return InvalidArgument(origin + ": \"rules\" must be a list");
  }
  static const std::set<std::string> kFields = {
      "id", "category", "pattern", "priority", "role", "persistence", "hardware", "action",
      "description", "case_sensitive", "scan", "source", "unless"};
  RuleSet set;
  std::set<std::string> ids;
  int index = 0;
  for (const auto& r : j["rules"]) {
    std::string where = origin + ": rule " + std::to_string(index++);
    if (!r.is_object()) return InvalidArgument(where + " is not an object");
    Rule rule;
    try {
      rule.id = r.at("id").get<std::string>();
      where = origin + ": rule '" + rule.id + "'";
      for (const auto& [key, value] : r.items()) {
        if (!kFields.count(key)) return InvalidArgument(where + ": unknown field '" + key + "'");
      }
      rule.category = r.at("category").get<std::string>();
      rule.pattern = r.at("pattern").get<std::string>();
      rule.priority = r.at("priority").get<int>();
      rule.role = r.value("role", "cause");
      rule.persistence = r.value("persistence", "unknown");
      rule.hardware = r.value("hardware", false);
      rule.action = r.value("action", "restart");
      rule.description = r.value("description", "");
      rule.case_sensitive = r.value("case_sensitive", false);
      rule.scan = r.value("scan", "");
      rule.unless = r.value("unless", "");
    } catch (const std::exception& e) {
      return InvalidArgument(where + ": " + e.what());
    }
    const auto& cats = AttributionCategories();
    if (rule.id.empty()) return InvalidArgument(where + ": empty id");
    if (!ids.insert(rule.id).second) return InvalidArgument(where + ": id used twice");
    if (std::find(cats.begin(), cats.end(), rule.category) == cats.end()) {
      return InvalidArgument(where + ": unknown category '" + rule.category + "'");
    }
    if (rule.priority < 0 || rule.priority > 100) {
      return InvalidArgument(where + ": priority must be 0..100");
    }
    if (!OneOf(rule.role, {"cause", "symptom"})) {
      return InvalidArgument(where + ": role must be cause or symptom");
    }
    if (!OneOf(rule.persistence, {"transient", "persistent", "unknown"})) {
      return InvalidArgument(where + ": persistence must be transient, persistent or unknown");
    }
    if (!OneOf(rule.action, {"restart", "evict_node", "stop"})) {
      return InvalidArgument(where + ": action must be restart, evict_node or stop");
    }
    if (!OneOf(rule.scan, {"", "fatal", "warning"})) {
      return InvalidArgument(where + ": scan must be fatal or warning");
    }
    if (rule.scan == "fatal" && rule.role != "cause") {
      return InvalidArgument(where + ": a fatal scan rule must be a cause");
    }
    RE2::Options options;
    options.set_case_sensitive(rule.case_sensitive);
    options.set_log_errors(false);
    rule.regex = std::make_shared<RE2>(rule.pattern, options);
    if (!rule.regex->ok()) {
      return InvalidArgument(where + ": bad pattern: " + rule.regex->error());
    }
    if (!rule.unless.empty()) {
      rule.unless_regex = std::make_shared<RE2>(rule.unless, options);
      if (!rule.unless_regex->ok()) {
        return InvalidArgument(where + ": bad unless pattern: " + rule.unless_regex->error());
      }
    }
    set.rules_.push_back(std::move(rule));
  }
  set.Compile();
  return set;
}

RuleSet RuleSet::ScanRules() const {
  RuleSet scan;
  for (const Rule& r : rules_) {
    if (!r.scan.empty()) scan.rules_.push_back(r);
  }
  scan.Compile();
  return scan;
}

std::string RuleSet::ToJson() const {
  nlohmann::json rules = nlohmann::json::array();
  for (const Rule& r : rules_) {
    nlohmann::json j = {{"id", r.id},           {"category", r.category},
                        {"pattern", r.pattern}, {"priority", r.priority},
                        {"role", r.role},       {"persistence", r.persistence},
                        {"hardware", r.hardware}, {"action", r.action},
                        {"description", r.description}};
    if (r.case_sensitive) j["case_sensitive"] = true;
    if (!r.scan.empty()) j["scan"] = r.scan;
    if (!r.unless.empty()) j["unless"] = r.unless;
    rules.push_back(std::move(j));
  }
  nlohmann::json file = {{"format", "trainguard-attribution-rules"}, {"version", kRulesVersion}, {"rules", rules}};
  return file.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void RuleSet::Compile() { matcher_ = std::make_shared<const RuleMatcher>(rules_); }

std::vector<int> RuleSet::Match(const std::string& text) const {
  if (matcher_ == nullptr || NonTextShare(text) > kMaxNonText) return {};
  return matcher_->Match(text);
}

StatusOr<RuleSet> RuleSet::Load(const std::string& path) {
  std::ifstream f(path);
  if (!f) return NotFound("cannot read rule file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return Parse(ss.str(), path);
}

void RuleSet::Merge(const RuleSet& overrides) {
  for (const Rule& r : overrides.rules_) {
    auto it = std::find_if(rules_.begin(), rules_.end(), [&](const Rule& x) { return x.id == r.id; });
    if (it != rules_.end()) {
      *it = r;
    } else {
      rules_.push_back(r);
    }
  }
  Compile();
}

int RankFromPrefix(const std::string& line) {
  static const RE2 kRank(R"((?i)^\s*(?:\[\d+\]\s*)?\[rank\s*(\d+)\]|^\s*\[\d+,(\d+)\]<std|\[Rank (\d+)\])");
  // Every form has a '['; and torchrun's own "[rank3]:" is read without the
  // expression (the same answer, at a scan's cost: it opens most lines of a
  // job's merged output).
  if (line.find('[') == std::string::npos) return -1;
  if (line.rfind("[rank", 0) == 0) {
    std::size_t i = 5, value = 0;
    while (i < line.size() && i < 5 + 9 && std::isdigit(static_cast<unsigned char>(line[i]))) {
      value = value * 10 + static_cast<std::size_t>(line[i] - '0');
      ++i;
    }
    if (i > 5 && i < line.size() && line[i] == ']') return static_cast<int>(value);
  }
  std::string a, b, c;
  if (RE2::PartialMatch(line, kRank, &a, &b, &c)) {
    const std::string& s = !a.empty() ? a : !b.empty() ? b : c;
    if (!s.empty()) return std::stoi(s);
  }
  return -1;
}

namespace {

// NVIDIA's Xid catalog on the faults it traces to the application (MMU
// faults, Xid 31, and the like): a burst is the application's, but the same
// fault on one GPU again and again, from process after process, while no
// other GPU shows it, points at that GPU. Returns the lines of such a GPU's
// reports among `app_lines` (lines an application-class rule matched), or
// nothing.
std::vector<std::size_t> RepeatedAppXidOnOneGpu(const LogStructure& s, const std::set<std::size_t>& app_lines) {
  constexpr std::size_t kProcesses = 3;
  std::map<int, std::map<std::string, std::set<std::string>>> pids;  // xid -> gpu -> pids
  std::map<int, std::map<std::string, std::vector<std::size_t>>> at;
  for (const auto& e : s.xids) {
    if (!app_lines.count(e.line)) continue;
    if (!e.pid.empty() && e.pid.find("unknown") == std::string::npos) pids[e.xid][e.gpu].insert(e.pid);
    at[e.xid][e.gpu].push_back(e.line);
  }
  for (const auto& [xid, gpus] : at) {
    if (gpus.size() != 1) continue;  // on several GPUs: the application's
    const std::string& gpu = gpus.begin()->first;
    if (pids[xid][gpu].size() >= kProcesses) return gpus.begin()->second;
  }
  return {};
}

}  // namespace

namespace {

// The rules' answer: the strongest matching rule, its culprits and evidence.
// `cascade`: the lines symptom rules (of a category) explain, and the first
// of them (the number of lines if there is none).
struct Cascade {
  std::size_t from = 0;
  std::vector<bool> lines;
};

Attribution AttributeByRules(const RuleSet& rules, const std::vector<LogLine>& lines,
                             const LogStructure& structure, Cascade* cascade) {
  struct Match {
    const Rule* rule;
    size_t line;
  };
  std::vector<Match> matches;
  // Rules see what a line says, not the code or the paths a stack trace quotes.
  for (size_t i = 0; i < lines.size(); ++i) {
    const LineStructure& ls = structure.lines[i];
    if (ls.kind == LineKind::kPythonFrame || ls.kind == LineKind::kQuotedSource) continue;
    for (int r : rules.Match(ls.match_text)) matches.push_back({&rules.rules()[r], i});
  }
  cascade->from = lines.size();
  cascade->lines.assign(lines.size(), false);
  for (const Match& m : matches) {
    if (m.rule->role == "symptom" && m.rule->category != "other") {
      cascade->from = std::min(cascade->from, m.line);
      cascade->lines[m.line] = true;
    }
  }
  Attribution a;
  if (matches.empty()) {
    a.summary = "no known failure pattern in " + std::to_string(lines.size()) +
                " line(s): category other, low confidence";
    return a;
  }
  // The highest priority wins; among equals the earliest line.
  const Match* best = &matches[0];
  for (const Match& m : matches) {
    if (m.rule->priority > best->rule->priority ||
        (m.rule->priority == best->rule->priority && m.line < best->line)) {
      best = &m;
    }
  }
  const Rule& win = *best->rule;
  a.answered_by = "rules";
  std::set<std::size_t> app_xid_lines;
  for (const Match& m : matches) {
    if (m.rule->category == "cuda_software" && m.rule->priority >= win.priority) app_xid_lines.insert(m.line);
  }
  const std::vector<std::size_t> repeated = RepeatedAppXidOnOneGpu(structure, app_xid_lines);
  a.category = win.category;
  a.rule_id = win.id;
  a.role = win.role;
  a.description = win.description;
  a.hardware = win.hardware;
  a.persistence = win.persistence;
  a.action = win.action;

  auto rank_of = [&](size_t i) { return structure.lines[i].rank; };
  auto evidence = [&](const Match& m) {
    return Evidence{rank_of(m.line), lines[m.line].node, m.rule->id, m.rule->category,
                    m.rule->role, lines[m.line].text.substr(0, 500)};
  };
  // Culprits: where the deciding category's cause-level lines came from.
  std::set<int> ranks;
  std::set<std::string> nodes;
  std::set<size_t> used;
  for (const Match& m : matches) {
    if (m.rule->category != win.category || m.rule->priority < win.priority) continue;
    if (a.evidence.size() < 5 && used.insert(m.line).second) a.evidence.push_back(evidence(m));
    if (rank_of(m.line) >= 0) ranks.insert(rank_of(m.line));
    if (!lines[m.line].node.empty()) nodes.insert(lines[m.line].node);
  }
  // Then the strongest line of each other category, as context.
  std::map<std::string, const Match*> others;
  for (const Match& m : matches) {
    if (m.rule->category == win.category) continue;
    auto& o = others[m.rule->category];
    if (o == nullptr || m.rule->priority > o->rule->priority) o = &m;
  }
  for (const auto& [cat, m] : others) a.evidence.push_back(evidence(*m));
  // A launcher summary's root cause names the rank when its lines do not.
  if (ranks.empty() && structure.launcher_root_rank >= 0) ranks.insert(structure.launcher_root_rank);
  a.culprit_ranks.assign(ranks.begin(), ranks.end());
  a.culprit_nodes.assign(nodes.begin(), nodes.end());

  // Confidence: a cause rule is strong evidence; a close cause of another
  // category, or a symptom only, weakens it; a symptom of category other (a
  // launcher's summary, an exit code) determines nothing, as no match.
  double conf = win.role == "cause" ? 0.55 + win.priority / 250.0 : win.category == "other" ? 0.2 : 0.35;
  for (const auto& [cat, m] : others) {
    if (m->rule->role == "cause" && m->rule->priority >= win.priority - 10) conf -= 0.15;
  }
  a.confidence = std::clamp(conf, 0.1, 0.95);
  if (!repeated.empty()) {
    a.category = "gpu_hardware";
    a.rule_id = "gpu-xid-repeated-on-one-gpu";
    a.description = "an application-class Xid again and again on one GPU, from 3 or more processes, and on no "
                    "other GPU: NVIDIA's Xid catalog reads that as a possible fault of that GPU";
    a.hardware = true;
    a.persistence = "persistent";
    a.action = "evict_node";
    a.confidence = 0.6;
    a.culprit_nodes.clear();
    if (!lines[repeated.front()].node.empty()) a.culprit_nodes.push_back(lines[repeated.front()].node);
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s (%s, %s%s): %s", a.category.c_str(),
                a.hardware ? "hardware" : "software", a.persistence.c_str(),
                win.role == "symptom" && repeated.empty() ? ", symptom only" : "", a.description.c_str());
  a.summary = buf;
  return a;
}

// The rules' raw confidence below which the model is consulted: no rule
// matched, a symptom only, or causes of several categories close together.
constexpr double kConsultBelow = 0.5;

bool HardwareCategory(const std::string& c) {
  return c == "gpu_hardware" || c == "network" || c == "node_failure" || c == "storage";
}

std::string DecidingText(const ModelPrediction& p) {
  std::string s;
  for (const auto& [feature, weight] : p.deciding) s += (s.empty() ? "" : ", ") + feature;
  return s.empty() ? "its prior" : s;
}

// Makes the model's reading `p` the answer: a restart at most.
void AnswerByModel(const LogModel& model, const ModelPrediction& p, const LogStructure& structure, Attribution* a) {
  char prob[32];
  std::snprintf(prob, sizeof(prob), "%.2f", p.probability);
  a->category = p.category;
  a->rule_id = kModelRuleId;
  a->answered_by = "model";
  a->hardware = HardwareCategory(p.category);
  a->persistence = "unknown";
  a->action = "restart";
  a->description = "no rule explained the log with confidence; the learned model (" + model.version() +
                   ") reads it as " + p.category + " with probability " + prob + " from " + DecidingText(p);
  a->confidence = p.probability;
  // The culprits: where the lines of the chosen category came from, if
  // rules named any; else what the launcher's summary says.
  std::set<int> ranks;
  std::set<std::string> nodes;
  for (const Evidence& e : a->evidence) {
    if (e.category != p.category) continue;
    if (e.rank >= 0) ranks.insert(e.rank);
    if (!e.node.empty()) nodes.insert(e.node);
  }
  if (ranks.empty() && structure.launcher_root_rank >= 0) ranks.insert(structure.launcher_root_rank);
  a->culprit_ranks.assign(ranks.begin(), ranks.end());
  a->culprit_nodes.assign(nodes.begin(), nodes.end());
  a->summary = p.category + " (" + (a->hardware ? "hardware" : "software") + ", unknown, learned model): " +
               a->description;
}

// The lines of [0, end) that `skip` (if given) does not mark, only as many
// of the last as the model reads (kFeatureLines) and a margin before them,
// so that the parse sees where a traceback they end in began: a part of a
// log of millions of lines costs what its tail does.
std::vector<LogLine> TailOf(const std::vector<LogLine>& lines, std::size_t end, const std::vector<bool>* skip) {
  constexpr std::size_t kTailLines = kFeatureLines + 200;
  std::vector<LogLine> out;
  for (std::size_t i = end; i > 0 && out.size() < kTailLines; --i) {
    if (skip == nullptr || !(*skip)[i - 1]) out.push_back(lines[i - 1]);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

// Calibrates the rules' confidence and, where no rule answered with
// confidence, lets the model answer. Where only symptoms matched (peers'
// timeouts, closed connections), they are the cascade of a cause no rule
// named: the model reads the lines before the first of them (a job log puts
// a cascade after its cause), then every line no symptom rule explains (a
// merged log can put peers' timeouts before the failing rank's complaint),
// and answers if it reads a failure of another category with more
// confidence than the symptom's. Otherwise, where rules matched (a symptom,
// causes of several categories close together), it only chooses among the
// rules' answer and the categories their cause lines name: a rule's reading
// of a line is knowledge the model does not have. It never recommends more
// than a restart (an eviction needs a rule, a diagnostic or the node's
// history: the policy's part). `a->model` keeps its reading.
// Whether the deciding rule read only trainguard's own lines ("trainguard:
// refusing to resume ..."): what trainguard itself saw, which no public log
// holds, so the calibration learned from public logs says nothing of it.
bool ReadOnlyOwnLines(const Attribution& a) {
  bool any = false;
  for (const Evidence& e : a.evidence) {
    if (e.rule_id != a.rule_id) continue;
    if (e.line.rfind("trainguard: ", 0) != 0) return false;
    any = true;
  }
  return any;
}

void ConsultModel(const LogModel& model, const std::vector<LogLine>& lines, const LogStructure& structure,
                  const Cascade& cascade, Attribution* a) {
  a->confidence = ReadOnlyOwnLines(*a) ? a->raw_confidence : model.CalibrateRule(a->raw_confidence, a->rule_id);
  if (a->raw_confidence >= kConsultBelow) return;
  const bool any_cause = std::any_of(a->evidence.begin(), a->evidence.end(),
                                     [](const Evidence& e) { return e.role == "cause"; });
  if (!any_cause && a->role == "symptom" && a->category != "other") {
    const std::vector<LogLine> before = TailOf(lines, cascade.from, nullptr);
    const std::vector<LogLine> unexplained = TailOf(lines, lines.size(), &cascade.lines);
    for (const std::vector<LogLine>* part : {&before, &unexplained}) {
      if (part->empty()) continue;
      const ModelPrediction p = model.Predict(LogFeatures(*part, ParseLogStructure(*part)), {});
      if (p.category != kNoFailureClass && p.category != a->category && p.probability >= model.answer_from() &&
          p.probability > a->confidence) {
        a->model = p;
        a->model_consulted = true;
        AnswerByModel(model, p, structure, a);
        return;
      }
    }
  }
  // The rules' answer, and every category a cause rule named: over the
  // whole log, a category that only symptoms named is the model's pick only
  // if it is the rules' answer too. A symptom of category other (a
  // launcher's summary, trainguard's own "exited with code 1") names no
  // category and restricts nothing.
  std::vector<std::string> among;
  if (!a->evidence.empty() && !(a->role == "symptom" && a->category == "other")) among.push_back(a->category);
  for (const Evidence& e : a->evidence) {
    if (e.role == "cause" && std::find(among.begin(), among.end(), e.category) == among.end()) {
      among.push_back(e.category);
    }
  }
  a->model = model.Predict(LogFeatures(lines, structure), among);
  a->model_consulted = true;
  const ModelPrediction& p = a->model;
  if (p.category == a->category) {  // two readings agree
    if (p.probability >= model.answer_from()) a->confidence = std::max(a->confidence, p.probability);
    return;
  }
  if (p.category == kNoFailureClass || p.probability < model.answer_from() || p.probability <= a->confidence) return;
  AnswerByModel(model, p, structure, a);
}


}  // namespace

std::string ModelReadingJson(const Attribution& a) {
  if (!a.model_consulted) return "null";
  json deciding = json::array();
  for (const auto& [feature, weight] : a.model.deciding) deciding.push_back({{"feature", feature}, {"weight", weight}});
  return json{{"category", a.model.category},
              {"probability", a.model.probability},
              {"known_features", a.model.known_features},
              {"deciding", deciding}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

Attribution Attribute(const RuleSet& rules, const std::vector<LogLine>& lines) {
  const LogStructure structure = ParseLogStructure(lines);
  Cascade cascade;
  Attribution a = AttributeByRules(rules, lines, structure, &cascade);
  a.raw_confidence = a.confidence;
  if (rules.model() != nullptr) ConsultModel(*rules.model(), lines, structure, cascade, &a);
  return a;
}

}  // namespace trainguard
