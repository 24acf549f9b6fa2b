// Protobuf `string` fields must hold valid UTF-8: a message with a bad one
// fails to parse on the other side, which ends the agent's session. Every
// message the agent sends passes through here first.
#pragma once

#include <google/protobuf/message.h>

namespace trainguard {

// Repairs every string field of `msg`, nested and repeated ones included
// (ill-formed bytes become U+FFFD). Returns how many fields it changed.
int SanitizeStrings(google::protobuf::Message* msg);

}  // namespace trainguard
