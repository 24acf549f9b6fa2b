// Constants of the agent <-> controller protocol (docs/protocol.md).
#pragma once

#include <cstdint>

#include "proto/trainguard.pb.h"

namespace trainguard {

// Bumped on every incompatible change of trainguard.proto.
constexpr std::uint32_t kProtocolVersion = 1;

}  // namespace trainguard
