// The job's secret: what agents show when they register and what the HTTP
// API's actions take as their bearer token. Made at random by the
// controller's command, or read from a file the operator gives.
#pragma once

#include <string>

#include "trainguard/status.h"

namespace trainguard {

// 48 hex digits from /dev/urandom.
StatusOr<std::string> NewJobSecret();
// The file's content without surrounding white space. InvalidArgument
// naming the file if it cannot be read or holds nothing.
StatusOr<std::string> ReadJobSecret(const std::string& path);
// Writes `secret` to `path` (its directory made if needed), readable and
// writable by this user only; an existing file is replaced, a link refused.
Status WriteJobSecret(const std::string& path, const std::string& secret);
// Whether `given` equals `secret` (not empty), in time independent of where
// they differ.
bool SecretMatches(const std::string& secret, const std::string& given);

}  // namespace trainguard
