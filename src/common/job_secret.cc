#include "common/job_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace trainguard {

StatusOr<std::string> NewJobSecret() {
  unsigned char bytes[24];
  std::ifstream random("/dev/urandom", std::ios::binary);
  if (!random.read(reinterpret_cast<char*>(bytes), sizeof(bytes))) return IoError("cannot read /dev/urandom");
  std::string secret;
  char hex[3];
  for (unsigned char b : bytes) {
    std::snprintf(hex, sizeof(hex), "%02x", b);
    secret += hex;
  }
  return secret;
}

StatusOr<std::string> ReadJobSecret(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument("secret file " + path + " cannot be read");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return InvalidArgument("secret file " + path + " is empty");
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

Status WriteJobSecret(const std::string& path, const std::string& secret) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return IoError("cannot write the job secret to " + path + ": " + std::strerror(errno));
  const bool mode_ok = ::fchmod(fd, 0600) == 0;  // a file that was there keeps no wider mode
  const std::string line = secret + "\n";
  const bool written = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!mode_ok || !written) return IoError("cannot write the job secret to " + path);
  return Status::Ok();
}

bool SecretMatches(const std::string& secret, const std::string& given) {
  if (secret.empty() || given.size() != secret.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < secret.size(); ++i) diff |= static_cast<unsigned char>(secret[i] ^ given[i]);
  return diff == 0;
}

}  // namespace trainguard
