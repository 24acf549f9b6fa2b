// LossExplainer: asks the scheduler backend why nodes were lost
// (NodeProvider::ExplainLoss), off the controller's lock. Under Slurm an
// answer takes up to 3 s from slurmctld plus a 1 s connect to the node's
// slurmd; a rack that loses power loses dozens of nodes at once. The
// controller hands each loss here, goes on (every rank is told to stop at
// once) and takes the answers back on its own thread (Take), before it
// decides on the incident.
//
// A few losses are explained at a time, on threads of this class. With
// threads = 0 each is explained inline, in Explain (unit tests with a fake
// backend that answers at once).
// Thread safety: all methods may be called from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "controller/job_controller.h"

namespace trainguard {

class LossExplainer {
 public:
  explicit LossExplainer(int threads);
  // Waits for the losses being explained (each bounded by its backend).
  ~LossExplainer();

  // Asks `provider` about `node_id`; the answer comes back through Take.
  void Explain(NodeProvider* provider, const std::string& node_id);
  // The answers that came since the last call, oldest first.
  std::vector<std::pair<std::string, LossExplanation>> Take();
  // Waits until no loss is being explained or waits to be (a backend that
  // is about to go must not be asked any more).
  void WaitIdle();

 private:
  struct Ask {
    NodeProvider* provider;
    std::string node_id;
  };
  void Work();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Ask> asks_;
  std::vector<std::pair<std::string, LossExplanation>> answers_;
  int busy_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace trainguard
