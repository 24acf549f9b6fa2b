#include "agent/error_file.h"

#include <cstdlib>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

namespace trainguard {

namespace {

constexpr std::size_t kMaxFileBytes = 1 << 20;
constexpr std::size_t kMaxUnparsedBytes = 4096;

std::string StringField(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

// "ValueError: text" -> "ValueError"; a type name has no spaces.
std::string TypeOf(const std::string& message) {
  std::size_t colon = message.find(':');
  std::string head = message.substr(0, colon);
  if (colon == std::string::npos || head.empty() || head.find(' ') != std::string::npos) return "";
  return head;
}

}  // namespace

std::optional<v1::RankError> ParseErrorFile(const std::string& text) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return std::nullopt;
  v1::RankError error;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) {
    error.set_message(text.substr(0, kMaxUnparsedBytes));
    return error;
  }
  const nlohmann::json& m = j["message"];
  if (m.is_string()) {
    error.set_message(m.get<std::string>());
  } else if (m.is_object()) {
    error.set_message(StringField(m, "message"));
    if (auto extra = m.find("extraInfo"); extra != m.end() && extra->is_object()) {
      error.set_traceback(StringField(*extra, "py_callstack"));
      std::string stamp = StringField(*extra, "timestamp");
      if (!stamp.empty()) error.set_timestamp_unix_s(std::strtoll(stamp.c_str(), nullptr, 10));
    }
  }
  if (error.message().empty() && error.traceback().empty()) return std::nullopt;
  error.set_type(TypeOf(error.message()));
  return error;
}

std::optional<v1::RankError> ReadErrorFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return std::nullopt;
  std::string text;
  text.resize(kMaxFileBytes);
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(f.gcount()));
  auto error = ParseErrorFile(text);
  if (error) error->set_path(path);
  return error;
}

}  // namespace trainguard
