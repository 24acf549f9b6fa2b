// trainguard sim: runs the simulator (sim/simulator.h) once, or over a sweep
// of parameters, and prints ETTR with where the time went.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_support.h"
#include "cli/commands.h"
#include "cli/sim_support.h"
#include "sim/sim_output.h"
#include "sim/simulator.h"

namespace trainguard {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// NAME=V1,V2,... -> (NAME, [V1, V2, ...]).
StatusOr<std::pair<std::string, std::vector<std::string>>> ParseSweep(const std::string& spec) {
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
    return InvalidArgument("--sweep " + spec + ": expected NAME=V1,V2,...");
  }
  std::vector<std::string> values;
  std::stringstream ss(spec.substr(eq + 1));
  std::string v;
  while (std::getline(ss, v, ',')) {
    if (v.empty()) return InvalidArgument("--sweep " + spec + ": an empty value");
    values.push_back(v);
  }
  return std::make_pair(spec.substr(0, eq), values);
}

struct Run {
  SimParams params;
  std::vector<std::pair<std::string, std::string>> swept;
};

}  // namespace

int SimCommand(const SimCommandOptions& o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "trainguard sim: error: %s\n", s.message().c_str());
    return 2;
  };
  auto model = ResolveFailureModel(o.model);
  if (!model.ok()) return fail(model.status());
  SimParams base;
  if (!o.params_file.empty()) {
    auto text = ReadFile(o.params_file);
    if (!text.ok()) return fail(text.status());
    Status s = base.MergeJson(*text, o.params_file);
    if (!s.ok()) return fail(s);
  }
  if (Status s = MergeSimFlags(o, *model, &base); !s.ok()) return fail(s);

  std::vector<Run> runs = {{base, {}}};
  for (const auto& spec : o.sweep) {
    auto sweep = ParseSweep(spec);
    if (!sweep.ok()) return fail(sweep.status());
    std::vector<Run> next;
    for (const Run& r : runs) {
      for (const auto& v : sweep->second) {
        Run n = r;
        json one = json::object();
        json value = json::parse(v, nullptr, false);
        one[sweep->first] = value.is_discarded() ? json(v) : value;
        if (Status s = n.params.MergeJson(one.dump(), "--sweep " + spec); !s.ok()) return fail(s);
        n.swept.push_back({sweep->first, v});
        next.push_back(n);
      }
    }
    runs = next;
  }
  for (const Run& r : runs) {
    if (Status s = r.params.Validate(); !s.ok()) return fail(InvalidArgument("parameter " + s.message()));
  }

  auto rules = LoadRulesFor({});
  if (!rules.ok()) return fail(rules.status());
  std::vector<SweepPoint> points;
  json all = json::array();
  int status = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    SimOptions opt;
    opt.rules = &*rules;
    std::optional<TemporarySimStore> temporary;
    if (o.store.empty() || runs.size() > 1) {
      temporary.emplace(static_cast<int>(i));
      opt.store_path = temporary->path();
    } else {
      opt.store_path = o.store;
    }
    opt.progress = [&](const std::string& line) { std::fprintf(stderr, "trainguard sim: %s\n", line.c_str()); };
    if (runs.size() > 1) {
      std::string what;
      for (const auto& [k, v] : runs[i].swept) what += " " + k + "=" + v;
      std::fprintf(stderr, "trainguard sim: run %zu of %zu:%s\n", i + 1, runs.size(), what.c_str());
    }
    auto result = RunSimulation(runs[i].params, *model, opt);
    temporary.reset();
    if (!result.ok()) return fail(result.status());
    if (!result->finished) status = 1;
    if (runs.size() == 1) {
      if (o.json) {
        std::printf("%s\n", SimJson(runs[i].params, *model, *result).dump(2).c_str());
      } else {
        std::fputs(SimText(runs[i].params, *model, *result).c_str(), stdout);
      }
    } else {
      json j = SimJson(runs[i].params, *model, *result);
      j["swept"] = json::object();
      for (const auto& [k, v] : runs[i].swept) j["swept"][k] = v;
      all.push_back(j);
      std::fprintf(stderr, "trainguard sim:   ETTR %.2f %%%s\n", 100 * result->report.ettr,
                   result->finished ? "" : (" (cannot finish: " + result->why_not + ")").c_str());
    }
    points.push_back({runs[i].params, runs[i].swept, std::move(result.value())});
  }
  if (runs.size() > 1) {
    std::error_code ec;
    fs::create_directories(o.out, ec);
    fs::path csv = fs::path(o.out) / "sim-sweep.csv", svg = fs::path(o.out) / "sim-sweep.svg";
    std::ofstream(csv) << SweepCsv(points);
    bool by_gpus = false;
    for (const auto& [k, v] : runs[0].swept) by_gpus = by_gpus || k == "gpus";
    if (by_gpus) std::ofstream(svg) << SweepSvg(points, "ETTR against scale, failure model " + model->name);
    if (o.json) {
      std::printf("%s\n", all.dump(2).c_str());
    } else {
      std::fputs(SweepCsv(points).c_str(), stdout);
    }
    std::fprintf(stderr, "trainguard sim: wrote %s%s\n", csv.c_str(),
                 by_gpus ? (" and " + svg.string()).c_str() : " (no plot: gpus was not swept)");
  }
  return status;
}

}  // namespace trainguard
