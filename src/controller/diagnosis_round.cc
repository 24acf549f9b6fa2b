#include "controller/diagnosis_round.h"

#include <algorithm>

namespace trainguard {

DiagnosisRound::DiagnosisRound(std::int64_t id, std::string purpose, std::vector<std::string> nodes,
                               int parallelism, Nanos timeout)
    : id_(id), purpose_(std::move(purpose)), order_(std::move(nodes)), parallelism_(parallelism),
      timeout_(timeout), queue_(order_) {}

const char* DiagStageName(DiagStage stage) {
  switch (stage) {
    case DiagStage::kSuite: return "suite";
    case DiagStage::kAllToAll: return "all-to-all";
    case DiagStage::kRackAllReduce: return "rack all-reduce";
  }
  return "?";
}

std::vector<std::size_t> RingNeighbours(std::size_t ring_size, std::size_t self) {
  std::vector<std::size_t> out;
  if (ring_size < 2 || self >= ring_size) return out;
  for (std::size_t distance : {1, 2}) {
    for (std::size_t j : {(self + ring_size - distance % ring_size) % ring_size, (self + distance) % ring_size}) {
      if (j != self && std::find(out.begin(), out.end(), j) == out.end()) out.push_back(j);
    }
  }
  return out;
}

void DiagnosisRound::StartStage(DiagStage stage, std::vector<std::vector<std::string>> groups) {
  stage_ = stage;
  queue_.clear();
  groups_.clear();
  for (auto& group : groups) {
    std::vector<std::string> alive;
    for (auto& node : group) {
      if (!failed_.count(node) && figures_.count(node)) alive.push_back(std::move(node));
    }
    if (!alive.empty()) groups_.push_back(std::move(alive));
  }
}

std::vector<std::string> DiagnosisRound::NextToAsk(Nanos now) {
  std::vector<std::string> out;
  if (stage_ != DiagStage::kSuite) {
    while (!groups_.empty()) {
      const std::vector<std::string>& group = groups_.front();
      const bool room = parallelism_ <= 0 || asked_.empty() ||
                        static_cast<int>(asked_.size() + group.size()) <= parallelism_;
      if (!room) break;
      for (const auto& node : group) {
        if (failed_.count(node)) continue;
        asked_[node] = now;
        out.push_back(node);
      }
      groups_.pop_front();
    }
    return out;
  }
  while (!queue_.empty() && (parallelism_ <= 0 || static_cast<int>(asked_.size()) < parallelism_)) {
    const std::string node = queue_.front();
    queue_.erase(queue_.begin());
    if (failed_.count(node)) continue;  // gone before it was asked
    asked_[node] = now;
    out.push_back(node);
  }
  return out;
}

bool DiagnosisRound::Answer(const std::string& node, std::vector<Figure> figures) {
  auto it = asked_.find(node);
  if (it == asked_.end()) return false;
  asked_.erase(it);
  auto earlier = figures_.find(node);
  if (stage_ != DiagStage::kSuite && earlier != figures_.end()) {  // a collective's figures join the node's
    for (auto& f : figures) {
      auto same = std::find_if(earlier->second.begin(), earlier->second.end(),
                               [&](const Figure& e) { return e.name == f.name; });
      if (same != earlier->second.end()) {
        *same = std::move(f);
      } else {
        earlier->second.push_back(std::move(f));
      }
    }
  } else if (earlier == figures_.end()) {
    figures_[node] = std::move(figures);
  } else {  // the confirmation run
    earlier->second = BestOf(earlier->second, figures);
  }
  return true;
}

std::vector<std::string> DiagnosisRound::QueueConfirmations(const JudgePolicy& policy) {
  if (passes_ >= 3 || !Done() || stage_ != DiagStage::kSuite) return {};
  std::vector<std::string> suspects;
  for (const auto& v : Judge(policy)) {
    if (WorthMeasuringAgain(v)) suspects.push_back(v.node);
  }
  if (suspects.empty()) return {};
  ++passes_;
  queue_.clear();
  if (passes_ == 2) {
    // Everyone again, not only the suspects: a host whose speed changed
    // during the round (nodes sharing a machine, a neighbour's burst) moved
    // the median too; the best of each node's runs is judged.
    for (const auto& node : order_) {
      if (figures_.count(node) && !failed_.count(node)) queue_.push_back(node);
    }
  } else {
    queue_ = suspects;  // a third chance against the settled median
  }
  return queue_;
}

void DiagnosisRound::NodeGone(const std::string& node, const std::string& why) {
  if (failed_.count(node)) return;
  if (std::find(order_.begin(), order_.end(), node) == order_.end()) return;
  asked_.erase(node);
  failed_[node] = why;
  figures_.erase(node);
}

void DiagnosisRound::CheckTimeouts(Nanos now) {
  for (auto it = asked_.begin(); it != asked_.end();) {
    if (now - it->second > timeout_) {
      failed_[it->first] = "no diagnostics within " + std::to_string(timeout_ / kSecond) + " s";
      it = asked_.erase(it);
    } else {
      ++it;
    }
  }
}

bool DiagnosisRound::Done() const {
  if (!asked_.empty() || !groups_.empty()) return false;
  for (const auto& node : queue_) {
    if (!failed_.count(node)) return false;
  }
  return true;
}

std::vector<NodeVerdict> DiagnosisRound::Judge(const JudgePolicy& policy) const {
  std::vector<NodeFigures> answered;
  for (const auto& node : order_) {
    if (auto it = figures_.find(node); it != figures_.end()) answered.push_back({node, it->second});
  }
  std::vector<NodeVerdict> judged = JudgeNodes(answered, policy);
  std::vector<NodeVerdict> out;
  std::size_t j = 0;
  for (const auto& node : order_) {
    if (auto it = failed_.find(node); it != failed_.end()) {
      out.push_back({node, false, {}, {it->second}});
    } else if (j < judged.size() && judged[j].node == node) {
      out.push_back(judged[j++]);
    }
  }
  return out;
}

const std::vector<Figure>* DiagnosisRound::FiguresOf(const std::string& node) const {
  auto it = figures_.find(node);
  return it == figures_.end() ? nullptr : &it->second;
}

}  // namespace trainguard
