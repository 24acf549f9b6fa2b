// How the straggler detector's findings write figures ("12.3 %",
// "45.6 ms"): one place for straggler_detector.cc (windows, trend) and
// straggler_change_point.cc (the step-by-step test).
#pragma once

#include <cstdio>
#include <string>

namespace trainguard::straggler_text {

inline std::string Percent(double f) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %%", f * 100);
  return buf;
}

inline std::string Ms(double us) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f ms", us / 1000);
  return buf;
}

}  // namespace trainguard::straggler_text
