// How a replica group's state is laid out as one byte stream, which part of
// it each member stores, and the checksum pieces of that part
// (docs/checkpoint_format.md). Pure functions; writer and reader share them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "trainguard/checkpoint.h"

namespace trainguard {

struct StreamLayout {
  std::uint64_t blob_offset = 0;
  std::uint64_t blob_nbytes = 0;
  std::vector<TensorLayout> tensors;
  std::uint64_t total_bytes = 0;
};

// The blob first, then each tensor in request order at a 64-byte aligned offset.
StreamLayout ComputeLayout(const SaveRequest& request);

// Member `index` of `members` stores [lo, hi); ranges are page-aligned and
// together cover [0, total).
std::pair<std::uint64_t, std::uint64_t> MemberRange(std::uint64_t total, int members, int index);

// A checksummed unit: a part of one entry (blob or tensor) inside [lo, hi),
// at most kMaxPieceBytes long. `entry` is -1 for the blob, else the tensor index.
struct Piece {
  int entry = -1;
  std::uint64_t offset = 0;  // in the stream
  std::uint64_t length = 0;
};
std::vector<Piece> PiecesIn(const StreamLayout& layout, std::uint64_t lo, std::uint64_t hi);

}  // namespace trainguard
