// DiagnosisRound: one round of node diagnostics ordered by the controller —
// before the first start (preflight) or after a failure, with every rank
// stopped. It decides which nodes to ask when (at most `parallelism` at a
// time: nodes that share a host must not measure each other), collects their
// figures, fails the nodes that do not answer in time, and judges them all
// together (diag/judge.h). When a node fails only against its peers' median,
// every node is asked once more and each is judged on the better of its two
// runs: a neighbour's burst (or a shared host's slow spell, which also moves
// the median) must not evict a node; a slow node is slow twice. Pure logic: the
// controller sends the orders and feeds the answers and the time.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "diag/judge.h"

namespace trainguard {

enum class DiagStage {
  kSuite,          // each node's own probes (compute, memory, disks, network ring)
  kAllToAll,       // each node's ranks among themselves
  kRackAllReduce,  // the nodes of a rack together
};
const char* DiagStageName(DiagStage stage);

// Why a round runs, which says what follows it: the first start, or the
// restart after an incident.
enum class DiagnosisPurpose { kPreflight, kIncident };

// The nodes a node measures the network against in a round: its neighbours
// in the round's ring, two on each side (fewer in a smaller ring), nearest
// first. A node's figure is the best over them, so a healthy node beside a
// bad link, or beside two, still has a fast pair; a node whose own link is
// slow is slow with all of them.
std::vector<std::size_t> RingNeighbours(std::size_t ring_size, std::size_t self);

class DiagnosisRound {
 public:
  // `nodes` in the order they are to be asked; parallelism 0 = all at once.
  DiagnosisRound(std::int64_t id, std::string purpose, std::vector<std::string> nodes, int parallelism,
                 Nanos timeout);

  std::int64_t id() const { return id_; }
  const std::string& purpose() const { return purpose_; }
  const std::vector<std::string>& nodes() const { return order_; }
  // The nodes to order now; they count as asked from `now`.
  std::vector<std::string> NextToAsk(Nanos now);
  // A node's figures. False if it was not asked in this round or answered already.
  bool Answer(const std::string& node, std::vector<Figure> figures);
  // Once every node answered: if a node fails only against the median,
  // queues every node that answered for its second run; after that, the
  // nodes that still fail only against the median for a third. Returns the
  // queued nodes (none: judge).
  std::vector<std::string> QueueConfirmations(const JudgePolicy& policy);
  // Once Done(): a collective stage whose `groups` are asked one group at a
  // time (with parallelism 1: nodes that share a host), or as many as
  // `parallelism` nodes allow; a group's nodes are always asked together.
  // Nodes that failed already are left out. Answers add their figures.
  void StartStage(DiagStage stage, std::vector<std::vector<std::string>> groups);
  DiagStage stage() const { return stage_; }
  // The node cannot answer (its agent went away): it fails with `why`.
  void NodeGone(const std::string& node, const std::string& why);
  // Asked nodes without an answer after the timeout fail.
  void CheckTimeouts(Nanos now);
  bool Done() const;
  // One verdict per node of the round, in its order. A node that did not
  // answer is unhealthy with why; the others are judged together.
  std::vector<NodeVerdict> Judge(const JudgePolicy& policy) const;
  const std::vector<Figure>* FiguresOf(const std::string& node) const;

 private:
  const std::int64_t id_;
  const std::string purpose_;
  const std::vector<std::string> order_;
  const int parallelism_;
  const Nanos timeout_;
  std::vector<std::string> queue_;           // to ask, in order
  std::map<std::string, Nanos> asked_;       // running: asked at
  int passes_ = 1;  // runs asked of the nodes so far
  DiagStage stage_ = DiagStage::kSuite;
  std::deque<std::vector<std::string>> groups_;  // a collective stage's, to ask
  std::map<std::string, std::vector<Figure>> figures_;
  std::map<std::string, std::string> failed_;  // no answer: why
};

}  // namespace trainguard
