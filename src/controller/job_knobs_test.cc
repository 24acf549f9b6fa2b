#include "controller/job_knobs.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

namespace trainguard {
namespace {

const Knob& Named(const std::string& name) {
  for (const Knob& k : JobKnobs()) {
    if (k.name == name) return k;
  }
  ADD_FAILURE() << "no knob " << name;
  return JobKnobs().front();
}

TEST(JobKnobsTest, NamesAndFlagsAreUniqueAndEveryDefaultReadsBack) {
  std::set<std::string> names, flags;
  const JobConfig defaults;
  for (const Knob& k : JobKnobs()) {
    EXPECT_TRUE(names.insert(k.name).second) << k.name;
    if (!k.flags.empty()) {
      EXPECT_TRUE(flags.insert(k.Flag()).second) << k.Flag();
    }
    EXPECT_FALSE(k.help.empty()) << k.name;
    // The default, given as a value, is accepted and changes nothing.
    JobConfig c;
    if (k.kind != KnobKind::kFlag) {
      ASSERT_TRUE(SetKnob(k, k.get(defaults), &c).ok()) << k.name << " = " << k.get(defaults);
      EXPECT_EQ(k.get(c), k.get(defaults)) << k.name;
    }
  }
  EXPECT_GE(JobKnobs().size(), 20u);
}

TEST(JobKnobsTest, ValuesSetTheConfigMembers) {
  JobConfig c;
  ASSERT_TRUE(SetKnob(Named("hang_timeout"), "2.5", &c).ok());
  EXPECT_EQ(c.hang_timeout, 2500 * kMillisecond);
  EXPECT_FALSE(c.hang_timeout_auto);
  ASSERT_TRUE(SetKnob(Named("hang_timeout"), "auto", &c).ok());
  EXPECT_TRUE(c.hang_timeout_auto);
  EXPECT_EQ(Named("hang_timeout").get(c), "auto");
  ASSERT_TRUE(SetKnob(Named("straggler_threshold"), "0.2", &c).ok());
  EXPECT_DOUBLE_EQ(c.straggler.min_slowdown, 0.2);
  ASSERT_TRUE(SetKnob(Named("straggler_evict_windows"), "7", &c).ok());
  EXPECT_EQ(c.straggler.windows_to_evict, 7);
  ASSERT_TRUE(SetKnob(Named("diagnose"), "quick", &c).ok());
  EXPECT_EQ(c.diagnose, DiagnoseMode::kQuick);
  ASSERT_TRUE(SetKnob(Named("max_restarts"), "0", &c).ok());
  EXPECT_EQ(c.max_restarts, 0);
  ASSERT_TRUE(SetKnob(Named("no_instrument"), "true", &c).ok());
  EXPECT_TRUE(c.no_instrument);
}

TEST(JobKnobsTest, BadValuesAreRefusedNamingTheFlagAndWhatItTakes) {
  JobConfig c;
  const JobConfig before = c;
  struct Case {
    std::string knob, value, says;
  };
  for (const Case& t : std::vector<Case>{{"missed_heartbeats", "0", "--missed-heartbeats: '0' must be at least 1"},
                                         {"heartbeat_interval", "0", "must be above 0"},
                                         {"max_restarts", "-1", "must be at least 0"},
                                         {"max_restarts", "2.5", "is not a whole number"},
                                         {"hang_timeout", "soon", "is not a number"},
                                         {"hang_timeout", "", "is not a number"},
                                         {"stop_grace", "nan", "is not a number"},
                                         {"diagnose", "thorough", "accepted: off, quick, full"},
                                         {"reconnect_window", "100000", "must be at most 86400"},
                                         {"straggler_evict_windows", "1", "must be at least 2"}}) {
    Status s = SetKnob(Named(t.knob), t.value, &c);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << t.knob << " " << t.value;
    EXPECT_NE(s.message().find(t.says), std::string::npos) << s.message();
  }
  EXPECT_EQ(c.max_restarts, before.max_restarts);  // nothing was set
  EXPECT_EQ(c.hang_timeout, before.hang_timeout);
}

TEST(JobKnobsTest, TheJobRecordAndTheReferenceHoldEveryKnob) {
  JobConfig c;
  c.hang_timeout_auto = true;
  auto j = nlohmann::json::parse(KnobsJson(c));
  EXPECT_EQ(j["max_restarts"], 3);
  EXPECT_EQ(j["heartbeat_interval_s"], 1.0);
  EXPECT_EQ(j["hang_timeout_s"], "auto");
  EXPECT_EQ(j["straggler_threshold"], 0.07);
  EXPECT_EQ(j["diagnose"], "off");
  EXPECT_EQ(j["no_instrument"], false);
  const std::string md = KnobsMarkdown();
  for (const Knob& k : JobKnobs()) {
    EXPECT_NE(md.find("| `" + k.name + "` |"), std::string::npos) << k.name;
    EXPECT_TRUE(j.contains(k.name) || j.contains(k.name + "_s")) << k.name;
  }
}

}  // namespace
}  // namespace trainguard
