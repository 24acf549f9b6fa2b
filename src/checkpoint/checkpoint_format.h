// Constants and names of the checkpoint format (docs/checkpoint_format.md).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace trainguard {

constexpr const char* kCheckpointFormat = "trainguard-checkpoint";
constexpr int kCheckpointVersion = 2;
constexpr const char* kCommitFile = "COMMIT.json";
constexpr const char* kSaveDirPrefix = "save-";          // save-<attempt>-<sequence>/
constexpr const char* kRetiringPrefix = ".retiring-";    // a step renamed away to be deleted
constexpr std::size_t kMaxAttemptLength = 64;
constexpr std::uint64_t kTensorAlignment = 64;          // stream offsets of tensors
constexpr std::uint64_t kRangeAlignment = 4096;         // replica ranges start on pages
constexpr std::uint64_t kMaxPieceBytes = 64ULL << 20;   // checksum + write unit

inline std::string StepDirName(std::int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%012lld", static_cast<long long>(step));
  return buf;
}
inline std::string RankFileStem(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank-%05d", rank);
  return buf;
}

// One save of a step: which attempt (run of the job) and which of its saves.
struct SaveId {
  std::string attempt;
  std::int64_t sequence = 0;

  bool operator==(const SaveId& o) const { return attempt == o.attempt && sequence == o.sequence; }
  bool operator!=(const SaveId& o) const { return !(*this == o); }
  // "save-<attempt>-<sequence>": the save's directory inside the step directory.
  std::string DirName() const { return kSaveDirPrefix + attempt + "-" + std::to_string(sequence); }
};

// 1-64 characters of [A-Za-z0-9_]: safe in a file name, and "-" stays the separator.
inline bool IsValidAttempt(const std::string& attempt) {
  if (attempt.empty() || attempt.size() > kMaxAttemptLength) return false;
  for (char c : attempt) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

// Parses a save directory's name; false if `name` is not one.
inline bool ParseSaveDirName(const std::string& name, SaveId* out) {
  std::string prefix = kSaveDirPrefix;
  if (name.rfind(prefix, 0) != 0) return false;
  std::size_t dash = name.rfind('-');
  if (dash == std::string::npos || dash < prefix.size()) return false;
  std::string attempt = name.substr(prefix.size(), dash - prefix.size());
  std::string seq = name.substr(dash + 1);
  if (!IsValidAttempt(attempt) || seq.empty() || seq.size() > 18) return false;
  for (char c : seq) {
    if (c < '0' || c > '9') return false;
  }
  out->attempt = attempt;
  out->sequence = std::stoll(seq);
  return out->DirName() == name;  // canonical: no leading zeros
}

}  // namespace trainguard
