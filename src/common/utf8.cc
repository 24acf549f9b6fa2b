#include "common/utf8.h"

namespace trainguard {

namespace {

// Length of the well-formed sequence at `i`, 0 if ill-formed (Unicode's
// table of well-formed byte sequences).
std::size_t SequenceAt(std::string_view s, std::size_t i) {
  auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;          // no overlong forms
    if (c == 0xED) hi = 0x9F;          // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;          // no overlong forms
    if (c == 0xF4) hi = 0x8F;          // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = SequenceAt(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string ValidUtf8(std::string_view s) {
  if (IsValidUtf8(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  for (std::size_t i = 0; i < s.size();) {
    std::size_t n = SequenceAt(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD for one ill-formed byte
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

double NonTextShare(std::string_view s) {
  if (s.empty()) return 0;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F) {  // printable ASCII, most of any log: no sequence to check
      ++i;
      continue;
    }
    std::size_t n = SequenceAt(s, i);
    if (n == 0) {
      ++bad, ++i;
      continue;
    }
    if (n == 1 && (c < 0x20 || c == 0x7F) && c != '\t' && c != '\r' && c != 0x1B) ++bad;
    i += n;
  }
  return static_cast<double>(bad) / static_cast<double>(s.size());
}

}  // namespace trainguard
