#include "agent/agent.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent/fake_controller_link.h"
#include "agent/process.h"
#include "testing/wait_until.h"

namespace trainguard {
namespace {

using namespace std::chrono_literals;

bool Alive(int pid) {
  std::string s = ProcState(pid);
  return !s.empty() && s != "Z";
}

// Live (non-zombie) members of a process group, from /proc.
int LiveGroupMembers(int pgid) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    std::ifstream f(entry.path() / "stat");
    std::string line;
    if (!std::getline(f, line)) continue;
    auto paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream rest(line.substr(paren + 2));
    std::string state;
    int ppid = 0, pgrp = 0;
    rest >> state >> ppid >> pgrp;
    if (pgrp == pgid && state != "Z") ++n;
  }
  return n;
}

class AgentTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/agent_test_" + std::to_string(getpid()) + "_" +
           testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
    AgentConfig config;
    config.node_id = "n0";
    config.hostname = "host";
    config.run_dir = dir_;
    config.shm_dir = dir_;
    config.stream_output = false;
    config.kernel_log = "";
    config.reconnect_window = 0;  // losing the fake controller ends the agent
    Configure(&config);
    agent_ = std::make_unique<Agent>(config, RealClock::Get(), &link_);
    thread_ = std::thread([this] { rc_ = agent_->Run(); });
    v1::ControllerMessage welcome;
    welcome.mutable_welcome()->set_protocol_version(kProtocolVersion);
    welcome.mutable_welcome()->set_heartbeat_interval_ms(100);
    agent_->OnCommand(welcome);
  }
  virtual void Configure(AgentConfig* config) {}
  void TearDown() override {
    if (thread_.joinable()) {
      agent_->Interrupt("test over");
      thread_.join();
    }
    std::filesystem::remove_all(dir_);
  }
  void StartRanks(std::vector<std::string> argv, int nproc = 2, int generation = 0) {
    v1::ControllerMessage m;
    v1::Start* s = m.mutable_start();
    s->set_generation(generation);
    s->set_run_id("job");
    s->set_group_rank(1);
    s->set_nnodes(2);
    s->set_nproc_per_node(nproc);
    s->set_world_size(2 * nproc);
    s->set_master_addr("127.0.0.1");
    s->set_master_port(12345);
    for (auto& a : argv) s->add_argv(a);
    agent_->OnCommand(m);
  }
  std::optional<v1::AgentMessage> WaitKind(v1::AgentMessage::KindCase kind,
                                           std::chrono::milliseconds t = 10s) {
    return link_.WaitFor([kind](const v1::AgentMessage& m) { return m.kind_case() == kind; }, t);
  }

  std::string dir_;
  FakeControllerLink link_;
  std::unique_ptr<Agent> agent_;
  std::thread thread_;
  int rc_ = -1;
};

TEST_F(AgentTest, RegistersFirst) {
  auto reg = WaitKind(v1::AgentMessage::kRegister);
  ASSERT_TRUE(reg);
  EXPECT_EQ(reg->register_().node_id(), "n0");
  EXPECT_EQ(reg->register_().protocol_version(), kProtocolVersion);
  EXPECT_GT(reg->register_().free_port(), 0);
}

TEST_F(AgentTest, RanksGetTheTorchrunEnvironmentAndExitsAreReported) {
  StartRanks({"/bin/sh", "-c",
              "echo rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE group=$GROUP_RANK "
              "port=$MASTER_PORT; exit $((40 + LOCAL_RANK))"});
  auto started = WaitKind(v1::AgentMessage::kStarted);
  ASSERT_TRUE(started);
  ASSERT_EQ(started->started().ranks_size(), 2);
  for (int local = 0; local < 2; ++local) {
    auto exited = link_.WaitFor(
        [local](const v1::AgentMessage& m) {
          return m.has_rank_exited() && m.rank_exited().rank().local_rank() == local;
        },
        10s);
    ASSERT_TRUE(exited);
    const auto& e = exited->rank_exited();
    EXPECT_EQ(e.rank().exit_code(), 40 + local);
    EXPECT_EQ(e.rank().global_rank(), 2 + local);
    ASSERT_GE(e.log_tail_size(), 1);
    EXPECT_EQ(e.log_tail(0), "rank=" + std::to_string(2 + local) + " local=" +
                                 std::to_string(local) + " world=4 group=1 port=12345");
  }
  std::ifstream log(dir_ + "/logs/rank2.stdout.log");
  std::string all((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(all.find("rank=2 local=0"), std::string::npos);
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

TEST_F(AgentTest, StderrIsKeptApartFromStdoutAndBothReachTheTail) {
  StartRanks({"/bin/sh", "-c", "echo to-out; echo to-err >&2; echo more-out; exit 1"}, 1);
  auto exited = WaitKind(v1::AgentMessage::kRankExited);
  ASSERT_TRUE(exited);
  std::string out = ReadAll(dir_ + "/logs/rank1.stdout.log");
  std::string err = ReadAll(dir_ + "/logs/rank1.stderr.log");
  EXPECT_NE(out.find("to-out\nmore-out\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("to-err"), std::string::npos) << out;
  EXPECT_NE(err.find("to-err\n"), std::string::npos) << err;
  EXPECT_EQ(err.find("to-out"), std::string::npos) << err;
  std::vector<std::string> tail(exited->rank_exited().log_tail().begin(),
                                exited->rank_exited().log_tail().end());
  for (const char* line : {"to-out", "to-err", "more-out"}) {
    EXPECT_NE(std::find(tail.begin(), tail.end(), line), tail.end()) << line;
  }
}

TEST_F(AgentTest, ARankGetsItsOwnErrorFileAndAFailureCarriesWhatItWrote) {
  // What torch's @record writes, by a shell: the message, a traceback, a timestamp.
  StartRanks({"/bin/sh", "-c",
              "case \"$TORCHELASTIC_ERROR_FILE\" in */errors/rank$RANK.gen3.json) ;; *) exit 9;; esac; "
              "printf '{\"message\": {\"message\": \"ValueError: rank %s says no\", \"extraInfo\": "
              "{\"py_callstack\": \"Traceback (most recent call last):\\\\n  File x\\\\nValueError: "
              "no\\\\n\", \"timestamp\": \"1700000000\"}}}' $RANK > \"$TORCHELASTIC_ERROR_FILE\"; exit 1"},
             1, /*generation=*/3);
  auto exited = WaitKind(v1::AgentMessage::kRankExited);
  ASSERT_TRUE(exited);
  EXPECT_EQ(exited->rank_exited().rank().exit_code(), 1);
  ASSERT_TRUE(exited->rank_exited().has_error());
  const v1::RankError& e = exited->rank_exited().error();
  EXPECT_EQ(e.type(), "ValueError");
  EXPECT_EQ(e.message(), "ValueError: rank 1 says no");
  EXPECT_EQ(e.traceback(), "Traceback (most recent call last):\n  File x\nValueError: no\n");
  EXPECT_EQ(e.timestamp_unix_s(), 1700000000);
  EXPECT_EQ(e.path(), dir_ + "/errors/rank1.gen3.json");
}

TEST_F(AgentTest, AnErrorFileLeftByAnEarlierGenerationIsNotReadAsThisOnes) {
  std::filesystem::create_directories(dir_ + "/errors");
  std::ofstream(dir_ + "/errors/rank1.gen0.json")
      << R"({"message": {"message": "OldError: from before", "extraInfo": {}}})";
  StartRanks({"/bin/sh", "-c", "exit 5"}, 1, /*generation=*/0);
  auto exited = WaitKind(v1::AgentMessage::kRankExited);
  ASSERT_TRUE(exited);
  EXPECT_EQ(exited->rank_exited().rank().exit_code(), 5);
  EXPECT_FALSE(exited->rank_exited().has_error());
}

TEST_F(AgentTest, AFailedRanksLastWordsAreDatedApartFromItsExit) {
  // It says why, then tears down for a second (as torch does, slower under load).
  StartRanks({"/bin/sh", "-c", "echo 'RuntimeError: out of luck'; sleep 1; exit 1"}, 1);
  auto exited = WaitKind(v1::AgentMessage::kRankExited);
  ASSERT_TRUE(exited);
  const v1::RankExited& e = exited->rank_exited();
  EXPECT_GT(e.last_words_unix_ms(), 0);
  EXPECT_LT(e.last_words_unix_ms(), e.exit_unix_ms());
}

TEST_F(AgentTest, SignalDeathIsReported) {
  StartRanks({"/bin/sh", "-c", "kill -9 $$"}, 1);
  auto exited = WaitKind(v1::AgentMessage::kRankExited);
  ASSERT_TRUE(exited);
  EXPECT_EQ(exited->rank_exited().rank().term_signal(), SIGKILL);
  EXPECT_EQ(exited->rank_exited().last_words_unix_ms(), 0);  // it said nothing
}

TEST_F(AgentTest, StopKillsRanksThatIgnoreSigtermAndTheirChildren) {
  StartRanks({"/bin/sh", "-c", "trap '' TERM; sleep 300 & sleep 300; wait"}, 2);
  auto started = WaitKind(v1::AgentMessage::kStarted);
  ASSERT_TRUE(started);
  std::vector<int> pids = agent_->RankPids();
  ASSERT_EQ(pids.size(), 2u);
  v1::ControllerMessage stop;
  stop.mutable_stop()->set_generation(0);
  stop.mutable_stop()->set_grace_ms(200);
  agent_->OnCommand(stop);
  auto stopped = WaitKind(v1::AgentMessage::kStopped);
  ASSERT_TRUE(stopped);
  EXPECT_EQ(stopped->stopped().generation(), 0);
  for (int pid : pids) {
    EXPECT_FALSE(Alive(pid)) << pid;
    EXPECT_EQ(LiveGroupMembers(pid), 0) << "process group " << pid << " still has members";
  }
  EXPECT_FALSE(link_.WaitFor([](const v1::AgentMessage& m) { return m.has_rank_exited(); }, 100ms))
      << "ranks stopped on command are not failures";
}

TEST_F(AgentTest, HeartbeatsCarryRankState) {
  StartRanks({"/bin/sh", "-c", "sleep 300"}, 1);
  auto hb = link_.WaitFor(
      [](const v1::AgentMessage& m) { return m.has_heartbeat() && m.heartbeat().ranks_size() == 1; },
      5s);
  ASSERT_TRUE(hb);
  const auto& r = hb->heartbeat().ranks(0);
  EXPECT_TRUE(r.running());
  EXPECT_FALSE(r.attached());  // sh does not use the client
  EXPECT_EQ(r.step(), -1);
  EXPECT_GT(hb->heartbeat().metrics().mem_total_kb(), 0);
}

TEST_F(AgentTest, ShutdownStopsRanksAndEndsRun) {
  StartRanks({"/bin/sh", "-c", "sleep 300"}, 1);
  ASSERT_TRUE(WaitKind(v1::AgentMessage::kStarted));
  std::vector<int> pids = agent_->RankPids();
  v1::ControllerMessage shutdown;
  shutdown.mutable_shutdown()->set_reason("done");
  agent_->OnCommand(shutdown);
  thread_.join();
  EXPECT_EQ(rc_, 0);
  for (int pid : pids) EXPECT_FALSE(Alive(pid));
}

TEST_F(AgentTest, LosingTheControllerStopsRanks) {
  StartRanks({"/bin/sh", "-c", "sleep 300"}, 1);
  ASSERT_TRUE(WaitKind(v1::AgentMessage::kStarted));
  std::vector<int> pids = agent_->RankPids();
  agent_->OnLinkLost("connection reset");
  thread_.join();
  EXPECT_EQ(rc_, 1);
  EXPECT_NE(agent_->error().find("connection reset"), std::string::npos);
  for (int pid : pids) EXPECT_FALSE(Alive(pid));
}

// An agent whose controller may come back (a restart on the same address).
class AgentReconnectTest : public AgentTest {
 protected:
  void Configure(AgentConfig* config) override { config->reconnect_window = 2 * kSecond; }
};

TEST_F(AgentReconnectTest, RanksKeepRunningAndARestartedControllerGetsThemBackWithWhatItMissed) {
  StartRanks({"/bin/sh", "-c", "sleep 300"}, 2);
  ASSERT_TRUE(WaitKind(v1::AgentMessage::kStarted));
  std::vector<int> pids = agent_->RankPids();
  ASSERT_EQ(pids.size(), 2u);
  link_.SetDown(true);
  agent_->OnLinkLost("connection reset");
  kill(pids[1], SIGKILL);  // a rank dies while the controller is away
  ASSERT_TRUE(testutil::WaitUntil([&] { return link_.reconnect_calls() >= 2; }, 10s));
  EXPECT_TRUE(Alive(pids[0]));
  link_.SetReconnectable(true);
  link_.SetDown(false);
  auto again = link_.WaitFor([](const v1::AgentMessage& m) { return m.has_register_() && m.register_().has_resume_generation(); },
                             10s);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->register_().resume_generation(), 0);
  EXPECT_EQ(again->register_().resume_group_rank(), 1);
  ASSERT_EQ(again->register_().resume_ranks_size(), 2);
  EXPECT_EQ(again->register_().resume_ranks(0).pid(), pids[0]);
  EXPECT_TRUE(again->register_().resume_ranks(0).running());
  // The exit that happened while away is sent after the new Register.
  auto exited = WaitKind(v1::AgentMessage::kRankExited);
  ASSERT_TRUE(exited);
  EXPECT_EQ(exited->rank_exited().rank().term_signal(), SIGKILL);
  EXPECT_TRUE(Alive(pids[0]));
  EXPECT_TRUE(thread_.joinable());
  // A controller that continues the generation says so; the rank goes on.
  v1::ControllerMessage welcome;
  welcome.mutable_welcome()->set_protocol_version(kProtocolVersion);
  welcome.mutable_welcome()->set_resumed(true);
  agent_->OnCommand(welcome);
  EXPECT_TRUE(testutil::HoldsFor([&] { return Alive(pids[0]); }, 100ms));
  // One that does not: the stale rank is stopped.
  welcome.mutable_welcome()->set_resumed(false);
  agent_->OnCommand(welcome);
  EXPECT_TRUE(testutil::WaitUntil([&] { return !Alive(pids[0]); }, 10s));
}

TEST_F(AgentReconnectTest, AControllerThatDoesNotComeBackInTheWindowEndsTheAgentAndItsRanks) {
  StartRanks({"/bin/sh", "-c", "sleep 300"}, 1);
  ASSERT_TRUE(WaitKind(v1::AgentMessage::kStarted));
  std::vector<int> pids = agent_->RankPids();
  link_.SetDown(true);
  agent_->OnLinkLost("connection reset");
  thread_.join();  // after the 2 s window
  EXPECT_EQ(rc_, 1);
  EXPECT_NE(agent_->error().find("connection reset; it did not come back within 2 s"), std::string::npos)
      << agent_->error();
  for (int pid : pids) EXPECT_FALSE(Alive(pid));
  EXPECT_GE(link_.reconnect_calls(), 2);
}

// With standbys (docs/standby.md): a message of a leader deposed since (a
// lower lead epoch than one seen) is not acted on, and its session is left.
TEST_F(AgentReconnectTest, ADeposedLeadersCommandIsNotActedOnAndItsSessionIsLeft) {
  StartRanks({"/bin/sh", "-c", "sleep 300"}, 1);
  ASSERT_TRUE(WaitKind(v1::AgentMessage::kStarted));
  std::vector<int> pids = agent_->RankPids();
  v1::ControllerMessage newer;
  newer.set_lead_epoch(2);
  newer.mutable_verified()->set_step(1);
  agent_->OnCommand(newer);
  v1::ControllerMessage stale;
  stale.set_lead_epoch(1);
  stale.mutable_stop()->set_generation(0);
  agent_->OnCommand(stale);
  ASSERT_EQ(link_.abandoned().size(), 1u);
  EXPECT_NE(link_.abandoned()[0].find("epoch 1) was taken over (epoch 2)"), std::string::npos) << link_.abandoned()[0];
  EXPECT_TRUE(testutil::HoldsFor([&] { return Alive(pids[0]); }, 300ms)) << "a deposed leader stopped the ranks";
  stale.set_lead_epoch(2);  // the leader's own stop is obeyed
  agent_->OnCommand(stale);
  EXPECT_TRUE(testutil::WaitUntil([&] { return !Alive(pids[0]); }, 10s));
}

// A leader that says how long its silence may last (Welcome.silence_ms) and
// then says nothing (paused, cut off) is left for the next address; one that
// keeps probing is not.
TEST_F(AgentReconnectTest, AControllerSilentLongerThanItsWelcomeSaidIsLeft) {
  v1::ControllerMessage welcome;
  welcome.set_lead_epoch(1);
  welcome.mutable_welcome()->set_protocol_version(kProtocolVersion);
  welcome.mutable_welcome()->set_heartbeat_interval_ms(100);
  welcome.mutable_welcome()->set_silence_ms(400);
  agent_->OnCommand(welcome);
  v1::ControllerMessage probe;
  probe.set_lead_epoch(1);
  probe.mutable_clock_probe()->set_controller_unix_us(1);
  EXPECT_TRUE(testutil::HoldsFor(
      [&] {
        agent_->OnCommand(probe);
        return link_.abandoned().empty();
      },
      1000ms));
  ASSERT_TRUE(testutil::WaitUntil([&] { return !link_.abandoned().empty(); }, 10s));
  EXPECT_EQ(link_.abandoned()[0], "the controller fell silent");
}

TEST_F(AgentTest, ACommandThatCannotRunIsReportedAsExit127) {
  StartRanks({"/no/such/binary"}, 1);
  auto exited = WaitKind(v1::AgentMessage::kRankExited);
  ASSERT_TRUE(exited);
  EXPECT_EQ(exited->rank_exited().rank().exit_code(), 127);
  EXPECT_NE(exited->rank_exited().log_tail(0).find("/no/such/binary"), std::string::npos);
}

TEST_F(AgentTest, RefusedRegistrationEndsRunWithTheReason) {
  v1::ControllerMessage refuse;
  refuse.mutable_welcome()->set_error("protocol version mismatch");
  agent_->OnCommand(refuse);
  thread_.join();
  EXPECT_EQ(rc_, 1);
  EXPECT_NE(agent_->error().find("protocol version mismatch"), std::string::npos);
}

TEST(KernelLogTest, ReadsOnlyNewRecordsAndSkipsContinuationLines) {
  std::string path = testing::TempDir() + "/kmsg_" + std::to_string(getpid());
  {
    std::ofstream f(path);
    f << "6,1,100,-;old message before the agent started\n";
  }
  KernelLog log(path);
  ASSERT_TRUE(log.available());
  {
    std::ofstream f(path, std::ios::app);
    f << "3,2,200,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n"
      << " SUBSYSTEM=pci\n"
      << "4,3,300,-;Out of memory: Killed process 1234 (python3)\n";
  }
  log.Poll();
  std::vector<std::string> lines = log.Recent(60 * kSecond, 10);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.");
  EXPECT_EQ(lines[1], "Out of memory: Killed process 1234 (python3)");
  EXPECT_EQ(log.Recent(60 * kSecond, 1).size(), 1u);
  EXPECT_FALSE(KernelLog("/nonexistent/kmsg").available());
  unlink(path.c_str());
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

GroupActivity Sample(Nanos cpu, std::uint64_t io_bytes) {
  GroupActivity a;
  a.cpu = cpu;
  a.io_bytes = io_bytes;
  a.processes = 1;
  return a;
}

TEST(ActivityTrackerTest, CpuAboveTheFloorOrAnyIoCountsAsActivity) {
  ActivityTracker t(0);
  EXPECT_FALSE(t.sampled());
  t.Update(Sample(0, 100), 1 * kSecond);               // first sample: a baseline only
  EXPECT_EQ(t.last_change(), 0);
  t.Update(Sample(10 * kMillisecond, 100), 2 * kSecond);   // 1 % of a core: below the floor
  EXPECT_EQ(t.last_change(), 0);
  t.Update(Sample(400 * kMillisecond, 100), 3 * kSecond);  // 39 %: computing
  EXPECT_EQ(t.last_change(), 3 * kSecond);
  t.Update(Sample(400 * kMillisecond, 101), 4 * kSecond);  // one byte of output
  EXPECT_EQ(t.last_change(), 4 * kSecond);
  t.Update(Sample(400 * kMillisecond, 101), 9 * kSecond);  // nothing moved
  EXPECT_EQ(t.last_change(), 4 * kSecond);
}

TEST(ActivityTrackerTest, SamplesARealProcessGroupBusyOrAsleep) {
  auto busy = Spawn({{"/bin/sh", "-c", "while :; do :; done"}, {{"PATH", "/usr/bin:/bin"}}, ""});
  auto idle = Spawn({{"/bin/sh", "-c", "sleep 30"}, {{"PATH", "/usr/bin:/bin"}}, ""});
  ASSERT_TRUE(busy.ok() && idle.ok());
  // The idle group settles once sh's child has become sleep (exec and the
  // dynamic loader read files) and sleeps in it: state S, not R or D.
  const std::string sh = std::to_string(idle->pid);
  auto asleep = [&] {
    std::ifstream children("/proc/" + sh + "/task/" + sh + "/children");
    int child = 0;
    if (!(children >> child)) return false;
    std::ifstream stat_file("/proc/" + std::to_string(child) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
    const auto open = stat.find('('), close = stat.rfind(')');
    return open != std::string::npos && close != std::string::npos && close + 2 < stat.size() &&
           stat.substr(open + 1, close - open - 1) == "sleep" && stat[close + 2] == 'S';
  };
  ASSERT_TRUE(testutil::WaitUntil(asleep, 10s, 10ms));
  GroupActivity i0 = SampleGroupActivity(idle->pid);
  GroupActivity b0 = SampleGroupActivity(busy->pid);
  // Wait (bounded) until the busy group has used 200 ms of CPU.
  GroupActivity b1 = b0;
  testutil::WaitUntil([&] { return (b1 = SampleGroupActivity(busy->pid)).cpu - b0.cpu >= 200 * kMillisecond; }, 10s);
  GroupActivity i1 = SampleGroupActivity(idle->pid);
  EXPECT_GE(b1.cpu - b0.cpu, 200 * kMillisecond);
  EXPECT_GE(b1.processes, 1);
  EXPECT_EQ(i1.processes, 2);              // sh and its sleep, one group
  EXPECT_LT(i1.cpu - i0.cpu, 20 * kMillisecond);
  EXPECT_EQ(i1.io_bytes, i0.io_bytes);
  SignalGroup(busy->pid, SIGKILL);
  SignalGroup(idle->pid, SIGKILL);
  EXPECT_TRUE(testutil::WaitUntil([&] { return TryReap(busy->pid); }, 10s));
  EXPECT_TRUE(testutil::WaitUntil([&] { return TryReap(idle->pid); }, 10s));
  close(busy->stdout_fd);
  close(busy->stderr_fd);
  close(idle->stdout_fd);
  close(idle->stderr_fd);
}

}  // namespace
}  // namespace trainguard
