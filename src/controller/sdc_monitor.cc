// SdcMonitor (sdc_monitor.h): the replicas' fingerprints and the ranks'
// numeric anomalies judged, rollback bounds set, and a suspicion confirmed by
// replaying its step (docs/sdc.md). What a successor rebuilds from the
// events: sdc_monitor_replay.cc.
#include "controller/sdc_monitor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "common/json_text.h"

namespace trainguard {

using nlohmann::json;

namespace {

// At most 16 ranks, then how many in all: a line, not a world.
std::string List(const std::vector<int>& ranks) {
  constexpr std::size_t kShown = 16;
  std::string out;
  for (std::size_t i = 0; i < ranks.size() && i < kShown; ++i) out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
  if (ranks.size() > kShown) out += ", ... (" + std::to_string(ranks.size()) + " ranks)";
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

std::string Dump(const json& j) { return j.dump(-1, ' ', false, kReplaceBadUtf8); }

SdcEvent Said(EventKind kind, std::string node, int rank, std::int64_t step, std::string message, const json& detail) {
  return SdcEvent{kind, std::move(node), rank, step, std::move(message), Dump(detail)};
}

}  // namespace

const char* SdcWhatName(SdcWhat w) {
  return w == SdcWhat::kNumeric ? "numeric" : w == SdcWhat::kDisagreement ? "disagreement" : "";
}

SdcMonitor::SdcMonitor(std::string job_id, int nproc_per_node)
    : job_id_(std::move(job_id)), nproc_per_node_(std::max(nproc_per_node, 1)) {}

void SdcMonitor::StartGeneration(std::int64_t generation, int world) {
  generation_ = generation;
  replicas_.Reset(world);
  numeric_.Reset(world);
  gen_commits_.clear();
  replica_fingerprints_new_ = false;
}

void SdcMonitor::Observe(const v1::RankStatus& status, SdcActions* out) {
  const int rank = status.global_rank();
  for (const v1::Fingerprint& f : status.fingerprints()) {
    replicas_.Add(rank, f.step(), f.value());
    replica_fingerprints_new_ = true;
  }
  numeric_.Observe(rank, status.step(), status.losses_observed());
  if (status.has_numeric()) {
    numeric_.Flag(rank, false, status.numeric().step(), status.numeric().kind(), status.numeric().value());
  }
  if (status.has_spike()) numeric_.Flag(rank, true, status.spike().step(), status.spike().kind(), status.spike().value());
  for (const std::string& dir : status.torch_checkpoint_dirs()) {
    if (dir.empty() || dir.size() > 4096 || dir.find('\n') != std::string::npos) continue;
    if (torch_checkpoint_dirs_.size() >= 16 && !torch_checkpoint_dirs_.count(dir)) continue;  // bounded
    if (torch_checkpoint_dirs_.insert(dir).second) {
      out->push_back(Said(EventKind::kTorchCheckpointDir, "", rank, -1,
                          "the script writes its own torch.save checkpoints to " + dir + " (set aside on a rollback)",
                          json{{"dir", dir}}));
    }
  }
}

void SdcMonitor::ObserveCommit(std::int64_t step) {
  if (step >= 0 && (gen_commits_.empty() || step > gen_commits_.back())) {
    gen_commits_.push_back(step);
    if (gen_commits_.size() > 16) gen_commits_.pop_front();
  }
}

bool SdcMonitor::Failed(const SdcActions& out) {
  return std::any_of(out.begin(), out.end(), [](const SdcAction& a) { return std::holds_alternative<SdcFailure>(a); });
}

void SdcMonitor::Check(const SdcJob& job, Nanos now_mono, Nanos now_wall, bool after_heartbeat, SdcActions* out) {
  CheckReplicas(job, now_mono, now_wall, out);
  if (!Failed(*out)) CheckNumeric(job, now_mono, now_wall, out);
  if (!Failed(*out)) CheckConfirmation(job, now_mono, now_wall, out);
  if (!after_heartbeat || Failed(*out)) return;
  AnnounceVerified(now_mono, out);
  MaybeClearResumeBound(out);
}

std::vector<std::string> SdcMonitor::NodesOf(const SdcJob& job, const std::vector<int>& ranks) const {
  std::set<std::string> nodes;
  for (int r : ranks) {
    if (std::string n = job.NodeOfRank(r); !n.empty()) nodes.insert(std::move(n));
  }
  return {nodes.begin(), nodes.end()};
}

std::map<int, std::string> SdcMonitor::DevicesOf(const SdcJob& job, const std::vector<int>& ranks) const {
  std::map<int, std::string> out;
  for (int r : ranks) {
    if (std::string n = job.NodeOfRank(r); !n.empty()) out[r] = n + ":" + std::to_string(r % nproc_per_node_);
  }
  return out;
}

std::vector<std::string> SdcMonitor::SuspectDevices(const std::vector<std::string>& nodes,
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

void SdcMonitor::ResumeAtMost(const SdcJob& job, std::int64_t step, const std::string& why) {
  if (resume_at_most_ < 0 || step < resume_at_most_) {
    resume_at_most_ = std::max<std::int64_t>(step, 0);
    resume_at_most_why_ = why;
  }
  // Every checkpoint this generation wrote is of a step it reached.
  bad_through_ = std::max(bad_through_, job.MaxStep());
  bound_generation_ = generation_;
}

// The bound holds until a later generation, resumed from before it, has
// committed a checkpoint at or past every step the bad generations reached:
// from then on the newest checkpoint is a good one (a bad one of the same
// step was saved again whole), and a later restart may resume from it.
void SdcMonitor::MaybeClearResumeBound(SdcActions* out) {
  if (resume_at_most_ < 0 || suspicion_.stage != 0 || generation_ <= bound_generation_ || gen_commits_.empty() ||
      gen_commits_.back() < bad_through_) {
    return;
  }
  out->push_back(Said(EventKind::kResumeBoundCleared, "", -1, gen_commits_.back(),
                      "checkpoint of step " + std::to_string(gen_commits_.back()) +
                          " committed after the rollback, past step " + std::to_string(bad_through_) +
                          " that the bad state reached: restarts resume from the newest again",
                      json{{"resume_at_most", resume_at_most_},
                           {"bad_through", bad_through_},
                           {"committed", gen_commits_.back()}}));
  resume_at_most_ = -1;
  resume_at_most_why_.clear();
  bad_through_ = -1;
}

void SdcMonitor::CheckReplicas(const SdcJob& job, Nanos now_mono, Nanos now_wall, SdcActions* out) {
  if (!replica_fingerprints_new_) return;
  // Learning and comparing scan the sets' members' kept fingerprints: a few
  // times a second at most, not once per heartbeat (12,500 nodes send
  // thousands a second).
  if (now_mono < next_replica_check_mono_) return;
  next_replica_check_mono_ = now_mono + 200 * kMillisecond;
  replica_fingerprints_new_ = false;
  const bool learned = !replicas_.replica_sets().empty();
  std::vector<Divergence> found = replicas_.Evaluate();
  if (!learned && !replicas_.replica_sets().empty()) {
    const auto& learned_sets = replicas_.replica_sets();
    json sets = ReplicaSetsJson(learned_sets);
    std::string sizes = std::to_string(learned_sets.front().size());
    for (const auto& set : learned_sets) {
      if (std::to_string(set.size()) != sizes) sizes = "different numbers of";
    }
    out->push_back(Said(EventKind::kReplicaSets, "", -1, -1,
                        "parameter fingerprints: " + std::to_string(learned_sets.size()) + " set(s) of " + sizes +
                            " replicas agree (the first: ranks " + List(learned_sets.front()) +
                            "), compared from now on",
                        json{{"generation", generation_}, {"sets", sets}, {"agreed_through", replicas_.AgreedThrough()}}));
  }
  for (const Divergence& d : found) {
    if (suspicion_.stage > 0 && d.step >= suspicion_.step) continue;  // the replay's own verdict decides
    if (ReplayWentWrongEarlier(d)) {
      json values = json::object();
      for (const auto& [r, v] : d.values) values[std::to_string(r)] = Hex(v);
      Reproduced(job, {{"replay_fingerprints", values}, {"replay_step", d.step}}, now_wall, out);
    } else {
      ActOnDivergence(job, d, now_wall, out);
    }
    return;  // either fails the job
  }
}

// The suspect step is where the first attempt's disagreement was seen, which
// can be well after where it began when fingerprints arrive late (a busy
// host, slow heartbeats). A replay of a deterministic job agrees at every
// step when nothing computes wrong, so the suspects disagreeing anywhere after
// their last agreement reproduces the fault: it is the replay's verdict, not a
// new suspicion (which restarted the replay again with no culprit).
bool SdcMonitor::ReplayWentWrongEarlier(const Divergence& d) const {
  if (suspicion_.what != SdcWhat::kDisagreement || suspicion_.stage == 0 || generation_ <= suspicion_.from_generation) {
    return false;
  }
  std::vector<int> replicas = d.replicas, suspects = suspicion_.ranks;
  std::sort(replicas.begin(), replicas.end());
  std::sort(suspects.begin(), suspects.end());
  return d.diverged.empty() && replicas == suspects && d.step > suspicion_.last_agreed_step;
}

void SdcMonitor::ActOnDivergence(const SdcJob& job, const Divergence& d, Nanos now_wall, SdcActions* out) {
  // The diverged ranks' fingerprints and a few of the others' (a set can
  // have thousands of members).
  json values = json::object();
  std::size_t others = 0;
  for (const auto& [r, v] : d.values) {
    const bool diverged = std::find(d.diverged.begin(), d.diverged.end(), r) != d.diverged.end();
    if (diverged || d.diverged.empty() || others++ < 8) values[std::to_string(r)] = Hex(v);
    if (values.size() >= 64) break;
  }
  const std::vector<std::string> nodes = NodesOf(job, d.diverged);
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
                 {"replicas", ReplicaSetJson(d.replicas)}, {"replicas_total", d.replicas.size()},
                 {"diverged", d.diverged},
                 {"fingerprints", values}, {"nodes", nodes}};
  // The state written after the last agreement may be corrupt: no checkpoint newer than it is resumed.
  ResumeAtMost(job, d.last_agreed_step, "the last at which the replicas' parameters agreed");
  detail["resume_at_most"] = resume_at_most_;
  detail["resume_why"] = resume_at_most_why_;
  detail["bad_through"] = bad_through_;
  if (two) {
    // No majority: the next generation replays the step on the same nodes (docs/sdc.md, "Confirmation").
    suspicion_ = Suspicion{};
    suspicion_.what = SdcWhat::kDisagreement;
    suspicion_.stage = 1;
    suspicion_.step = d.step;
    suspicion_.last_agreed_step = d.last_agreed_step;
    suspicion_.ranks = d.replicas;
    suspicion_.values = d.values;
    suspicion_.nodes = NodesOf(job, d.replicas);
    suspicion_.devices = DevicesOf(job, d.replicas);
    suspicion_.from_generation = generation_;
    out->push_back(SdcReadHistory{suspicion_.nodes});  // which of them to move out if it reproduces
    detail["replay"] = {{"step", d.step}, {"on", "the same nodes"}};
  }
  Finding f;
  f.kind = FindingKind::kReplicaDivergence;
  f.description = message;
  f.rank = two ? -1 : d.diverged[0];
  f.node = nodes.empty() ? "" : nodes.front();
  f.rank_step = d.step;
  f.fault_wall = now_wall;
  f.lines.push_back({f.rank, f.node, "trainguard: " + message});
  f.detail_json = Dump(detail);
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
  if (!two) {  // a strict majority of replicas is the confirmation
    std::vector<std::string> devices;
    for (const auto& [r, device] : DevicesOf(job, d.diverged)) devices.push_back(device);
    Record(nodes, detail, true, devices, out);
  }
  out->push_back(SdcEvent{EventKind::kReplicaDivergence, f.node, f.rank, d.step, message, f.detail_json});
  if (two) SaySuspicion(out);
  out->push_back(SdcFailure{std::move(f)});
}

void SdcMonitor::AnnounceVerified(Nanos now_mono, SdcActions* out) {
  if (gen_commits_.empty() || gen_commits_.back() <= verified_commit_ || now_mono < next_verify_mono_) return;
  next_verify_mono_ = now_mono + kSecond;  // the scan below is over every rank
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
  out->push_back(SdcAnnounceVerified{through});
  json detail = {{"step", commit}, {"verified_through", through}, {"clean_through", clean}, {"generation", generation_}};
  detail["replicas_agreed_through"] = replicas == ReplicaCheck::kNoReplicas ? json(nullptr) : json(replicas);
  out->push_back(Said(EventKind::kCheckpointVerified, "", -1, commit,
                      "checkpoint of step " + std::to_string(commit) + " verified: " +
                          (replicas == ReplicaCheck::kNoReplicas
                               ? std::string("no replicas to compare")
                               : "the replicas agreed through step " + std::to_string(replicas)) +
                          ", no NaN/Inf through step " + std::to_string(clean) + "; retention keeps it",
                      detail));
}

void SdcMonitor::CheckNumeric(const SdcJob& job, Nanos now_mono, Nanos now_wall, SdcActions* out) {
  for (const NumericFinding& n : numeric_.Evaluate(now_mono)) {
    ActOnNumeric(job, n, now_wall, out);
    if (Failed(*out)) return;
  }
}

void SdcMonitor::ActOnNumeric(const SdcJob& job, const NumericFinding& n, Nanos now_wall, SdcActions* out) {
  std::vector<int> ranks = n.Ranks();
  json flagged = json::object();
  int kind = 0;
  for (const auto& [r, kv] : n.flagged) {
    flagged[std::to_string(r)] = {{"kind", kv.first},
                                  {"value", std::isfinite(kv.second) ? json(kv.second) : json(std::to_string(kv.second))}};
    if (kind == 0) kind = kv.first;
  }
  const std::vector<std::string> nodes = NodesOf(job, ranks);
  json detail = {{"step", n.step},     {"ranks", ranks},   {"observers", n.observers}, {"all", n.all},
                 {"flagged", flagged}, {"nodes", nodes},   {"spike", n.spike},         {"generation", generation_}};
  const std::string what = NumericKindText(kind);
  const std::string where = n.all ? "on every rank that computes a loss (" + std::to_string(n.observers) + ")"
                                  : "on rank " + List(ranks) + " only (of " + std::to_string(n.observers) + ")";
  const std::string first_node = nodes.empty() ? "" : nodes.front();
  if (n.spike) {  // reported, never acted on: a spike may be the data's
    out->push_back(Said(EventKind::kNumericSpike, first_node, ranks.empty() ? -1 : ranks.front(), n.step,
                        what + " at step " + std::to_string(n.step) + " " + where, detail));
    return;
  }
  if (suspicion_.stage > 0 && suspicion_.what == SdcWhat::kNumeric && generation_ > suspicion_.from_generation &&
      n.step == suspicion_.step && ranks == suspicion_.ranks) {
    out->push_back(Said(EventKind::kNumericAnomaly, first_node, ranks.front(), n.step,
                        what + " at step " + std::to_string(n.step) + " " + where + " again, on replay", detail));
    Reproduced(job, detail, now_wall, out);
    return;
  }
  ResumeAtMost(job, n.step - 1, "the last before " + std::string(what).substr(4) + " at step " + std::to_string(n.step));
  detail["resume_at_most"] = resume_at_most_;
  detail["resume_why"] = resume_at_most_why_;
  detail["bad_through"] = bad_through_;
  const std::string message = what + " at step " + std::to_string(n.step) + " " + where;
  Finding f;
  f.kind = FindingKind::kNumericAnomaly;
  f.rank = n.all || ranks.empty() ? -1 : ranks.front();
  f.node = n.all ? "" : first_node;
  f.rank_step = n.step;
  f.fault_wall = now_wall;
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
    suspicion_ = Suspicion{};
    suspicion_.what = SdcWhat::kNumeric;
    suspicion_.stage = 1;
    suspicion_.step = n.step;
    suspicion_.ranks = ranks;
    suspicion_.nodes = nodes;
    suspicion_.devices = DevicesOf(job, ranks);
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
  f.detail_json = Dump(detail);
  f.verdict = v;
  out->push_back(SdcEvent{EventKind::kNumericAnomaly, f.node, f.rank, n.step, f.description, f.detail_json});
  if (!n.all) SaySuspicion(out);
  out->push_back(SdcFailure{std::move(f)});
}

void SdcMonitor::CheckConfirmation(const SdcJob& job, Nanos now_mono, Nanos now_wall, SdcActions* out) {
  if (suspicion_.stage == 0 || generation_ <= suspicion_.from_generation) return;
  if (suspicion_.what == SdcWhat::kNumeric) {
    if (numeric_.PassedClean(suspicion_.step, now_mono)) NotReproduced(job, json::object(), {}, out);
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
    Reproduced(job, detail, now_wall, out);
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
  NotReproduced(job, detail, wrong, out);
}

// The suspicion's step replayed cleanly: a transient fault (or, after a suspect was moved away, the moved
// node's persistent one).
void SdcMonitor::NotReproduced(const SdcJob& job, json detail, std::vector<int> culprits, SdcActions* out) {
  if (suspicion_.what == SdcWhat::kNumeric) culprits = suspicion_.ranks;
  const bool moved = suspicion_.stage == 2;
  std::vector<std::string> nodes = moved ? suspicion_.moved : NodesOf(job, culprits);
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
  Record(nodes, detail, moved, SuspectDevices(nodes, moved ? std::vector<int>{} : culprits), out);
  out->push_back(Said(EventKind::kSdcConfirmation, nodes.empty() ? "" : nodes.front(),
                      culprits.empty() ? -1 : culprits.front(), suspicion_.step, message, detail));
  suspicion_ = Suspicion{};
  SaySuspicion(out);
}

// The suspicion's step went wrong again on replay. On the same nodes: persistent, and a suspect's node is moved
// out (evicted; a spare or the rest replays) to tell the device from the data. After that move: numeric, the
// anomaly follows the rank's data (the moved node is returned); a disagreement, the other replica's node.
void SdcMonitor::Reproduced(const SdcJob& job, json detail, Nanos now_wall, SdcActions* out) {
  detail["step"] = suspicion_.step;
  detail["suspects"] = suspicion_.ranks;
  detail["what"] = SdcWhatName(suspicion_.what);
  detail["result"] = "reproduced";
  detail["persistence"] = "persistent";
  Finding f;
  f.kind = suspicion_.what == SdcWhat::kNumeric ? FindingKind::kNumericAnomaly : FindingKind::kReplicaDivergence;
  f.rank_step = suspicion_.step;
  f.fault_wall = now_wall;
  DetectorVerdict v;
  v.persistence = "persistent";
  if (suspicion_.stage == 1) {
    // Which node to move: one with a confirmed corruption before, else the suspect whose node is last.
    std::vector<std::string> nodes = suspicion_.nodes;
    std::string move = nodes.empty() ? "" : nodes.back();
    for (const auto& n : nodes) {
      if (job.SdcHistory(n) > 0) move = n;
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
    for (const auto& n : suspicion_.moved) {
      out->push_back(SdcReturnNode{n, "the NaN at step " + std::to_string(suspicion_.step) +
                                          " followed its rank to another node: not this node's"});
    }
    f.description = "step " + std::to_string(suspicion_.step) + "'s NaN/Inf follows rank " + List(suspicion_.ranks) +
                    " to another node: its data or the model's numerics, not a device";
    v.rule_id = "numeric-follows-data";
    v.category = "numeric";
    v.hardware = false;
    v.action = "stop";
    v.description = "a NaN/Inf that recurs on the same rank at the same step wherever it runs: the job's numerics";
    detail["returned"] = suspicion_.moved;
    suspicion_ = Suspicion{};
  } else {
    // Without the moved node the replicas still disagree: the one that stayed computes wrong.
    std::vector<std::string> others;
    for (const auto& n : suspicion_.nodes) {
      if (std::find(suspicion_.moved.begin(), suspicion_.moved.end(), n) == suspicion_.moved.end() && job.HasNode(n)) {
        others.push_back(n);
      }
    }
    for (const auto& n : suspicion_.moved) {
      out->push_back(SdcReturnNode{
          n, "the replicas disagreed at step " + std::to_string(suspicion_.step) + " without it too"});
    }
    detail["returned"] = suspicion_.moved;
    detail["nodes"] = others;
    f.description = "without node " + Join(suspicion_.moved) + " the replicas still disagree at step " +
                    std::to_string(suspicion_.step) + ": node " + (others.empty() ? "?" : Join(others)) +
                    " computes wrong (confirmed)";
    v.rule_id = "sdc-confirmed";
    v.category = "gpu_hardware";
    v.hardware = true;
    v.evict_nodes = others;
    v.description = "confirmed by replay: the replica that disagreed on other hardware too computed wrong";
    Record(others, detail, true, SuspectDevices(others, {}), out);
    out->push_back(Said(EventKind::kSdcConfirmation, others.empty() ? "" : others.front(), -1, suspicion_.step,
                        "confirmed: " + f.description, detail));
    suspicion_ = Suspicion{};
  }
  SaySuspicion(out);
  f.lines.push_back({-1, "", "trainguard: " + f.description});
  f.detail_json = Dump(detail);
  f.verdict = v;
  out->push_back(SdcFailure{std::move(f)});
}

void SdcMonitor::Record(const std::vector<std::string>& nodes, json evidence, bool confirmed,
                        const std::vector<std::string>& devices, SdcActions* out) const {
  if (nodes.empty()) return;
  if (!devices.empty()) evidence["devices"] = devices;
  out->push_back(SdcNodeRecord{nodes, confirmed, Dump(evidence)});
}

void SdcMonitor::FillStart(v1::Start* start) const {
  // After replicas diverged: no checkpoint saved after their last agreement
  // (trainguard's checkpointer honours it; docs/sdc.md).
  if (resume_at_most_ >= 0) {
    (*start->mutable_env())["TRAINGUARD_RESUME_AT_MOST"] = std::to_string(resume_at_most_);
    (*start->mutable_env())["TRAINGUARD_RESUME_AT_MOST_WHY"] = resume_at_most_why_;
    std::string dirs;
    for (const auto& d : torch_checkpoint_dirs_) dirs += (dirs.empty() ? "" : "\n") + d;
    if (!dirs.empty()) (*start->mutable_env())["TRAINGUARD_TORCH_CHECKPOINT_DIRS"] = dirs;
  }
  // A replay confirming a disagreement needs every replica's fingerprint at its step.
  if (suspicion_.stage > 0 && suspicion_.what == SdcWhat::kDisagreement) {
    (*start->mutable_env())["TRAINGUARD_FINGERPRINT_AT"] = std::to_string(suspicion_.step);
  }
}

// ---- What is recorded for a successor (replayed: sdc_monitor_replay.cc) ----

json SdcMonitor::SuspicionJson() const {
  json values = json::object(), devices = json::object();
  for (const auto& [r, v] : suspicion_.values) values[std::to_string(r)] = Hex(v);
  for (const auto& [r, d] : suspicion_.devices) devices[std::to_string(r)] = d;
  return {{"what", SdcWhatName(suspicion_.what)},
          {"stage", suspicion_.stage},
          {"step", suspicion_.step},
          {"last_agreed_step", suspicion_.last_agreed_step},
          {"ranks", suspicion_.ranks},
          {"values", values},
          {"nodes", suspicion_.nodes},
          {"moved", suspicion_.moved},
          {"devices", devices},
          {"from_generation", suspicion_.from_generation}};
}

void SdcMonitor::SaySuspicion(SdcActions* out) const {
  const std::string message =
      suspicion_.stage == 0
          ? std::string("no suspicion of silent data corruption is being confirmed")
          : std::string("suspicion (") + SdcWhatName(suspicion_.what) + ") of step " + std::to_string(suspicion_.step) +
                " on rank " + List(suspicion_.ranks) + ": replayed " +
                (suspicion_.stage == 1 ? "on the same nodes" : "without node " + Join(suspicion_.moved));
  out->push_back(Said(EventKind::kSdcSuspicion, "", -1, suspicion_.step, message, SuspicionJson()));
}

}  // namespace trainguard
