// Text from ranks and kernels is bytes: progress bars cut in the middle of a
// character, binary dumps, other encodings. Protobuf string fields and JSON
// must be valid UTF-8, so such text is repaired before it is sent or stored.
#pragma once

#include <string>
#include <string_view>

namespace trainguard {

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code
// points above U+10FFFF).
bool IsValidUtf8(std::string_view s);

// `s` with every ill-formed sequence replaced by U+FFFD; `s` itself when valid.
std::string ValidUtf8(std::string_view s);

// The share of `s` (0..1) that is not text: bytes of ill-formed sequences
// and control characters other than tab, carriage return and escape.
double NonTextShare(std::string_view s);

}  // namespace trainguard
