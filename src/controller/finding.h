// Finding: what a detector reports, with its evidence. Detectors only find;
// the controller decides what happens next.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attribution/attribution.h"
#include "common/clock.h"

namespace trainguard {

struct Finding {
  std::string kind;         // "rank_failed", "hang", "node_lost"
  std::string description;  // one line, for people
  std::string node;         // where it was seen first ("" if unknown)
  int rank = -1;            // the rank it was seen on first (-1: none)
  std::int64_t rank_step = -1;  // that rank's step
  Nanos fault_wall = 0;     // when the fault happened, as well as known
  std::vector<int> capture_stacks_of;  // ranks whose stacks the agents dump before stopping
  std::vector<int> hung_ranks;         // hang: every rank without progress
  std::vector<int> roots;              // hang: the ranks the others wait for (journals)
  std::vector<LogLine> lines;          // evidence for the attribution
  std::string detail_json = "{}";      // the event's detail
  int exit_code = 0;                   // rank_failed: the rank's exit code (0 if killed)
  int signal = 0;                      // rank_failed: the signal that killed it, 0 if none
};

}  // namespace trainguard
