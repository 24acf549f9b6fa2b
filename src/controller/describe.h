// Wording shared by the controller, its detectors and its policy.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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
// A rank's error file as event evidence: type, message, traceback, timestamp, path.
nlohmann::json RankErrorJson(const v1::RankError& e);
// The error file as lines for the attribution: the exception ("Type: text"),
// then the traceback lines not already among `seen` (the rank's output
// usually carries the same traceback).
std::vector<std::string> RankErrorLines(const v1::RankError& e,
                                        const std::vector<std::string>& seen);

}  // namespace trainguard
