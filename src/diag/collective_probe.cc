#include "diag/collective_probe.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "diag/run_program.h"

namespace trainguard {

using nlohmann::json;

namespace {

Figure ProbeError(const std::string& why) { return Figure{"collective_probe", 0, why}; }

std::string LastLine(const std::string& text) {
  std::size_t end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return "";
  std::size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin == std::string::npos ? 0 : begin + 1));
}

}  // namespace

std::vector<Figure> CollectiveFiguresFromOutput(const std::string& stdout_text) {
  json out = json::parse(LastLine(stdout_text), nullptr, false);
  if (out.is_discarded() || !out.is_object()) {
    return {ProbeError("the collective probe printed no result: " + LastLine(stdout_text).substr(0, 200))};
  }
  if (out.contains("skipped") && out["skipped"].is_string()) {
    return {ProbeError("not run: " + out["skipped"].get<std::string>())};
  }
  std::vector<Figure> figures;
  if (!out.contains("figures") || !out["figures"].is_array()) return {ProbeError("the probe's result has no figures")};
  for (const auto& f : out["figures"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("value") ||
        !f["value"].is_number()) {
      return {ProbeError("the probe's figure is malformed: " + f.dump())};
    }
    Figure figure{f["name"].get<std::string>(), f["value"].get<double>(), ""};
    if (f.contains("error") && f["error"].is_string()) figure.error = f["error"].get<std::string>();
    if (f.contains("device") && f["device"].is_string()) figure.device = f["device"].get<std::string>();
    figures.push_back(std::move(figure));
  }
  return figures;
}

std::vector<Figure> RunCollectiveProbe(const CollectivePlan& plan) {
  if (plan.local_ranks < 2 && plan.rack_size < 2 && !plan.gpu) return {};
  std::vector<std::string> argv = {plan.python,
                                   plan.script,
                                   "--work-dir",
                                   plan.work_dir,
                                   "--local-ranks",
                                   std::to_string(plan.local_ranks),
                                   "--bytes",
                                   std::to_string(plan.bytes),
                                   "--iters",
                                   std::to_string(plan.iters),
                                   "--timeout",
                                   std::to_string(plan.timeout / kSecond)};
  if (plan.gpu) argv.push_back("--gpu");
  if (plan.nccl) argv.push_back("--nccl");
  if (plan.rack_size >= 2) {
    for (const std::string& a : {std::string("--rack-rank"), std::to_string(plan.rack_rank),
                                 std::string("--rack-size"), std::to_string(plan.rack_size),
                                 std::string("--rack-master"), plan.rack_master}) {
      argv.push_back(a);
    }
  }
  if (access(plan.script.c_str(), R_OK) != 0) return {ProbeError("no probe script at " + plan.script)};
  const ProgramResult run = RunProgram(argv, plan.timeout + plan.grace);
  if (run.timed_out) {
    return {ProbeError("the collective probe did not finish within " +
                       std::to_string((plan.timeout + plan.grace) / kSecond) + " s")};
  }
  if (!run.started || run.exit_code != 0) return {ProbeError(run.Describe(plan.python))};
  return CollectiveFiguresFromOutput(run.output);
}

}  // namespace trainguard
