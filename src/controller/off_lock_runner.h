// OffLockRunner: work the controller must not do under its lock, and what
// it then does with the result under the lock.
//
// Two kinds of work take seconds at a fleet's size: asking the scheduler
// why a node was lost (Slurm: up to 3 s from slurmctld and a 1 s connect
// to the node's slurmd, for each of the dozens of nodes a rack's power cut
// loses), and blaming an incident (the attribution rules over every line of
// 100,000 stopped ranks, 2 million of them, and other jobs' incidents read
// from the fleet store). A Work runs on a thread of this class and returns
// an Apply; the controller takes the Applys (Take) on its own thread, with
// its lock held, and runs them in the order their work finished.
//
// With threads = 0, each Work runs inline in Run (unit tests whose fakes
// answer at once: the controller then behaves as if it were synchronous).
// Thread safety: all methods may be called from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace trainguard {

class OffLockRunner {
 public:
  using Apply = std::function<void()>;  // under the controller's lock
  using Work = std::function<Apply()>;  // off it; must be bounded

  explicit OffLockRunner(int threads);
  // Waits for the work in progress and what is queued.
  ~OffLockRunner();

  void Run(Work work);
  // What finished since the last call, in the order it finished.
  std::vector<Apply> Take();
  // Waits until nothing runs or waits to run (what it uses is about to go).
  void WaitIdle();

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Work> queued_;
  std::vector<Apply> done_;
  int busy_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace trainguard
