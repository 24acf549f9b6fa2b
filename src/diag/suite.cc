#include "diag/suite.h"

#include "diag/gpu_probe.h"
#include "diag/net_probe.h"

#include <nlohmann/json.hpp>

namespace trainguard {

using nlohmann::json;

std::vector<Figure> RunSuite(const SuitePlan& plan) {
  const ProbeBudget budget = plan.mode == "full" ? ProbeBudget::Full() : ProbeBudget::Quick();
  std::vector<Figure> out;
  out.push_back(MeasureCompute(budget.compute, budget.window));
  out.push_back(MeasureMemory(budget.memory, budget.window));
  out.push_back(CheckKnownAnswer());
  for (const auto& [role, dir] : plan.paths) {
    for (auto& f : MeasureDisk(role, dir, budget.disk_bytes)) out.push_back(std::move(f));
  }
  if (plan.gpus) {
    for (auto& f : MeasureGpus(plan.mode)) out.push_back(std::move(f));
  }
  if (!plan.peers.empty()) {
    for (auto& f : MeasureNetwork(plan.peers, budget.net_bytes, 20 * kSecond)) out.push_back(std::move(f));
  }
  return out;
}

std::string FiguresToJson(const std::vector<Figure>& figures) {
  json out = json::array();
  for (const auto& f : figures) {
    json j = {{"name", f.name}, {"value", f.value}};
    if (!f.error.empty()) j["error"] = f.error;
    if (!f.device.empty()) j["device"] = f.device;
    out.push_back(std::move(j));
  }
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

StatusOr<std::vector<Figure>> FiguresFromJson(const std::string& text) {
  json parsed = json::parse(text, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_array()) {
    return InvalidArgument("diagnostics figures are not a JSON array: " + text.substr(0, 80));
  }
  std::vector<Figure> out;
  for (const auto& j : parsed) {
    if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || !j.contains("value") ||
        !j["value"].is_number()) {
      return InvalidArgument("a diagnostics figure lacks a name or a numeric value: " + j.dump());
    }
    Figure f{j["name"].get<std::string>(), j["value"].get<double>(), ""};
    if (j.contains("error") && j["error"].is_string()) f.error = j["error"].get<std::string>();
    if (j.contains("device") && j["device"].is_string()) f.device = j["device"].get<std::string>();
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace trainguard
