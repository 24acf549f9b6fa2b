#include "sim/failure_model.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace trainguard {

using nlohmann::json;

const char* FailureSignalName(FailureSignal s) {
  switch (s) {
    case FailureSignal::kCrash: return "crash";
    case FailureSignal::kHang: return "hang";
    case FailureSignal::kNodeDown: return "node_down";
    case FailureSignal::kSdc: return "sdc";
    case FailureSignal::kPlanned: return "planned";
  }
  return "?";
}

double FailureModel::PerNodeDay() const {
  double total = 0;
  for (const auto& c : categories) total += c.per_node_day;
  return total;
}

namespace {

// Field readers: each error names the origin and the field's path.
class Fields {
 public:
  Fields(const json& obj, std::string path, std::string origin)
      : obj_(obj), path_(std::move(path)), origin_(std::move(origin)) {}

  Status Error(const std::string& field, const std::string& what) const {
    return InvalidArgument(origin_ + ": " + path_ + (path_.empty() ? "" : ".") + field + ": " + what);
  }
  // Fields not in `known` are refused: a typo must not fall back to a default.
  Status OnlyKnown(const std::set<std::string>& known) const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (!known.count(it.key())) return Error(it.key(), "unknown field");
    }
    return Status::Ok();
  }
  bool Has(const std::string& f) const { return obj_.contains(f); }
  Status Number(const std::string& f, double lo, double hi, double* out, bool required = false) const {
    if (!obj_.contains(f)) return required ? Error(f, "missing") : Status::Ok();
    const json& v = obj_[f];
    if (!v.is_number() || !std::isfinite(v.get<double>())) return Error(f, "expected a number, got " + v.dump());
    double d = v.get<double>();
    if (d < lo || d > hi) {
      std::ostringstream s;
      s << "expected a number in [" << lo << ", " << hi << "], got " << v.dump();
      return Error(f, s.str());
    }
    *out = d;
    return Status::Ok();
  }
  Status Int(const std::string& f, int lo, int hi, int* out) const {
    double d = *out;
    Status s = Number(f, lo, hi, &d);
    if (!s.ok()) return s;
    if (obj_.contains(f) && d != std::floor(d)) return Error(f, "expected a whole number, got " + obj_[f].dump());
    *out = static_cast<int>(d);
    return Status::Ok();
  }
  Status String(const std::string& f, std::string* out, bool required = false) const {
    if (!obj_.contains(f)) return required ? Error(f, "missing") : Status::Ok();
    if (!obj_[f].is_string()) return Error(f, "expected a string, got " + obj_[f].dump());
    *out = obj_[f].get<std::string>();
    if (required && out->empty()) return Error(f, "must not be empty");
    return Status::Ok();
  }
  Status Bool(const std::string& f, bool* out) const {
    if (!obj_.contains(f)) return Status::Ok();
    if (!obj_[f].is_boolean()) return Error(f, "expected true or false, got " + obj_[f].dump());
    *out = obj_[f].get<bool>();
    return Status::Ok();
  }
  Status Strings(const std::string& f, std::vector<std::string>* out) const {
    if (!obj_.contains(f)) return Status::Ok();
    if (!obj_[f].is_array()) return Error(f, "expected a list of strings");
    for (const auto& v : obj_[f]) {
      if (!v.is_string()) return Error(f, "expected a list of strings, got " + v.dump());
      out->push_back(v.get<std::string>());
    }
    return Status::Ok();
  }
  Status Object(const std::string& f, Fields* out) const {
    if (!obj_[f].is_object()) return Error(f, "expected an object, got " + obj_[f].dump());
    *out = Fields(obj_[f], path_ + (path_.empty() ? "" : ".") + f, origin_);
    return Status::Ok();
  }
  const json& Raw(const std::string& f) const { return obj_[f]; }
  const std::string& path() const { return path_; }

 private:
  json obj_;
  std::string path_;
  std::string origin_;
};

StatusOr<FailureSignal> SignalNamed(const std::string& name) {
  for (FailureSignal s : {FailureSignal::kCrash, FailureSignal::kHang, FailureSignal::kNodeDown, FailureSignal::kSdc,
                          FailureSignal::kPlanned}) {
    if (name == FailureSignalName(s)) return s;
  }
  return InvalidArgument("");
}

Status ParseCategory(const Fields& f, double basis_node_days, FailureCategory* c) {
  TG_RETURN_IF_ERROR(f.OnlyKnown({"name", "label", "hardware", "count", "per_1000_node_days", "mtbf_node_hours",
                                  "signals", "persistent", "repair_hours", "latency_hours", "exit_code",
                                  "term_signal", "log_tail", "kernel_lines", "notes"}));
  TG_RETURN_IF_ERROR(f.String("name", &c->name, true));
  c->label = c->name;
  TG_RETURN_IF_ERROR(f.String("label", &c->label));
  TG_RETURN_IF_ERROR(f.Bool("hardware", &c->hardware));
  int forms = f.Has("count") + f.Has("per_1000_node_days") + f.Has("mtbf_node_hours");
  if (forms != 1) {
    return f.Error("count", "give exactly one of count, per_1000_node_days and mtbf_node_hours (" +
                                std::to_string(forms) + " given)");
  }
  if (f.Has("count")) {
    if (basis_node_days <= 0) return f.Error("count", "a count needs the model's basis (gpus and days)");
    double count = 0;
    TG_RETURN_IF_ERROR(f.Number("count", 0, 1e9, &count));
    c->per_node_day = count / basis_node_days;
  } else if (f.Has("per_1000_node_days")) {
    double r = 0;
    TG_RETURN_IF_ERROR(f.Number("per_1000_node_days", 0, 1e6, &r));
    c->per_node_day = r / 1000;
  } else {
    double h = 0;
    TG_RETURN_IF_ERROR(f.Number("mtbf_node_hours", 1e-3, 1e12, &h));
    c->per_node_day = 24 / h;
  }
  if (!f.Has("signals")) return f.Error("signals", "missing (e.g. {\"crash\": 1})");
  const json& sig = f.Raw("signals");
  if (!sig.is_object() || sig.empty()) return f.Error("signals", "expected an object of signal: weight");
  double total = 0;
  for (auto it = sig.begin(); it != sig.end(); ++it) {
    auto s = SignalNamed(it.key());
    if (!s.ok()) {
      return f.Error("signals." + it.key(), "unknown signal (crash, hang, node_down, sdc or planned)");
    }
    if (!it.value().is_number() || it.value().get<double>() < 0) {
      return f.Error("signals." + it.key(), "expected a weight >= 0, got " + it.value().dump());
    }
    c->signals.push_back({*s, it.value().get<double>()});
    total += it.value().get<double>();
  }
  if (total <= 0) return f.Error("signals", "the weights add up to 0");
  for (auto& [s, w] : c->signals) w /= total;
  TG_RETURN_IF_ERROR(f.Number("persistent", 0, 1, &c->persistent));
  TG_RETURN_IF_ERROR(f.Number("repair_hours", 0, 1e6, &c->repair_hours));
  TG_RETURN_IF_ERROR(f.Number("latency_hours", 0, 1e6, &c->latency_hours));
  TG_RETURN_IF_ERROR(f.Int("exit_code", 0, 255, &c->exit_code));
  TG_RETURN_IF_ERROR(f.Int("term_signal", 0, 64, &c->signal));
  TG_RETURN_IF_ERROR(f.Strings("log_tail", &c->log_tail));
  TG_RETURN_IF_ERROR(f.Strings("kernel_lines", &c->kernel_lines));
  for (const auto& [s, w] : c->signals) {
    if ((s == FailureSignal::kCrash || s == FailureSignal::kSdc) && w > 0 && c->exit_code == 0 && c->signal == 0) {
      return f.Error("exit_code", "a crash needs a non-zero exit_code or a term_signal");
    }
  }
  return Status::Ok();
}

// [low, high], both within [lo, hi], low <= high.
Status Range(const Fields& f, const std::string& field, double lo, double hi, double* low, double* high) {
  if (!f.Has(field)) return Status::Ok();
  const json& v = f.Raw(field);
  if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number()) {
    return f.Error(field, "expected [low, high], got " + v.dump());
  }
  const double a = v[0].get<double>(), b = v[1].get<double>();
  if (!(a >= lo && b <= hi && a <= b)) {
    std::ostringstream s;
    s << "expected " << lo << " <= low <= high <= " << hi << ", got " << v.dump();
    return f.Error(field, s.str());
  }
  *low = a;
  *high = b;
  return Status::Ok();
}

Status ParseStragglers(const Fields& f, StragglerModel* m) {
  TG_RETURN_IF_ERROR(f.OnlyKnown({"per_1000_node_days", "slowdown", "minutes", "on_node", "source", "notes"}));
  double r = 0;
  TG_RETURN_IF_ERROR(f.Number("per_1000_node_days", 0, 1e6, &r, true));
  m->per_node_day = r / 1000;
  TG_RETURN_IF_ERROR(Range(f, "slowdown", 1.001, 100, &m->slowdown_min, &m->slowdown_max));
  TG_RETURN_IF_ERROR(Range(f, "minutes", 1e-3, 1e6, &m->minutes_min, &m->minutes_max));
  TG_RETURN_IF_ERROR(f.Number("on_node", 0, 1, &m->on_node));
  TG_RETURN_IF_ERROR(f.String("source", &m->source));
  return Status::Ok();
}

}  // namespace

StatusOr<FailureModel> FailureModel::Parse(const std::string& text, const std::string& origin) {
  json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded()) return InvalidArgument(origin + ": not valid JSON");
  if (!doc.is_object()) return InvalidArgument(origin + ": expected a JSON object");
  Fields top(doc, "", origin);
  TG_RETURN_IF_ERROR(top.OnlyKnown({"name", "source", "notes", "basis", "gpus_per_node", "bad_nodes", "categories",
                                    "stragglers"}));
  FailureModel m;
  TG_RETURN_IF_ERROR(top.String("name", &m.name, true));
  TG_RETURN_IF_ERROR(top.String("source", &m.source, true));
  TG_RETURN_IF_ERROR(top.Int("gpus_per_node", 1, 1024, &m.gpus_per_node));
  double basis_node_days = 0;
  if (top.Has("basis")) {
    Fields b(json::object(), "", origin);
    TG_RETURN_IF_ERROR(top.Object("basis", &b));
    TG_RETURN_IF_ERROR(b.OnlyKnown({"gpus", "days", "notes"}));
    double gpus = 0, days = 0;
    TG_RETURN_IF_ERROR(b.Number("gpus", 1, 1e9, &gpus, true));
    TG_RETURN_IF_ERROR(b.Number("days", 1e-6, 1e6, &days, true));
    basis_node_days = gpus / m.gpus_per_node * days;
  }
  if (top.Has("bad_nodes")) {
    Fields b(json::object(), "", origin);
    TG_RETURN_IF_ERROR(top.Object("bad_nodes", &b));
    TG_RETURN_IF_ERROR(b.OnlyKnown({"fraction", "rate_multiplier", "notes"}));
    TG_RETURN_IF_ERROR(b.Number("fraction", 0, 1, &m.bad_node_fraction, true));
    TG_RETURN_IF_ERROR(b.Number("rate_multiplier", 1, 1e6, &m.bad_node_multiplier, true));
  }
  if (top.Has("stragglers")) {
    Fields st(json::object(), "", origin);
    TG_RETURN_IF_ERROR(top.Object("stragglers", &st));
    TG_RETURN_IF_ERROR(ParseStragglers(st, &m.stragglers));
  }
  if (!top.Has("categories") || !doc["categories"].is_array() || doc["categories"].empty()) {
    return top.Error("categories", "expected a non-empty list");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < doc["categories"].size(); ++i) {
    const json& cj = doc["categories"][i];
    std::string path = "categories[" + std::to_string(i) + "]";
    if (!cj.is_object()) return InvalidArgument(origin + ": " + path + ": expected an object");
    FailureCategory c;
    TG_RETURN_IF_ERROR(ParseCategory(Fields(cj, path, origin), basis_node_days, &c));
    if (!names.insert(c.name).second) {
      return InvalidArgument(origin + ": " + path + ".name: \"" + c.name + "\" is given twice");
    }
    m.categories.push_back(std::move(c));
  }
  if (m.PerNodeDay() <= 0) return top.Error("categories", "every rate is 0: nothing would ever fail");
  return m;
}

StatusOr<FailureModel> FailureModel::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("cannot read failure model " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return Parse(ss.str(), path);
}

}  // namespace trainguard
