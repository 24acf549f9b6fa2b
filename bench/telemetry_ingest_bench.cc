// How many rank-steps of timings one controller core ingests per second:
// synthetic agents (125 nodes x 8 ranks by default) send each second's
// steps as one Timings message per node, serialized as on the wire; the
// controller parses them (as the transport does) and handles them (store in
// SQLite, straggler detector). Baselines measured in the same run: parsing
// alone, and the same rows appended to the same kind of store directly.
// The goal: 1,000 ranks x 10 steps/s = 10,000 rank-steps/s.
//
// With --store postgresql://..., both stores are that database (the fleet
// store, docs/store.md) instead of SQLite files.
//
//   build/bench/telemetry_ingest_bench [--ranks 1000] [--steps-per-s 10] [--seconds 10] [--dir /tmp]
//                                      [--store postgresql://...]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "controller/fake_agent_link.h"
#include "controller/job_controller.h"
#include "store/event_store.h"
#include "store/step_timing_text.h"

using namespace trainguard;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One node's Timings for steps [from, to): 8 intervals a step (data, forward,
// backward, 3 all_reduce buckets, optimizer, and a GC pause every 50 steps).
std::string NodeSecond(int node, int nproc, std::int64_t from, std::int64_t to) {
  v1::AgentMessage m;
  v1::Timings* t = m.mutable_timings();
  t->set_generation(0);
  for (const char* n : {"data", "forward", "backward", "all_reduce", "optimizer", "gc"}) t->add_names(n);
  for (std::int64_t step = from; step < to; ++step) {
    for (int local = 0; local < nproc; ++local) {
      v1::StepTiming* st = t->add_steps();
      st->set_global_rank(node * nproc + local);
      st->set_step(step);
      st->set_start_unix_us(1'700'000'000'000'000 + step * 100000);
      st->set_duration_us(100000 + (node * 7 + local * 3 + step) % 997);
      std::int64_t at = 0;
      auto add = [&](int name, int kind, std::int64_t dur, std::int64_t seq = 0) {
        v1::PhaseInterval* i = st->add_intervals();
        i->set_name(name);
        i->set_kind(kind);
        i->set_start_us(at);
        i->set_duration_us(dur);
        if (kind == 10) {
          i->set_group_id(0);
          i->set_seq(seq);
          i->set_peer(-1);
          i->set_numel(25'000'000);
        }
        at += dur;
      };
      add(0, 1, 3000 + (step * 13 + local) % 400);
      add(1, 1, 30000 + (step * 31 + node) % 900);
      add(2, 1, 60000 + (step * 17 + node) % 1500);
      for (int b = 0; b < 3; ++b) add(3, 10, 2000 + b * 100, step * 3 + b + 1);
      add(4, 1, 5000);
      if (step % 50 == 0 && local == 0) add(5, 1, 40000);
    }
  }
  return m.SerializeAsString();
}

}  // namespace

int main(int argc, char** argv) {
  int ranks = 1000, steps_per_s = 10, seconds = 10;
  std::string dir = "/tmp", url;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--ranks")) ranks = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps-per-s")) steps_per_s = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--seconds")) seconds = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--store")) url = argv[i + 1];
  }
  const int nproc = 8;
  const int nodes = std::max(1, ranks / nproc);
  ranks = nodes * nproc;
  std::string base = dir + "/telemetry_ingest_bench." + std::to_string(getpid());
  std::filesystem::create_directories(base);

  // The traffic, serialized as agents would send it.
  std::vector<std::string> wire;  // second-major, node-minor
  for (int s = 0; s < seconds; ++s) {
    for (int n = 0; n < nodes; ++n) wire.push_back(NodeSecond(n, nproc, s * steps_per_s, (s + 1) * steps_per_s));
  }
  const double rank_steps = static_cast<double>(ranks) * steps_per_s * seconds;
  std::size_t bytes = 0;
  for (const auto& w : wire) bytes += w.size();

  // Baseline 1: parsing alone.
  double t = Now();
  std::int64_t parsed = 0;
  for (const auto& w : wire) {
    v1::AgentMessage m;
    m.ParseFromString(w);
    parsed += m.timings().steps_size();
  }
  double parse_s = Now() - t;

  // The controller: a job of `nodes` nodes, all registered and running.
  const std::string kind = url.empty() ? "SQLite" : "PostgreSQL";
  auto store = url.empty() ? OpenSqliteEventStore(base + "/controller.db") : OpenEventStore(url);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  FakeClock clock;
  JobConfig config;
  config.job_id = "bench-" + std::to_string(getpid());
  config.nnodes = nodes;
  config.nproc_per_node = nproc;
  config.argv = {"python3", "train.py"};
  JobController controller(config, &clock, store->get(), nullptr);
  if (!controller.Start().ok()) return 1;
  std::vector<std::shared_ptr<FakeAgentLink>> links;
  for (int n = 0; n < nodes; ++n) {
    links.push_back(std::make_shared<FakeAgentLink>());
    controller.OnConnect(n + 1, links.back());
    v1::AgentMessage reg;
    reg.mutable_register_()->set_protocol_version(kProtocolVersion);
    reg.mutable_register_()->set_node_id("node" + std::to_string(n));
    reg.mutable_register_()->set_address("10.0.0.1");
    reg.mutable_register_()->set_free_port(40000);
    controller.OnMessage(n + 1, reg);
  }
  if (controller.state() != JobState::kRunning) {
    std::fprintf(stderr, "the job did not start\n");
    return 1;
  }
  t = Now();
  for (std::size_t i = 0; i < wire.size(); ++i) {
    v1::AgentMessage m;
    m.ParseFromString(wire[i]);
    controller.OnMessage(static_cast<std::uint64_t>(i % nodes) + 1, m);
  }
  double ingest_s = Now() - t;
  auto stored = (*store)->StepTimings(config.job_id, 0, INT64_MAX);
  std::size_t rows = stored.ok() ? stored->size() : 0;

  // Baseline 2: the same rows appended to a fresh store directly (one
  // transaction per node-second, as the controller does).
  auto raw = url.empty() ? OpenSqliteEventStore(base + "/raw.db") : OpenEventStore(url);
  if (!raw.ok()) return 1;
  std::vector<std::vector<StepTimingRecord>> batches;
  for (const auto& w : wire) {
    v1::AgentMessage m;
    m.ParseFromString(w);
    std::vector<StepTimingRecord> batch;
    for (const auto& st : m.timings().steps()) {
      StepTimingRecord r;
      r.job_id = "raw-" + std::to_string(getpid());
      r.rank = st.global_rank();
      r.step = st.step();
      r.node = "node";
      r.start_us = st.start_unix_us();
      r.duration_us = st.duration_us();
      r.totals = "data=3000;forward=30000;backward=60000;comm:all_reduce=6300;optimizer=5000";
      r.intervals = "data,1,0,3000;forward,1,3000,30000;backward,1,33000,60000;all_reduce,10,93000,2000,0,1,-1,25000000;"
                    "all_reduce,10,95000,2100,0,2,-1,25000000;all_reduce,10,97100,2200,0,3,-1,25000000;optimizer,1,99300,5000";
      batch.push_back(std::move(r));
    }
    batches.push_back(std::move(batch));
  }
  t = Now();
  for (const auto& b : batches) (void)(*raw)->AppendStepTimings(b);
  double raw_s = Now() - t;

  std::printf("traffic: %d ranks x %d steps/s x %d s = %.0f rank-steps in %zu messages (%.1f MB)\n", ranks,
              steps_per_s, seconds, rank_steps, wire.size(), bytes / 1e6);
  std::printf("controller ingest (parse + store in %s + straggler detector), one core: %.0f rank-steps/s "
              "(%.1f x the %d needed); %zu rows stored\n",
              kind.c_str(), rank_steps / ingest_s, rank_steps / ingest_s / (ranks * steps_per_s), ranks * steps_per_s, rows);
  std::printf("baseline, parsing alone: %.0f rank-steps/s\n", parsed / parse_s);
  std::printf("baseline, the same rows appended to %s directly: %.0f rank-steps/s\n", kind.c_str(),
              rank_steps / raw_s);
  std::filesystem::remove_all(base);
  return rows == static_cast<std::size_t>(rank_steps) ? 0 : 1;
}
