// The root cause of a failed job, as torchrun's failure summary gives it: the
// rank the attribution blamed for the last incident, how it ended, and the
// exception from its error file (else its last lines of output).
#pragma once

#include <string>
#include <vector>

#include "store/event_store.h"

namespace trainguard {

// Lines to print, without prefix; empty when the job has no failed rank.
std::vector<std::string> RootCauseLines(const std::vector<Event>& events);

}  // namespace trainguard
