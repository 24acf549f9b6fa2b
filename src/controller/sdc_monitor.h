// SdcMonitor: the controller's component for silent data corruption and
// numeric sentinels (docs/sdc.md). It owns what it learns of a generation —
// the replicas' fingerprints (replica_check.h), the ranks' NaN/Inf and spikes
// (numeric_check.h), the commits it may verify — and what outlives a
// generation: the rollback bound, the script's own checkpoint directories and
// the suspicion being confirmed by replaying its step.
//
// It decides; the job carries out. Observe and Check return typed actions
// (SdcAction), in the order they are to be carried out: events to record,
// nodes' SDC history to keep or read, a node to return, a verified step to
// announce, and at most one failure, which ends the list (the job stops).
// It asks the job for nothing but the read-only facts of SdcJob.
//
// Everything it must not forget is in its events: a controller restarted or
// a standby taking over replays them (Replay, then FinishReplay) and goes on
// where its predecessor was, the suspicion under replay included
// (`sdc_suspicion`).
//
// Not thread-safe: the controller calls it under its lock. Memory: bounded
// by the world size (replica_check.h, numeric_check.h) and 16 directories.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/clock.h"
#include "controller/event_kind.h"
#include "controller/finding.h"
#include "controller/numeric_check.h"
#include "controller/replica_check.h"
#include "proto/protocol.h"

namespace trainguard {

// What the monitor needs to know of the job, read under the job's lock.
class SdcJob {
 public:
  virtual ~SdcJob() = default;
  // The node holding `rank` in the running generation ("" when none).
  virtual std::string NodeOfRank(int rank) const = 0;
  // Whether `node` is still one of the job's.
  virtual bool HasNode(const std::string& node) const = 0;
  // The highest step any rank of the running generation reported.
  virtual std::int64_t MaxStep() const = 0;
  // Silent data corruptions confirmed on `node` in earlier jobs, as last
  // read (0 when not read yet: SdcReadHistory asks for it).
  virtual int SdcHistory(const std::string& node) const = 0;
};

// An event to record.
struct SdcEvent {
  EventKind kind;
  std::string node;
  int rank = -1;
  std::int64_t step = -1;
  std::string message;
  std::string detail_json;
};
// The nodes' SDC history in the store: `sdc-confirmed` or `sdc-suspect`.
struct SdcNodeRecord {
  std::vector<std::string> nodes;
  bool confirmed = false;
  std::string evidence_json;
};
// A node moved out to confirm a suspicion was innocent: uncordoned.
struct SdcReturnNode {
  std::string node;
  std::string why;
};
// The confirmed history of these nodes is wanted (off the lock).
struct SdcReadHistory {
  std::vector<std::string> nodes;
};
// Tell the ranks the newest verified step (retention keeps its checkpoint).
struct SdcAnnounceVerified {
  std::int64_t through = -1;
};
// The job fails with this finding (the last action of a list).
struct SdcFailure {
  Finding finding;
};
using SdcAction =
    std::variant<SdcEvent, SdcNodeRecord, SdcReturnNode, SdcReadHistory, SdcAnnounceVerified, SdcFailure>;
using SdcActions = std::vector<SdcAction>;

// What the suspicion being confirmed is about.
enum class SdcWhat { kNone, kNumeric, kDisagreement };  // NaN/Inf on some ranks; two replicas differ
const char* SdcWhatName(SdcWhat w);

class SdcMonitor {
 public:
  SdcMonitor(std::string job_id, int nproc_per_node);

  // A generation starts on `world` ranks: what was learned of the last one goes.
  void StartGeneration(std::int64_t generation, int world);
  // A rank's status from a heartbeat of the running generation: its
  // fingerprints, NaN/Inf and spikes, and where its script saves.
  void Observe(const v1::RankStatus& status, SdcActions* out);
  // A rank's newest committed checkpoint (any report of the generation).
  void ObserveCommit(std::int64_t step);
  // Judges what came in. `after_heartbeat`: also verifies commits and
  // clears a rollback bound that no longer holds (paced, a few times a
  // second at most).
  void Check(const SdcJob& job, Nanos now_mono, Nanos now_wall, bool after_heartbeat, SdcActions* out);
  // A Start's environment: the rollback bound, the script's checkpoint
  // directories, the step whose fingerprints a replay must report.
  void FillStart(v1::Start* start) const;

  // A restarted controller: each event of the job whose kind Replays, in
  // order, then FinishReplay for the running generation.
  static bool Replays(EventKind kind);
  void Replay(EventKind kind, std::int64_t generation, std::int64_t step, const nlohmann::json& detail);
  void FinishReplay(std::int64_t generation, int world);

  std::int64_t resume_at_most() const { return resume_at_most_; }
  std::int64_t verified_commit() const { return verified_commit_; }
  SdcWhat suspicion_what() const { return suspicion_.what; }
  int suspicion_stage() const { return suspicion_.stage; }
  std::int64_t suspicion_step() const { return suspicion_.step; }

 private:
  // A suspicion being confirmed by replaying its step: stage 1 on the same
  // nodes, stage 2 with the suspect node(s) moved out (evicted).
  struct Suspicion {
    SdcWhat what = SdcWhat::kNone;
    int stage = 0;  // 0: none
    std::int64_t step = -1;
    std::int64_t last_agreed_step = -1;   // disagreement: the replicas agreed through this step
    std::vector<int> ranks;               // the suspects
    std::map<int, std::uint64_t> values;  // disagreement: the original fingerprints at `step`
    std::vector<std::string> nodes;       // the suspects' nodes
    std::vector<std::string> moved;       // stage 2: the nodes moved out
    std::map<int, std::string> devices;   // the suspects' devices ("node:local rank"), for the store
    std::int64_t from_generation = -1;    // the replay is a later generation
  };
  nlohmann::json SuspicionJson() const;
  // Records the suspicion as it now is (`sdc_suspicion`): what a successor replays.
  void SaySuspicion(SdcActions* out) const;

  void CheckReplicas(const SdcJob& job, Nanos now_mono, Nanos now_wall, SdcActions* out);
  void CheckNumeric(const SdcJob& job, Nanos now_mono, Nanos now_wall, SdcActions* out);
  void CheckConfirmation(const SdcJob& job, Nanos now_mono, Nanos now_wall, SdcActions* out);
  void AnnounceVerified(Nanos now_mono, SdcActions* out);
  void MaybeClearResumeBound(SdcActions* out);
  void ActOnDivergence(const SdcJob& job, const Divergence& d, Nanos now_wall, SdcActions* out);
  void ActOnNumeric(const SdcJob& job, const NumericFinding& n, Nanos now_wall, SdcActions* out);
  // A divergence of the suspects during their replay, before the suspect step.
  bool ReplayWentWrongEarlier(const Divergence& d) const;
  void NotReproduced(const SdcJob& job, nlohmann::json detail, std::vector<int> culprits, SdcActions* out);
  void Reproduced(const SdcJob& job, nlohmann::json detail, Nanos now_wall, SdcActions* out);
  // The next generations resume from no checkpoint newer than `step`.
  void ResumeAtMost(const SdcJob& job, std::int64_t step, const std::string& why);
  void Record(const std::vector<std::string>& nodes, nlohmann::json evidence, bool confirmed,
              const std::vector<std::string>& devices, SdcActions* out) const;
  std::vector<std::string> NodesOf(const SdcJob& job, const std::vector<int>& ranks) const;
  // A rank's device: its local rank is its GPU index on its node (one GPU
  // per rank, torchrun's convention): "node1:2".
  std::map<int, std::string> DevicesOf(const SdcJob& job, const std::vector<int>& ranks) const;
  // The suspects' devices on `nodes` (remembered: a moved node has left the job).
  std::vector<std::string> SuspectDevices(const std::vector<std::string>& nodes, const std::vector<int>& only) const;
  static bool Failed(const SdcActions& out);

  const std::string job_id_;
  const int nproc_per_node_;
  std::int64_t generation_ = -1;
  ReplicaCheck replicas_;
  bool replica_fingerprints_new_ = false;
  Nanos next_replica_check_mono_ = 0;
  NumericCheck numeric_;
  std::deque<std::int64_t> gen_commits_;  // this generation's newest committed steps (at most 16)
  std::int64_t verified_commit_ = -1;     // the newest commit announced as verified
  Nanos next_verify_mono_ = 0;
  // After a divergence or a NaN/Inf, the next generations resume from a
  // checkpoint no newer than resume_at_most_ (-1: any).
  std::int64_t resume_at_most_ = -1;
  std::string resume_at_most_why_;
  std::int64_t bad_through_ = -1;       // the highest step a generation that set the bound reached
  std::int64_t bound_generation_ = -1;  // the generation that set it last
  std::set<std::string> torch_checkpoint_dirs_;  // where the script's own torch.save checkpoints go (at most 16)
  Suspicion suspicion_;
  // Replay's memory of the running generation: its replica sets.
  std::vector<std::vector<int>> replayed_sets_;
  std::int64_t replayed_agreed_ = -1;
};

}  // namespace trainguard
