// Constants of the checkpoint format (docs/checkpoint_format.md).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace trainguard {

constexpr const char* kCheckpointFormat = "trainguard-checkpoint";
constexpr int kCheckpointVersion = 1;
constexpr const char* kCommitFile = "COMMIT.json";
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

}  // namespace trainguard
