// Encoding of rank manifests and COMMIT.json (docs/checkpoint_format.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_format.h"
#include "trainguard/checkpoint.h"

namespace trainguard {

struct StoredPiece {
  std::uint64_t offset = 0;   // in the group stream
  std::uint64_t length = 0;
  std::uint64_t xxh3 = 0;
};

struct ManifestFile {
  RankManifest manifest;      // manifest.attempt/sequence name the save it belongs to
  std::string data_file;      // relative to the save's directory
  std::vector<StoredPiece> pieces;
};

std::string EncodeManifest(const ManifestFile& m);
// Errors name `origin` (the file) and the field that is wrong.
StatusOr<ManifestFile> DecodeManifest(const std::string& text, const std::string& origin);

struct CommitRecord {
  std::int64_t step = 0;
  SaveId save;                // the one save whose parts this commit binds
  int world_size = 0;
  std::int64_t created_unix_ms = 0;
  std::vector<std::uint64_t> manifest_xxh3;  // by rank
};

std::string EncodeCommit(const CommitRecord& c);
StatusOr<CommitRecord> DecodeCommit(const std::string& text, const std::string& origin);

// A rank's commit of a save to memory alone (rank-R.commit beside its data
// and manifest in the node's memory): every rank had the save whole when it
// was written; it binds this rank's manifest by its checksum.
struct MemoryCommitRecord {
  std::int64_t step = 0;
  SaveId save;
  int rank = 0;
  int world_size = 0;
  std::uint64_t manifest_xxh3 = 0;
  std::int64_t created_unix_ms = 0;  // of two saves of one step, the later wins
};

std::string EncodeMemoryCommit(const MemoryCommitRecord& c);
StatusOr<MemoryCommitRecord> DecodeMemoryCommit(const std::string& text, const std::string& origin);

}  // namespace trainguard
