// The Prometheus text exposition format (version 0.0.4), written from metric
// families built at scrape time. Debian has no C++ Prometheus client, so this
// is the one small writer: names and label names are checked, label values
// and help texts escaped, values written so that they read back exactly.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trainguard/status.h"

namespace trainguard {

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

struct MetricSample {
  MetricLabels labels;
  double value = 0;
};

struct MetricFamily {
  std::string name;  // a counter's name ends in _total
  std::string help;
  std::string type;  // "gauge" or "counter"
  std::vector<MetricSample> samples;
};

// The page. InvalidArgument naming the metric if a name, label name or type
// is not valid, if a counter's name lacks _total or its value is negative,
// if two families share a name or two samples of a family their labels.
StatusOr<std::string> PrometheusText(const std::vector<MetricFamily>& families);

// The content type Prometheus asks for.
constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace trainguard
