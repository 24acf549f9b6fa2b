#include "attribution/log_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "attribution/attribution.h"

namespace trainguard {

using nlohmann::json;

namespace {
constexpr const char* kFormat = "trainguard-attribution-model";
constexpr int kVersion = 1;
constexpr std::size_t kDeciding = 5;
}  // namespace

StatusOr<LogModel> LogModel::Parse(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument(origin + ": not valid JSON");
  if (!j.is_object() || j.value("format", "") != kFormat) {
    return InvalidArgument(origin + ": not a trainguard model file (\"format\" must be \"" + kFormat + "\")");
  }
  if (j.value("version", 0) != kVersion) {
    return InvalidArgument(origin + ": model file version " + std::to_string(j.value("version", 0)) +
                           ", this trainguard reads version " + std::to_string(kVersion));
  }
  LogModel m;
  try {
    m.version_ = j.at("trained_on").at("sha256").get<std::string>().substr(0, 12);
    m.classes_ = j.at("classes").get<std::vector<std::string>>();
    m.bias_ = j.at("bias").get<std::vector<double>>();
    m.temperature_ = j.at("temperature").get<double>();
    m.answer_from_ = j.at("answer_from").get<double>();
    for (const auto& bin : j.at("rule_calibration")) {
      m.rule_calibration_.emplace_back(bin.at(0).get<double>(), bin.at(1).get<double>());
    }
    // Optional (model files before it calibrate by bins alone).
    if (j.contains("rule_record")) {
      m.rule_record_weight_ = j.at("rule_record_weight").get<double>();
      if (!(m.rule_record_weight_ > 0)) return InvalidArgument(origin + ": \"rule_record_weight\" must be positive");
      for (const auto& [id, rec] : j.at("rule_record").items()) {
        Record r{rec.at(0).get<int>(), rec.at(1).get<int>()};
        if (r.answers < 1 || r.right < 0 || r.right > r.answers) {
          return InvalidArgument(origin + ": \"rule_record\" of '" + id +
                                 "' must be [answers >= 1, right between 0 and answers]");
        }
        m.rule_record_.emplace(id, r);
      }
    }
    const auto& cats = AttributionCategories();
    for (const auto& c : m.classes_) {
      if (c != kNoFailureClass && std::find(cats.begin(), cats.end(), c) == cats.end()) {
        return InvalidArgument(origin + ": unknown category '" + c + "' in \"classes\"");
      }
    }
    const std::size_t k = m.classes_.size();
    if (k < 2 || m.bias_.size() != k) {
      return InvalidArgument(origin + ": \"bias\" must have one value per class (" + std::to_string(k) + ")");
    }
    if (!(m.temperature_ > 0)) return InvalidArgument(origin + ": \"temperature\" must be positive");
    const json& features = j.at("features");
    if (!features.is_object()) return InvalidArgument(origin + ": \"features\" must be an object");
    m.weights_.reserve(features.size() * k);
    for (const auto& [name, w] : features.items()) {
      if (!w.is_array() || w.size() != k) {
        return InvalidArgument(origin + ": feature '" + name + "' must have one weight per class (" +
                               std::to_string(k) + ")");
      }
      m.index_.emplace(name, m.index_.size());
      for (const auto& x : w) m.weights_.push_back(x.get<float>());
    }
  } catch (const std::exception& e) {
    return InvalidArgument(origin + ": " + e.what());
  }
  return m;
}

StatusOr<LogModel> LogModel::Load(const std::string& path) {
  std::ifstream f(path);
  if (!f) return NotFound("cannot read model file " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return Parse(ss.str(), path);
}

ModelPrediction LogModel::Predict(const std::vector<std::string>& features,
                                  const std::vector<std::string>& among) const {
  const std::size_t k = classes_.size();
  std::vector<const float*> rows;
  std::vector<const std::string*> names;
  for (const auto& f : features) {
    auto it = index_.find(f);
    if (it == index_.end()) continue;
    rows.push_back(&weights_[it->second * k]);
    names.push_back(&f);
  }
  const double scale = rows.empty() ? 0 : 1.0 / std::sqrt(static_cast<double>(rows.size()));
  std::vector<double> score = bias_;
  for (const float* row : rows) {
    for (std::size_t c = 0; c < k; ++c) score[c] += row[c] * scale;
  }
  const std::size_t top = std::max_element(score.begin(), score.end()) - score.begin();
  std::size_t best = top;
  if (!among.empty()) {
    best = k;
    for (std::size_t c = 0; c < k; ++c) {
      if (std::find(among.begin(), among.end(), classes_[c]) == among.end()) continue;
      if (best == k || score[c] > score[best]) best = c;
    }
    if (best == k) return {};  // none of them is a class of the model
  }
  double sum = 0;
  for (std::size_t c = 0; c < k; ++c) sum += std::exp((score[c] - score[top]) / temperature_);
  ModelPrediction p;
  p.category = classes_[best];
  p.probability = std::exp((score[best] - score[top]) / temperature_) / sum;
  p.known_features = static_cast<int>(rows.size());
  std::vector<std::pair<double, std::size_t>> push;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i][best] > 0) push.emplace_back(rows[i][best] * scale, i);
  }
  std::sort(push.begin(), push.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  for (std::size_t i = 0; i < push.size() && i < kDeciding; ++i) {
    p.deciding.emplace_back(*names[push[i].second], push[i].first);
  }
  return p;
}

double LogModel::CalibrateRule(double raw, const std::string& rule_id) const {
  double bin = raw;
  for (const auto& [upper, accuracy] : rule_calibration_) {
    if (raw <= upper) {
      bin = accuracy;
      break;
    }
  }
  auto it = rule_id.empty() ? rule_record_.end() : rule_record_.find(rule_id);
  if (it == rule_record_.end()) return bin;
  return (it->second.right + rule_record_weight_ * bin) / (it->second.answers + rule_record_weight_);
}

}  // namespace trainguard
