#include "api/prometheus_text.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace trainguard {
namespace {

TEST(PrometheusTextTest, WritesHelpTypeAndSamplesWithEscapedLabels) {
  MetricFamily f{"tg_node_up", "1 if up\nsecond line \\ end", "gauge", {}};
  f.samples.push_back({{{"node", "a\"b\\c\nd"}}, 1});
  f.samples.push_back({{}, 0.25});
  MetricFamily c{"tg_restarts_total", "restarts", "counter", {{{{"job_id", "j"}}, 3}}};
  auto text = PrometheusText({f, c});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text,
            "# HELP tg_node_up 1 if up\\nsecond line \\\\ end\n"
            "# TYPE tg_node_up gauge\n"
            "tg_node_up{node=\"a\\\"b\\\\c\\nd\"} 1\n"
            "tg_node_up 0.25\n"
            "# HELP tg_restarts_total restarts\n"
            "# TYPE tg_restarts_total counter\n"
            "tg_restarts_total{job_id=\"j\"} 3\n");
}

TEST(PrometheusTextTest, ValuesReadBackExactlyAndSpecialValuesUseTheirNames) {
  MetricFamily f{"x", "h", "gauge", {}};
  f.samples.push_back({{{"v", "third"}}, 1.0 / 3});
  f.samples.push_back({{{"v", "nan"}}, std::nan("")});
  f.samples.push_back({{{"v", "inf"}}, std::numeric_limits<double>::infinity()});
  f.samples.push_back({{{"v", "-inf"}}, -std::numeric_limits<double>::infinity()});
  f.samples.push_back({{{"v", "big"}}, 1e300});
  auto text = PrometheusText({f});
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("x{v=\"third\"} 0.3333333333333333\n"), std::string::npos) << *text;
  EXPECT_NE(text->find("x{v=\"nan\"} NaN\n"), std::string::npos);
  EXPECT_NE(text->find("x{v=\"inf\"} +Inf\n"), std::string::npos);
  EXPECT_NE(text->find("x{v=\"-inf\"} -Inf\n"), std::string::npos);
  EXPECT_NE(text->find("x{v=\"big\"} 1e+300\n"), std::string::npos);
}

TEST(PrometheusTextTest, RefusesWhatAScraperWouldRejectNamingTheMetric) {
  auto refused = [](std::vector<MetricFamily> families, const std::string& says) {
    auto text = PrometheusText(families);
    EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument) << says;
    EXPECT_NE(text.status().message().find(says), std::string::npos) << text.status().message();
  };
  refused({{"9lives", "h", "gauge", {}}}, "9lives");
  refused({{"a-b", "h", "gauge", {}}}, "a-b");
  refused({{"a", "h", "histogram", {}}}, "unknown type");
  refused({{"a", "h", "counter", {}}}, "_total");
  refused({{"a_total", "h", "counter", {{{}, -1}}}}, "negative");
  refused({{"a", "h", "gauge", {}}, {"a", "h", "gauge", {}}}, "twice");
  refused({{"a", "h", "gauge", {{{{"__name", "x"}}, 1}}}}, "__name");
  refused({{"a", "h", "gauge", {{{{"bad-label", "x"}}, 1}}}}, "bad-label");
  refused({{"a", "h", "gauge", {{{{"l", "x"}}, 1}, {{{"l", "x"}}, 2}}}}, "same labels");
}

}  // namespace
}  // namespace trainguard
