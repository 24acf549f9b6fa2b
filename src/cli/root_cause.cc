#include "cli/root_cause.h"

#include <sstream>

#include <nlohmann/json.hpp>

namespace trainguard {

namespace {

constexpr std::size_t kTailLines = 10;

nlohmann::json Detail(const Event& e) {
  nlohmann::json d = nlohmann::json::parse(e.detail_json, nullptr, false);
  return d.is_object() ? d : nlohmann::json::object();
}

bool FailedExit(const nlohmann::json& d) {
  return d.value("exit_code", 0) != 0 || d.value("signal", 0) != 0;
}

}  // namespace

std::vector<std::string> RootCauseLines(const std::vector<Event>& events) {
  // The last incident's culprit rank, as the attribution named it; else the
  // rank its failure was seen on.
  int rank = -1;
  std::int64_t generation = -1;
  const Event* named = nullptr;
  for (auto it = events.rbegin(); it != events.rend() && rank < 0; ++it) {
    if (it->kind == "attribution" || it->kind == "failure") {
      rank = it->rank;
      generation = it->generation;
      named = &*it;
    }
  }
  if (rank < 0) return {};
  // That rank's failed exit in that generation (the newest one if the
  // generation is unknown).
  const Event* exit = nullptr;
  for (auto it = events.rbegin(); it != events.rend(); ++it) {
    if (it->kind != "rank_exited" || it->rank != rank) continue;
    if (generation >= 0 && it->generation != generation) continue;
    if (!FailedExit(Detail(*it))) continue;
    exit = &*it;
    break;
  }
  nlohmann::json d;
  std::vector<std::string> lines;
  if (exit != nullptr) {
    d = Detail(*exit);
    lines = {"root cause: " + exit->message};
  } else {
    // The culprit raised but was still tearing down when its peers failed:
    // the incident stopped it, and its error file came with the stop.
    nlohmann::json a = Detail(*named);
    auto file = a.find("culprit_error_file");
    if (file == a.end() || !file->is_object()) return {};
    d = {{"error_file", *file}};
    lines = {"root cause: rank " + std::to_string(rank) + " on " + named->node +
             ", which raised before its peers failed (stopped by the incident while it exited)"};
  }
  auto error = d.find("error_file");
  if (error != d.end() && error->is_object()) {
    lines.push_back("  error file: " + error->value("path", std::string()));
    lines.push_back("  exception:  " + error->value("message", std::string()));
    std::istringstream traceback(error->value("traceback", std::string()));
    for (std::string line; std::getline(traceback, line);) lines.push_back("  " + line);
    return lines;
  }
  lines.push_back("  error file: none (the rank wrote none; decorate main with "
                  "torch.distributed.elastic.multiprocessing.errors.record for one)");
  auto tail = d.find("log_tail");
  if (tail != d.end() && tail->is_array() && !tail->empty()) {
    lines.push_back("  last output:");
    std::size_t from = tail->size() > kTailLines ? tail->size() - kTailLines : 0;
    for (std::size_t i = from; i < tail->size(); ++i) {
      if ((*tail)[i].is_string()) lines.push_back("  " + (*tail)[i].get<std::string>());
    }
  }
  return lines;
}

}  // namespace trainguard
