// Wording shared by the controller, its detectors and its policy.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/clock.h"
#include "proto/protocol.h"

namespace trainguard {

// "1.250 s"
std::string Seconds(Nanos d);
// "exited with code 3" / "was killed by signal 9"
std::string DescribeExit(const v1::RankStatus& r);
// " at step N", or " before any step" when the rank reported none.
std::string AtStep(std::int64_t step);
// A rank's status as event evidence.
nlohmann::json RankJson(const v1::RankStatus& r);

}  // namespace trainguard
