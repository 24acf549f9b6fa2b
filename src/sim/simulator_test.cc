// The simulator: its inputs refused with the field named, its runs
// deterministic, and what it measures coming from the detectors.
#include "sim/simulator.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "sim/sim_output.h"
#include "store/event_store.h"

namespace trainguard {
namespace {

namespace fs = std::filesystem;

std::string Model(const std::string& categories, const std::string& extra = "") {
  return R"({"name": "test", "source": "a test", )" + extra + R"("categories": [)" + categories + "]}";
}

TEST(FailureModelTest, TheShippedModelsLoad) {
  for (const char* name : {"llama3", "meta_rsc", "mtbf"}) {
    auto m = FailureModel::Load(std::string(TG_MODELS_DIR) + "/" + name + ".json");
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().ToString();
    EXPECT_FALSE(m->source.empty());
  }
  // Llama 3: 466 interruptions over 2,048 nodes x 54 days.
  auto llama = FailureModel::Load(std::string(TG_MODELS_DIR) + "/llama3.json");
  EXPECT_NEAR(llama->PerNodeDay() * 2048 * 54, 466, 1e-6);
  auto meta = FailureModel::Load(std::string(TG_MODELS_DIR) + "/meta_rsc.json");
  EXPECT_NEAR(meta->PerNodeDay() * 1000, 6.50, 1e-3);
}

TEST(FailureModelTest, BadModelsAreRefusedNamingTheField) {
  struct Case {
    std::string text;
    std::string says;
  };
  const std::string crash = R"("signals": {"crash": 1}, "exit_code": 1)";
  for (const Case& c : std::vector<Case>{
           {"not json", "not valid JSON"},
           {R"({"name": "x", "categories": []})", "source: missing"},
           {Model(R"({"name": "a", "per_1000_node_days": 1, )" + crash + "}", R"("colour": 1, )"), "colour: unknown field"},
           {Model(R"({"name": "a", "count": 3, )" + crash + "}"), "categories[0].count: a count needs the model's basis"},
           {Model(R"({"name": "a", "per_1000_node_days": 1, "mtbf_node_hours": 5, )" + crash + "}"),
            "give exactly one of"},
           {Model(R"({"name": "a", "per_1000_node_days": 1, "signals": {"explode": 1}})"),
            "categories[0].signals.explode: unknown signal"},
           {Model(R"({"name": "a", "per_1000_node_days": 1, "persistent": 2, )" + crash + "}"),
            "categories[0].persistent: expected a number in [0, 1], got 2"},
           {Model(R"({"name": "a", "per_1000_node_days": "often", )" + crash + "}"),
            "categories[0].per_1000_node_days: expected a number"},
           {Model(R"({"name": "a", "per_1000_node_days": 1, "signals": {"crash": 1}, "exit_code": 0})"),
            "categories[0].exit_code: a crash needs"},
           {Model(R"({"name": "a", "per_1000_node_days": 1, )" + crash + R"(}, {"name": "a", "per_1000_node_days": 1, )" +
                  crash + "}"),
            "categories[1].name: \"a\" is given twice"},
           {Model(R"({"name": "a", "per_1000_node_days": 0, )" + crash + "}"), "every rate is 0"},
           {Model(R"({"name": "a", "per_1000_node_days": 1, )" + crash + "}",
                  R"("stragglers": {"per_1000_node_days": 1, "slowdown": [1.5, 1.2]}, )"),
            "stragglers.slowdown: expected 1.001 <= low <= high <= 100, got [1.5,1.2]"},
           {Model(R"({"name": "a", "per_1000_node_days": 1, )" + crash + "}",
                  R"("stragglers": {"per_1000_node_days": 1, "speed": 2}, )"),
            "stragglers.speed: unknown field"},
           {Model(R"({"name": "a", "per_1000_node_days": 1, )" + crash + "}", R"("stragglers": {"minutes": [1, 2]}, )"),
            "stragglers.per_1000_node_days: missing"},
       }) {
    auto m = FailureModel::Parse(c.text, "m.json");
    ASSERT_FALSE(m.ok()) << c.text;
    EXPECT_NE(m.status().message().find(c.says), std::string::npos) << m.status().message();
    EXPECT_EQ(m.status().message().rfind("m.json: ", 0), 0u) << m.status().message();
  }
}

TEST(SimParamsTest, BadParametersAreRefusedNamingThem) {
  SimParams p;
  Status s = p.MergeJson(R"({"checkpoint_intervall_s": 60})", "p.json");
  EXPECT_NE(s.message().find("p.json: checkpoint_intervall_s: unknown parameter"), std::string::npos) << s.message();
  s = p.MergeJson(R"({"gpus": "many"})", "p.json");
  EXPECT_NE(s.message().find("p.json: gpus: expected a number"), std::string::npos) << s.message();
  s = p.MergeJson(R"({"spares": 1.5})", "p.json");
  EXPECT_NE(s.message().find("spares: expected a whole number"), std::string::npos) << s.message();
  SimParams q;
  q.gpus_per_node = 8;
  q.gpus = 100;
  EXPECT_NE(q.Validate().message().find("gpus: 100 is not a whole number of nodes of 8"), std::string::npos);
  q.gpus = 64;
  q.hang_timeout_s = 8;
  EXPECT_NE(q.Validate().message().find("hang_timeout_s"), std::string::npos);
}

class SimulatorTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tg-sim-test-" + std::to_string(getpid()) + "-" +
                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    auto rules = RuleSet::Load(TG_RULES_FILE);
    ASSERT_TRUE(rules.ok()) << rules.status().ToString();
    rules_ = std::make_unique<RuleSet>(std::move(rules.value()));
  }
  void TearDown() override { fs::remove_all(dir_); }

  // 8 nodes x 8 GPUs, short steps; `categories` fail often.
  SimResult Run(const std::string& categories, SimParams p = Small(), const std::string& extra = "",
                std::vector<SimTraceEntry>* trace = nullptr) {
    auto m = FailureModel::Parse(Model(categories, extra), "test");
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    SimOptions o;
    o.store_path = (dir_ / ("run" + std::to_string(runs_++) + ".db")).string();
    o.rules = rules_.get();
    o.trace = trace;
    auto r = RunSimulation(p, *m, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r.value() : SimResult{};
  }
  static SimParams Small() {
    SimParams p;
    p.gpus = 64;
    p.gpus_per_node = 8;
    p.days = 2;
    p.step_s = 2;
    p.checkpoint_interval_s = 600;
    p.hang_timeout_s = 120;
    p.restart_s = 30;
    p.replacement_s = 60;
    return p;
  }

  fs::path dir_;
  std::unique_ptr<RuleSet> rules_;
  int runs_ = 0;
};

const std::string kXid79 =
    R"({"name": "gpu", "hardware": true, "per_1000_node_days": 400, "signals": {"crash": 1}, "persistent": 1,
        "repair_hours": 24, "exit_code": 1, "log_tail": ["RuntimeError: CUDA error: unspecified launch failure"],
        "kernel_lines": ["NVRM: Xid (PCI:0000:1b:00): 79, pid=1, name=python, GPU has fallen off the bus."]})";
const std::string kBug =
    R"({"name": "bug", "hardware": false, "per_1000_node_days": 400, "signals": {"crash": 1}, "exit_code": 1,
        "log_tail": ["Traceback (most recent call last):", "KeyError: 'attention_mask'"]})";
const std::string kHang = R"({"name": "hang", "hardware": false, "per_1000_node_days": 400, "signals": {"hang": 1}})";
const std::string kDown =
    R"({"name": "down", "hardware": true, "per_1000_node_days": 400, "signals": {"node_down": 1}, "persistent": 1})";

TEST_F(SimulatorTest, TheSameSeedGivesTheSameRunAnotherSeedAnother) {
  const std::string model = kXid79 + "," + kBug + "," + kHang + "," + kDown;
  SimResult a = Run(model), b = Run(model);
  SimParams other = Small();
  other.seed = 2;
  SimResult c = Run(model, other);
  ASSERT_GT(a.report.incidents.size(), 3u);
  EXPECT_EQ(a.report.incidents.dump(), b.report.incidents.dump());
  EXPECT_EQ(a.report.ettr, b.report.ettr);
  EXPECT_EQ(a.messages, b.messages);
  EXPECT_EQ(a.events_stored, b.events_stored);
  EXPECT_NE(a.report.incidents.dump(), c.report.incidents.dump());
}

TEST_F(SimulatorTest, DetectionComesFromTheDetectors) {
  // A crash is seen at once; a hang once the hang timeout has passed since
  // the last step (and since the stuck operation began); a dead host after
  // missed_heartbeats x interval.
  SimParams p = Small();
  SimResult crash = Run(kBug, p);
  SimResult hang = Run(kHang, p);
  SimResult down = Run(kDown, p);
  ASSERT_GT(crash.categories[0].incidents, 2);
  ASSERT_GT(hang.categories[0].incidents, 2);
  ASSERT_GT(down.categories[0].incidents, 2);
  EXPECT_LT(crash.categories[0].detection_s / crash.categories[0].incidents, 0.1);
  double hang_mean = hang.categories[0].detection_s / hang.categories[0].incidents;
  EXPECT_GE(hang_mean, p.hang_timeout_s - p.step_s);
  // The stuck operation must be that old too: up to a step after the last one.
  EXPECT_LE(hang_mean, p.hang_timeout_s + p.step_s + 0.1);
  double down_mean = down.categories[0].detection_s / down.categories[0].incidents;
  EXPECT_GE(down_mean, p.missed_heartbeats * p.heartbeat_interval_s - 0.01);
  EXPECT_LE(down_mean, p.missed_heartbeats * p.heartbeat_interval_s + 0.2);
  for (const auto& inc : hang.report.incidents) EXPECT_EQ(inc.value("failure_kind", ""), "hang") << inc.dump();
  EXPECT_EQ(crash.false_alarms + hang.false_alarms + down.false_alarms, 0);
}

TEST_F(SimulatorTest, TheRestartsTermsThatGrowWithTheJobLengthenEveryRestartByTheirSum) {
  // Software crashes (no eviction, no wait for a node): each restart is
  // launch -> first step, plus what the restore reads.
  SimParams p = Small();
  SimResult plain = Run(kBug, p);
  p.import_s_per_node = 0.5;        // 8 nodes: 4 s
  p.store_s_per_rank = 0.01;        // 64 ranks: 0.64 s
  p.nccl_init_s_per_rank = 0.0625;  // 64 ranks: 4 s
  EXPECT_DOUBLE_EQ(p.LaunchS(8), p.restart_s + 8.64);
  SimResult at_scale = Run(kBug, p);
  ASSERT_GT(plain.categories[0].incidents, 2);
  ASSERT_EQ(plain.categories[0].incidents, at_scale.categories[0].incidents);  // the same faults, drawn first
  const double per_restart = (at_scale.report.restart_s - plain.report.restart_s) / plain.categories[0].incidents;
  EXPECT_NEAR(per_restart, 8.64, 0.1);
  p.nccl_init_s_per_rank = -0.1;
  EXPECT_NE(p.Validate().message().find("nccl_init_s_per_rank"), std::string::npos);
}

TEST_F(SimulatorTest, HardwareFaultsAreEvictedAndReplacedSoftwareOnesRestarted) {
  SimResult hw = Run(kXid79);
  ASSERT_GT(hw.categories[0].incidents, 2);
  EXPECT_EQ(hw.categories[0].evictions, hw.categories[0].incidents);
  EXPECT_EQ(hw.categories[0].hardware_agrees, hw.categories[0].incidents);
  EXPECT_GE(hw.replacements, hw.categories[0].evictions);
  EXPECT_TRUE(hw.finished) << hw.why_not;
  SimResult sw = Run(kBug);
  ASSERT_GT(sw.categories[0].incidents, 2);
  EXPECT_EQ(sw.categories[0].evictions, 0);
  EXPECT_EQ(sw.replacements, 0);
  // The accounting adds up, as `trainguard report` has it.
  const DowntimeReport& d = hw.report;
  EXPECT_NEAR(d.productive_s + d.startup_s + d.lost_s + d.detection_s + d.shutdown_s + d.restart_s + d.tail_s +
                  d.checkpoint_s,
              d.wall_s, 1.0);
  EXPECT_GT(d.ettr, 0.5);
  EXPECT_LT(d.ettr, 1.0);
  // `trainguard report` over the store says the same.
  auto store = OpenSqliteEventStore((dir_ / "run0.db").string());
  ASSERT_TRUE(store.ok());
  auto events = store.value()->Events("sim");
  ASSERT_TRUE(events.ok());
  EXPECT_EQ(static_cast<std::int64_t>(events->size()), hw.events_stored);
  auto from_store = ComputeReport("sim", *events);
  ASSERT_TRUE(from_store.ok());
  EXPECT_EQ(ReportJson(*from_store).dump(), ReportJson(d).dump());
}

TEST_F(SimulatorTest, ASimulationThatCannotFinishSaysWhy) {
  SimParams p = Small();
  p.replacement_s = -1;
  p.spares = 0;
  SimResult r = Run(kDown, p);
  EXPECT_FALSE(r.finished);
  EXPECT_NE(r.why_not.find("FAILED"), std::string::npos) << r.why_not;
  EXPECT_NE(r.why_not.find("no spare and no replacement"), std::string::npos) << r.why_not;
  // With a spare per failure it goes on.
  p.spares = 100;
  p.days = 0.5;
  SimResult spared = Run(kDown, p);
  EXPECT_TRUE(spared.finished) << spared.why_not;
}

// A host that dies just before the simulated time is up: the job is ended
// only once it is whole again (it ran on forever, checkpointing, when the
// end came while the dead host was not yet found lost).
TEST_F(SimulatorTest, AHostDeadAtTheEndIsFoundBeforeTheJobEnds) {
  SimParams p;
  p.gpus = 8;
  p.gpus_per_node = 2;
  p.days = 30.0 / 86400;
  p.seed = 20;
  p.step_s = 0.2;
  p.checkpoint_interval_s = 2;
  p.hang_timeout_s = 5;
  p.heartbeat_interval_s = 0.5;
  p.missed_heartbeats = 4;
  p.restart_s = 1;
  p.shutdown_s = 1.5;
  p.replacement_s = 2;
  // The equivalence test's model (simulator_equivalence_test.cc), in its order.
  SimResult r = Run(R"({"name": "gpu", "hardware": true, "mtbf_node_hours": 0.022, "signals": {"crash": 1}, "exit_code": 1,
     "log_tail": ["RuntimeError: CUDA error: unspecified launch failure"],
     "kernel_lines": ["NVRM: Xid (PCI:0000:1b:00): 79, pid=1, name=python, GPU has fallen off the bus."]},
    {"name": "bug", "mtbf_node_hours": 0.022, "signals": {"crash": 1}, "exit_code": 1,
     "log_tail": ["Traceback (most recent call last):", "KeyError: 'attention_mask'"]},
    {"name": "hang", "mtbf_node_hours": 0.022, "signals": {"hang": 1}},
    {"name": "down", "hardware": true, "mtbf_node_hours": 0.022, "signals": {"node_down": 1}})",
                    p);
  EXPECT_TRUE(r.finished) << r.why_not;
  EXPECT_LT(r.sim_s, 120);
}

// Idle spares fail at a job node's rate. A host lost while idle: the
// transport closes its session, the controller records it and asks the
// scheduler for another, so the job keeps its spares. A persistent fault
// waits for the spare's promotion and fails its ranks 30 s after the first
// step of the generation it joins; a passing one hits no rank.
TEST_F(SimulatorTest, SparesFailWhileIdleAndTheJobKeepsItsSpares) {
  SimParams p = Small();
  p.spares = 8;  // as many as the job's nodes: half the faults strike a spare
  p.days = 3;
  const std::string down =
      R"({"name": "down", "hardware": true, "per_1000_node_days": 400, "signals": {"node_down": 1}})";
  SimResult r = Run(kXid79 + "," + down, p);
  ASSERT_TRUE(r.finished) << r.why_not;
  EXPECT_GT(r.faults_on_spares, 4);
  EXPECT_GT(r.spares_lost, 0);
  EXPECT_GT(r.spares_broken, 0);
  EXPECT_LT(r.faults_on_spares, r.faults);
  auto store = OpenSqliteEventStore((dir_ / "run0.db").string());
  ASSERT_TRUE(store.ok());
  auto events = store.value()->Events("sim");
  ASSERT_TRUE(events.ok());
  std::set<std::string> promoted;
  std::map<std::int64_t, Nanos> first_step;  // generation -> its first step
  int spare_lost = 0;
  for (const Event& e : *events) {
    if (e.kind == "spare_lost") {
      ++spare_lost;
      EXPECT_NE(e.message.find("the scheduler is asked for another"), std::string::npos) << e.message;
    }
    if (e.kind == "spare_promoted") promoted.insert(e.node);
    if (e.kind == "first_step") first_step.emplace(e.generation, e.wall_ns);
  }
  // Every spare host lost was found (none in the job's last 30 s here).
  EXPECT_EQ(spare_lost, r.spares_lost);
  // A spare broken while idle fails 30 s into the generation it was promoted in.
  int refaults = 0;
  for (const Event& e : *events) {
    if (e.kind != "failure" || !promoted.count(e.node)) continue;
    auto first = first_step.find(e.generation);
    if (first != first_step.end() && std::abs(e.wall_ns - first->second - 30 * kSecond) < 100 * kMillisecond) ++refaults;
  }
  EXPECT_GT(refaults, 0);
  // Without spares nothing is drawn on one.
  SimResult none = Run(kXid79 + "," + down);
  EXPECT_EQ(none.faults_on_spares, 0);
}

// A GPU with a defect that stays corrupts every step: its rank's parameter
// fingerprints leave its replicas' at once. The controller's replica check
// names it, the node is evicted and the job resumes from no checkpoint
// newer than the replicas' last agreement. Without fingerprints the same
// defect shows only as a NaN loss an hour later, again after every restart.
TEST_F(SimulatorTest, ADefectThatCorruptsAgainIsFoundByItsFingerprintsAndEvicted) {
  const std::string sdc =
      R"({"name": "sdc", "hardware": true, "per_1000_node_days": 400, "signals": {"sdc": 1}, "persistent": 1,
          "latency_hours": 1, "exit_code": 1, "log_tail": ["RuntimeError: loss is nan, stopping training"]})";
  SimParams p = Small();
  p.memory_interval_s = 20;  // saves to memory every 20 s, to storage every 10 min
  SimResult found = Run(sdc, p);
  ASSERT_TRUE(found.finished) << found.why_not;
  const SimCategoryStats& c = found.categories[0];
  ASSERT_GT(c.incidents, 3);
  EXPECT_EQ(c.evictions, c.incidents);
  EXPECT_EQ(c.hardware_agrees, c.incidents);
  EXPECT_EQ(found.sdc_redone_s, 0);  // nothing went unseen
  for (const auto& inc : found.report.incidents) {
    EXPECT_EQ(inc.value("failure_kind", ""), "replica_divergence") << inc.dump();
  }
  auto store = OpenSqliteEventStore((dir_ / "run0.db").string());
  ASSERT_TRUE(store.ok());
  auto events = store.value()->Events("sim");
  ASSERT_TRUE(events.ok());
  std::map<std::int64_t, std::int64_t> bound;  // generation -> the last step its replicas agreed at
  std::map<std::int64_t, std::int64_t> resumed;  // generation -> the step it resumed from
  for (const Event& e : *events) {
    auto d = nlohmann::json::parse(e.detail_json, nullptr, false);
    if (e.kind == "failure" && d.contains("resume_at_most")) bound[e.generation] = d["resume_at_most"].get<std::int64_t>();
    if (e.kind == "first_step" && d.contains("resumed_step")) resumed[e.generation] = d["resumed_step"].get<std::int64_t>();
  }
  ASSERT_GT(bound.size(), 3u);
  int near = 0;
  for (const auto& [g, at_most] : bound) {
    ASSERT_TRUE(resumed.count(g + 1)) << g;
    EXPECT_LE(resumed[g + 1], at_most) << g;
    // From the peer's memory when its newest copy is within the bound, else
    // from storage (the evicted node's own copies are gone with it).
    if (resumed[g + 1] >= at_most - 20 / p.step_s - 1) ++near;
  }
  EXPECT_GT(near, static_cast<int>(bound.size()) / 2);
  p.fingerprint_every = 0;
  SimResult blind = Run(sdc, p);
  EXPECT_GT(blind.sdc_redone_s, 3600);
  EXPECT_LT(blind.ettr_true, found.ettr_true - 0.1) << blind.ettr_true << " " << found.ettr_true;
}

TEST_F(SimulatorTest, SweepsWriteACsvRowAndAPlotPointPerRun) {
  std::vector<SweepPoint> points;
  for (int gpus : {64, 128}) {
    SimParams p = Small();
    p.gpus = gpus;
    p.days = 0.5;
    points.push_back({p, {{"gpus", std::to_string(gpus)}}, Run(kBug, p)});
  }
  std::string csv = SweepCsv(points);
  EXPECT_EQ(csv.rfind("gpus,finished,ettr,", 0), 0u) << csv;
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 3);
  EXPECT_NE(csv.find("\n128,true,"), std::string::npos) << csv;
  std::string svg = SweepSvg(points, "t");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), 'M'), 1);  // one line
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

TEST_F(SimulatorTest, ALostNodeRestoresFromItsPeersMemoryAndANodeWithItsPeerFromStorage) {
  // Hosts lost (each replaced by the scheduler), saves to memory every 20 s
  // and to storage every 10 minutes.
  SimParams p = Small();
  p.memory_interval_s = 20;
  p.checkpoint_interval_s = 600;
  p.persist_s = 30;
  p.peer_copy_s = 1;
  p.restore_storage_s = 40;
  p.peer_loss_fraction = 0;
  SimResult alone = Run(kDown, p);
  ASSERT_GT(alone.report.incidents.size(), 3u);
  EXPECT_EQ(alone.storage_restores, 0);
  // Every loss took the peer along: each restart reads storage's older save.
  p.peer_loss_fraction = 1;
  SimResult pairs = Run(kDown, p);
  ASSERT_GT(pairs.report.incidents.size(), 3u);
  EXPECT_EQ(pairs.storage_restores, static_cast<int>(pairs.report.incidents.size()));
  const double lost_alone = alone.report.lost_s / static_cast<double>(alone.report.incidents.size());
  const double lost_pairs = pairs.report.lost_s / static_cast<double>(pairs.report.incidents.size());
  EXPECT_LT(lost_alone, 20 + 2 * p.step_s);  // at most a memory interval (and the save under way)
  EXPECT_GT(lost_pairs, 3 * lost_alone);
  // Without a memory tier every restart reads storage.
  p.memory_interval_s = 0;
  p.peer_loss_fraction = 0;
  SimResult storage_only = Run(kDown, p);
  EXPECT_EQ(storage_only.storage_restores, static_cast<int>(storage_only.report.incidents.size()));
}

TEST_F(SimulatorTest, TheAutomaticPolicyFollowsTheControllersPlanToTheOptimum) {
  // Crashes only (no node is lost), every 25 minutes or so on 8 nodes: the
  // plan's memory interval is Daly's for the job's MTBF, and the run ends
  // within a point of the first-order optimum; the script's 10-minute
  // storage interval loses more.
  SimParams p = Small();
  p.days = 4;
  p.step_s = 1;
  p.checkpoint_blocked_s = 0.5;
  p.checkpoint_interval_s = 600;
  p.peer_copy_s = 1;
  p.persist_s = 5;
  const std::string often =
      R"({"name": "bug", "per_1000_node_days": 4000, "signals": {"crash": 1}, "exit_code": 1,
          "log_tail": ["Traceback (most recent call last):", "KeyError: 'attention_mask'"]})";
  SimResult fixed = Run(often, p);
  p.checkpoint_policy = "auto";
  SimResult planned = Run(often, p);
  ASSERT_GT(planned.report.incidents.size(), 50u);
  ASSERT_FALSE(planned.plan.empty());
  EXPECT_GT(planned.memory_interval_s, 0);
  EXPECT_NEAR(planned.memory_interval_s, planned.optimum_interval_s, 0.2 * planned.optimum_interval_s)
      << planned.plan;
  EXPECT_NEAR(planned.report.ettr, planned.optimum_ettr, 0.01) << planned.plan;
  EXPECT_GT(planned.report.ettr, fixed.report.ettr + 0.02);
  EXPECT_LT(planned.report.lost_s, fixed.report.lost_s / 4);
}

// A rare crash (a model needs a failure) and, with `stragglers`, nodes that
// slow by 1.3x for 20 minutes, about ten times in the 2 days on 8 nodes.
const std::string kRareCrash =
    R"({"name": "bug", "per_1000_node_days": 10, "signals": {"crash": 1}, "exit_code": 1,
        "log_tail": ["Traceback (most recent call last):", "KeyError: 'attention_mask'"]})";
std::string Stragglers(double on_node) {
  return R"("stragglers": {"per_1000_node_days": 600, "slowdown": [1.3, 1.3], "minutes": [20, 20], "on_node": )" +
         std::to_string(on_node) + "}, ";
}

TEST_F(SimulatorTest, ASlowNodeSetsTheJobsPaceAndTheDetectorNamesItAndNoHealthyNode) {
  SimResult r = Run(kRareCrash, Small(), Stragglers(1));
  ASSERT_GE(r.slowdowns_in_job, 5) << r.slowdowns;
  double drawn_s = 0;
  std::vector<double> soon;
  for (const SimSlowdown& s : r.slowdown_list) {
    if (!s.in_job) continue;
    drawn_s += s.end_s - s.start_s;
    // Named while it lasted: by the change point a few steps in, or (slow
    // from a generation's start, no baseline) by the windows.
    EXPECT_GE(s.named_s, 0) << s.node << " slow from " << s.start_s << " s was never named";
    EXPECT_LT(s.named_s, 100 * 2 * 1.3) << s.node;  // within 100 steps at the slow pace
    soon.push_back(s.named_s);
  }
  std::sort(soon.begin(), soon.end());
  EXPECT_LT(soon[soon.size() / 2], 25 * 2 * 1.3);  // most within 25 steps
  EXPECT_EQ(r.named_wrongly, 0);
  EXPECT_GE(r.stragglers_named, r.slowdowns_in_job);  // again when it may be evicted
  // The job ran at the slow node's pace: every slowed second cost 1 - 1/1.3 of itself.
  EXPECT_GT(r.slow_s, 0.8 * drawn_s);
  EXPECT_LE(r.slow_s, drawn_s + 1);
  EXPECT_NEAR(r.slowed_s, r.slow_s * (1 - 1 / 1.3), 1e-6 * r.slow_s);
  EXPECT_NEAR(r.ettr_true, r.report.ettr - r.slowed_s / r.report.wall_s, 1e-9);
  // Named, not acted on: no incident comes of it.
  EXPECT_EQ(r.categories.back().name, "straggler");
  EXPECT_EQ(r.categories.back().incidents, 0);
  EXPECT_EQ(r.false_alarms, 0);
}

TEST_F(SimulatorTest, EvictingStragglersReplacesTheSlowNodeForARestart) {
  // Saves to node memory every 20 s: a restart costs little work, less
  // than 20 minutes at 1.3x.
  SimParams p = Small();
  p.spares = 1;
  p.memory_interval_s = 20;
  SimResult kept = Run(kRareCrash, p, Stragglers(1));
  p.straggler_action = "evict";
  SimResult evicted = Run(kRareCrash, p, Stragglers(1));
  const SimCategoryStats& s = evicted.categories.back();
  ASSERT_GE(s.incidents, 4) << evicted.slowdowns_in_job;
  EXPECT_EQ(s.evictions, s.incidents);
  EXPECT_EQ(evicted.false_alarms, 0);
  EXPECT_EQ(evicted.named_wrongly, 0);
  // Slow for the detector's windows and the restart, not for the slowdowns' 20 minutes.
  EXPECT_LT(evicted.slow_s, kept.slow_s / 3) << kept.slow_s;
  EXPECT_GT(evicted.ettr_true, kept.ettr_true);
}

TEST_F(SimulatorTest, ASlowLinkSlowsEveryNodeAliteAndNamesNoneAndFailuresAreDrawnAsWithout) {
  const std::string often =
      R"({"name": "bug", "per_1000_node_days": 300, "signals": {"crash": 1}, "exit_code": 1,
          "log_tail": ["Traceback (most recent call last):", "KeyError: 'attention_mask'"]})";
  SimResult plain = Run(often, Small());
  SimResult links = Run(often, Small(), Stragglers(0));
  ASSERT_GE(links.slowdowns_in_job, 3);
  EXPECT_GT(links.slowed_s, 0);
  EXPECT_EQ(links.stragglers_named, 0);
  EXPECT_LT(links.ettr_true, links.report.ettr);
  // Stragglers have a random stream of their own: the same failures strike.
  ASSERT_GT(plain.faults, 3);
  EXPECT_EQ(links.faults, plain.faults);
  EXPECT_EQ(links.categories[0].injected, plain.categories[0].injected);
  EXPECT_EQ(plain.slowdowns, 0);
  EXPECT_EQ(plain.ettr_true, plain.report.ettr);
}

}  // namespace
}  // namespace trainguard
