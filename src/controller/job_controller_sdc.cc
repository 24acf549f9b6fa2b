// Silent data corruption and numeric sentinels (docs/sdc.md): the replicas'
// fingerprints and the ranks' numeric anomalies judged, rollback bounds set,
// and a suspicion confirmed by replaying its step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "common/json_text.h"
#include "common/utf8.h"
#include "controller/job_controller.h"

namespace trainguard {

using nlohmann::json;

namespace {

std::string List(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

std::string Hex(std::uint64_t v) {
  char hex[24];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(v));
  return hex;
}

const char* NumericKindText(int kind) {
  switch (kind) {
    case 1: return "the loss is NaN/Inf";
    case 2: return "the gradient norm is NaN/Inf";
    case 3: return "the loss spiked";
    case 4: return "the gradient norm spiked";
  }
  return "a numeric anomaly";
}

}  // namespace

// A rank's device: its local rank on its node is its GPU index there (one GPU per rank, torchrun's
// convention), so the store counts per GPU, not only per node: "node1:2".
std::map<int, std::string> JobController::DevicesOf(const std::vector<int>& ranks) const {
  std::map<int, std::string> out;
  for (int r : ranks) {
    for (const auto& n : nodes_) {
      if (n.group_rank >= 0 && n.ranks.count(r)) {
        out[r] = n.node_id + ":" + std::to_string(r % std::max(config_.nproc_per_node, 1));
      }
    }
  }
  return out;
}

// The suspects' devices on `nodes` (remembered: a moved node has left the job).
std::vector<std::string> JobController::SuspectDevices(const std::vector<std::string>& nodes,
                                                       const std::vector<int>& only) const {
  std::vector<std::string> out;
  for (const auto& [r, device] : suspicion_.devices) {
    const std::string node = device.substr(0, device.rfind(':'));
    if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) continue;
    if (!only.empty() && std::find(only.begin(), only.end(), r) == only.end()) continue;
    out.push_back(device);
  }
  return out;
}

std::vector<std::string> JobController::NodesOfRanks(const std::vector<int>& ranks) const {
  std::set<std::string> nodes;
  for (int r : ranks) {
    for (const auto& n : nodes_) {
      if (n.group_rank >= 0 && n.ranks.count(r)) nodes.insert(n.node_id);
    }
  }
  return {nodes.begin(), nodes.end()};
}

void JobController::ResumeAtMost(std::int64_t step, const std::string& why) {
  if (resume_at_most_ < 0 || step < resume_at_most_) {
    resume_at_most_ = std::max<std::int64_t>(step, 0);
    resume_at_most_why_ = why;
  }
  // Every checkpoint this generation wrote is of a step it reached.
  bad_through_ = std::max(bad_through_, MaxStep());
  bound_generation_ = generation_;
}

// The bound holds until a later generation, resumed from before it, has
// committed a checkpoint at or past every step the bad generations reached:
// from then on the newest checkpoint is a good one (a bad one of the same
// step was saved again whole), and a later restart may resume from it.
void JobController::MaybeClearResumeBound() {
  if (resume_at_most_ < 0 || suspicion_.stage != 0 || generation_ <= bound_generation_ || gen_commits_.empty() ||
      gen_commits_.back() < bad_through_) {
    return;
  }
  Emit(EventKind::kResumeBoundCleared, "", -1, gen_commits_.back(),
       "checkpoint of step " + std::to_string(gen_commits_.back()) + " committed after the rollback, past step " +
           std::to_string(bad_through_) + " that the bad state reached: restarts resume from the newest again",
       json{{"resume_at_most", resume_at_most_}, {"bad_through", bad_through_}, {"committed", gen_commits_.back()}}
           .dump(-1, ' ', false, kReplaceBadUtf8));
  resume_at_most_ = -1;
  resume_at_most_why_.clear();
  bad_through_ = -1;
}

void JobController::ObserveTorchCheckpointDirs(const v1::RankStatus& status) {
  for (const std::string& dir : status.torch_checkpoint_dirs()) {
    if (dir.empty() || dir.size() > 4096 || dir.find('\n') != std::string::npos) continue;
    if (torch_checkpoint_dirs_.size() >= 16 && !torch_checkpoint_dirs_.count(dir)) continue;  // bounded
    if (torch_checkpoint_dirs_.insert(dir).second) {
      Emit(EventKind::kTorchCheckpointDir, "", status.global_rank(), -1,
           "the script writes its own torch.save checkpoints to " + dir + " (set aside on a rollback)",
           json{{"dir", dir}}.dump(-1, ' ', false, kReplaceBadUtf8));
    }
  }
}

void JobController::ObserveNumeric(const v1::RankStatus& status) {
  const int rank = status.global_rank();
  numeric_.Observe(rank, status.step(), status.losses_observed());
  if (status.has_numeric()) {
    numeric_.Flag(rank, false, status.numeric().step(), status.numeric().kind(), status.numeric().value());
  }
  if (status.has_spike()) numeric_.Flag(rank, true, status.spike().step(), status.spike().kind(), status.spike().value());
}

void JobController::CheckReplicas() {
  if (!replica_fingerprints_new_) return;
  // Learning and comparing scan the sets' members' kept fingerprints: a few
  // times a second at most, not once per heartbeat (12,500 nodes send
  // thousands a second).
  const Nanos now = clock_->MonotonicNanos();
  if (now < next_replica_check_mono_) return;
  next_replica_check_mono_ = now + 200 * kMillisecond;
  replica_fingerprints_new_ = false;
  const bool learned = !replicas_.replica_sets().empty();
  std::vector<Divergence> found = replicas_.Evaluate();
  if (!learned && !replicas_.replica_sets().empty()) {
    json sets = replicas_.replica_sets();
    Emit(EventKind::kReplicaSets, "", -1, -1,
         "parameter fingerprints: " + std::to_string(replicas_.replica_sets().size()) +
             " set(s) of replicas agree (" + sets.dump() + "), compared from now on",
         json{{"generation", generation_}, {"sets", sets}, {"agreed_through", replicas_.AgreedThrough()}}
             .dump(-1, ' ', false, kReplaceBadUtf8));
  }
  for (const Divergence& d : found) {
    if (suspicion_.stage > 0 && d.step >= suspicion_.step) continue;  // the replay's own verdict decides
    if (ReplayWentWrongEarlier(d)) {
      json values = json::object();
      for (const auto& [r, v] : d.values) values[std::to_string(r)] = Hex(v);
      ConfirmationReproduced({{"replay_fingerprints", values}, {"replay_step", d.step}});
    } else {
      ActOnDivergence(d);
    }
    if (state_ != JobState::kRunning) break;
  }
}

// The suspect step is where the first attempt's disagreement was seen, which
// can be well after where it began when fingerprints arrive late (a busy
// host, slow heartbeats). A replay of a deterministic job agrees at every
// step when nothing computes wrong, so the suspects disagreeing anywhere after
// their last agreement reproduces the fault: it is the replay's verdict, not a
// new suspicion (which restarted the replay again with no culprit).
bool JobController::ReplayWentWrongEarlier(const Divergence& d) const {
  if (suspicion_.what != SdcWhat::kDisagreement || suspicion_.stage == 0 || generation_ <= suspicion_.from_generation) {
    return false;
  }
  std::vector<int> replicas = d.replicas, suspects = suspicion_.ranks;
  std::sort(replicas.begin(), replicas.end());
  std::sort(suspects.begin(), suspects.end());
  return d.diverged.empty() && replicas == suspects && d.step > suspicion_.last_agreed_step;
}

void JobController::ActOnDivergence(const Divergence& d) {
  json values = json::object();
  for (const auto& [r, v] : d.values) values[std::to_string(r)] = Hex(v);
  const std::vector<std::string> nodes = NodesOfRanks(d.diverged);
  const bool two = d.diverged.empty();
  const std::string message =
      two ? "replicas " + List(d.replicas) + " disagree on their parameters after step " + std::to_string(d.step) +
                " (agreed after step " + std::to_string(d.last_agreed_step) +
                "): no majority names the wrong one; replaying from before the disagreement to tell"
          : "rank " + List(d.diverged) + "'s parameters diverged from " +
                std::to_string(d.replicas.size() - d.diverged.size()) + " replicas' after step " +
                std::to_string(d.step) + " (all agreed after step " + std::to_string(d.last_agreed_step) +
                "): silent data corruption suspected on its device";
  json detail = {{"step", d.step},        {"last_agreed_step", d.last_agreed_step},
                 {"replicas", d.replicas}, {"diverged", d.diverged},
                 {"fingerprints", values}, {"nodes", nodes}};
  // The state written after the last agreement may be corrupt: no checkpoint newer than it is resumed.
  ResumeAtMost(d.last_agreed_step, "the last at which the replicas' parameters agreed");
  detail["resume_at_most"] = resume_at_most_;
  detail["resume_why"] = resume_at_most_why_;
  detail["bad_through"] = bad_through_;
  if (two) {
    // No majority: the next generation replays the step on the same nodes (docs/sdc.md, "Confirmation").
    suspicion_ = SdcSuspicion{};
    suspicion_.what = SdcWhat::kDisagreement;
    suspicion_.stage = 1;
    suspicion_.step = d.step;
    suspicion_.last_agreed_step = d.last_agreed_step;
    suspicion_.ranks = d.replicas;
    suspicion_.values = d.values;
    suspicion_.nodes = NodesOfRanks(d.replicas);
    ReadSdcHistoryOffLock(suspicion_.nodes);  // which of them to move out if it reproduces (SdcHistory)
    suspicion_.devices = DevicesOf(d.replicas);
    suspicion_.from_generation = generation_;
    detail["replay"] = {{"step", d.step}, {"on", "the same nodes"}};
  }
  Finding f;
  f.kind = FindingKind::kReplicaDivergence;
  f.description = message;
  f.rank = two ? -1 : d.diverged[0];
  f.node = nodes.empty() ? "" : nodes.front();
  f.rank_step = d.step;
  f.fault_wall = clock_->WallNanos();
  f.lines.push_back({f.rank, f.node, "trainguard: " + message});
  f.detail_json = detail.dump(-1, ' ', false, kReplaceBadUtf8);
  DetectorVerdict v;
  v.rule_id = two ? "replica-disagreement" : "replica-divergence";
  v.category = "gpu_hardware";
  v.hardware = !two;
  v.persistence = two ? "unknown" : "transient";
  v.description = two ? "two replicas' parameters differ with no majority to say which is wrong; the step is "
                        "replayed to tell"
                      : "a rank's parameters differ from the majority of its data-parallel replicas' with no error "
                        "reported: its device computed wrong (silent data corruption)";
  v.evict_nodes = two ? std::vector<std::string>{} : nodes;
  f.verdict = v;
  if (!two) {
    std::vector<std::string> devices;
    for (const auto& [r, device] : DevicesOf(d.diverged)) devices.push_back(device);
    RecordSdc(nodes, detail, true, devices);
  }  // a strict majority of replicas is the confirmation
  Emit(EventKind::kReplicaDivergence, f.node, f.rank, d.step, message, f.detail_json);
  Fail(f);
}

void JobController::AnnounceVerified() {
  const Nanos now = clock_->MonotonicNanos();
  if (gen_commits_.empty() || gen_commits_.back() <= verified_commit_ || now < next_verify_mono_) return;
  next_verify_mono_ = now + kSecond;  // the scan below is over every rank
  const std::int64_t replicas = replicas_.AgreedThrough();
  if (replicas == ReplicaCheck::kUnknown) return;  // still learning which ranks are replicas
  const std::int64_t clean = numeric_.CleanThrough();
  const std::int64_t through = std::min(replicas, clean);
  if (through < 0) return;
  std::int64_t commit = -1;
  for (std::int64_t c : gen_commits_) {
    if (c <= through) commit = c;
  }
  if (commit <= verified_commit_) return;
  verified_commit_ = commit;
  v1::ControllerMessage msg;
  msg.mutable_verified()->set_step(through);
  for (auto& n : nodes_) {
    if (n.conn != 0 && n.group_rank >= 0) n.link->Send(msg);
  }
  json detail = {{"step", commit}, {"verified_through", through}, {"clean_through", clean}, {"generation", generation_}};
  detail["replicas_agreed_through"] = replicas == ReplicaCheck::kNoReplicas ? json(nullptr) : json(replicas);
  Emit(EventKind::kCheckpointVerified, "", -1, commit,
       "checkpoint of step " + std::to_string(commit) + " verified: " +
           (replicas == ReplicaCheck::kNoReplicas ? std::string("no replicas to compare")
                                                  : "the replicas agreed through step " + std::to_string(replicas)) +
           ", no NaN/Inf through step " + std::to_string(clean) + "; retention keeps it",
       detail.dump(-1, ' ', false, kReplaceBadUtf8));
}

void JobController::CheckNumeric() {
  for (const NumericFinding& n : numeric_.Evaluate(clock_->MonotonicNanos())) {
    ActOnNumeric(n);
    if (state_ != JobState::kRunning) return;
  }
}

void JobController::ActOnNumeric(const NumericFinding& n) {
  std::vector<int> ranks = n.Ranks();
  json flagged = json::object();
  int kind = 0;
  for (const auto& [r, kv] : n.flagged) {
    flagged[std::to_string(r)] = {{"kind", kv.first}, {"value", std::isfinite(kv.second) ? json(kv.second) : json(std::to_string(kv.second))}};
    if (kind == 0) kind = kv.first;
  }
  const std::vector<std::string> nodes = NodesOfRanks(ranks);
  json detail = {{"step", n.step},     {"ranks", ranks},   {"observers", n.observers}, {"all", n.all},
                 {"flagged", flagged}, {"nodes", nodes},   {"spike", n.spike},         {"generation", generation_}};
  const std::string what = NumericKindText(kind);
  const std::string where = n.all ? "on every rank that computes a loss (" + std::to_string(n.observers) + ")"
                                  : "on rank " + List(ranks) + " only (of " + std::to_string(n.observers) + ")";
  if (n.spike) {  // reported, never acted on: a spike may be the data's
    Emit(EventKind::kNumericSpike, nodes.empty() ? "" : nodes.front(), ranks.empty() ? -1 : ranks.front(), n.step,
         what + " at step " + std::to_string(n.step) + " " + where, detail.dump(-1, ' ', false, kReplaceBadUtf8));
    return;
  }
  if (suspicion_.stage > 0 && suspicion_.what == SdcWhat::kNumeric && generation_ > suspicion_.from_generation &&
      n.step == suspicion_.step && ranks == suspicion_.ranks) {
    Emit(EventKind::kNumericAnomaly, nodes.empty() ? "" : nodes.front(), ranks.front(), n.step,
         what + " at step " + std::to_string(n.step) + " " + where + " again, on replay",
         detail.dump(-1, ' ', false, kReplaceBadUtf8));
    ConfirmationReproduced(detail);
    return;
  }
  ResumeAtMost(n.step - 1, "the last before " + std::string(what).substr(4) + " at step " + std::to_string(n.step));
  detail["resume_at_most"] = resume_at_most_;
  detail["resume_why"] = resume_at_most_why_;
  detail["bad_through"] = bad_through_;
  const std::string message = what + " at step " + std::to_string(n.step) + " " + where;
  Finding f;
  f.kind = FindingKind::kNumericAnomaly;
  f.rank = n.all || ranks.empty() ? -1 : ranks.front();
  f.node = n.all || nodes.empty() ? "" : nodes.front();
  f.rank_step = n.step;
  f.fault_wall = clock_->WallNanos();
  DetectorVerdict v;
  if (n.all) {
    f.description = message + ": a numeric problem of the job (model, data or hyper-parameters), not of a node";
    v.rule_id = "numeric-all-ranks";
    v.category = "numeric";
    v.hardware = false;
    v.persistence = "persistent";
    v.action = "stop";  // restarted once from before it; the same again stops the job
    v.description = "every rank's loss or gradient norm became NaN/Inf at the same step: the job's numerics";
  } else {
    f.description = message + ": its device (or its share of the data) is suspect; replaying from before it to tell";
    suspicion_ = SdcSuspicion{};
    suspicion_.what = SdcWhat::kNumeric;
    suspicion_.stage = 1;
    suspicion_.step = n.step;
    suspicion_.ranks = ranks;
    suspicion_.nodes = nodes;
    suspicion_.devices = DevicesOf(ranks);
    suspicion_.from_generation = generation_;
    detail["replay"] = {{"step", n.step}, {"on", "the same nodes"}};
    v.rule_id = "numeric-one-rank";
    v.category = "gpu_hardware";
    v.hardware = true;
    v.persistence = "unknown";
    v.description = "NaN/Inf on some ranks only, not on their peers at the same step: a device computing wrong, "
                    "or those ranks' data; a replay tells";
  }
  f.lines.push_back({f.rank, f.node, "trainguard: " + f.description});
  f.detail_json = detail.dump(-1, ' ', false, kReplaceBadUtf8);
  f.verdict = v;
  Emit(EventKind::kNumericAnomaly, f.node, f.rank, n.step, f.description, f.detail_json);
  Fail(f);
}

void JobController::CheckConfirmation() {
  if (suspicion_.stage == 0 || generation_ <= suspicion_.from_generation || state_ != JobState::kRunning) return;
  if (suspicion_.what == SdcWhat::kNumeric) {
    if (numeric_.PassedClean(suspicion_.step, clock_->MonotonicNanos())) ConfirmationNotReproduced({});
    return;
  }
  std::map<int, std::uint64_t> replay;
  for (int r : suspicion_.ranks) {
    auto v = replicas_.ValueAt(r, suspicion_.step);
    if (!v) return;  // not every replica has replayed the step yet
    replay[r] = *v;
  }
  json values = json::object();
  for (const auto& [r, v] : replay) values[std::to_string(r)] = Hex(v);
  const std::uint64_t first = replay.begin()->second;
  const bool agree = std::all_of(replay.begin(), replay.end(), [&](const auto& e) { return e.second == first; });
  json detail = {{"replay_fingerprints", values}};
  if (!agree) {
    ConfirmationReproduced(detail);
    return;
  }
  // The replicas agree now: whoever held another value before computed wrong (if the job is
  // deterministic: a value no original replica held says it is not, and names nobody).
  std::vector<int> wrong;
  bool someone_right = false;
  for (const auto& [r, v] : suspicion_.values) {
    if (v == first) {
      someone_right = true;
    } else {
      wrong.push_back(r);
    }
  }
  if (!someone_right) wrong.clear();
  detail["agreed"] = Hex(first);
  ConfirmationNotReproduced(detail, wrong);
}

// The suspicion's step replayed cleanly: a transient fault (or, after a suspect was moved away, the moved
// node's persistent one).
void JobController::ConfirmationNotReproduced(json detail, std::vector<int> culprits) {
  if (suspicion_.what == SdcWhat::kNumeric) culprits = suspicion_.ranks;
  const bool moved = suspicion_.stage == 2;
  std::vector<std::string> nodes = moved ? suspicion_.moved : NodesOfRanks(culprits);
  if (!moved && culprits.empty()) nodes.clear();
  detail["step"] = suspicion_.step;
  detail["suspects"] = suspicion_.ranks;
  detail["what"] = SdcWhatName(suspicion_.what);
  detail["culprit_ranks"] = culprits;
  detail["nodes"] = nodes;
  detail["result"] = moved ? "confirmed" : "not reproduced";
  detail["persistence"] = moved ? "persistent" : "transient";
  std::string message =
      moved ? "confirmed: step " + std::to_string(suspicion_.step) + " replayed cleanly without node(s) " +
                  Join(nodes) + ", so their device computed wrong (persistent silent data corruption; cordoned)"
            : "not reproduced: step " + std::to_string(suspicion_.step) + " replayed on the same nodes cleanly: a "
                  "transient fault" +
                  (culprits.empty() ? std::string(" (which replica was wrong cannot be told)")
                                    : " of rank " + List(culprits) + (nodes.empty() ? "" : " on " + nodes.front()));
  RecordSdc(nodes, detail, moved, SuspectDevices(nodes, moved ? std::vector<int>{} : culprits));
  Emit(EventKind::kSdcConfirmation, nodes.empty() ? "" : nodes.front(), culprits.empty() ? -1 : culprits.front(),
       suspicion_.step, message, detail.dump(-1, ' ', false, kReplaceBadUtf8));
  suspicion_ = SdcSuspicion{};
}

// The suspicion's step went wrong again on replay. On the same nodes: persistent, and a suspect's node is moved
// out (evicted; a spare or the rest replays) to tell the device from the data. After that move: numeric, the
// anomaly follows the rank's data (the moved node is returned); a disagreement, the other replica's node.
void JobController::ConfirmationReproduced(json detail) {
  detail["step"] = suspicion_.step;
  detail["suspects"] = suspicion_.ranks;
  detail["what"] = SdcWhatName(suspicion_.what);
  detail["result"] = "reproduced";
  detail["persistence"] = "persistent";
  Finding f;
  f.kind = suspicion_.what == SdcWhat::kNumeric ? FindingKind::kNumericAnomaly : FindingKind::kReplicaDivergence;
  f.rank_step = suspicion_.step;
  f.fault_wall = clock_->WallNanos();
  DetectorVerdict v;
  v.persistence = "persistent";
  if (suspicion_.stage == 1) {
    // Which node to move: one with a confirmed corruption before, else the suspect whose node is last.
    std::vector<std::string> nodes = suspicion_.nodes;
    std::string move = nodes.empty() ? "" : nodes.back();
    for (const auto& n : nodes) {
      if (SdcHistory(n) > 0) move = n;
    }
    if (suspicion_.what == SdcWhat::kNumeric) move = nodes.empty() ? "" : nodes.front();
    suspicion_.stage = 2;
    suspicion_.moved = suspicion_.what == SdcWhat::kNumeric ? nodes : std::vector<std::string>{move};
    suspicion_.from_generation = generation_;
    detail["moved"] = suspicion_.moved;
    f.description = "step " + std::to_string(suspicion_.step) + " went wrong again on replay on the same nodes: " +
                    "moving node " + Join(suspicion_.moved) + " out to tell its device from the " +
                    (suspicion_.what == SdcWhat::kNumeric ? "data" : "other replica");
    v.rule_id = "sdc-replay-reproduced";
    v.category = "gpu_hardware";
    v.hardware = true;
    v.evict_nodes = suspicion_.moved;
    v.description = "the suspect step's fault reproduced on replay; the suspect node is moved out to tell which";
  } else if (suspicion_.what == SdcWhat::kNumeric) {
    // The NaN followed the rank to other nodes: the data's, not a device's. The moved nodes go back.
    for (const auto& n : suspicion_.moved) ReturnNode(n, "the NaN at step " + std::to_string(suspicion_.step) +
                                                                 " followed its rank to another node: not this node's");
    f.description = "step " + std::to_string(suspicion_.step) + "'s NaN/Inf follows rank " + List(suspicion_.ranks) +
                    " to another node: its data or the model's numerics, not a device";
    v.rule_id = "numeric-follows-data";
    v.category = "numeric";
    v.hardware = false;
    v.action = "stop";
    v.description = "a NaN/Inf that recurs on the same rank at the same step wherever it runs: the job's numerics";
    detail["returned"] = suspicion_.moved;
    suspicion_ = SdcSuspicion{};
  } else {
    // Without the moved node the replicas still disagree: the one that stayed computes wrong.
    std::vector<std::string> others;
    for (const auto& n : suspicion_.nodes) {
      if (std::find(suspicion_.moved.begin(), suspicion_.moved.end(), n) == suspicion_.moved.end() && NodeById(n)) {
        others.push_back(n);
      }
    }
    for (const auto& n : suspicion_.moved) ReturnNode(n, "the replicas disagreed at step " +
                                                                 std::to_string(suspicion_.step) + " without it too");
    detail["returned"] = suspicion_.moved;
    detail["nodes"] = others;
    f.description = "without node " + Join(suspicion_.moved) + " the replicas still disagree at step " + std::to_string(suspicion_.step) + ": node " +
                    (others.empty() ? "?" : Join(others)) + " computes wrong (confirmed)";
    v.rule_id = "sdc-confirmed";
    v.category = "gpu_hardware";
    v.hardware = true;
    v.evict_nodes = others;
    v.description = "confirmed by replay: the replica that disagreed on other hardware too computed wrong";
    RecordSdc(others, detail, true, SuspectDevices(others, {}));
    Emit(EventKind::kSdcConfirmation, others.empty() ? "" : others.front(), -1, suspicion_.step, "confirmed: " + f.description,
         detail.dump(-1, ' ', false, kReplaceBadUtf8));
    suspicion_ = SdcSuspicion{};
  }
  f.lines.push_back({-1, "", "trainguard: " + f.description});
  f.detail_json = detail.dump(-1, ' ', false, kReplaceBadUtf8);
  f.verdict = v;
  Fail(f);
}

void JobController::RecordSdc(const std::vector<std::string>& nodes, json evidence, bool confirmed,
                              const std::vector<std::string>& devices) {
  const Nanos now = clock_->WallNanos();
  if (!devices.empty()) evidence["devices"] = devices;
  for (const auto& n : nodes) {
    writer_->RecordNodeAction({n, now, confirmed ? std::string("sdc-confirmed") : std::string("sdc-suspect"),
                               "controller of job " + config_.job_id,
                               confirmed ? std::string("silent data corruption confirmed by replay")
                                         : std::string("silent data corruption suspected, not reproduced on replay (transient)"),
                               config_.job_id, evidence.dump(-1, ' ', false, kReplaceBadUtf8)});
  }
}

int JobController::SdcHistory(const std::string& node) const { return health_.SdcConfirmed(node); }

void JobController::ReturnNode(const std::string& node, const std::string& why) {
  const Nanos now = clock_->WallNanos();
  const std::string by = "controller of job " + config_.job_id;
  writer_->RecordNodeAction({node, now, "uncordon", by, why, config_.job_id, "{}"});
  writer_->SetNodeHealth({node, "ok", "returned: " + why, config_.job_id, now});
  Emit(EventKind::kNodeReturned, node, -1, -1, "node " + node + " uncordoned: " + why,
       json{{"reason", why}, {"by", by}}.dump(-1, ' ', false, kReplaceBadUtf8));
}

}  // namespace trainguard
