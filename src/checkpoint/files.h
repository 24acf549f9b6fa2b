// Small POSIX file helpers of the checkpoint module; errors name the path.
#pragma once

#include <cstdint>
#include <string>

#include "trainguard/status.h"

namespace trainguard {

// Writes `content` to path.tmp, fsyncs it, renames it to `path`, fsyncs the directory.
Status WriteFileAtomic(const std::string& path, const std::string& content);
Status FsyncDir(const std::string& dir);
StatusOr<std::string> ReadWholeFile(const std::string& path);
std::string ErrnoMessage(const std::string& what, const std::string& path);
std::string HexU64(std::uint64_t v);
// 16 hex digits from std::random_device: names that must not repeat.
std::string RandomHex();

}  // namespace trainguard
