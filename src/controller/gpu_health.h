// What the GPUs' health in heartbeats says (docs/telemetry.md, "GPU
// health"): error counters that grew since the node's previous heartbeat
// (a GPU going bad, said at once), and a GPU held down on a straggler's node
// that the other nodes' GPUs are not (the straggler's cause). Pure logic.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "proto/protocol.h"

namespace trainguard {

// "GPU 2: uncorrected ECC errors 0 -> 1" for each counter that means a
// failing GPU (uncorrected ECC errors, pending and failed row remaps) and
// grew from `before` to `now`, and "GPU 2: Xid 79 (1 new)" when its Xid
// count grew and the newest is a hardware Xid (matched by index; unknown
// counts are skipped).
std::vector<std::string> GpuErrorIncreases(const std::vector<v1::GpuHealth>& before,
                                           const std::vector<v1::GpuHealth>& now);

// Why `node` computes slower, if its GPUs say so: "GPU 3 held down by
// hw_thermal_slowdown at 1410 MHz (the other nodes' GPUs: 1980 MHz)" for
// each of its GPUs with a throttle reason and an SM clock at least 5 %
// below the median of the other nodes' GPUs; "" if none.
std::string GpuSlowCause(const std::string& node, const std::map<std::string, std::vector<v1::GpuHealth>>& gpus);

}  // namespace trainguard
