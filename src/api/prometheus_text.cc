#include "api/prometheus_text.h"

#include <charconv>
#include <cmath>
#include <set>

namespace trainguard {

namespace {

bool ValidName(const std::string& s, bool colons) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colons && c == ':') ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string Escape(const std::string& s, bool quotes) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quotes) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);  // shortest that reads back exactly
  return std::string(buf, end);
}

}  // namespace

StatusOr<std::string> PrometheusText(const std::vector<MetricFamily>& families) {
  std::string out;
  std::set<std::string> names;
  for (const MetricFamily& f : families) {
    const std::string what = "metric " + f.name + ": ";
    if (!ValidName(f.name, true)) return InvalidArgument("metric name \"" + f.name + "\" is not valid");
    if (!names.insert(f.name).second) return InvalidArgument(what + "named twice");
    if (f.type != "gauge" && f.type != "counter") return InvalidArgument(what + "unknown type \"" + f.type + "\"");
    const bool counter = f.type == "counter";
    if (counter && (f.name.size() < 6 || f.name.compare(f.name.size() - 6, 6, "_total") != 0)) {
      return InvalidArgument(what + "a counter's name ends in _total");
    }
    out += "# HELP " + f.name + " " + Escape(f.help, false) + "\n";
    out += "# TYPE " + f.name + " " + f.type + "\n";
    std::set<MetricLabels> seen;
    for (const MetricSample& s : f.samples) {
      if (!seen.insert(s.labels).second) return InvalidArgument(what + "two samples with the same labels");
      if (counter && !(s.value >= 0)) return InvalidArgument(what + "a counter cannot be negative or NaN");
      out += f.name;
      if (!s.labels.empty()) {
        out += "{";
        std::set<std::string> label_names;
        for (size_t i = 0; i < s.labels.size(); ++i) {
          const auto& [k, v] = s.labels[i];
          if (!ValidName(k, false) || k.rfind("__", 0) == 0) {
            return InvalidArgument(what + "label name \"" + k + "\" is not valid");
          }
          if (!label_names.insert(k).second) return InvalidArgument(what + "label " + k + " twice");
          out += (i ? "," : "") + k + "=\"" + Escape(v, true) + "\"";
        }
        out += "}";
      }
      out += " " + Value(s.value) + "\n";
    }
  }
  return out;
}

}  // namespace trainguard
