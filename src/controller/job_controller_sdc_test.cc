// The SDC monitor inside the controller: a disagreement of two replicas and
// its replay (docs/sdc.md, "Confirmation").
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "controller/job_controller_test_fixture.h"

namespace trainguard {
namespace {

class JobControllerSdcTest : public JobControllerTest {
 protected:
  // Rank `rank` on `node` is at `step` of generation `gen` and reports the
  // fingerprints `prints` (step, value); the clock moves past the replica
  // check's pacing first.
  void Beat(int node, std::int64_t gen, int rank, std::int64_t step,
            const std::vector<std::pair<std::int64_t, std::uint64_t>>& prints) {
    clock_.Advance(300 * kMillisecond);
    v1::RankStatus r = Rank(rank, step);
    for (const auto& [s, v] : prints) {
      v1::Fingerprint* f = r.add_fingerprints();
      f->set_step(s);
      f->set_value(v);
    }
    Heartbeat(node, gen, {r});
  }
};

// Found when the suite first ran in parallel on a busy machine: the first
// attempt's fingerprints arrived late, so the disagreement was first seen at
// step 24 although it began at 12; the replay, seen promptly, disagreed at
// 12 again, before the suspect step. That is the fault reproduced, not a new
// suspicion (which restarted the replay once more, with no culprit, and then
// evicted the replacement of the moved node).
TEST_F(JobControllerSdcTest, AReplayThatDisagreesBeforeTheSuspectStepReproducesTheFault) {
  Make(2, 1);
  Register(0);
  Register(1);
  Beat(0, 0, 0, 8, {{4, 1}, {8, 2}});
  Beat(1, 0, 1, 8, {{4, 1}, {8, 2}});
  Beat(0, 0, 0, 24, {{24, 30}});
  Beat(1, 0, 1, 24, {{24, 31}});
  auto first = EventsOf("replica_divergence");
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].step, 24);
  ASSERT_EQ(controller_->state(), JobState::kStopping);
  Stopped(0, 0);
  Stopped(1, 0);
  ASSERT_EQ(controller_->state(), JobState::kRunning);
  // The replay on the same nodes: they agree through step 8 again, then not.
  Beat(0, 1, 0, 8, {{4, 1}, {8, 2}});
  Beat(1, 1, 1, 8, {{4, 1}, {8, 2}});
  Beat(0, 1, 0, 12, {{12, 5}});
  Beat(1, 1, 1, 12, {{12, 6}});
  EXPECT_EQ(EventsOf("replica_divergence").size(), 1u);
  auto failures = EventsOf("failure");
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_NE(failures[1].message.find("step 24 went wrong again on replay on the same nodes: moving node node1 out"),
            std::string::npos)
      << failures[1].message;
}

// A controller that dies while a suspicion is being replayed: its successor
// (a restart, or a standby taking over) goes on with the replay and decides
// it, rather than forgetting it and letting the replay pass as a normal run.
TEST_F(JobControllerSdcTest, AReplayGoesOnAcrossAControllerRestart) {
  Make(2, 1);
  Register(0);
  Register(1);
  Beat(0, 0, 0, 8, {{4, 1}, {8, 2}});
  Beat(1, 0, 1, 8, {{4, 1}, {8, 2}});
  Beat(0, 0, 0, 12, {{12, 5}});
  Beat(1, 0, 1, 12, {{12, 6}});
  ASSERT_EQ(controller_->state(), JobState::kStopping);
  Stopped(0, 0);
  Stopped(1, 0);
  ASSERT_EQ(controller_->state(), JobState::kRunning);  // generation 1 replays step 12
  Beat(0, 1, 0, 8, {{4, 1}, {8, 2}});
  Beat(1, 1, 1, 8, {{4, 1}, {8, 2}});
  ASSERT_TRUE(controller_->FlushStore(std::chrono::seconds(5)));
  ASSERT_TRUE(Restart().ok());
  Reconnect(0, 1, 8);
  Reconnect(1, 1, 8);
  conn_base_ = 10;
  ASSERT_EQ(EventsOf("job_resumed").size(), 1u);
  // The replay reaches step 12: rank 1 now holds rank 0's value, so rank 1 computed wrong, once.
  Beat(0, 1, 0, 12, {{12, 5}});
  Beat(1, 1, 1, 12, {{12, 5}});
  auto decided = EventsOf("sdc_confirmation");
  ASSERT_EQ(decided.size(), 1u);
  EXPECT_NE(decided[0].message.find("not reproduced: step 12 replayed on the same nodes cleanly: a transient fault "
                                    "of rank 1 on node1"),
            std::string::npos)
      << decided[0].message;
  EXPECT_EQ(controller_->state(), JobState::kRunning);
  EXPECT_EQ(EventsOf("failure").size(), 1u);
  // Each change of the suspicion is recorded once: set, then decided.
  auto said = EventsOf("sdc_suspicion");
  ASSERT_EQ(said.size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(said[0].detail_json).value("stage", -1), 1);
  EXPECT_EQ(nlohmann::json::parse(said[1].detail_json).value("stage", -1), 0);
}

}  // namespace
}  // namespace trainguard
