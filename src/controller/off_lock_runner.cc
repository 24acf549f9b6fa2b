#include "controller/off_lock_runner.h"

#include "common/signal_free_thread.h"

namespace trainguard {

OffLockRunner::OffLockRunner(int threads) {
  // Made with the controller, before the daemon's signal watcher.
  for (int i = 0; i < threads; ++i) threads_.push_back(SignalFreeThread([this] { Loop(); }));
}

OffLockRunner::~OffLockRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  for (auto& t : threads_) t.join();
}

void OffLockRunner::Run(Work work) {
  if (threads_.empty()) {
    Apply apply = work();
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back(std::move(apply));
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  queued_.push_back(std::move(work));
  cv_.notify_one();
}

std::vector<OffLockRunner::Apply> OffLockRunner::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Apply> out;
  out.swap(done_);
  return out;
}

void OffLockRunner::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queued_.empty() && busy_ == 0; });
}

void OffLockRunner::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queued_.empty(); });
    if (queued_.empty()) return;  // stopping, nothing left
    Work work = std::move(queued_.front());
    queued_.pop_front();
    ++busy_;
    lock.unlock();
    Apply apply = work();
    lock.lock();
    --busy_;
    done_.push_back(std::move(apply));
    cv_.notify_all();
  }
}

}  // namespace trainguard
