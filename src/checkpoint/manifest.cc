#include "checkpoint/manifest.h"
#include "common/json_text.h"

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint_format.h"
#include "checkpoint/files.h"

namespace trainguard {

using nlohmann::json;

std::string EncodeManifest(const ManifestFile& f) {
  const RankManifest& m = f.manifest;
  json tensors = json::array();
  for (const auto& t : m.tensors) {
    tensors.push_back({{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape},
                       {"offset", t.offset}, {"nbytes", t.nbytes}});
  }
  json pieces = json::array();
  for (const auto& p : f.pieces) {
    pieces.push_back({{"offset", p.offset}, {"length", p.length}, {"xxh3", HexU64(p.xxh3)}});
  }
  json j = {{"format", kCheckpointFormat},
            {"version", kCheckpointVersion},
            {"step", m.step},
            {"save", {{"attempt", m.attempt}, {"sequence", m.sequence}}},
            {"rank", m.rank},
            {"world_size", m.world_size},
            {"replica_group", m.replica_group},
            {"stream",
             {{"total_bytes", m.total_bytes},
              {"blob", {{"offset", m.blob_offset}, {"nbytes", m.blob_nbytes}}},
              {"tensors", tensors}}},
            {"range", {{"lo", m.lo}, {"hi", m.hi}}},
            {"data_file", f.data_file},
            {"checksum", "xxh3-64"},
            {"pieces", pieces}};
  return j.dump(1, ' ', false, kReplaceBadUtf8) + "\n";
}

namespace {

Status CheckHeader(const json& j, const std::string& origin) {
  if (!j.is_object() || j.value("format", "") != kCheckpointFormat) {
    return InvalidArgument(origin + ": not a trainguard checkpoint file");
  }
  if (j.value("version", 0) != kCheckpointVersion) {
    return InvalidArgument(origin + ": format version " + std::to_string(j.value("version", 0)) +
                           ", this trainguard reads version " +
                           std::to_string(kCheckpointVersion));
  }
  return Status::Ok();
}

// A commit's "save": {"attempt", "sequence"}, checked. Throws on a missing
// or mistyped field (the callers turn that into their error).
StatusOr<SaveId> DecodeSaveId(const json& j, const std::string& origin) {
  SaveId save;
  save.attempt = j.at("save").at("attempt").get<std::string>();
  save.sequence = j.at("save").at("sequence").get<std::int64_t>();
  if (!IsValidAttempt(save.attempt) || save.sequence < 0) return InvalidArgument(origin + ": bad save identity");
  return save;
}

}  // namespace

StatusOr<ManifestFile> DecodeManifest(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument(origin + ": not valid JSON");
  TG_RETURN_IF_ERROR(CheckHeader(j, origin));
  try {
    ManifestFile f;
    RankManifest& m = f.manifest;
    m.step = j.at("step").get<std::int64_t>();
    m.attempt = j.at("save").at("attempt").get<std::string>();
    m.sequence = j.at("save").at("sequence").get<std::int64_t>();
    if (!IsValidAttempt(m.attempt)) return InvalidArgument(origin + ": bad save attempt");
    m.rank = j.at("rank").get<int>();
    m.world_size = j.at("world_size").get<int>();
    m.replica_group = j.at("replica_group").get<std::vector<int>>();
    const json& s = j.at("stream");
    m.total_bytes = s.at("total_bytes").get<std::uint64_t>();
    m.blob_offset = s.at("blob").at("offset").get<std::uint64_t>();
    m.blob_nbytes = s.at("blob").at("nbytes").get<std::uint64_t>();
    for (const auto& t : s.at("tensors")) {
      m.tensors.push_back({t.at("name").get<std::string>(), t.at("dtype").get<std::string>(),
                           t.at("shape").get<std::vector<std::int64_t>>(),
                           t.at("offset").get<std::uint64_t>(), t.at("nbytes").get<std::uint64_t>()});
    }
    m.lo = j.at("range").at("lo").get<std::uint64_t>();
    m.hi = j.at("range").at("hi").get<std::uint64_t>();
    f.data_file = j.at("data_file").get<std::string>();
    if (f.data_file.find('/') != std::string::npos) {
      return InvalidArgument(origin + ": data_file must be a plain file name");
    }
    for (const auto& p : j.at("pieces")) {
      f.pieces.push_back({p.at("offset").get<std::uint64_t>(), p.at("length").get<std::uint64_t>(),
                          std::stoull(p.at("xxh3").get<std::string>(), nullptr, 16)});
      const StoredPiece& last = f.pieces.back();
      if (last.offset < m.lo || last.offset + last.length > m.hi) {
        return InvalidArgument(origin + ": a piece lies outside the stored range");
      }
    }
    if (m.lo > m.hi || m.hi > m.total_bytes) return InvalidArgument(origin + ": bad range");
    return f;
  } catch (const std::exception& e) {
    return InvalidArgument(origin + ": " + e.what());
  }
}

std::string EncodeCommit(const CommitRecord& c) {
  json ranks = json::array();
  for (size_t r = 0; r < c.manifest_xxh3.size(); ++r) {
    ranks.push_back({{"rank", r},
                     {"manifest", c.save.DirName() + "/" + RankFileStem(static_cast<int>(r)) + ".json"},
                     {"xxh3", HexU64(c.manifest_xxh3[r])}});
  }
  json j = {{"format", kCheckpointFormat},
            {"version", kCheckpointVersion},
            {"step", c.step},
            {"save", {{"attempt", c.save.attempt}, {"sequence", c.save.sequence}}},
            {"world_size", c.world_size},
            {"created_unix_ms", c.created_unix_ms},
            {"ranks", ranks}};
  return j.dump(1, ' ', false, kReplaceBadUtf8) + "\n";
}

StatusOr<CommitRecord> DecodeCommit(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument(origin + ": not valid JSON");
  TG_RETURN_IF_ERROR(CheckHeader(j, origin));
  try {
    CommitRecord c;
    c.step = j.at("step").get<std::int64_t>();
    StatusOr<SaveId> save = DecodeSaveId(j, origin);
    if (!save.ok()) return save.status();
    c.save = *save;
    c.world_size = j.at("world_size").get<int>();
    c.created_unix_ms = j.value("created_unix_ms", 0LL);
    for (const auto& r : j.at("ranks")) {
      int rank = r.at("rank").get<int>();
      if (rank != static_cast<int>(c.manifest_xxh3.size()) ||
          r.at("manifest").get<std::string>() !=
              c.save.DirName() + "/" + RankFileStem(rank) + ".json") {
        return InvalidArgument(origin + ": rank entries out of order or naming another save");
      }
      c.manifest_xxh3.push_back(std::stoull(r.at("xxh3").get<std::string>(), nullptr, 16));
    }
    if (static_cast<int>(c.manifest_xxh3.size()) != c.world_size) {
      return InvalidArgument(origin + ": lists " + std::to_string(c.manifest_xxh3.size()) +
                             " ranks for world size " + std::to_string(c.world_size));
    }
    return c;
  } catch (const std::exception& e) {
    return InvalidArgument(origin + ": " + e.what());
  }
}

std::string EncodeMemoryCommit(const MemoryCommitRecord& c) {
  json j = {{"format", kCheckpointFormat},
            {"version", kCheckpointVersion},
            {"kind", "memory-commit"},
            {"step", c.step},
            {"save", {{"attempt", c.save.attempt}, {"sequence", c.save.sequence}}},
            {"rank", c.rank},
            {"world_size", c.world_size},
            {"manifest", RankFileStem(c.rank) + ".json"},
            {"xxh3", HexU64(c.manifest_xxh3)},
            {"created_unix_ms", c.created_unix_ms}};
  return j.dump(1, ' ', false, kReplaceBadUtf8) + "\n";
}

StatusOr<MemoryCommitRecord> DecodeMemoryCommit(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return InvalidArgument(origin + ": not valid JSON");
  TG_RETURN_IF_ERROR(CheckHeader(j, origin));
  if (j.value("kind", "") != "memory-commit") return InvalidArgument(origin + ": not a memory commit");
  try {
    MemoryCommitRecord c;
    c.step = j.at("step").get<std::int64_t>();
    StatusOr<SaveId> save = DecodeSaveId(j, origin);
    if (!save.ok()) return save.status();
    c.save = *save;
    c.rank = j.at("rank").get<int>();
    c.world_size = j.at("world_size").get<int>();
    if (c.rank < 0 || c.rank >= c.world_size || j.at("manifest").get<std::string>() != RankFileStem(c.rank) + ".json") {
      return InvalidArgument(origin + ": names another rank's manifest");
    }
    c.manifest_xxh3 = std::stoull(j.at("xxh3").get<std::string>(), nullptr, 16);
    c.created_unix_ms = j.value("created_unix_ms", 0LL);
    return c;
  } catch (const std::exception& e) {
    return InvalidArgument(origin + ": " + e.what());
  }
}

}  // namespace trainguard
