// trainguard sim: the simulated nodes — their links to the controller, what
// they report (RanksStarted, heartbeats with every rank's status, Stopped,
// diagnostics), the controller's orders to them — and the scheduler that
// replaces, evicts and explains them (simulation.h).
#include <algorithm>

#include <nlohmann/json.hpp>

#include "sim/simulation.h"

namespace trainguard::sim_detail {

using nlohmann::json;

void SimLink::Send(const v1::ControllerMessage& msg) { sim_->OnCommand(node_, msg); }
void SimLink::Close() { sim_->OnClose(node_); }
Nanos SimLink::LastHeardMono() const { return sim_->HeardOf(node_); }
void SimProvider::ReplaceNode(const std::string& id, const std::string&) { sim_->Replace(id, false); }
bool SimProvider::EvictNode(const std::string& id, const std::string&) {
  bool coming = sim_->ReplacementComing();
  sim_->Replace(id, true);
  return coming;
}
LossExplanation SimProvider::ExplainLoss(const std::string& id) { return sim_->Explain(id); }

int Simulation::AddNode() {
  Node n;
  n.id = "n" + std::to_string(nodes_.size());
  n.bad = model_.bad_node_fraction > 0 && Uniform() < model_.bad_node_fraction;
  nodes_.push_back(std::move(n));
  int i = static_cast<int>(nodes_.size()) - 1;
  heard_.push_back(0);
  SetHeard(i);
  nodes_[i].link = std::make_shared<SimLink>(this, i);
  node_by_id_[nodes_[i].id] = i;
  return i;
}

void Simulation::Connect(int i) {
  Node& n = nodes_[i];
  n.in_session = true;
  SetHeard(i);
  if (opt_.trace != nullptr) {
    SimTraceEntry t;
    t.kind = SimTraceEntry::kConnect;
    t.at = clock_.MonotonicNanos() - start_mono_;
    t.node = i;
    opt_.trace->push_back(std::move(t));
  }
  ctl_->OnConnect(static_cast<std::uint64_t>(i) + 1, n.link);
  scratch_.Clear();
  auto* r = scratch_.mutable_register_();
  r->set_protocol_version(kProtocolVersion);
  r->set_node_id(n.id);
  r->set_hostname(n.id);
  r->set_address("10." + std::to_string(i / 65536 % 256) + "." + std::to_string(i / 256 % 256) + "." +
                 std::to_string(i % 256));
  r->set_nproc_per_node(nproc_);
  r->set_free_port(29500);
  r->set_pid(100 + i);
  r->set_runs_diagnostics(p_.diagnose != "off");
  Deliver(i, std::move(scratch_));
}

void Simulation::Deliver(int i, v1::AgentMessage&& msg) {
  ++result_.messages;
  if (opt_.trace != nullptr) {
    SimTraceEntry t;
    t.at = clock_.MonotonicNanos() - start_mono_;
    t.node = i;
    t.msg = msg;
    opt_.trace->push_back(std::move(t));
  }
  ctl_->OnMessage(static_cast<std::uint64_t>(i) + 1, std::move(msg), clock_.MonotonicNanos());
}

void Simulation::FillRanks(int i, Nanos now, google::protobuf::RepeatedPtrField<v1::RankStatus>* out, bool started) {
  const Node& n = nodes_[i];
  const std::int64_t step = started ? gen_.first_no - 1 : StepAt(now);
  const bool stepped = step >= gen_.first_no;
  const std::int64_t committed = Restorable();
  const std::int64_t blocked_us = stepped ? gen_.blocked / 1000 : 0;
  const std::int64_t saves = stepped ? gen_.saves : 0;
  const Nanos last = stepped ? StepTime(step) : gen_.launched;
  for (int l = 0; l < nproc_; ++l) {
    v1::RankStatus* r = out->Add();
    const int global = n.group_rank * nproc_ + l;
    r->set_local_rank(l);
    r->set_global_rank(global);
    r->set_running(true);
    r->set_pid(1000 + global);
    r->set_attached(true);
    r->set_step(stepped ? step : -1);
    r->set_step_count(stepped ? step - gen_.first_no + 1 : 0);
    r->set_progress_age_ms(std::max<Nanos>(0, now - last) / kMillisecond);
    if (stepped) {
      r->set_first_step_unix_ms(Wall(gen_.first) / kMillisecond);
      r->set_first_step(gen_.first_no);
      r->set_last_step_unix_ms(Wall(last) / kMillisecond);
    }
    r->set_checkpoint_step(committed);
    r->set_checkpoint_blocked_ms(blocked_us / 1000);
    r->set_checkpoint_blocked_us(blocked_us);
    r->set_checkpoint_saves(saves);
    if (gen_.restored >= 0) r->set_resumed_step(gen_.restored);
    r->set_phase(stepped ? "forward" : "");
    r->set_proc_state("R");
    r->set_activity_sampled(true);
    if (gen_.hung && gen_.frozen <= now) {
      // The stuck rank never reached the next collective; its peers wait in
      // it (NCCL's waiters spin: busy, not quiet).
      const std::int64_t issued = step + 1;
      auto* g = r->add_groups();
      g->set_id(0);
      g->set_name("default_pg");
      g->set_size(nnodes_ * nproc_);
      g->set_first(0);
      g->set_stride(1);
      const bool culprit = global == gen_.hang_rank;
      g->set_issued(culprit ? issued - 1 : issued);
      g->set_completed(issued - 1);
      if (culprit) {
        r->set_activity_age_ms((now - gen_.frozen) / kMillisecond);
        r->set_proc_state("S");
      } else {
        auto* op = r->add_ops_in_flight();
        op->set_group_id(0);
        op->set_seq(issued);
        op->set_op("all_reduce");
        op->set_dtype("bfloat16");
        op->set_numel(1 << 26);
        op->set_peer(-1);
        op->set_age_ms((now - gen_.frozen) / kMillisecond);
        op->set_duration_ms(-1);
      }
    }
  }
}

std::uint64_t Simulation::Fingerprint(int global, std::int64_t step) const {
  // The same for every replica of one part of the model (ranks equal modulo
  // model_parallel) at one step; a diverged rank's differs from then on.
  std::uint64_t x = static_cast<std::uint64_t>(step) * 0x9E3779B97F4A7C15ULL +
                    static_cast<std::uint64_t>(global % p_.ModelParallel());
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;  // splitmix64's finaliser
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return global == sdc_rank_ && step >= sdc_step_ ? ~x : x;
}

void Simulation::AddFingerprints(int i, Nanos now, google::protobuf::RepeatedPtrField<v1::RankStatus>* ranks) {
  if (!Fingerprinted()) return;
  const std::int64_t step = StepAt(now), k = p_.fingerprint_every;
  auto multiple_from = [k](std::int64_t s) { return (s + k - 1) / k * k; };  // steps are >= 0
  // Fingerprints travel where a comparison can find something (a real
  // agent sends each one; between these every replica's is the same, and
  // 100,000 more a round would only confirm it): a node's first heartbeat
  // of a generation carries the generation's first two (the replicas are
  // learned from them, in its first steps, not a round later) and the
  // newest; while a rank is diverged, every heartbeat carries the newest
  // and the one before (the rollback's bound is the step before).
  std::vector<std::int64_t> steps;
  Node& n = nodes_[i];
  const std::int64_t first = multiple_from(gen_.first_no);
  if (n.fp_generation != gen_.g && first + k <= step) {
    steps = {first, first + k};
    n.fp_generation = gen_.g;
  } else if (sdc_rank_ < 0) {
    return;
  }
  const std::int64_t newest = step / k * k;
  for (std::int64_t s : {sdc_rank_ >= 0 ? newest - k : newest, newest}) {
    if (s >= first && (steps.empty() || s > steps.back())) steps.push_back(s);
  }
  for (auto& r : *ranks) {
    for (std::int64_t s : steps) {
      v1::Fingerprint* f = r.add_fingerprints();
      f->set_step(s);
      f->set_value(Fingerprint(r.global_rank(), s));
    }
  }
}

void Simulation::Report(int i) {
  const Node& n = nodes_[i];
  if (!n.alive || !n.in_session || !n.ranks_running || n.generation != gen_.g) return;
  auto* hb = heartbeat_.mutable_heartbeat();
  hb->Clear();  // not heartbeat_.Clear(): that frees the ranks
  hb->set_generation(n.generation);
  Nanos now = clock_.MonotonicNanos();
  FillRanks(i, now, hb->mutable_ranks(), false);
  AddFingerprints(i, now, hb->mutable_ranks());
  hb->set_sent_unix_ms(Wall(now) / kMillisecond);
  Deliver(i, std::move(heartbeat_));
}

void Simulation::ReportAll() {
  for (int node : slot_node_) {
    if (node >= 0) Report(node);
  }
}


void Simulation::OnCommand(int i, const v1::ControllerMessage& msg) {
  ++result_.commands;
  Node& n = nodes_[i];
  const Nanos now = clock_.MonotonicNanos();
  if (!n.alive) return;
  switch (msg.kind_case()) {
    case v1::ControllerMessage::kStart: {
      const v1::Start& s = msg.start();
      n.generation = s.generation();
      n.group_rank = s.group_rank();
      n.ranks_running = true;
      if (static_cast<int>(slot_node_.size()) <= s.group_rank()) slot_node_.resize(s.group_rank() + 1, -1);
      slot_node_[s.group_rank()] = i;
      if (gen_.g != s.generation()) {
        // After replicas diverged the controller bounds the restore (trainguard.Checkpointer honours it).
        auto bound = s.env().find("TRAINGUARD_RESUME_AT_MOST");
        resume_at_most_ = bound == s.env().end() ? -1 : std::stoll(bound->second);
        StartSteps(s.generation(), now, now);
        sdc_since_ = -1;
        // A new generation starts from one checkpoint everywhere (DDP
        // broadcasts rank 0's parameters): no replica is diverged.
        sdc_rank_ = -1;
        sdc_step_ = -1;
        sdc_category_ = -1;
        Schedule(gen_.first, Ev::kFirstStep, -1, gen_.g);
      }
      Schedule(now + 50 * kMillisecond, Ev::kStarted, i, s.generation());
      if (n.broken >= 0) Schedule(gen_.first + Sec(30), Ev::kRefault, i, s.generation());
      break;
    }
    case v1::ControllerMessage::kStop:
      if (n.generation == gen_.g) Freeze(now);
      Schedule(now + Sec(p_.shutdown_s), Ev::kStopped, i, msg.stop().generation());
      break;
    case v1::ControllerMessage::kRunDiagnostics:
      Schedule(now + Sec(p_.diagnose_s), Ev::kDiagnosed, i, msg.run_diagnostics().round() * 2 +
                                                            (msg.run_diagnostics().collective() ? 1 : 0));
      break;
    case v1::ControllerMessage::kShutdown:
      n.ranks_running = false;
      break;
    case v1::ControllerMessage::kCheckpointPlan:
      ApplyPlan(msg.checkpoint_plan());
      break;
    default: break;  // Welcome, ClockProbe
  }
}

void Simulation::OnClose(int i) {
  Node& n = nodes_[i];
  if (n.in_session && n.alive) n.heard_until = clock_.MonotonicNanos();
  n.in_session = false;
  SetHeard(i);
  n.ranks_running = false;
}

void Simulation::Replace(const std::string& id, bool evicted) {
  auto it = node_by_id_.find(id);
  if (it == node_by_id_.end()) return;
  Node& n = nodes_[it->second];
  if (n.gone) return;
  n.gone = true;
  n.ranks_running = false;
  NodeLost(n.group_rank);  // its memory copies go with it
  if (n.alive) {
    n.heard_until = clock_.MonotonicNanos();
    if (opt_.trace != nullptr) {
      SimTraceEntry t;
      t.kind = SimTraceEntry::kDown;
      t.at = clock_.MonotonicNanos() - start_mono_;
      t.node = it->second;
      opt_.trace->push_back(std::move(t));
    }
  }
  n.alive = false;  // killed: it will not be heard again
  SetHeard(it->second);
  // It is back in the scheduler's pool once repaired (or, healthy, at once).
  int cat = n.broken >= 0 ? n.broken : n.down_category;
  double hours = cat >= 0 ? model_.categories[cat].repair_hours : 0;
  if (p_.pool >= 0) Schedule(clock_.MonotonicNanos() + Sec(hours * 3600), Ev::kRepaired);
  if (!ReplacementComing()) return;
  if (p_.pool > 0) --pool_left_;
  ++result_.replacements;
  Schedule(clock_.MonotonicNanos() + Sec(p_.replacement_s), Ev::kArrive);
}

LossExplanation Simulation::Explain(const std::string& id) {
  LossExplanation e = Explanation(id);
  if (opt_.explained != nullptr) (*opt_.explained)[id] = e;
  return e;
}

LossExplanation Simulation::Explanation(const std::string& id) const {
  auto it = node_by_id_.find(id);
  if (it == node_by_id_.end()) return {};
  const Node& n = nodes_[it->second];
  if (n.alive) return {};  // the scheduler sees nothing wrong
  if (n.planned) {
    return {"the scheduler drained node " + id + " for planned maintenance", AgentExitedVerdict()};
  }
  if (n.down_category >= 0) return {"the scheduler reports node " + id + " DOWN (not responding)", HostDownVerdict(id)};
  return {};
}

}  // namespace trainguard::sim_detail
