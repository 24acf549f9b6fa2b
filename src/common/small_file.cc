#include "common/small_file.h"

#include <fstream>
#include <iterator>

namespace trainguard {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace trainguard
