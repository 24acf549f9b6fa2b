#include "diag/judge.h"

#include <algorithm>
#include <cstdio>

namespace trainguard {

namespace {

std::string Format(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), v >= 100 ? "%.0f" : v >= 1 ? "%.2f" : "%.3f", v);
  return buf;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::string FigureKind(const std::string& name) { return name.substr(0, name.find(':')); }

std::vector<NodeVerdict> JudgeNodes(const std::vector<NodeFigures>& nodes, const JudgePolicy& policy) {
  // The median of each figure (by full name: a path role is compared with
  // the same role on the other nodes) over the nodes that measured it.
  std::map<std::string, std::vector<double>> values;
  for (const auto& n : nodes) {
    for (const auto& f : n.figures) {
      if (f.error.empty()) values[f.name].push_back(f.value);
    }
  }
  std::vector<NodeVerdict> out;
  for (const auto& n : nodes) {
    NodeVerdict v;
    v.node = n.node;
    for (const auto& f : n.figures) {
      FigureVerdict fv{f, 0, 0, ""};
      const std::string kind = FigureKind(f.name);
      if (policy.shown_only.count(kind)) {
        v.figures.push_back(std::move(fv));
        continue;
      }
      const auto& peers = values[f.name];
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
      } else if (fv.median > 0 && f.value < fr->second * fv.median) {
        char pct[32];
        const double percent = 100.0 * f.value / fv.median;
        std::snprintf(pct, sizeof(pct), percent < 10 ? "%.1f %%" : "%.0f %%", percent);
        fv.failure = f.name + " " + Format(f.value) + " is " + pct + " of the median " + Format(fv.median) +
                     " of " + std::to_string(fv.peers) + " nodes (min " +
                     std::to_string(static_cast<int>(fr->second * 100 + 0.5)) + " %)";
        fv.relative = true;
      }
      if (!fv.failure.empty()) v.failures.push_back(fv.failure);
      v.figures.push_back(std::move(fv));
    }
    v.healthy = v.failures.empty();
    out.push_back(std::move(v));
  }
  return out;
}

bool FailsOnlyAgainstPeers(const NodeVerdict& verdict) {
  if (verdict.healthy || verdict.figures.empty()) return false;
  for (const auto& f : verdict.figures) {
    if (!f.failure.empty() && !f.relative) return false;
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
