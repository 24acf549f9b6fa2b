// What a rank's journal of communication operations says, as heartbeat
// fields: its groups, point-to-point counters, operations in flight and
// latest completed operations.
#pragma once

#include "common/clock.h"
#include "common/op_journal.h"
#include "proto/protocol.h"

namespace trainguard {

// Fills the journal fields of `out`; ages are relative to `now_mono`.
void DescribeJournal(const JournalSnapshot& journal, Nanos now_mono, v1::RankStatus* out);

}  // namespace trainguard
