// The simulator runs the real controller: the same message stream, replayed
// in real time over gRPC into a controller wired as `trainguard controller`
// wires it (RealClock, the gRPC transport, off-lock threads, a 50 ms tick),
// gives the same findings and decisions as in the simulation (~40 s).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "proto/trainguard.grpc.pb.h"
#include "sim/simulator.h"
#include "transport/grpc_transport.h"

namespace trainguard {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The scheduler as the simulation's was: the same explanations; the nodes
// it brought are in the stream.
class ReplayProvider final : public NodeProvider {
 public:
  explicit ReplayProvider(std::map<std::string, LossExplanation> said) : said_(std::move(said)) {}
  void ReplaceNode(const std::string&, const std::string&) override {}
  bool EvictNode(const std::string&, const std::string&) override { return true; }
  LossExplanation ExplainLoss(const std::string& id) override {
    auto it = said_.find(id);
    return it == said_.end() ? LossExplanation{} : it->second;
  }

 private:
  std::map<std::string, LossExplanation> said_;
};

// One simulated node's session with the live controller.
struct Session {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::AgentMessage, v1::ControllerMessage>> stream;
  std::thread reader;
  std::mutex mu;
  bool open = true;
  bool down = false;
  bool Write(const v1::AgentMessage& m) {
    std::lock_guard<std::mutex> lock(mu);
    if (!open) return false;
    open = stream->Write(m);
    return open;
  }
};

// What the two runs must agree on: every finding and decision, in order.
std::vector<std::string> Decisions(const std::string& store_path) {
  auto store = OpenSqliteEventStore(store_path);
  EXPECT_TRUE(store.ok());
  std::vector<std::string> out;
  for (const auto& e : store.value()->Events("sim").value()) {
    json d = json::parse(e.detail_json, nullptr, false);
    if (e.kind == "failure") {
      out.push_back("failure " + d.value("failure_kind", "") + " rank " + std::to_string(e.rank) + " on " + e.node);
    } else if (e.kind == "attribution") {
      out.push_back("attribution " + d.value("category", "") + " " + d.value("rule", "") + " hardware=" +
                    (d.value("hardware", false) ? "1" : "0"));
    } else if (e.kind == "decision") {
      out.push_back("decision " + d.value("decision", ""));
    } else if (e.kind == "node_evicted" || e.kind == "node_lost" || e.kind == "spare_promoted") {
      out.push_back(e.kind + " " + e.node);
    } else if (e.kind == "generation_started") {
      out.push_back("generation " + std::to_string(d.value("restart_count", -1)));
    } else if (e.kind == "job_succeeded" || e.kind == "job_failed") {
      out.push_back(e.kind);
    }
  }
  return out;
}

TEST(SimulatorEquivalenceTest, TheLiveControllerDecidesAsTheSimulatedOne) {
  const fs::path dir = fs::temp_directory_path() / ("tg-sim-equiv-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto rules = RuleSet::Load(TG_RULES_FILE);
  ASSERT_TRUE(rules.ok());
  // Four nodes of two ranks; a failure every few seconds: a GPU that falls
  // off the bus (evicted, replaced), a software crash (restarted), a hang
  // (found by the hang detector after 2 s), a host that dies (silence).
  auto model = FailureModel::Parse(R"({"name": "equivalence", "source": "this test", "categories": [
    {"name": "gpu", "hardware": true, "mtbf_node_hours": 0.022, "signals": {"crash": 1}, "exit_code": 1,
     "log_tail": ["RuntimeError: CUDA error: unspecified launch failure"],
     "kernel_lines": ["NVRM: Xid (PCI:0000:1b:00): 79, pid=1, name=python, GPU has fallen off the bus."]},
    {"name": "bug", "mtbf_node_hours": 0.022, "signals": {"crash": 1}, "exit_code": 1,
     "log_tail": ["Traceback (most recent call last):", "KeyError: 'attention_mask'"]},
    {"name": "hang", "mtbf_node_hours": 0.022, "signals": {"hang": 1}},
    {"name": "down", "hardware": true, "mtbf_node_hours": 0.022, "signals": {"node_down": 1}}]})",
                                   "equivalence");
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  SimParams p;
  p.gpus = 8;
  p.gpus_per_node = 2;
  p.days = 30.0 / 86400;
  p.seed = 14;  // every kind of failure, six in all
  // Margins for a loaded machine (the replay runs beside other tests): a
  // node is lost after 2 s of silence, a hang after 5 s, and a node answers
  // Stop 1.5 s after the simulated controller sent it.
  p.step_s = 0.2;
  p.checkpoint_interval_s = 2;
  p.hang_timeout_s = 5;
  p.heartbeat_interval_s = 0.5;
  p.missed_heartbeats = 4;
  p.restart_s = 1;
  p.shutdown_s = 1.5;
  p.replacement_s = 2;
  std::vector<SimTraceEntry> trace;
  std::map<std::string, LossExplanation> explained;
  SimOptions o;
  o.store_path = (dir / "sim.db").string();
  o.rules = &*rules;
  o.trace = &trace;
  o.explained = &explained;
  auto sim = RunSimulation(p, *model, o);
  ASSERT_TRUE(sim.ok()) << sim.status().ToString();
  const std::vector<std::string> simulated = Decisions(o.store_path);
  int failures = 0;
  for (const auto& d : simulated) failures += d.rfind("failure", 0) == 0;
  std::string said;
  for (const auto& d : simulated) said += d + "\n";
  ASSERT_GE(failures, 4) << "the scenario must hold several failures:\n" << said << sim->faults << " faults, "
                         << sim->faults_while_down << " while down; " << sim->summary;

  // The live controller, as the daemon wires it.
  JobConfig config = SimJobConfig(p);
  config.watch_gap_grace = kSecond;
  const std::string live_path = (dir / "live.db").string();
  auto reads = OpenSqliteEventStore(live_path);
  auto writes = OpenSqliteEventStore(live_path);
  ASSERT_TRUE(reads.ok() && writes.ok());
  ReplayProvider provider(explained);
  JobController controller(config, RealClock::Get(), reads->get(), &provider, &*rules, writes->get());
  ASSERT_TRUE(controller.Start().ok());
  GrpcControllerServer server(&controller);
  ASSERT_TRUE(server.Start("127.0.0.1:0").ok());
  std::atomic<bool> ticking{true};
  std::thread ticker([&] {
    while (ticking) {
      controller.Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server.port()), grpc::InsecureChannelCredentials());
  auto stub = v1::Controller::NewStub(channel);
  std::map<int, std::unique_ptr<Session>> sessions;
  const auto t0 = std::chrono::steady_clock::now();
  auto keepalive = [&] {
    v1::AgentMessage alive;
    alive.mutable_heartbeat()->set_generation(-1);
    for (auto& [node, s] : sessions) {
      if (!s->down) s->Write(alive);
    }
  };
  auto next_keepalive = t0;
  for (const SimTraceEntry& t : trace) {
    const auto at = t0 + std::chrono::nanoseconds(t.at);
    // A live agent is heard every interval: the simulation reads that from
    // the session (AgentLink::LastHeardMono); here it is sent.
    while (next_keepalive < at) {
      std::this_thread::sleep_until(next_keepalive);
      keepalive();
      next_keepalive += std::chrono::milliseconds(100);
    }
    std::this_thread::sleep_until(at);
    if (t.kind == SimTraceEntry::kConnect) {
      auto s = std::make_unique<Session>();
      s->stream = stub->Session(&s->ctx);
      Session* raw = s.get();
      s->reader = std::thread([raw] {
        v1::ControllerMessage m;
        while (raw->stream->Read(&m)) {
        }
      });
      sessions[t.node] = std::move(s);
    } else if (t.kind == SimTraceEntry::kDown) {
      sessions[t.node]->down = true;
    } else {
      sessions[t.node]->Write(t.msg);
    }
  }
  EXPECT_TRUE(controller.WaitFinished(std::chrono::seconds(30))) << controller.summary();
  ticking = false;
  ticker.join();
  ASSERT_TRUE(controller.FlushStore(std::chrono::seconds(10)));
  for (auto& [node, s] : sessions) s->ctx.TryCancel();
  server.Shutdown(2000);
  for (auto& [node, s] : sessions) {
    if (s->reader.joinable()) s->reader.join();
  }
  const std::vector<std::string> live = Decisions(live_path);
  EXPECT_EQ(live, simulated);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace trainguard
