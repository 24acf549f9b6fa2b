// DiagnosisCoordinator: the controller's diagnosis rounds, as a component.
// A round (diagnosis_round.h) is the pure logic of one set of orders and
// answers; the coordinator owns the round under way and what goes with it:
// why it runs (preflight or an incident), the rounds' count, which nodes are
// asked what in each stage (the suite with its network ring, each node's
// all-to-all and GPU figures, each rack's all-reduce, and the rack seats of
// that stage), their answers, and the verdict.
//
// It reads the job's nodes through the node registry (read-only) and does
// no I/O: each call returns typed actions, in the order they are to be
// carried out — an order to a node, an event, a diagnostics record for the
// store, an eviction — ending, when the round is over, with DiagDone, which
// says what follows it (the first start, or the restart it held up).
// Not thread-safe: the controller calls it under its lock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/clock.h"
#include "controller/diagnosis_round.h"
#include "controller/event_kind.h"
#include "controller/job_config.h"
#include "controller/node_registry.h"
#include "proto/protocol.h"

namespace trainguard {

struct DiagOrder {  // send `msg` (a RunDiagnostics) to `node`
  std::string node;
  v1::ControllerMessage msg;
};
struct DiagEvent {
  EventKind kind;
  std::string node;
  std::string message;
  std::string detail_json;
};
struct DiagRecord {  // a node's figures, for the store (`trainguard nodes`)
  std::string node;
  std::string figures_json;
};
struct DiagEviction {  // the node failed: out of the job, cordoned
  std::string node;
  std::string why;
  std::string evidence_json;
};
struct DiagDone {  // the round is over: the first start, or the restart it held up
  DiagnosisPurpose purpose;
};
using DiagAction = std::variant<DiagOrder, DiagEvent, DiagRecord, DiagEviction, DiagDone>;
using DiagActions = std::vector<DiagAction>;

class DiagnosisCoordinator {
 public:
  explicit DiagnosisCoordinator(const JobConfig& config) : config_(config) {}

  bool active() const { return round_.has_value(); }
  std::int64_t rounds() const { return rounds_; }
  // The nodes of the round under way (0: none).
  std::size_t round_size() const { return round_ ? round_->nodes().size() : 0; }

  // A round of every connected node that runs diagnostics: the job's nodes
  // in group-rank order, then the spares (a bad spare is found before it
  // takes a place). `label`: "preflight" or "incident N". Returns its
  // diagnosis_started event; the orders go out with SendOrders.
  // `only`: just these nodes (the suspects of an attribution no telemetry
  // corroborates), with the quick suite when the job diagnoses nothing
  // routinely.
  DiagActions Start(DiagnosisPurpose purpose, const std::string& label, const NodeRegistry& nodes,
                    const std::vector<std::string>& only = {});
  // The suite the round under way runs.
  DiagnoseMode mode() const { return mode_; }
  // Orders to the nodes whose turn came (a node gone meanwhile fails).
  DiagActions SendOrders(const NodeRegistry& nodes, Nanos now);
  // A node's answer (a stale round's is ignored): its record and event.
  DiagActions Answer(const JobNode& node, const v1::DiagnosticsResult& result);
  // The node's agent went away during the round: it fails with `why`.
  void NodeGone(const std::string& node, const std::string& why);
  void CheckTimeouts(Nanos now);
  // Once every asked node answered: confirmations, the next collective
  // stage, or the verdict (evictions, the diagnosis event, DiagDone).
  DiagActions Finish(const NodeRegistry& nodes, Nanos now);

 private:
  // The network probe's neighbours of a node: the nodes before and after it
  // in the round's ring that serve the probe (HOST:PORT).
  std::vector<std::string> NetworkPeersOf(const NodeRegistry& nodes, const std::string& node_id) const;
  // Whether the node's suite in this round listed GPUs (nvidia-smi).
  bool HasGpus(const std::string& node_id) const;
  // After the nodes' own probes: the all-to-all stage (when nodes have more
  // than one rank), then the rack all-reduce stage (when a rack has two
  // nodes or more; nodes without a rack take no part). False when none is left.
  bool StartNextCollectiveStage(const NodeRegistry& nodes);
  // The verdict of the finished round: evictions, its event, DiagDone.
  DiagActions Judge(const NodeRegistry& nodes);

  // A node's place in its rack's all-reduce during that stage of a round.
  struct RackSeat {
    int rank = 0;
    int size = 0;
    std::string master;  // HOST:PORT
    bool nccl = false;   // every node of the rack has GPUs
  };

  const JobConfig& config_;
  std::optional<DiagnosisRound> round_;
  DiagnosisPurpose purpose_ = DiagnosisPurpose::kPreflight;
  DiagnoseMode mode_ = DiagnoseMode::kQuick;
  std::int64_t rounds_ = 0;
  std::map<std::string, RackSeat> rack_seats_;  // the round's rack all-reduce stage
};

}  // namespace trainguard
