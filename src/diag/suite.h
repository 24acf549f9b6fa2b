// The diagnostics suite of one node: which probes run in which mode, and the
// figures' JSON form (as the store keeps them and `trainguard diag --json`
// prints them). The collective probes run apart, in the round's later stages
// (diag/collective_probe.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "diag/probes.h"
#include "trainguard/status.h"

namespace trainguard {

struct SuitePlan {
  std::string mode = "quick";  // "quick" or "full"
  // Paths a job writes, by role ("checkpoint", "scratch"): each gets the disk probe.
  std::vector<std::pair<std::string, std::string>> paths;
  // Neighbours' diagnostics peer servers (HOST:PORT) for the network probe; none: no network figures.
  std::vector<std::string> peers;
  // GPU checks (diag/gpu_probe.h); a node without nvidia-smi has none.
  bool gpus = true;
};

// Runs every probe of the plan on this node, one after the other (so that
// they do not measure each other), and returns their figures.
std::vector<Figure> RunSuite(const SuitePlan& plan);

std::string FiguresToJson(const std::vector<Figure>& figures);
// Errors name what is wrong with the text (a record written by a newer version, a torn row).
StatusOr<std::vector<Figure>> FiguresFromJson(const std::string& text);

}  // namespace trainguard
