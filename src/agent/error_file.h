// The error file torchrun gives every rank (TORCHELASTIC_ERROR_FILE): torch's
// @record decorator writes the exception that ended the rank there, as JSON
//   {"message": {"message": "Type: text",
//                "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1700000000"}}}
// (newer writers may put a plain string in "message"). The agent reads it when
// the rank fails and sends it with the exit.
#pragma once

#include <optional>
#include <string>

#include "proto/protocol.h"

namespace trainguard {

// The error recorded in `json_text`; nullopt if it holds none. Text that is
// not torchelastic's JSON still counts: it becomes the message, cut short.
std::optional<v1::RankError> ParseErrorFile(const std::string& json_text);

// Reads and parses the file at `path` (at most 1 MiB of it); nullopt when it
// does not exist or is empty.
std::optional<v1::RankError> ReadErrorFile(const std::string& path);

}  // namespace trainguard
