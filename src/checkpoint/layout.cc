#include "checkpoint/layout.h"

#include <algorithm>

#include "checkpoint/checkpoint_format.h"

namespace trainguard {

namespace {
std::uint64_t AlignUp(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

StreamLayout ComputeLayout(const SaveRequest& request) {
  StreamLayout layout;
  layout.blob_offset = 0;
  layout.blob_nbytes = request.blob.size();
  std::uint64_t pos = layout.blob_nbytes;
  for (const auto& t : request.tensors) {
    pos = AlignUp(pos, kTensorAlignment);
    layout.tensors.push_back({t.name, t.dtype, t.shape, pos, t.nbytes});
    pos += t.nbytes;
  }
  layout.total_bytes = pos;
  return layout;
}

std::pair<std::uint64_t, std::uint64_t> MemberRange(std::uint64_t total, int members, int index) {
  std::uint64_t chunk = AlignUp((total + members - 1) / std::max(members, 1), kRangeAlignment);
  std::uint64_t lo = std::min(total, chunk * static_cast<std::uint64_t>(index));
  std::uint64_t hi = std::min(total, lo + chunk);
  return {lo, hi};
}

std::vector<Piece> PiecesIn(const StreamLayout& layout, std::uint64_t lo, std::uint64_t hi) {
  std::vector<Piece> pieces;
  auto add = [&](int entry, std::uint64_t offset, std::uint64_t nbytes) {
    std::uint64_t a = std::max(offset, lo);
    std::uint64_t b = std::min(offset + nbytes, hi);
    for (std::uint64_t p = a; p < b; p += kMaxPieceBytes) {
      pieces.push_back({entry, p, std::min(kMaxPieceBytes, b - p)});
    }
  };
  add(-1, layout.blob_offset, layout.blob_nbytes);
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    add(static_cast<int>(i), layout.tensors[i].offset, layout.tensors[i].nbytes);
  }
  return pieces;
}

}  // namespace trainguard
