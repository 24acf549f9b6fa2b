// JSON text of values that may hold text from outside (rank output, command
// lines, file names): ill-formed UTF-8 becomes U+FFFD instead of throwing.
// Use as `j.dump(kJsonIndent, ' ', false, kReplaceBadUtf8)`.
#pragma once

#include <nlohmann/json.hpp>

namespace trainguard {

inline constexpr auto kReplaceBadUtf8 = nlohmann::json::error_handler_t::replace;

}  // namespace trainguard
