// The learned fallback of attribution: a linear classifier over a log's
// features (log_features.h), for the logs no rule explains. It is data, like
// the rules: rules/attribution_model.json, written by
// scripts/train_attribution_model.py from the corpus's `read` split, with the
// training data's hash. Evaluating it needs nothing beyond this file.
//
// The model scores each category as bias + the sum of the weights of the
// log's known features, each scaled by 1/sqrt(number of known features);
// its probabilities are the softmax of the scores divided by a temperature
// fitted on held-out predictions, so they are calibrated.
//
// Immutable after loading; Predict() is a pure function.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "trainguard/status.h"

namespace trainguard {

// The model's class for text that tells no failure (healthy output): it
// never answers with it.
inline constexpr const char* kNoFailureClass = "none";

struct ModelPrediction {
  std::string category;  // an attribution category, or kNoFailureClass
  double probability = 0;  // calibrated
  // The known features that pushed hardest toward `category`, with their
  // share of its score, strongest first (at most 5).
  std::vector<std::pair<std::string, double>> deciding;
  int known_features = 0;  // how many of the log's features the model knows
};

class LogModel {
 public:
  // Errors name `origin` and what is wrong.
  static StatusOr<LogModel> Parse(const std::string& json_text, const std::string& origin);
  static StatusOr<LogModel> Load(const std::string& path);

  // `features`: LogFeatures() of the log. A log with no known feature gets
  // the model's prior (its biases). `among` (if not empty): the categories
  // to choose from; the probability stays the model's own over all classes.
  ModelPrediction Predict(const std::vector<std::string>& features,
                          const std::vector<std::string>& among = {}) const;

  const std::string& version() const { return version_; }  // "<sha256 of the training data, 12 hex>"
  // The calibrated probability from which the model may answer.
  double answer_from() const { return answer_from_; }
  // Rule confidences as measured: a rule's raw confidence (attribution.h)
  // maps to how often answers of about that confidence were right (its
  // bin); where the rule that answered has a track record on the held-out
  // logs (`rule_record`: how often it answered, how often rightly), the
  // record moves the bin's figure toward its own, as a beta prior of
  // `rule_record_weight` answers at the bin's figure would:
  // (right + weight * bin) / (answers + weight). A rule that is often
  // wrong on logs it was not written from says so in its confidence, a
  // rule that has held up is trusted more than its bin.
  double CalibrateRule(double raw, const std::string& rule_id = "") const;

 private:
  std::string version_;
  std::vector<std::string> classes_;
  std::vector<double> bias_;
  std::unordered_map<std::string, std::size_t> index_;  // feature -> row in weights_
  std::vector<float> weights_;                         // rows of classes_.size()
  double temperature_ = 1;
  double answer_from_ = 0.5;
  // Ascending raw-confidence upper bounds and the accuracy measured below each.
  std::vector<std::pair<double, double>> rule_calibration_;
  struct Record {
    int answers = 0;
    int right = 0;
  };
  std::unordered_map<std::string, Record> rule_record_;  // rule id -> its answers on held-out logs
  double rule_record_weight_ = 2;
};

}  // namespace trainguard
