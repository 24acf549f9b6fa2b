// What `trainguard sim` prints: one run as text and JSON, and a sweep as a
// CSV and an SVG plot of ETTR against the job's size. Pure formatting.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/failure_model.h"
#include "sim/sim_params.h"
#include "sim/simulator.h"

namespace trainguard {

std::string SimText(const SimParams& p, const FailureModel& m, const SimResult& r);
// "auto (the controller's plan), memory every 19 s, storage every 131 s (64 s to write); 1200 saves, ..."
std::string CheckpointLine(const SimParams& p, const SimResult& r);
nlohmann::json SimJson(const SimParams& p, const FailureModel& m, const SimResult& r);

// One run of a sweep and the values of the swept parameters.
struct SweepPoint {
  SimParams params;
  std::vector<std::pair<std::string, std::string>> swept;  // name, value as given
  SimResult result;
};
// One row per run: the swept values, then ETTR and its terms.
std::string SweepCsv(const std::vector<SweepPoint>& points);
// ETTR (%) against GPUs (log scale), one line per combination of the other
// swept values. Needs "gpus" among the swept parameters.
std::string SweepSvg(const std::vector<SweepPoint>& points, const std::string& title);

// One horizontal bar per candidate, its ETTR; kept ones dark (trainguard plan's plan.svg).
struct EttrBar {
  std::string label;
  double ettr = 0;
  bool kept = false;
};
std::string BarsSvg(const std::vector<EttrBar>& bars, const std::string& title);

}  // namespace trainguard
