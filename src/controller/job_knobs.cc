#include "controller/job_knobs.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/json_text.h"

namespace trainguard {

namespace {

// "300", "0.5", "1e-06" -> the shortest text that reads back the same.
std::string Number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.15g", v);
  return buf;
}

// A knob's name, flags, kind, help and accepted range; get and put are the caller's.
Knob Base(std::string name, std::string flags, KnobKind kind, std::string help, double min = 0,
          bool min_exclusive = false, double max = 1e18) {
  Knob k;
  k.name = std::move(name);
  k.flags = std::move(flags);
  k.kind = kind;
  k.help = std::move(help);
  k.min = min;
  k.min_exclusive = min_exclusive;
  k.max = max;
  return k;
}

// A whole-number knob at `field` of a JobConfig (a member, or one nested in one).
Knob CountAt(std::string name, std::string flags, std::string help, std::function<int*(JobConfig*)> field, int min,
             int max = 1'000'000'000) {
  Knob k = Base(std::move(name), std::move(flags), KnobKind::kCount, std::move(help), min, false, max);
  k.get = [field](const JobConfig& c) { return std::to_string(*field(const_cast<JobConfig*>(&c))); };
  k.put = [field](JobConfig* c, const std::string& v) { *field(c) = std::stoi(v); };
  return k;
}

Knob Count(std::string name, std::string flags, std::string help, int JobConfig::*member, int min,
           int max = 1'000'000'000) {
  return CountAt(std::move(name), std::move(flags), std::move(help), [member](JobConfig* c) { return &(c->*member); },
                 min, max);
}

Knob Duration(std::string name, std::string flags, std::string help, Nanos JobConfig::*member, double min,
              bool min_exclusive, double max = 1e9) {
  Knob k = Base(std::move(name), std::move(flags), KnobKind::kSeconds, std::move(help), min, min_exclusive, max);
  k.get = [member](const JobConfig& c) { return Number(static_cast<double>(c.*member) / kSecond); };
  k.put = [member](JobConfig* c, const std::string& v) {
    c->*member = static_cast<Nanos>(std::llround(std::stod(v) * kSecond));
  };
  return k;
}

// A real number at a member of JobConfig, kept as the value given divided by
// `scale` (--failure-prior: failures per 1000 GPU-hours, kept per GPU-hour).
Knob Real(std::string name, std::string flags, std::string help, double JobConfig::*member, double min,
          bool min_exclusive, double max, double scale = 1) {
  Knob k = Base(std::move(name), std::move(flags), KnobKind::kRatio, std::move(help), min, min_exclusive, max);
  k.get = [member, scale](const JobConfig& c) { return Number(c.*member * scale); };
  k.put = [member, scale](JobConfig* c, const std::string& v) { c->*member = std::stod(v) / scale; };
  return k;
}

// A real number at `field` of a JobConfig (a member nested in one), kept as given.
Knob RealAt(std::string name, std::string flags, std::string help, std::function<double*(JobConfig*)> field,
            double min, bool min_exclusive, double max) {
  Knob k = Base(std::move(name), std::move(flags), KnobKind::kRatio, std::move(help), min, min_exclusive, max);
  k.get = [field](const JobConfig& c) { return Number(*field(const_cast<JobConfig*>(&c))); };
  k.put = [field](JobConfig* c, const std::string& v) { *field(c) = std::stod(v); };
  return k;
}

// A real-number knob in [0, max] at a member of JobConfig.
Knob Ratio(std::string name, std::string flags, std::string help, double JobConfig::*member, double max) {
  return Real(std::move(name), std::move(flags), std::move(help), member, 0, false, max);
}

// A choice kept as an enum: `values` in the order shown, named by `name_of`.
template <typename E>
Knob Choice(std::string name, std::string flags, std::string help, E JobConfig::*member, std::vector<E> values,
            const char* (*name_of)(E)) {
  Knob k = Base(std::move(name), std::move(flags), KnobKind::kChoice, std::move(help));
  for (E v : values) k.choices.push_back(name_of(v));
  k.get = [member, name_of](const JobConfig& c) { return std::string(name_of(c.*member)); };
  k.put = [member, values, name_of](JobConfig* c, const std::string& v) {
    for (E e : values) {
      if (v == name_of(e)) c->*member = e;
    }
  };
  return k;
}

std::vector<Knob> MakeKnobs() {
  std::vector<Knob> t;
  // Restarts.
  t.push_back(Count("max_restarts", "--max-restarts,--max_restarts",
                    "restarts of every rank after the first launch; the failure after that fails the job",
                    &JobConfig::max_restarts, 0));
  t.push_back(Count("no_progress_restarts", "--no-progress-restarts",
                    "stop after this many failures in a row that got no step further than the one before",
                    &JobConfig::no_progress_restarts, 1));
  t.push_back(Ratio("min_confidence", "--min-confidence",
                    "act on an attribution's own recommendation (evict its node, stop a deterministic failure) "
                    "only at this calibrated confidence or above (0..1); below it the job restarts",
                    &JobConfig::min_confidence, 1));
  t.push_back(Count("spares", "--spares",
                    "idle extra nodes (agents) that take the place of an evicted or lost node at the restart; "
                    "`run` starts them, a `controller` accepts that many beyond --nnodes",
                    &JobConfig::spares, 0));
  t.push_back(Duration("elastic_wait", "--elastic-wait",
                       "with --nnodes MIN:MAX and fewer than MAX nodes present (but at least MIN): seconds to "
                       "wait for more before the job starts or restarts without them; nodes nobody will bring "
                       "(evicted with no replacement) are not waited for",
                       &JobConfig::elastic_wait, 0, false));
  t.push_back(Duration("rendezvous_timeout", "--rendezvous-timeout",
                       "seconds to wait for all nodes to join (at the start and at every restart)",
                       &JobConfig::rendezvous_timeout, 0, true));
  t.push_back(Duration("reconnect_window", "--reconnect-window",
                       "seconds agents keep their ranks running and try to reconnect when the controller is gone; "
                       "a controller started again on the job's store within it takes the job back (0: agents "
                       "exit)",
                       &JobConfig::reconnect_window, 0, false, 86400));
  // Detection.
  t.push_back(Duration("heartbeat_interval", "--heartbeat-interval", "seconds between an agent's heartbeats",
                       &JobConfig::heartbeat_interval, 0, true));
  t.push_back(Count("missed_heartbeats", "--missed-heartbeats",
                    "heartbeat intervals without one before a node counts as lost", &JobConfig::missed_heartbeats,
                    1));
  {
    Knob k = Duration("hang_timeout", "--hang-timeout",
                      "seconds without a step before a rank counts as hung, or `auto`: "
                      "hang_timeout_multiple x the slowest step so far, at least --hang-timeout-floor",
                      &JobConfig::hang_timeout, 0, true);
    k.special = "auto";
    auto get = k.get;
    auto put = k.put;
    k.get = [get](const JobConfig& c) { return c.hang_timeout_auto ? std::string("auto") : get(c); };
    k.put = [put](JobConfig* c, const std::string& v) {
      c->hang_timeout_auto = v == "auto";
      if (v != "auto") put(c, v);
    };
    t.push_back(std::move(k));
  }
  t.push_back(Duration("hang_timeout_floor", "--hang-timeout-floor",
                       "with --hang-timeout auto: the shortest timeout, seconds", &JobConfig::hang_timeout_floor, 0,
                       true));
  t.push_back(Count("hang_timeout_multiple", "",
                    "with --hang-timeout auto: the timeout in slowest steps", &JobConfig::hang_timeout_multiple, 1));
  t.push_back(Duration("startup_timeout", "--startup-timeout",
                       "seconds allowed before a rank's first step (imports, data loading, rendezvous)",
                       &JobConfig::startup_timeout, 0, true));
  t.push_back(Duration("stop_grace", "--stop-grace", "seconds between SIGTERM and SIGKILL when ranks are stopped",
                       &JobConfig::stop_grace, 0, false));
  t.push_back(Duration("stop_timeout", "--stop-timeout",
                       "seconds an agent gets to report its ranks stopped before its node counts as lost",
                       &JobConfig::stop_timeout, 0, true));
  // Nodes: diagnostics, links, history.
  t.push_back(Choice("diagnose", "--diagnose",
                     "node diagnostics before the first start and after every failure (ranks stopped): "
                     "off, quick or full; failing nodes are evicted and cordoned (docs/nodes.md)",
                     &JobConfig::diagnose, {DiagnoseMode::kOff, DiagnoseMode::kQuick, DiagnoseMode::kFull},
                     DiagnoseModeName));
  t.push_back(Duration("diag_timeout", "--diag-timeout", "seconds a node gets to answer its diagnostics",
                       &JobConfig::diag_timeout, 0, true));
  t.push_back(Count("link_flaps_to_evict", "--link-flaps-to-evict",
                    "a node whose links lose their carrier this often within --link-flap-window is failed and "
                    "evicted (0: never)",
                    &JobConfig::link_flaps_to_evict, 0));
  t.push_back(Duration("link_flap_window", "--link-flap-window", "seconds over which link flaps are counted",
                       &JobConfig::link_flap_window, 0, true));
  t.push_back(Duration("suspicion_window", "",
                       "seconds a node's hardware incidents count against it in any job, unless an operator "
                       "cleared it since",
                       &JobConfig::suspicion_window, 0, true));
  // Stragglers.
  t.push_back(Choice("straggler_action", "--straggler-action",
                     "what a straggler node gets: report (an event) or evict (taken out like a failed node, a "
                     "spare takes its place) once it has been slow for --straggler-evict-windows windows",
                     &JobConfig::straggler_action, {StragglerAction::kReport, StragglerAction::kEvict},
                     StragglerActionName));
  t.push_back(RealAt("straggler_threshold", "--straggler-threshold",
                     "a node this much slower than the job's median (0.07 = 7 %) in a window of steps is slow",
                     [](JobConfig* c) { return &c->straggler.min_slowdown; }, 0, true, 100));
  t.push_back(RealAt("straggler_change_threshold", "--straggler-change-threshold",
                     "the sum of a node's newest 5 steps, each in standard deviations of its own noise and at most "
                     "3, that names it at once; noise alone crosses T with probability at most 2 x Q(T / sqrt(5)) a "
                     "step for each measure judged (11: 8.7e-7; docs/telemetry.md gives it per node-hour)",
                     [](JobConfig* c) { return &c->straggler.change_threshold; }, 0, true, 1000));
  t.push_back(CountAt("straggler_window", "--straggler-window", "steps per judged window",
                      [](JobConfig* c) { return &c->straggler.window_steps; }, 1));
  t.push_back(CountAt("straggler_evict_windows", "--straggler-evict-windows",
                      "slow windows (a slow window counts one up, a normal one one down) before evict acts; a node "
                      "is reported after 3",
                      [](JobConfig* c) { return &c->straggler.windows_to_evict; }, 2));
  // Telemetry.
  t.push_back(Duration("clock_probe_interval", "", "seconds between probes of each node's clock offset",
                       &JobConfig::clock_probe_interval, 0, true));
  {
    Knob k;
    k.name = "timing_detail_steps";
    k.help = "the newest steps whose timings keep every interval in the store (the trace)";
    k.min = 1;
    k.get = [](const JobConfig& c) { return std::to_string(c.timing_detail_steps); };
    k.put = [](JobConfig* c, const std::string& v) { c->timing_detail_steps = std::stoll(v); };
    t.push_back(std::move(k));
  }
  t.push_back(Duration("gpu_series_interval", "--gpu-series-interval",
                       "seconds between the points of each GPU's series in the store (its lowest SM clock, every "
                       "throttle reason, the latest other figures of the interval); 0: no series",
                       &JobConfig::gpu_series_interval, 0, false, 3600));
  t.push_back(Count("timing_keep_every", "",
                    "of older steps, the store keeps the per-phase totals of one in this many",
                    &JobConfig::timing_keep_every, 1));
  // Ranks.
  {
    Knob k;
    k.name = "no_instrument";
    k.flags = "--no-instrument";
    k.kind = KnobKind::kFlag;
    k.help = "launch ranks with torchrun's environment only: no automatic instrumentation (steps then come "
             "only from scripts that call trainguard.step())";
    k.get = [](const JobConfig& c) { return std::string(c.no_instrument ? "true" : "false"); };
    k.put = [](JobConfig* c, const std::string& v) { c->no_instrument = v == "true"; };
    t.push_back(std::move(k));
  }
  t.push_back(Count("memory_checkpoints", "--memory-checkpoints",
                    "committed checkpoints (trainguard.Checkpointer) each node keeps in memory per rank, restored "
                    "from there after a restart when they verify (docs/restart.md); 0: none",
                    &JobConfig::memory_checkpoints, 0, 8));
  // The checkpoint plan (docs/checkpoint_policy.md).
  {
    Knob k = Real("failure_prior", "--failure-prior",
                  "the failure rate the checkpoint plan assumes before the job has seen its own, in failures per "
                  "1000 GPU-hours (without it: the rate of the jobs that ended in this store, once they had 3 or "
                  "more failures, else Meta RSC-1's 6.50 per 1000 node-days of 8 GPUs)",
                  &JobConfig::failure_prior_per_gpu_hour, 0, true, 1e9, 1000);
    k.put = [put = k.put](JobConfig* c, const std::string& v) {
      put(c, v);
      c->failure_prior_given = true;
    };
    t.push_back(std::move(k));
  }
  t.push_back(Real("failure_prior_weight", "--failure-prior-weight",
                   "how many failures the assumed rate is worth against the job's own incidents",
                   &JobConfig::failure_prior_weight, 0, true, 1e9));
  t.push_back(Real("checkpoint_min_interval", "--checkpoint-min-interval",
                   "the checkpoint plan's shortest interval between saves to node memory, seconds",
                   &JobConfig::memory_tier_min_interval_s, 0, true, 1e9));
  {
    Knob k;
    k.name = "no_warm";
    k.flags = "--no-warm";
    k.kind = KnobKind::kFlag;
    k.help = "start every rank cold: no warm standby interpreters kept for restarts (docs/restart.md)";
    k.get = [](const JobConfig& c) { return std::string(c.no_warm ? "true" : "false"); };
    k.put = [](JobConfig* c, const std::string& v) { c->no_warm = v == "true"; };
    t.push_back(std::move(k));
  }
  return t;
}

std::string Range(const Knob& k) {
  switch (k.kind) {
    case KnobKind::kChoice: {
      std::string s;
      for (const auto& c : k.choices) s += (s.empty() ? "" : ", ") + c;
      return s;
    }
    case KnobKind::kFlag: return "given or not";
    default: break;
  }
  std::string s = (k.min_exclusive ? "> " : ">= ") + Number(k.min);
  if (k.max < 1e8) s += ", <= " + Number(k.max);
  if (!k.special.empty()) s += ", or `" + k.special + "`";
  return s;
}

}  // namespace

std::string Knob::Flag() const { return flags.substr(0, flags.find(',')); }

const std::vector<Knob>& JobKnobs() {
  static const std::vector<Knob> table = MakeKnobs();
  return table;
}

Status SetKnob(const Knob& knob, const std::string& text, JobConfig* config) {
  const std::string who = knob.flags.empty() ? knob.name : knob.Flag();
  auto refuse = [&](const std::string& why) {
    return InvalidArgument(who + ": '" + text + "' " + why + " (accepted: " + Range(knob) + ")");
  };
  switch (knob.kind) {
    case KnobKind::kFlag:
      if (text != "true" && text != "false") return refuse("is not true or false");
      knob.put(config, text);
      return Status::Ok();
    case KnobKind::kChoice:
      for (const auto& c : knob.choices) {
        if (c == text) {
          knob.put(config, text);
          return Status::Ok();
        }
      }
      return refuse("is not one of them");
    default: break;
  }
  if (!knob.special.empty() && text == knob.special) {
    knob.put(config, text);
    return Status::Ok();
  }
  double v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(v)) return refuse("is not a number");
  if (knob.kind == KnobKind::kCount && v != std::floor(v)) return refuse("is not a whole number");
  if (knob.min_exclusive ? v <= knob.min : v < knob.min) {
    return refuse(std::string("must be ") + (knob.min_exclusive ? "above " : "at least ") + Number(knob.min));
  }
  if (v > knob.max) return refuse("must be at most " + Number(knob.max));
  knob.put(config, knob.kind == KnobKind::kCount ? Number(v) : text);
  return Status::Ok();
}

std::string KnobsJson(const JobConfig& config) {
  nlohmann::json j = nlohmann::json::object();
  for (const Knob& k : JobKnobs()) {
    const std::string v = k.get(config);
    switch (k.kind) {
      case KnobKind::kChoice: j[k.name] = v; break;
      case KnobKind::kFlag: j[k.name] = v == "true"; break;
      case KnobKind::kSeconds:
        if (!k.special.empty() && v == k.special) {
          j[k.name + "_s"] = v;
        } else {
          j[k.name + "_s"] = std::stod(v);
        }
        break;
      case KnobKind::kRatio: j[k.name] = std::stod(v); break;
      case KnobKind::kCount: j[k.name] = std::stoll(v); break;
    }
  }
  return j.dump(-1, ' ', false, kReplaceBadUtf8);
}

std::string KnobsMarkdown() {
  const JobConfig defaults;
  std::string md =
      "# Reference: the job's knobs\n\n"
      "Generated from the one table of knobs (`src/controller/job_knobs.cc`) by\n"
      "`trainguard knobs > docs/reference.md`; `tests/test_docs.py` fails when this file\n"
      "is not what the table says. The options of `run`, `torchrun` and\n"
      "`controller` and the `knobs` object of the `job_created` event come from\n"
      "the same table. Knobs without a flag are fixed; they are listed because\n"
      "they set worst cases (docs/detection.md).\n\n"
      "| knob | flag | default | accepted | what it sets |\n|---|---|---|---|---|\n";
  for (const Knob& k : JobKnobs()) {
    std::string unit = k.kind == KnobKind::kSeconds ? " s" : "";
    std::string def = k.kind == KnobKind::kFlag ? "off" : k.get(defaults) + unit;
    std::string help = k.help;
    for (std::size_t at; (at = help.find('|')) != std::string::npos;) help.replace(at, 1, "/");
    md += "| `" + k.name + "` | " + (k.flags.empty() ? "—" : "`" + k.Flag() + "`") + " | " + def + " | " +
          Range(k) + " | " + help + " |\n";
  }
  return md;
}

}  // namespace trainguard
