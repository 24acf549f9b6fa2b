#include "attribution/attribution.h"

#include <gtest/gtest.h>

#include <tuple>

namespace trainguard {
namespace {

RuleSet Shipped() {
  auto rules = RuleSet::Load(TG_RULES_FILE);
  EXPECT_TRUE(rules.ok()) << rules.status().ToString();
  return rules.value();
}

std::vector<LogLine> Lines(std::initializer_list<std::pair<int, std::string>> l) {
  std::vector<LogLine> out;
  for (const auto& [rank, text] : l) out.push_back({rank, "node" + std::to_string(rank / 8), text});
  return out;
}

TEST(AttributionTest, OneGpuFaultOutranksManyCollectiveTimeouts) {
  std::vector<LogLine> lines;
  for (int r = 0; r < 64; ++r) {
    if (r == 37) continue;
    lines.push_back({r, "node" + std::to_string(r / 8),
                     "[Rank " + std::to_string(r) + "] Watchdog caught collective operation timeout: "
                     "WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 milliseconds before timing out."});
  }
  lines.push_back({37, "node4", "NVRM: Xid (PCI:0000:3b:00): 79, pid=123, GPU has fallen off the bus."});
  Attribution a = Attribute(Shipped(), lines);
  EXPECT_EQ(a.category, "gpu_hardware");
  EXPECT_TRUE(a.hardware);
  EXPECT_EQ(a.persistence, "persistent");
  EXPECT_EQ(a.action, "evict_node");
  EXPECT_EQ(a.culprit_ranks, std::vector<int>{37});
  EXPECT_EQ(a.culprit_nodes, std::vector<std::string>{"node4"});
  ASSERT_FALSE(a.evidence.empty());
  EXPECT_NE(a.evidence[0].line.find("fallen off the bus"), std::string::npos);
  // The timeouts are kept as context, marked as a symptom.
  bool symptom = false;
  for (const auto& e : a.evidence) symptom |= e.category == "comm_hang" && e.role == "symptom";
  EXPECT_TRUE(symptom);
  EXPECT_GT(a.confidence, 0.8);
}

TEST(AttributionTest, TimeoutsAloneAreACommHangWithLowerConfidence) {
  Attribution a = Attribute(Shipped(), Lines({{0, "Watchdog caught collective operation timeout"},
                                              {1, "Watchdog caught collective operation timeout"}}));
  EXPECT_EQ(a.category, "comm_hang");
  EXPECT_LT(a.confidence, 0.5);
}

TEST(AttributionTest, AnOomOutranksThePeersThatSawTheConnectionClose) {
  Attribution a = Attribute(
      Shipped(), Lines({{0, "NCCL WARN socketProgress: Connection closed by remote peer"},
                        {2, "NCCL WARN Net : Connection closed by remote peer"},
                        {3, "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}}));
  EXPECT_EQ(a.category, "oom");
  EXPECT_EQ(a.culprit_ranks, std::vector<int>{3});
}

// A process that touched memory with an uncorrectable error dies of SIGBUS,
// as one whose /dev/shm ran out does; the kernel's EDAC or machine-check
// line says it is the host (trainguard sim: the SIGBUS alone was blamed on
// /dev/shm, the node restarted on and failed again).
TEST(AttributionTest, AnUncorrectableHostMemoryErrorOutranksTheBusError) {
  for (const char* kernel :
       {"EDAC MC1: 1 UE memory read error on CPU_SrcID#1_MC#0_Chan#2_DIMM#0 (channel:2 slot:0 page:0x3f2a1)",
        "mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 6: be00000000800400",
        "Memory failure: 0x3f2a1: recovery action for dirty LRU page: Recovered"}) {
    Attribution a = Attribute(Shipped(), Lines({{5, "Fatal Python error: Bus error"}, {5, kernel}}));
    EXPECT_EQ(a.category, "node_failure") << kernel;
    EXPECT_TRUE(a.hardware) << kernel;
    EXPECT_EQ(a.rule_id, "host-memory-uncorrectable") << kernel;
  }
  Attribution shm = Attribute(Shipped(), Lines({{5, "ERROR: Unexpected bus error encountered in worker. This might be "
                                                    "caused by insufficient shared memory (shm)."}}));
  EXPECT_EQ(shm.category, "storage");
  // Corrected machine checks are logged too, and are no cause.
  Attribution corrected = Attribute(Shipped(), Lines({{5, "Fatal Python error: Bus error"},
                                                      {5, "mce: [Hardware Error]: Machine check events logged"}}));
  EXPECT_EQ(corrected.category, "storage");
}

TEST(AttributionTest, AnOomAfterEccErrorsIsTheGpu) {
  Attribution a = Attribute(Shipped(), Lines({{5, "kernel: NVRM: Xid 48: DBE (double bit error) ECC error"},
                                              {5, "RuntimeError: CUDA out of memory."}}));
  EXPECT_EQ(a.category, "gpu_hardware");
}

TEST(AttributionTest, AmongEqualCausesTheEarliestWins) {
  Attribution a = Attribute(Shipped(), Lines({{1, "OSError: [Errno 28] No space left on device"},
                                              {0, "ENOSPC while writing /ckpt"}}));
  EXPECT_EQ(a.category, "storage");
  EXPECT_EQ(a.evidence[0].rank, 1);
}

TEST(AttributionTest, NoKnownPatternIsOtherWithLowConfidence) {
  Attribution a = Attribute(Shipped(), Lines({{0, "all is well"}}));
  EXPECT_EQ(a.category, "other");
  EXPECT_TRUE(a.rule_id.empty());
  EXPECT_LE(a.confidence, 0.2);
}

TEST(AttributionTest, BoilerplateHintsDoNotCountAsDeviceAsserts) {
  Attribution a = Attribute(
      Shipped(), Lines({{1, "RuntimeError: CUDA error: an illegal memory access was encountered"},
                        {1, "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions."}}));
  EXPECT_EQ(a.category, "cuda_software");
}

TEST(AttributionTest, RankIsReadFromLauncherPrefixes) {
  EXPECT_EQ(RankFromPrefix("[rank3]: Traceback"), 3);
  EXPECT_EQ(RankFromPrefix("[80746] [rank12]:[E321 02:07:08] x"), 12);
  EXPECT_EQ(RankFromPrefix("[1,14]<stdout>:host:815 NCCL WARN"), 14);
  EXPECT_EQ(RankFromPrefix("[E ProcessGroupNCCL.cpp:737] [Rank 7] Watchdog"), 7);
  EXPECT_EQ(RankFromPrefix("no rank here"), -1);
}

TEST(RuleSetTest, ShippedRulesCoverEveryCategory) {
  RuleSet rules = Shipped();
  for (const auto& c : AttributionCategories()) {
    bool found = false;
    for (const auto& r : rules.rules()) found |= r.category == c;
    EXPECT_TRUE(found) << c;
  }
}

TEST(RuleSetTest, InvalidRuleFilesAreRejectedWithTheReason) {
  auto expect_error = [](const std::string& rules, const std::string& needle) {
    std::string text = R"({"format": "trainguard-attribution-rules", "version": 1, "rules": [)" +
                       rules + "]}";
    auto r = RuleSet::Parse(text, "test.json");
    ASSERT_FALSE(r.ok()) << rules;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  expect_error(R"({"id": "a", "category": "gpu", "pattern": "x", "priority": 1})", "unknown category 'gpu'");
  expect_error(R"({"id": "a", "category": "oom", "pattern": "(", "priority": 1})", "rule 'a': bad pattern");
  expect_error(R"({"id": "a", "category": "oom", "pattern": "x", "priority": 1, "colour": 2})",
               "unknown field 'colour'");
  expect_error(R"({"id": "a", "category": "oom", "pattern": "x", "priority": 1},
                  {"id": "a", "category": "oom", "pattern": "y", "priority": 1})", "id used twice");
  expect_error(R"({"id": "a", "category": "oom", "pattern": "x", "priority": 101})", "priority");
  expect_error(R"({"id": "a", "category": "oom", "pattern": "x", "priority": 1, "action": "reboot"})",
               "action");
  expect_error(R"({"id": "a", "category": "oom", "priority": 1})", "pattern");
  EXPECT_NE(RuleSet::Parse(R"({"format": "trainguard-attribution-rules", "version": 2, "rules": []})", "v.json")
                .status().message().find("version 2"), std::string::npos);
  EXPECT_FALSE(RuleSet::Parse("not json", "x.json").ok());
  EXPECT_EQ(RuleSet::Load("/no/such/rules.json").status().code(), StatusCode::kNotFound);
}

TEST(RuleSetTest, OperatorRulesOverrideAndExtend) {
  RuleSet rules = Shipped();
  auto extra = RuleSet::Parse(R"({"format": "trainguard-attribution-rules", "version": 1, "rules": [
      {"id": "site-flaky-switch", "category": "network", "pattern": "switch sw-\\d+ reboot", "priority": 99,
       "action": "restart"},
      {"id": "oom-gpu", "category": "oom", "pattern": "never matches anything", "priority": 80}]})",
                              "site.json");
  ASSERT_TRUE(extra.ok()) << extra.status().ToString();
  size_t before = rules.rules().size();
  rules.Merge(*extra);
  EXPECT_EQ(rules.rules().size(), before + 1);
  EXPECT_EQ(Attribute(rules, Lines({{0, "switch sw-12 reboot"}})).category, "network");
  EXPECT_NE(Attribute(rules, Lines({{0, "CUDA out of memory"}})).rule_id, "oom-gpu");
}

TEST(AttributionTest, CodeAndPathsQuotedInATracebackAreNotEvidence) {
  std::vector<LogLine> lines;
  for (const char* t : {"Traceback (most recent call last):",
                        "  File \"/lustre/scratch/u/train.py\", line 88, in step",
                        "    if torch.isnan(loss): raise RuntimeError('loss is nan, ECC error?')",
                        "KeyError: 'input_ids'"}) {
    lines.push_back({2, "node0", t});
  }
  Attribution a = Attribute(Shipped(), lines);
  EXPECT_EQ(a.category, "user_code") << a.rule_id;
  EXPECT_EQ(a.culprit_ranks, std::vector<int>{2});
  for (const auto& e : a.evidence) EXPECT_EQ(e.line.find("/lustre"), std::string::npos) << e.line;
}

TEST(AttributionTest, AWatchdogFrameInACxxStackIsACollectiveTimeout) {
  Attribution a = Attribute(
      Shipped(), {{1, "node0", "terminate called after throwing an instance of 'c10::DistBackendError'"},
                  {1, "node0", "frame #2: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<long>) "
                               "+ 0x1f2 (0x7f3c in /gpfs/envs/torch/lib/libtorch_cuda.so)"}});
  EXPECT_EQ(a.category, "comm_hang") << a.rule_id;
}

TEST(AttributionTest, TorchrunsRootCauseNamesTheCulpritRank) {
  std::vector<LogLine> lines;
  for (const char* t : {"Root Cause (first observed failure):", "[0]:", "  time      : 2022-11-29_17:14:19",
                        "  host      : GPU236", "  rank      : 3 (local_rank: 3)",
                        "  exitcode  : -9 (pid: 49151)",
                        "  traceback : Signal 9 (SIGKILL) received by PID 49151"}) {
    lines.push_back({-1, "", t});
  }
  Attribution a = Attribute(Shipped(), lines);
  EXPECT_EQ(a.culprit_ranks, std::vector<int>{3});
}

std::vector<LogLine> XidLines(const std::vector<std::pair<std::string, std::string>>& gpu_pid, int xid) {
  std::vector<LogLine> out;
  for (const auto& [gpu, pid] : gpu_pid) {
    out.push_back({-1, "node7", "NVRM: Xid (PCI:" + gpu + "): " + std::to_string(xid) + ", pid=" + pid +
                                    ", Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_10 faulted"});
  }
  return out;
}

TEST(AttributionTest, AnApplicationXidRepeatedByManyProcessesOnOneGpuOnlyPointsAtThatGpu) {
  Attribution a = Attribute(Shipped(), XidLines({{"0000:db:00", "13641"}, {"0000:db:00", "14323"},
                                                 {"0000:db:00", "33275"}}, 31));
  EXPECT_EQ(a.category, "gpu_hardware");
  EXPECT_EQ(a.rule_id, "gpu-xid-repeated-on-one-gpu");
  EXPECT_TRUE(a.hardware);
  EXPECT_EQ(a.culprit_nodes, std::vector<std::string>{"node7"});
  EXPECT_NE(a.summary.find("possible fault of that GPU"), std::string::npos) << a.summary;
}

TEST(AttributionTest, AnApplicationXidStaysTheApplicationsWhenItIsOnSeveralGpusOrFewProcesses) {
  // The same fault on two GPUs: the application (NVIDIA: "different GPU: check the app").
  Attribution spread = Attribute(Shipped(), XidLines({{"0000:db:00", "1"}, {"0000:db:00", "2"}, {"0000:db:00", "3"},
                                                      {"0000:3b:00", "4"}}, 31));
  EXPECT_EQ(spread.category, "cuda_software");
  // Two processes, or one process faulting again and again: a burst, not a pattern.
  EXPECT_EQ(Attribute(Shipped(), XidLines({{"0000:db:00", "1"}, {"0000:db:00", "2"}}, 31)).category, "cuda_software");
  EXPECT_EQ(Attribute(Shipped(), XidLines({{"0000:db:00", "7"}, {"0000:db:00", "7"}, {"0000:db:00", "7"},
                                           {"0000:db:00", "'<unknown>'"}}, 31)).category,
            "cuda_software");
}

TEST(AttributionTest, ATransportRejectingItsOwnRequestIsSoftwareNotTheFabric) {
  Attribution a = Attribute(
      Shipped(), Lines({{0, "node201:1:2 [0] transport/net_ib.cc:101 NCCL WARN NET/IB : mlx5_0:1 Got async event : "
                            "local access violation work queue error"},
                        {8, "node023:1:2 [0] transport/net_ib.cc:1909 NCCL WARN NET/IB : Got completion from peer "
                            "10.1.3.201<33057> with status=9 opcode=0 len=0 vendor err 138 (Send)"}}));
  EXPECT_EQ(a.category, "cuda_software");
  EXPECT_FALSE(a.hardware);
  EXPECT_NE(a.action, "evict_node");
}

TEST(AttributionTest, NcclsCudaFailureNamesTheCudaErrorItSaw) {
  EXPECT_EQ(Attribute(Shipped(), Lines({{0, "h:1:2 [0] transport.cc:154 NCCL WARN Cuda failure 'invalid argument'"}}))
                .category,
            "cuda_software");
  EXPECT_EQ(Attribute(Shipped(), Lines({{0, "h:1:2 [0] NCCL WARN Cuda failure 'uncorrectable ECC error encountered'"}}))
                .category,
            "gpu_hardware");
}

TEST(AttributionTest, ANodeThatDiedUnderRayAndAClosedRendezvousAreNodeLoss) {
  Attribution ray = Attribute(Shipped(), Lines({{0, "The actor is dead because its node has died. Node Id: 677df2a9"}}));
  EXPECT_EQ(ray.category, "node_failure");
  Attribution closed = Attribute(Shipped(), Lines({{0, "torch.distributed.elastic.rendezvous.api.RendezvousClosedError"}}));
  EXPECT_EQ(closed.category, "node_failure");
  EXPECT_EQ(closed.role, "symptom");  // the loss of a peer, seen from the survivors
  // A cause elsewhere in the log outranks it.
  EXPECT_EQ(Attribute(Shipped(), Lines({{0, "torch.distributed.elastic.rendezvous.api.RendezvousClosedError"},
                                        {1, "torch.cuda.OutOfMemoryError: CUDA out of memory."}}))
                .category,
            "oom");
}

TEST(AttributionTest, WordsThatOnlyLookLikeACauseAreNotOne) {
  // Ray lists the OOM killer among the possible causes of every dead worker.
  Attribution ray = Attribute(Shipped(), Lines({{0, "The actor is dead because its worker process has died. There are "
                                                    "some potential root causes. (1) The process is killed by SIGKILL "
                                                    "by OOM killer due to high memory usage. (2) ray stop --force"}}));
  EXPECT_NE(ray.category, "oom");
  // A host's prefix and "inodes" are no node that died.
  for (const char* line : {"node2: Net : Call to recv from NODE2_IP<56843> failed : Connection refused",
                           "/scratch: 12 inodes left, the write failed"}) {
    EXPECT_NE(Attribute(Shipped(), Lines({{0, line}})).category, "node_failure") << line;
  }
  EXPECT_EQ(Attribute(Shipped(), Lines({{0, "node gpu-12 is unreachable"}})).category, "node_failure");
  // A check of the user's that raises on a NaN: the NaN is the cause.
  for (const char* line : {"AssertionError: Rank 3: found NaN in local grad norm in backwards pass.",
                           "ValueError:Network outputs is NAN! Stop Training"}) {
    EXPECT_EQ(Attribute(Shipped(), Lines({{0, line}})).category, "numeric") << line;
  }
}

TEST(RuleSetTest, ARuleFileWrittenByToJsonReadsBackAsTheSameRules) {
  RuleSet shipped = Shipped();
  auto again = RuleSet::Parse(shipped.ToJson(), "round trip");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ(again->rules().size(), shipped.rules().size());
  for (size_t i = 0; i < shipped.rules().size(); ++i) {
    const Rule& a = shipped.rules()[i];
    const Rule& b = again->rules()[i];
    EXPECT_EQ(a.id, b.id);
    EXPECT_EQ(a.pattern, b.pattern);
    EXPECT_EQ(std::tie(a.category, a.priority, a.role, a.persistence, a.hardware, a.action, a.scan,
                       a.case_sensitive, a.description),
              std::tie(b.category, b.priority, b.role, b.persistence, b.hardware, b.action, b.scan,
                       b.case_sensitive, b.description))
        << a.id;
  }
  // The scan rules alone, as the controller sends them to agents.
  auto scan = RuleSet::Parse(shipped.ScanRules().ToJson(), "scan rules");
  ASSERT_TRUE(scan.ok());
  EXPECT_FALSE(scan->rules().empty());
  for (const Rule& r : scan->rules()) EXPECT_FALSE(r.scan.empty()) << r.id;
}

TEST(RuleSetTest, ASkippedCheckpointLineIsScannedAsAWarning) {
  RuleSet scan = Shipped().ScanRules();
  for (const std::string line :
       {"trainguard: checkpoint of step 40 skipped: /ck/step-40/s1/rank-00001.data has the wrong size",
        "trainguard: checkpoint of step 20 unusable on rank 1: checksum mismatch; falling back to an older one",
        "trainguard: checkpoint of step 30: the ranks read different saves of this step; falling back"}) {
    std::vector<int> hits = scan.Match(line);
    ASSERT_EQ(hits.size(), 1u) << line;
    EXPECT_EQ(scan.rules()[hits[0]].id, "checkpoint-skipped");
    EXPECT_EQ(scan.rules()[hits[0]].scan, "warning");
  }
  EXPECT_TRUE(scan.Match("rank 0: resumed from step 40 (trainguard checkpoint)").empty());
}

TEST(AttributionTest, ALineThatAlsoMatchesARulesUnlessDoesNotCountForIt) {
  auto rules = RuleSet::Parse(R"({"format": "trainguard-attribution-rules", "version": 1, "rules": [
    {"id": "missing", "category": "user_code", "priority": 60, "pattern": "No such file or directory",
     "unless": "NCCL INFO"}]})", "r");
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  EXPECT_TRUE(rules->Match("h:1:1 [0] NCCL INFO NET/Plugin : libnccl-net.so: cannot open shared object file: "
                           "No such file or directory").empty());
  EXPECT_EQ(rules->Match("FileNotFoundError: [Errno 2] No such file or directory: 'data.bin'").size(), 1u);
  // It survives the trip to the agents.
  auto again = RuleSet::Parse(rules->ToJson(), "again");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->rules()[0].unless, "NCCL INFO");
  auto bad = RuleSet::Parse(R"({"format": "trainguard-attribution-rules", "version": 1, "rules": [
    {"id": "x", "category": "other", "priority": 1, "pattern": "a", "unless": "("}]})", "f.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f.json: rule 'x': bad unless pattern"), std::string::npos);
}

}  // namespace
}  // namespace trainguard
