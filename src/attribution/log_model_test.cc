#include "attribution/log_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "attribution/attribution.h"
#include "attribution/log_features.h"
#include "attribution/log_structure.h"

namespace trainguard {
namespace {

// A hand-made model: "w:nan" reads numeric, "w:xid" gpu_hardware.
std::string TinyModel(double answer_from = 0.5) {
  return R"({"format": "trainguard-attribution-model", "version": 1,
    "trained_on": {"sha256": "0123456789abcdef"},
    "classes": ["gpu_hardware", "numeric", "other"], "bias": [0, 0, 0.5],
    "temperature": 1.0, "answer_from": )" + std::to_string(answer_from) + R"(,
    "rule_calibration": [[0.3, 0.6], [1.0, 0.97]],
    "features": {"w:nan": [0, 6, 0], "w:loss": [0, 1, 0], "w:xid": [6, 0, 0]}})";
}

std::vector<LogLine> Log(std::initializer_list<const char*> texts) {
  std::vector<LogLine> out;
  for (const char* t : texts) out.push_back({-1, "node0", t});
  return out;
}

std::vector<std::string> FeaturesOf(const std::vector<LogLine>& lines) {
  return LogFeatures(lines, ParseLogStructure(lines));
}

TEST(LogFeaturesTest, WordsPairsPiecesAndTheParsesShape) {
  auto f = FeaturesOf(Log({"Traceback (most recent call last):",
                           "  File \"/opt/x/train.py\", line 12, in step",
                           "    raise RuntimeError(\"gradient overflow\")",
                           "RuntimeError: Loss is NaN at node17 pid 123456 0x7f3a",
                           "Xid 79"}));
  auto has = [&](const std::string& x) { return std::find(f.begin(), f.end(), x) != f.end(); };
  EXPECT_TRUE(has("w:loss") && has("w:nan") && has("b:loss is") && has("b:is nan"));
  EXPECT_TRUE(has("w:node0"));          // digit runs read alike
  EXPECT_TRUE(has("w:79"));             // short numbers stay
  EXPECT_FALSE(has("w:123456"));        // long ones go
  EXPECT_FALSE(has("w:0x7f3a"));        // hex goes
  EXPECT_TRUE(has("py:train") && has("fn:step"));
  EXPECT_TRUE(has("exc:RuntimeError") && has("final:RuntimeError"));
  EXPECT_FALSE(has("w:overflow"));      // quoted source is not read
  EXPECT_TRUE(std::is_sorted(f.begin(), f.end()));
}

TEST(LogFeaturesTest, OfALaunchersSummaryOnlyTheExitCodeAndASignalAreRead) {
  auto f = FeaturesOf(Log({"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
                           "Root Cause (first observed failure):", "[0]:",
                           "  time      : 2025-05-21_15:43:03", "  host      : worker-7",
                           "  rank      : 0 (local_rank: 0)", "  exitcode  : -9 (pid: 14750)",
                           "  error_file: <N/A>", "  traceback : Signal 9 (SIGKILL) received by PID 14750"}));
  auto has = [&](const std::string& x) { return std::find(f.begin(), f.end(), x) != f.end(); };
  EXPECT_TRUE(has("exit:-9") && has("w:sigkill"));
  EXPECT_FALSE(has("w:host") || has("w:local_rank") || has("w:exitcode") || has("w:error_file"));
  auto plain = FeaturesOf(Log({"Failures:", "[1]:", "  exitcode  : 1 (pid: 49149)",
                               "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"}));
  EXPECT_TRUE(plain.empty());  // exit code 1 and the pointer to the docs say nothing
  // The agent's report and torchrun's own traceback before the summary: the
  // same in every failure torchrun reports, but for the exit code.
  auto whole = FeaturesOf(Log({
      "E0512 17:04:53.622000 124936 site-packages/torch/distributed/elastic/multiprocessing/api.py:869] "
      "failed (exitcode: -11) local_rank: 6 (pid: 125052) of binary: /usr/local/bin/python3.10",
      "Traceback (most recent call last):", "  File \"/usr/local/bin/torchrun\", line 8, in <module>",
      "    sys.exit(main())",
      "  File \"/usr/local/lib/python3.10/site-packages/torch/distributed/elastic/multiprocessing/errors/"
      "__init__.py\", line 355, in wrapper",
      "  File \"/usr/local/lib/python3.10/site-packages/torch/distributed/run.py\", line 919, in main",
      "  File \"/usr/local/lib/python3.10/site-packages/torch/distributed/launcher/api.py\", line 269, in "
      "launch_agent",
      "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "train.py FAILED",
      "Failures:", "  <NO_OTHER_FAILURES>"}));
  EXPECT_EQ(whole, std::vector<std::string>{"exit:-11"});
}

TEST(LogFeaturesTest, TrainguardsOwnLinesAreLeftToTheRules) {
  EXPECT_TRUE(FeaturesOf(Log({"trainguard: rank 1 on node1 exited with code 1 before any step"})).empty());
}

TEST(LogFeaturesTest, NcclsInfoTraceIsNotRead) {
  EXPECT_TRUE(FeaturesOf(Log({"host-2:38610:38610 [0] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) returned 2 : "
                              "libnccl-net.so: cannot open shared object file: No such file or directory"}))
                  .empty());
  EXPECT_FALSE(FeaturesOf(Log({"host-2:38610:38621 [0] NCCL WARN NET/IB : Got completion with error 12"})).empty());
}

TEST(LogFeaturesTest, BinaryLinesGiveNothing) {
  std::string junk;
  for (int i = 0; i < 200; ++i) junk += static_cast<char>(0x80 + (i * 37) % 100);
  EXPECT_TRUE(FeaturesOf(Log({junk.c_str()})).empty());
}

TEST(LogModelTest, PredictsWithCalibratedProbabilityAndTheDecidingFeatures) {
  auto m = LogModel::Parse(TinyModel(), "tiny");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ModelPrediction p = m->Predict({"w:loss", "w:nan", "w:unknown"});
  EXPECT_EQ(p.category, "numeric");
  EXPECT_EQ(p.known_features, 2);
  // scores: numeric (6+1)/sqrt(2) = 4.95, other 0.5, gpu 0.
  double e = std::exp(7 / std::sqrt(2.0));
  EXPECT_NEAR(p.probability, e / (e + std::exp(0.5) + 1), 1e-9);
  ASSERT_EQ(p.deciding.size(), 2u);
  EXPECT_EQ(p.deciding[0].first, "w:nan");
  // No known feature: the prior.
  EXPECT_EQ(m->Predict({"w:hello"}).category, "other");
  EXPECT_DOUBLE_EQ(m->CalibrateRule(0.2), 0.6);
  EXPECT_DOUBLE_EQ(m->CalibrateRule(0.9), 0.97);
  EXPECT_EQ(m->version(), "0123456789ab");
}

// A rule's record on held-out logs moves its bin's figure toward its own:
// as a prior of `rule_record_weight` answers at the bin's figure.
TEST(LogModelTest, ARulesTrackRecordMovesItsBinsFigure) {
  std::string t = TinyModel();
  t.replace(t.find("\"features\""), 0,
            R"("rule_record": {"often-wrong": [3, 0], "held-up": [6, 6]}, "rule_record_weight": 2, )");
  auto m = LogModel::Parse(t, "m.json");
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_DOUBLE_EQ(m->CalibrateRule(0.9, "often-wrong"), (0 + 2 * 0.97) / 5);
  EXPECT_DOUBLE_EQ(m->CalibrateRule(0.9, "held-up"), (6 + 2 * 0.97) / 8);
  EXPECT_DOUBLE_EQ(m->CalibrateRule(0.2, "held-up"), (6 + 2 * 0.6) / 8);
  // No record (a rule that never answered a held-out log): the bin alone.
  EXPECT_DOUBLE_EQ(m->CalibrateRule(0.9, "never-seen"), 0.97);
  EXPECT_DOUBLE_EQ(m->CalibrateRule(0.9), 0.97);
  // A record that cannot be is refused, naming the rule.
  std::string bad = t;
  bad.replace(bad.find("[6, 6]"), 6, "[6, 7]");
  auto b = LogModel::Parse(bad, "m.json");
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("m.json: \"rule_record\" of 'held-up'"), std::string::npos)
      << b.status().message();
  bad = t;
  bad.replace(bad.find("\"rule_record_weight\": 2"), 23, "\"rule_record_weight\": 0");
  EXPECT_FALSE(LogModel::Parse(bad, "m.json").ok());
}

TEST(LogModelTest, ABadModelFileIsAnErrorNamingIt) {
  auto bad = [](const std::string& text) { return LogModel::Parse(text, "m.json").status().message(); };
  EXPECT_NE(bad("{").find("m.json: not valid JSON"), std::string::npos);
  EXPECT_NE(bad(R"({"format": "x"})").find("not a trainguard model file"), std::string::npos);
  std::string t = TinyModel();
  std::string wrong_class = t;
  wrong_class.replace(wrong_class.find("\"numeric\""), 9, "\"numbers\"");
  EXPECT_NE(bad(wrong_class).find("unknown category 'numbers'"), std::string::npos);
  std::string short_row = t;
  short_row.replace(short_row.find("[0, 6, 0]"), 9, "[0, 6]");
  EXPECT_NE(bad(short_row).find("feature 'w:nan' must have one weight per class (3)"), std::string::npos);
  std::string no_bias = t;
  no_bias.replace(no_bias.find("\"bias\""), 6, "\"bias_\"");
  EXPECT_NE(bad(no_bias).find("m.json"), std::string::npos);
  EXPECT_NE(LogModel::Load("/nonexistent/m.json").status().message().find("cannot read model file"),
            std::string::npos);
}

RuleSet WithModel(const std::string& rules_json, double answer_from = 0.5) {
  auto rules = RuleSet::Parse(rules_json, "rules");
  EXPECT_TRUE(rules.ok()) << rules.status().ToString();
  auto m = LogModel::Parse(TinyModel(answer_from), "tiny");
  EXPECT_TRUE(m.ok());
  rules->set_model(std::make_shared<const LogModel>(std::move(*m)));
  return *rules;
}

const char* kRules = R"({"format": "trainguard-attribution-rules", "version": 1, "rules": [
  {"id": "oom", "category": "oom", "priority": 90, "pattern": "out of memory"},
  {"id": "timeout", "category": "comm_hang", "priority": 20, "role": "symptom", "pattern": "timed out"},
  {"id": "nan-word", "category": "numeric", "priority": 10, "pattern": "nan"}]})";

TEST(AttributeWithModelTest, TheModelAnswersWhatNoRuleExplainsAndNeverRecommendsEviction) {
  RuleSet rules = WithModel(kRules);
  Attribution a = Attribute(rules, Log({"step 10 xid reported, stopping"}));
  EXPECT_EQ(a.category, "gpu_hardware");
  EXPECT_EQ(a.answered_by, "model");
  EXPECT_EQ(a.rule_id, kModelRuleId);
  EXPECT_TRUE(a.hardware);
  EXPECT_EQ(a.action, "restart");  // a hardware reading of the model alone evicts nothing
  EXPECT_EQ(a.persistence, "unknown");
  EXPECT_TRUE(a.model_consulted);
  EXPECT_GT(a.confidence, 0.5);
  EXPECT_NE(a.summary.find("w:xid"), std::string::npos) << a.summary;
  EXPECT_NE(ModelReadingJson(a).find("\"deciding\""), std::string::npos);
}

TEST(AttributeWithModelTest, ASymptomYieldsToAConfidentModelButACauseRuleDoesNot) {
  RuleSet rules = WithModel(kRules);
  Attribution symptom = Attribute(rules, Log({"collective timed out", "loss is nan"}));
  EXPECT_EQ(symptom.category, "numeric");
  EXPECT_EQ(symptom.role, "symptom");  // the rules' own reading stays known
  EXPECT_EQ(symptom.answered_by, "model");
  // Two readings of equal weight (an Xid, a NaN) leave the rules' answer:
  // the model answers only when more likely right than wrong.
  Attribution timeout = Attribute(rules, Log({"collective timed out", "xid", "nan"}));
  EXPECT_EQ(timeout.category, "comm_hang");
  EXPECT_EQ(timeout.answered_by, "rules");
  Attribution cause = Attribute(rules, Log({"CUDA out of memory", "loss is nan"}));
  EXPECT_EQ(cause.category, "oom");
  EXPECT_EQ(cause.answered_by, "rules");
  EXPECT_FALSE(cause.model_consulted);
  EXPECT_DOUBLE_EQ(cause.confidence, 0.97);  // calibrated
  EXPECT_NEAR(cause.raw_confidence, 0.55 + 90 / 250.0, 1e-9);
  // What trainguard saw itself is no public log's line: not calibrated by them.
  Attribution own = Attribute(rules, Log({"trainguard: rank 1 ran out of memory"}));
  EXPECT_EQ(own.category, "oom");
  EXPECT_DOUBLE_EQ(own.confidence, own.raw_confidence);
  Attribution both = Attribute(rules, Log({"trainguard: rank 1 ran out of memory", "CUDA out of memory"}));
  EXPECT_DOUBLE_EQ(both.confidence, 0.97);
}

// The model's reading of a complaint no rule names, with the timeouts of
// its cascade kept as linked symptoms and no eviction of its own.
void ExpectTheModelsCauseWithTheTimeoutsLinked(const RuleSet& rules, const std::vector<LogLine>& log) {
  Attribution a = Attribute(rules, log);
  EXPECT_EQ(a.category, "gpu_hardware");
  EXPECT_EQ(a.answered_by, "model");
  EXPECT_EQ(a.action, "restart");
  ASSERT_FALSE(a.evidence.empty());
  EXPECT_EQ(a.evidence[0].role, "symptom");
  EXPECT_EQ(a.evidence[0].category, "comm_hang");
}

TEST(AttributeWithModelTest, ACauseNoRuleNamesBeforeItsCascadeIsReadFromTheLinesBeforeIt) {
  RuleSet rules = WithModel(kRules);
  ExpectTheModelsCauseWithTheTimeoutsLinked(
      rules, Log({"step 10 xid reported", "rank 3: collective timed out", "rank 5: collective timed out"}));
  // Lines before the cascade the model reads as nothing known leave the timeout's answer.
  Attribution routine = Attribute(rules, Log({"epoch 3 step 100", "rank 3: collective timed out"}));
  EXPECT_EQ(routine.category, "comm_hang");
  EXPECT_EQ(routine.answered_by, "rules");
}

TEST(AttributeWithModelTest, ACauseMergedAfterTheFirstLinesOfItsCascadeIsReadToo) {
  // Ranks' output merged by time: a peer's timeout can come before the
  // failing rank's own complaint (a stuck device says nothing until killed).
  RuleSet rules = WithModel(kRules);
  ExpectTheModelsCauseWithTheTimeoutsLinked(
      rules, Log({"rank 3: collective timed out", "step 10 xid reported", "rank 5: collective timed out"}));
  // The timeouts' own lines are not read as a cause: with nothing else the
  // answer stays the rules'.
  Attribution alone = Attribute(rules, Log({"rank 3: collective timed out", "epoch 3 step 100",
                                            "rank 5: collective timed out"}));
  EXPECT_EQ(alone.category, "comm_hang");
  EXPECT_EQ(alone.answered_by, "rules");
}

TEST(AttributeWithModelTest, OfALongLogOnlyTheTailBeforeTheCascadeIsRead) {
  // As for a whole log, the model reads the last kFeatureLines lines of
  // the part before a cascade: a complaint further back is not its cause.
  RuleSet rules = WithModel(kRules);
  auto with_gap = [&](std::size_t routine_lines) {
    std::vector<LogLine> log = Log({"step 10 xid reported"});
    for (std::size_t i = 0; i < routine_lines; ++i) log.push_back({-1, "node0", "epoch 3 step " + std::to_string(i)});
    log.push_back({3, "node0", "rank 3: collective timed out"});
    return Attribute(rules, log);
  };
  EXPECT_EQ(with_gap(kFeatureLines - 10).category, "gpu_hardware");
  EXPECT_EQ(with_gap(kFeatureLines + 500).category, "comm_hang");
}

TEST(AttributeWithModelTest, AnExitOrLauncherSummaryNamesNoCategoryAndRestrictsNothing) {
  auto rules = RuleSet::Parse(R"({"format": "trainguard-attribution-rules", "version": 1, "rules": [
    {"id": "exit", "category": "other", "priority": 5, "role": "symptom", "pattern": "exited with code"}]})", "r");
  ASSERT_TRUE(rules.ok());
  auto m = LogModel::Parse(TinyModel(), "tiny");
  ASSERT_TRUE(m.ok());
  rules->set_model(std::make_shared<const LogModel>(std::move(*m)));
  Attribution a = Attribute(*rules, Log({"xid seen, giving up", "trainguard: rank 1 exited with code 1"}));
  EXPECT_EQ(a.category, "gpu_hardware");
  EXPECT_EQ(a.answered_by, "model");
  EXPECT_EQ(a.action, "restart");
}

TEST(AttributeWithModelTest, AnUnsureModelLeavesTheAnswerOther) {
  RuleSet rules = WithModel(kRules, /*answer_from=*/0.999);
  Attribution a = Attribute(rules, Log({"xid"}));
  EXPECT_EQ(a.category, "other");
  EXPECT_EQ(a.answered_by, "none");
  EXPECT_TRUE(a.model_consulted);
  EXPECT_EQ(a.model.category, "gpu_hardware");
  EXPECT_DOUBLE_EQ(a.confidence, 0.6);  // no rule: calibrated as such
}

TEST(AttributeWithModelTest, TextTheModelReadsAsNoFailureGetsNoAnswer) {
  std::string t = TinyModel();
  t.replace(t.find("\"other\"]"), 8, "\"none\"]");
  auto m = LogModel::Parse(t, "tiny");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto rules = RuleSet::Parse(kRules, "rules");
  ASSERT_TRUE(rules.ok());
  rules->set_model(std::make_shared<const LogModel>(std::move(*m)));
  Attribution a = Attribute(*rules, Log({"epoch 3 step 100"}));  // no known feature: the prior, "none"
  EXPECT_EQ(a.model.category, "none");
  EXPECT_EQ(a.category, "other");
  EXPECT_EQ(a.answered_by, "none");
}

TEST(AttributeWithModelTest, MergingRulesKeepsTheModel) {
  RuleSet rules = WithModel(kRules);
  auto extra = RuleSet::Parse(R"({"format": "trainguard-attribution-rules", "version": 1, "rules": []})", "x");
  ASSERT_TRUE(extra.ok());
  rules.Merge(*extra);
  EXPECT_NE(rules.model(), nullptr);
}

}  // namespace
}  // namespace trainguard
