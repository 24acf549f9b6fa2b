// Every kind of event the controller records (docs/events.md), in one
// table: its name in the store, when it is recorded and what its detail
// holds. Decisions are made on the enum; the name is the boundary's (the
// store, the API, the docs). docs/events.md's table is EventKindsMarkdown()
// (`trainguard events --kinds`; tests/test_docs.py checks it is current).
//
// Pure data; thread-safe (the table is immutable).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trainguard {

enum class EventKind {
  kJobCreated,
  kNodeRegistered,
  kAgentRefused,
  kGenerationStarted,
  kWaitingForNodes,
  kGroupRanksRenumbered,
  kWorldResized,
  kRanksStarted,
  kFirstStep,
  kReplicaSets,
  kReplicaDivergence,
  kNumericAnomaly,
  kNumericSpike,
  kSdcConfirmation,
  kSdcSuspicion,
  kNodeReturned,
  kCheckpointVerified,
  kResumeBoundCleared,
  kTorchCheckpointDir,
  kCheckpointCommitted,
  kCheckpointPlan,
  kRankExited,
  kFailure,
  kLogAlert,
  kStacks,
  kRankUnkillable,
  kNodeLost,
  kControllerStalled,
  kStopped,
  kRestarting,
  kDowntime,
  kAttribution,
  kDecision,
  kNodeEvicted,
  kSparePromoted,
  kDiagnosisStarted,
  kDiagnostics,
  kDiagnosisConfirming,
  kDiagnosis,
  kLinkDown,
  kLinkUp,
  kLinkFlap,
  kLinkFlapping,
  kLinkSilent,
  kStraggler,
  kGpuErrors,
  kStragglerCleared,
  kStragglerBaseline,
  kSlowTrend,
  kLayout,
  kTimingsDropped,
  kSpareLost,
  kNodeReassigned,
  kNodeSuspect,
  kControllerRestarted,
  kNodeReconnected,
  kJobResumed,
  kState,
  kJobSucceeded,
  kJobFailed,
};

struct EventKindInfo {
  EventKind kind;
  const char* name;    // in the store's `kind` column
  const char* when;    // when it is recorded (markdown)
  const char* detail;  // what its detail_json holds (markdown)
};

// Every kind, in the order the docs list them.
const std::vector<EventKindInfo>& EventKinds();
const char* EventKindName(EventKind kind);
// The kind a stored name stands for; nullopt for a name no version records
// (a newer controller's, read by an older one: skipped, not misread).
std::optional<EventKind> EventKindFromName(std::string_view name);
// docs/events.md's table: "| kind | when | detail |" and a row per kind.
std::string EventKindsMarkdown();

}  // namespace trainguard
