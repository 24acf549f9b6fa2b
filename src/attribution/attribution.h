// Attribution: says why an incident happened, from rules that are data.
//
// Input: what is known about one incident (each rank's exit and output tail,
// node lines such as dmesg, trainguard's own observations as text lines).
// Output: a category, hardware vs software, transient vs persistent, the
// culprit ranks and nodes, the evidence lines, a confidence and an action.
// Rules (rules/attribution.json, docs/attribution.md) map patterns to
// categories with a priority and a role: causes outrank symptoms, so 63
// ranks' collective timeouts and one rank's "GPU fallen off the bus" are a
// gpu_hardware failure of that rank's node. Ties go to the earliest line.
//
// No dependency on the daemons or the transport. Thread safety: a RuleSet
// is immutable after loading and may be shared; Attribute() is a pure function.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attribution/log_model.h"
#include "trainguard/status.h"

namespace re2 {
class RE2;
}

namespace trainguard {
class RuleMatcher;
}

namespace trainguard {

// Categories, in the order of docs/attribution.md.
const std::vector<std::string>& AttributionCategories();

struct Rule {
  std::string id;
  std::string category;
  std::string pattern;
  int priority = 0;            // 0..100, higher wins
  std::string role;            // "cause" or "symptom"
  std::string persistence;     // "transient", "persistent" or "unknown"
  bool hardware = false;
  std::string action;          // "restart", "evict_node" or "stop"
  std::string description;
  bool case_sensitive = false;
  // Scanned as lines arrive (the agent, every rank's output and the kernel
  // log): "fatal" starts an incident at once, "warning" is recorded and makes
  // the node watched; "" only when an incident is attributed.
  std::string scan;
  // A line that also matches this does not count for the rule ("" none):
  // what looks like the pattern but is known not to be the failure (an
  // optional NCCL plugin's "No such file or directory" in an INFO line).
  std::string unless;
  std::shared_ptr<re2::RE2> regex;
  std::shared_ptr<re2::RE2> unless_regex;
};

class RuleSet {
 public:
  // Parses a rule file; errors name `origin`, the rule id and the field.
  static StatusOr<RuleSet> Parse(const std::string& json_text, const std::string& origin);
  static StatusOr<RuleSet> Load(const std::string& path);
  // Rules of `overrides` replace rules with the same id and add new ones.
  void Merge(const RuleSet& overrides);
  // The rules with a `scan` severity, compiled as a set of their own.
  RuleSet ScanRules() const;
  // The rules as a rule file (the format Parse reads), for shipping them to
  // the agents: Parse(ToJson()) gives the same rules.
  std::string ToJson() const;
  const std::vector<Rule>& rules() const { return rules_; }

  // The learned fallback for what no rule explains (log_model.h), or null;
  // Merge keeps it.
  void set_model(std::shared_ptr<const LogModel> model) { model_ = std::move(model); }
  const LogModel* model() const { return model_.get(); }

  // Indices (into rules()) of every rule that matches `text`, ascending: one
  // pass of a compiled set over the text, not one regex after another. Text
  // that is mostly not text (binary bytes) matches nothing.
  std::vector<int> Match(const std::string& text) const;

 private:
  void Compile();
  std::vector<Rule> rules_;
  std::shared_ptr<const RuleMatcher> matcher_;  // all rules at once; rebuilt by Parse/Merge
  std::shared_ptr<const LogModel> model_;
};

struct LogLine {
  int rank = -1;        // -1: unknown; parsed from "[rankN]:"-style prefixes if so
  std::string node;     // "" if unknown
  std::string text;
};

struct Evidence {
  int rank = -1;
  std::string node;
  std::string rule_id;
  std::string category;
  std::string role;
  std::string line;
};

// The rule id of an answer the learned model gave.
inline constexpr const char* kModelRuleId = "learned-model";

struct Attribution {
  std::string category = "other";
  std::string rule_id;          // the deciding rule, "" if none matched, kModelRuleId for the model
  std::string role;             // the strongest rule's role: "cause", "symptom", or "" if none
  // "rules", "model" (no rule explained the log with confidence; the model
  // did: action restart, never an eviction of its own) or "none".
  std::string answered_by = "none";
  std::string description;
  bool hardware = false;
  std::string persistence = "unknown";
  std::string action = "restart";
  std::vector<int> culprit_ranks;
  std::vector<std::string> culprit_nodes;
  std::vector<Evidence> evidence;  // the deciding lines first, then other categories' lines
  double confidence = 0.2;       // calibrated where a model file is loaded (docs/attribution.md)
  double raw_confidence = 0.2;   // the rules' own measure, before calibration
  // The model's reading of the log, when it was consulted (no rule answered
  // with confidence): its category, probability and deciding features.
  bool model_consulted = false;
  ModelPrediction model;
  std::string summary;             // one line for people
};

// The model's reading of an attribution as JSON text: {"category",
// "probability", "known_features", "deciding": [{"feature", "weight"}]},
// or null where the model was not consulted.
std::string ModelReadingJson(const Attribution& a);

// Lines are in time order (the earliest first) as far as it is known.
Attribution Attribute(const RuleSet& rules, const std::vector<LogLine>& lines);

// The rank a line names in a launcher prefix ("[rank3]:", "[Rank 3]",
// "[1,3]<stdout>:"), or -1.
int RankFromPrefix(const std::string& line);

}  // namespace trainguard
