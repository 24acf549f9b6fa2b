// JobControllerTest: the fixture of the controller's unit tests — a
// controller on a FakeClock, an in-memory store, fake agent links and a fake
// node provider — and the agent messages the tests send. Shared by
// job_controller_*_test.cc (one test binary).
#pragma once

#include <functional>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <nlohmann/json.hpp>

#include "attribution/log_model.h"
#include "controller/fake_agent_link.h"
#include "controller/job_controller.h"
#include "testing/wait_until.h"

namespace trainguard {

using Kind = v1::ControllerMessage::KindCase;

class JobControllerTest : public testing::Test {
 protected:
  void Make(int nnodes = 2, int nproc = 2, int max_restarts = 2, bool attribute = false) {
    config_.job_id = "job";
    config_.nnodes = nnodes;
    config_.nproc_per_node = nproc;
    config_.argv = {"python3", "train.py"};
    config_.max_restarts = max_restarts;
    config_.heartbeat_interval = 1 * kSecond;
    config_.missed_heartbeats = 3;
    config_.hang_timeout = 10 * kSecond;
    config_.startup_timeout = 60 * kSecond;
    config_.stop_timeout = 5 * kSecond;
    config_.rendezvous_timeout = 30 * kSecond;
    if (attribute) {
      auto rules = RuleSet::Load(TG_RULES_FILE);
      ASSERT_TRUE(rules.ok()) << rules.status().ToString();
      rules_ = std::make_unique<RuleSet>(std::move(rules.value()));
      // With the learned model beside the rule file, as `run` and
      // `controller` load them: calibrated confidences, as in production.
      auto model = LogModel::Load(TG_MODEL_FILE);
      ASSERT_TRUE(model.ok()) << model.status().ToString();
      rules_->set_model(std::make_shared<const LogModel>(std::move(*model)));
      if (!rules_override_.empty()) {
        auto site = RuleSet::Parse(rules_override_, "site rules");
        ASSERT_TRUE(site.ok()) << site.status().ToString();
        rules_->Merge(*site);
      }
    }
    controller_ = std::make_unique<JobController>(config_, &clock_, &store_, &provider_, rules_.get(), write_store_);
    controller_->SetOffLockThreads(off_lock_threads_);  // 0: the fake backend answers inline
    ASSERT_TRUE(controller_->Start().ok());
  }

  // Connects and registers node `i` (conn id i+1).
  FakeAgentLink* Register(int i, std::uint32_t version = kProtocolVersion, const std::string& rack = "") {
    auto link = std::make_shared<FakeAgentLink>();
    links_.push_back(link);
    controller_->OnConnect(i + 1, link);
    v1::AgentMessage m;
    m.mutable_register_()->set_protocol_version(version);
    m.mutable_register_()->set_node_id("node" + std::to_string(i));
    m.mutable_register_()->set_address("10.0.0." + std::to_string(i));
    m.mutable_register_()->set_free_port(40000 + i);
    m.mutable_register_()->set_runs_diagnostics(true);
    m.mutable_register_()->set_rack(rack);
    controller_->OnMessage(i + 1, m);
    return link.get();
  }

  // Node `i` answers the diagnosis round it was last ordered to run.
  void Diagnosed(int i, FakeAgentLink* link, double gflops) {
    ASSERT_NE(link->Last(Kind::kRunDiagnostics), nullptr) << "node" << i << " was not asked";
    v1::AgentMessage m;
    m.mutable_diagnostics()->set_round(link->Last(Kind::kRunDiagnostics)->run_diagnostics().round());
    m.mutable_diagnostics()->set_figures_json(
        nlohmann::json::array({{{"name", "compute_gflops"}, {"value", gflops}}}).dump());
    m.mutable_diagnostics()->set_wall_ms(2000);
    controller_->OnMessage(conn_base_ + static_cast<std::uint64_t>(i), m);
  }

  // Node `i` answers a collective stage's order with `figures` and a new free port.
  void Collective(int i, FakeAgentLink* link, const nlohmann::json& figures) {
    const v1::ControllerMessage* order = link->Last(Kind::kRunDiagnostics);
    ASSERT_NE(order, nullptr);
    ASSERT_TRUE(order->run_diagnostics().collective()) << "node" << i;
    v1::AgentMessage m;
    m.mutable_diagnostics()->set_round(order->run_diagnostics().round());
    m.mutable_diagnostics()->set_figures_json(figures.dump());
    m.mutable_diagnostics()->set_collective(true);
    m.mutable_diagnostics()->set_free_port(60000 + i);
    controller_->OnMessage(i + 1, m);
  }

  v1::RankStatus Rank(int global, std::int64_t step, std::int64_t age_ms = 0) {
    v1::RankStatus r;
    r.set_global_rank(global);
    r.set_running(true);
    r.set_attached(true);
    r.set_pid(1000 + global);
    r.set_step(step);
    r.set_step_count(step < 0 ? 0 : step);
    r.set_progress_age_ms(age_ms);
    r.set_checkpoint_step(-1);
    return r;
  }

  void Heartbeat(int node, std::int64_t gen, std::vector<v1::RankStatus> ranks) {
    v1::AgentMessage m;
    m.mutable_heartbeat()->set_generation(gen);
    for (auto& r : ranks) *m.mutable_heartbeat()->add_ranks() = r;
    controller_->OnMessage(conn_base_ + static_cast<std::uint64_t>(node), m);
  }

  void Exit(int node, std::int64_t gen, int rank, int code, int sig = 0, std::int64_t step = 7,
            const std::string& last_line = "Traceback: boom", Nanos exit_wall = 0,
            const std::string& kernel_line = "", Nanos last_words = 0) {
    v1::AgentMessage m;
    auto* e = m.mutable_rank_exited();
    e->set_generation(gen);
    *e->mutable_rank() = Rank(rank, step);
    e->mutable_rank()->set_running(false);
    e->mutable_rank()->set_exit_code(code);
    e->mutable_rank()->set_term_signal(sig);
    e->add_log_tail(last_line);
    if (!kernel_line.empty()) e->add_kernel_lines(kernel_line);  // the node's kernel log
    e->set_exit_unix_ms((exit_wall > 0 ? exit_wall : clock_.WallNanos()) / kMillisecond);
    if (last_words > 0) e->set_last_words_unix_ms(last_words / kMillisecond);
    controller_->OnMessage(conn_base_ + static_cast<std::uint64_t>(node), m);
  }

  // Node `node` reports GPUs 0..count-1 in a heartbeat of generation 0; `set` fills each.
  void GpuHeartbeat(int node, int count, const std::function<void(int, v1::GpuHealth*)>& set) {
    v1::AgentMessage m;
    m.mutable_heartbeat()->set_generation(0);
    for (int i = 0; i < count; ++i) {
      v1::GpuHealth* g = m.mutable_heartbeat()->mutable_metrics()->add_gpus();
      g->set_index(i);
      set(i, g);
    }
    controller_->OnMessage(conn_base_ + static_cast<std::uint64_t>(node), m);
  }

  void Stopped(int node, std::int64_t gen) {
    v1::AgentMessage m;
    m.mutable_stopped()->set_generation(gen);
    m.mutable_stopped()->set_free_port(50000 + node);
    controller_->OnMessage(conn_base_ + static_cast<std::uint64_t>(node), m);
  }

  // Node `node` sends the timings of `steps` for its ranks: forward takes
  // `forward_us` (x `slow` on node `slow_node`), backward 2 x that.
  void Timings(int node, std::int64_t gen, int nproc, std::int64_t from, std::int64_t to, double slow = 1.0,
               int slow_node = -1, std::int64_t start_unix_us = 1'700'000'000'000'000) {
    v1::AgentMessage m;
    v1::Timings* t = m.mutable_timings();
    t->set_generation(gen);
    t->add_names("forward");
    t->add_names("backward");
    t->add_names("all_reduce");
    t->add_names("data");
    for (std::int64_t step = from; step < to; ++step) {
      for (int local = 0; local < nproc; ++local) {
        v1::StepTiming* st = t->add_steps();
        st->set_global_rank(node * nproc + local);
        st->set_step(step);
        st->set_start_unix_us(start_unix_us + step * 100000);
        st->set_duration_us(100000);
        const bool slowed = node == slow_node || node * nproc + local == slow_rank_;
        std::int64_t fwd = static_cast<std::int64_t>(30000 * (slowed ? slow : 1.0));
        auto* f = st->add_intervals();
        f->set_name(0);
        f->set_kind(1);
        f->set_start_us(0);
        f->set_duration_us(fwd);
        auto* b = st->add_intervals();
        b->set_name(1);
        b->set_kind(1);
        b->set_start_us(fwd);
        b->set_duration_us(2 * fwd);
        auto* c = st->add_intervals();
        c->set_name(2);
        c->set_kind(10);
        c->set_start_us(fwd + 100);
        c->set_duration_us(500);
        c->set_group_id(0);
        c->set_seq(step + 1);
        c->set_peer(-1);
        c->set_numel(1000);
        if (data_rank_ >= 0) {  // every rank reads its batch: 1 ms, data_rank_ data_wait_us_
          auto* d = st->add_intervals();
          d->set_name(3);
          d->set_kind(1);
          d->set_start_us(3 * fwd + 1000);
          d->set_duration_us(node * nproc + local == data_rank_ ? data_wait_us_ : 1000);
        }
      }
    }
    controller_->OnMessage(conn_base_ + static_cast<std::uint64_t>(node), m);
  }

  // Polls `done` (which may drive the controller) every millisecond of real
  // time, for at most 10 s; whether it came true.
  template <typename Pred>
  static bool WaitUntil(Pred done) {
    return testutil::WaitUntil(done, std::chrono::seconds(10), std::chrono::milliseconds(1));
  }

  // The store once the controller's writes are in it.
  InMemoryEventStore& Stored() {
    if (controller_) {
      EXPECT_TRUE(controller_->FlushStore(std::chrono::milliseconds(10000)));
    }
    return store_;
  }

  // The old controller is gone without a word; a new one resumes.
  Status Restart() {
    controller_.reset();
    links_.clear();
    clock_.Advance(3 * kSecond);
    controller_ = std::make_unique<JobController>(config_, &clock_, &store_, &provider_, rules_.get());
    controller_->SetOffLockThreads(0);
    return controller_->Resume();
  }
  // Node `i` reconnects (conn 10 + i) asking to keep its ranks of `generation`
  // (-1: none), each at `step`.
  FakeAgentLink* Reconnect(int i, std::int64_t generation, std::int64_t step = 14) {
    auto link = std::make_shared<FakeAgentLink>();
    links_.push_back(link);
    controller_->OnConnect(10 + i, link);
    v1::AgentMessage m;
    v1::Register* r = m.mutable_register_();
    r->set_protocol_version(kProtocolVersion);
    r->set_node_id("node" + std::to_string(i));
    r->set_address("10.0.0." + std::to_string(i));
    r->set_free_port(41000 + i);
    r->set_runs_diagnostics(true);
    if (generation >= 0) {
      r->set_resume_generation(generation);
      r->set_resume_group_rank(i);
      const int nproc = config_.nproc_per_node;
      for (int local = 0; local < nproc; ++local) *r->add_resume_ranks() = Rank(i * nproc + local, step);
    }
    controller_->OnMessage(10 + i, m);
    return link.get();
  }

  std::vector<Event> EventsOf(const std::string& kind) {
    std::vector<Event> out;
    for (const auto& e : Stored().Events("job").value()) {
      if (e.kind == kind) out.push_back(e);
    }
    return out;
  }

  nlohmann::json Detail(const std::string& kind, size_t i = 0) {
    return nlohmann::json::parse(EventsOf(kind).at(i).detail_json);
  }

  JobConfig config_;
  std::string rules_override_;  // a --rules file merged over the shipped rules
  int slow_rank_ = -1;          // Timings: this global rank is slowed as well
  std::uint64_t conn_base_ = 1;  // Heartbeat, Exit, Stopped, Timings: node i's connection is conn_base_ + i
  int data_rank_ = -1;          // Timings: every rank has a "data" phase, this one of data_wait_us_
  std::int64_t data_wait_us_ = 1000;
  int off_lock_threads_ = 0;    // Make: the controller's OffLockRunner threads
  EventStore* write_store_ = nullptr;  // Make: where the controller writes (null: store_)
  std::unique_ptr<RuleSet> rules_;
  FakeClock clock_;
  InMemoryEventStore store_;
  FakeNodeProvider provider_;
  std::unique_ptr<JobController> controller_;
  std::vector<std::shared_ptr<FakeAgentLink>> links_;
};

}  // namespace trainguard
