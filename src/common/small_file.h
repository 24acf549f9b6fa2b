// Reading a small text file whole: /proc and /sys entries, cgroup files.
#pragma once

#include <string>

namespace trainguard {

// The file's contents, or "" when it cannot be read (gone, no permission).
std::string ReadSmallFile(const std::string& path);

}  // namespace trainguard
