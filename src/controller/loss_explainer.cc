#include "controller/loss_explainer.h"

namespace trainguard {

LossExplainer::LossExplainer(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

LossExplainer::~LossExplainer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  for (auto& t : threads_) t.join();
}

void LossExplainer::Explain(NodeProvider* provider, const std::string& node_id) {
  if (threads_.empty()) {
    LossExplanation known = provider->ExplainLoss(node_id);
    std::lock_guard<std::mutex> lock(mu_);
    answers_.emplace_back(node_id, std::move(known));
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  asks_.push_back({provider, node_id});
  cv_.notify_one();
}

std::vector<std::pair<std::string, LossExplanation>> LossExplainer::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, LossExplanation>> out;
  out.swap(answers_);
  return out;
}

void LossExplainer::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return asks_.empty() && busy_ == 0; });
}

void LossExplainer::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !asks_.empty(); });
    if (asks_.empty()) return;  // stopping, nothing left
    Ask ask = std::move(asks_.front());
    asks_.pop_front();
    ++busy_;
    lock.unlock();
    LossExplanation known = ask.provider->ExplainLoss(ask.node_id);
    lock.lock();
    --busy_;
    answers_.emplace_back(ask.node_id, std::move(known));
    cv_.notify_all();
  }
}

}  // namespace trainguard
