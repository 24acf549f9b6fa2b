#include "diag/judge.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "common/stats.h"

namespace trainguard {

namespace {

std::string Format(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), v >= 100 ? "%.0f" : v >= 1 ? "%.2f" : "%.3f", v);
  return buf;
}

std::string Percent(double percent) {
  char pct[32];
  std::snprintf(pct, sizeof(pct), percent < 10 ? "%.1f %%" : "%.0f %%", percent);
  return pct;
}

}  // namespace

std::string FigureKind(const std::string& name) { return name.substr(0, name.find(':')); }

std::string GpuModel(const std::string& device, const JudgePolicy& policy) {
  std::string word;
  for (std::size_t i = 0; i <= device.size(); ++i) {
    const char c = i < device.size() ? device[i] : ' ';
    if (c == ' ' || c == '-' || c == '_' || c == '/') {
      if (policy.gpu_model_floors.count(word)) return word;
      word.clear();
    } else {
      word += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
  }
  return "";
}

namespace {

// The floor of a per-GPU figure for its model; 0 when there is none.
double ModelFloor(const Figure& f, const std::string& kind, const JudgePolicy& policy) {
  if (f.device.empty()) return 0;
  auto model = policy.gpu_model_floors.find(GpuModel(f.device, policy));
  if (model == policy.gpu_model_floors.end()) return 0;
  auto it = model->second.find(kind);
  return it == model->second.end() ? 0 : it->second;
}

// The median of the node's other GPUs of f's model for f's kind, f left out;
// 0 with fewer than two others.
double OthersMedian(const std::map<std::pair<std::string, std::string>, std::vector<double>>& gpus, const Figure& f,
                    const std::string& kind) {
  if (f.device.empty() || !f.error.empty()) return 0;
  auto it = gpus.find({kind, f.device});
  if (it == gpus.end() || it->second.size() < 3) return 0;
  std::vector<double> others = it->second;
  others.erase(std::find(others.begin(), others.end(), f.value));
  return Median(others);
}

}  // namespace

std::vector<NodeVerdict> JudgeNodes(const std::vector<NodeFigures>& nodes, const JudgePolicy& policy) {
  // The median of each figure (by full name: a path role is compared with
  // the same role on the other nodes; a GPU's with the same GPU of nodes
  // that have that model) over the nodes that measured it.
  auto peer_key = [](const Figure& f) { return f.device.empty() ? f.name : f.name + "\n" + f.device; };
  std::map<std::string, std::vector<double>> values;
  for (const auto& n : nodes) {
    for (const auto& f : n.figures) {
      if (f.error.empty()) values[peer_key(f)].push_back(f.value);
    }
  }
  std::vector<NodeVerdict> out;
  for (const auto& n : nodes) {
    NodeVerdict v;
    v.node = n.node;
    // This node's GPUs by (kind, model): each against the others.
    std::map<std::pair<std::string, std::string>, std::vector<double>> gpus;
    for (const auto& f : n.figures) {
      if (!f.device.empty() && f.error.empty() && policy.fraction_of_node_gpus.count(FigureKind(f.name))) {
        gpus[{FigureKind(f.name), f.device}].push_back(f.value);
      }
    }
    for (const auto& f : n.figures) {
      FigureVerdict fv{f, 0, 0, ""};
      const std::string kind = FigureKind(f.name);
      if (policy.shown_only.count(kind)) {
        v.figures.push_back(std::move(fv));
        continue;
      }
      const auto& peers = values[peer_key(f)];
      auto fr = policy.fraction_of_median.find(kind);
      if (fr != policy.fraction_of_median.end() && peers.size() >= policy.min_nodes_for_median) {
        fv.median = Median(peers);
        fv.peers = peers.size();
      }
      if (!f.error.empty()) {
        fv.failure = f.name + ": " + f.error;
      } else if (auto cl = policy.ceilings.find(kind); cl != policy.ceilings.end() && f.value > cl->second) {
        fv.failure = f.name + " " + Format(f.value) + " is above " + Format(cl->second);
      } else if (auto fl = policy.floors.find(kind); fl != policy.floors.end() && f.value < fl->second) {
        fv.failure = f.name + " " + Format(f.value) + " is below the floor " + Format(fl->second);
      } else if (double floor = ModelFloor(f, kind, policy); f.value < floor) {
        fv.failure = f.name + " " + Format(f.value) + " is below the floor " + Format(floor) + " of the " +
                     GpuModel(f.device, policy);
      } else if (double others = OthersMedian(gpus, f, kind); others > 0 &&
                 f.value < policy.fraction_of_node_gpus.at(kind) * others) {
        const auto& same = gpus.at({kind, f.device});
        fv.failure = f.name + " " + Format(f.value) + " is " + Percent(100.0 * f.value / others) +
                     " of the median " + Format(others) + " of this node's " + std::to_string(same.size() - 1) +
                     " other " + f.device + " GPUs (min " +
                     std::to_string(static_cast<int>(policy.fraction_of_node_gpus.at(kind) * 100 + 0.5)) + " %)";
      } else if (fv.median > 0 && f.value < fr->second * fv.median) {
        fv.failure = f.name + " " + Format(f.value) + " is " + Percent(100.0 * f.value / fv.median) + " of the median " + Format(fv.median) +
                     " of " + std::to_string(fv.peers) + " nodes (min " +
                     std::to_string(static_cast<int>(fr->second * 100 + 0.5)) + " %)";
      }
      fv.repeatable = !fv.failure.empty() && f.error.empty() && policy.speeds.count(kind);
      if (!fv.failure.empty()) v.failures.push_back(fv.failure);
      v.figures.push_back(std::move(fv));
    }
    v.healthy = v.failures.empty();
    out.push_back(std::move(v));
  }
  return out;
}

bool WorthMeasuringAgain(const NodeVerdict& verdict) {
  if (verdict.healthy || verdict.figures.empty()) return false;
  for (const auto& f : verdict.figures) {
    if (!f.failure.empty() && !f.repeatable) return false;
  }
  return true;
}

std::vector<Figure> BestOf(const std::vector<Figure>& first, const std::vector<Figure>& second) {
  std::vector<Figure> out = first;
  for (const auto& s : second) {
    auto it = std::find_if(out.begin(), out.end(), [&](const Figure& f) { return f.name == s.name; });
    if (it == out.end()) {
      out.push_back(s);
    } else if (s.error.empty() && (!it->error.empty() || s.value > it->value)) {
      *it = s;
    }
  }
  return out;
}

}  // namespace trainguard
