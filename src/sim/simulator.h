// Simulator: a job of thousands of simulated nodes, run by the real
// JobController (its detectors, recovery policy, attribution rules, hang
// locator, diagnosis rounds and a real SQLite store) on a simulated clock.
//
// The nodes are a model: each sends what a real agent sends (Register,
// RanksStarted, Heartbeat with every rank's status and, in a hang, its
// journal, RankExited with the output and kernel lines, Stopped,
// DiagnosticsResult) and answers the controller's commands after the
// measured costs (SimParams). Failures are drawn from a FailureModel and
// turn into those messages (or into silence), so detection is whatever the
// detectors make of them. The scheduler is a NodeProvider that brings a
// replacement after replacement_s and tells the controller a dead host is
// down.
//
// What the simulation leaves out, and why (docs/simulator.md):
//  - a healthy node's heartbeat is sent once per round, every
//    hang_timeout minus a margin, not every second: a heartbeat says only
//    that the ranks still step, and the silence of a node is read from its
//    session (AgentLink::LastHeardMono), as the gRPC transport stamps it;
//  - the controller's clock probes are sent once an hour (the nodes share
//    the simulated clock: there is no offset to learn);
//  - only the failing node's output travels with Stopped (healthy nodes'
//    last lines are symptoms; the cause is in the failing rank's exit);
//  - the controller ticks every 50 ms while a failure is outstanding or
//    the job is not running, every second otherwise.
//
// Deterministic: the same parameters, model and seed give the same run.
// Single-threaded (the controller's off-lock work runs inline); the store's
// writer thread is the only other thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "attribution/attribution.h"
#include "controller/job_controller.h"
#include "proto/protocol.h"
#include "report/downtime_report.h"
#include "sim/failure_model.h"
#include "sim/sim_params.h"

namespace trainguard {

// Per failure category (the cause the simulation injected).
struct SimCategoryStats {
  std::string name;
  bool hardware = false;
  int injected = 0;        // faults drawn
  int incidents = 0;       // incidents they caused (a persistent fault may cause several)
  int evictions = 0;       // incidents decided by evicting a node
  int hardware_agrees = 0; // incidents whose attribution got hardware vs software right
  double detection_s = 0, lost_s = 0, shutdown_s = 0, restart_s = 0;
};

// One message or connection event the controller was given, for replaying
// the same stream elsewhere (the equivalence test).
struct SimTraceEntry {
  // kDown: the node's host died (it is silent from then on).
  enum Kind { kConnect, kMessage, kDown } kind = kMessage;
  Nanos at = 0;  // since the simulation's start
  int node = 0;  // the simulated node (its connection)
  v1::AgentMessage msg;
};

// One slowdown drawn (the failure model's stragglers), and what became of it.
struct SimSlowdown {
  std::string node;
  double start_s = 0, end_s = 0;  // since the simulation's start (end: as drawn)
  double slowdown = 1;
  bool visible = false;  // in the node's own compute (else in every node's collectives)
  bool in_job = false;   // a node of the running job when it began
  double named_s = -1;   // the detector named its node this long after it began (-1: never)
};

struct SimResult {
  DowntimeReport report;  // `trainguard report`'s accounting of the simulated job's events
  std::vector<SimCategoryStats> categories;
  int false_alarms = 0;   // incidents with no injected fault behind them
  std::map<std::string, double> state_s;  // simulated seconds in each controller state
  double sim_s = 0, real_s = 0, cpu_s = 0;
  double sim_cpu_s = 0;  // of cpu_s, the simulation's and the controller's thread; the rest is the store's writer
  std::int64_t messages = 0;      // agent messages the controller handled
  std::int64_t commands = 0;      // messages it sent
  std::int64_t events_stored = 0;
  int faults = 0;
  int faults_while_down = 0;      // drawn while the job was not running (only persistent ones matter)
  // Drawn on an idle spare: its host lost (the transport closes its session,
  // the scheduler brings another), or a persistent fault it takes into the
  // job when promoted; a passing one hits no rank.
  int faults_on_spares = 0;
  int spares_lost = 0, spares_broken = 0;
  int replacements = 0;           // nodes the scheduler brought
  double sdc_redone_s = 0;        // work on corrupted state, redone from an older checkpoint: not in the report
  // Checkpoints: the intervals the saves followed last (auto: the
  // controller's plan, whose line is `plan`), saves made, restarts that
  // resumed from storage rather than memory.
  double memory_interval_s = 0, storage_interval_s = 0;
  std::string plan;
  std::int64_t saves = 0;
  int storage_restores = 0;
  // The first-order model Young and Daly optimize, with this run's own job
  // MTBF (wall / incidents) and downtime per failure (detection, shutdown,
  // restart): the ETTR at Daly's interval for a save's cost, and at the
  // interval the saves followed.
  double mtbf_s = 0;
  double optimum_interval_s = 0, optimum_ettr = 0, model_ettr = 0;
  // Stragglers: slowdowns drawn (on a node of the job), the time the job
  // ran slowed, and the time that cost (a step f times as long costs
  // 1 - 1/f of it); named: the detector's straggler events, of which
  // named_wrongly were of a node not slow then.
  int slowdowns = 0, slowdowns_in_job = 0;
  double slow_s = 0, slowed_s = 0;
  int stragglers_named = 0, named_wrongly = 0;
  std::vector<SimSlowdown> slowdown_list;
  // Goodput: report.ettr less (sdc_redone_s + slowed_s) / wall: the work
  // redone after corruption and the time slow nodes cost are not in the
  // report's downtime.
  double ettr_true = 0;
  bool finished = true;
  std::string why_not;            // when !finished: why the job could not go on
  std::string summary;            // the controller's
};

struct SimOptions {
  std::string store_path;  // SQLite file, created; must not exist
  const RuleSet* rules = nullptr;
  std::vector<SimTraceEntry>* trace = nullptr;  // if set, every input is recorded
  std::map<std::string, LossExplanation>* explained = nullptr;  // if set: what the scheduler said of lost nodes
  std::function<void(const std::string&)> progress;  // a line now and then, if set
};

// The job the simulated controller runs (`p.gpus_per_node` resolved).
JobConfig SimJobConfig(const SimParams& p);

StatusOr<SimResult> RunSimulation(const SimParams& params, const FailureModel& model, const SimOptions& options);

}  // namespace trainguard
