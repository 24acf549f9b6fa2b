#include "controller/hang_detector.h"
#include "common/json_text.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>

#include "common/mounts.h"
#include "controller/describe.h"

namespace trainguard {

using nlohmann::json;

Nanos EffectiveHangTimeout(const JobView& view, const JobConfig& config) {
  if (!config.hang_timeout_auto) return config.hang_timeout;
  Nanos slowest = 0;
  for (const NodeView* n : view.nodes) {
    for (const auto& [rank, rv] : n->ranks) {
      slowest = std::max<Nanos>(slowest, rv.status.max_step_ms() * kMillisecond);
    }
  }
  if (slowest == 0) return config.startup_timeout;
  return std::max(config.hang_timeout_floor, slowest * config.hang_timeout_multiple);
}

Nanos LowestHangTimeout(const JobConfig& config) {
  return config.hang_timeout_auto ? std::min(config.hang_timeout_floor, config.startup_timeout) : config.hang_timeout;
}

Nanos HangDeadline(const RankView& rv, Nanos timeout, const JobConfig& config) {
  const v1::RankStatus& s = rv.status;
  if (!s.running()) return kNoHangDeadline;
  // DetectHang's tests, solved for the time: "age + (now - received) > limit"
  // holds once now > received + limit - age.
  auto after = [&](Nanos limit, Nanos age) { return rv.received_mono + limit - age; };
  Nanos activity = s.activity_age_ms() * kMillisecond;
  if (!s.attached()) return s.activity_sampled() ? after(timeout, activity) : kNoHangDeadline;
  Nanos limit = s.step_count() > 0 ? timeout : config.startup_timeout;
  Nanos stuck = after(limit, s.progress_age_ms() * kMillisecond);
  Nanos quiet = s.activity_sampled() ? after(limit, activity) : INT64_MIN;
  Nanos op = kNoHangDeadline;
  for (const auto& o : s.ops_in_flight()) op = std::min(op, after(timeout, o.age_ms() * kMillisecond));
  return std::max(stuck, std::min(quiet, op));
}

std::optional<Finding> DetectHang(const JobView& view, const JobConfig& config, Nanos* next_check) {
  const Nanos timeout = EffectiveHangTimeout(view, config);
  if (next_check != nullptr) *next_check = kNoHangDeadline;
  struct Stuck {
    const NodeView* node;
    const v1::RankStatus* status;
    Nanos age;
    bool stopped;
    bool waiting;  // in a journaled operation, or in backward (DDP's reducer waits there)
    bool quiet;
    const v1::CommOp* not_started;  // its oldest operation, on a GPU that never started it
    const v1::BlockedIo* storage;   // a task of it waits in a file system call (state D)
    bool data_stall;                 // waits for data and has read nothing for half the timeout
  };
  std::vector<Stuck> stuck;
  // The two largest progress ages of all ranks, stuck or not: a rank that
  // stopped progressing well before every other one stands out.
  Nanos oldest = INT64_MIN, second_oldest = INT64_MIN;
  bool any_quiet = false;
  // A communication operation in flight for the timeout is a hang however
  // busy its rank looks (NCCL's waiters spin).
  bool op_stuck = false;
  for (const NodeView* n : view.nodes) {
    for (const auto& [rank, rv] : n->ranks) {
      // When this rank could be hung next, in the same pass (100,000 ranks).
      if (next_check != nullptr) *next_check = std::min(*next_check, HangDeadline(rv, timeout, config));
      const v1::RankStatus& s = rv.status;
      if (!s.running()) continue;
      Nanos since_report = view.now_mono - rv.received_mono;
      bool active_known = s.activity_sampled();
      Nanos activity_age = s.activity_age_ms() * kMillisecond + since_report;
      if (s.attached()) {
        Nanos progress = s.progress_age_ms() * kMillisecond + since_report;
        second_oldest = std::max(second_oldest, std::min(oldest, progress));
        oldest = std::max(oldest, progress);
      }
      Nanos age;
      bool quiet;
      if (s.attached()) {
        age = s.progress_age_ms() * kMillisecond + since_report;
        Nanos limit = s.step_count() > 0 ? timeout : config.startup_timeout;
        if (age <= limit) continue;
        quiet = !active_known || activity_age > limit;
      } else {
        // No progress reports (not Python, or not instrumented): stalled when
        // nothing at all moves.
        if (!active_known || activity_age <= timeout) continue;
        age = activity_age;
        quiet = true;
      }
      any_quiet = any_quiet || quiet;
      for (const auto& op : s.ops_in_flight()) {
        op_stuck = op_stuck || op.age_ms() * kMillisecond + since_report > timeout;
      }
      const v1::CommOp* oldest = nullptr;
      for (const auto& op : s.ops_in_flight()) {
        if (oldest == nullptr || op.age_ms() > oldest->age_ms()) oldest = &op;
      }
      const v1::CommOp* not_started =
          oldest != nullptr && oldest->on_device() && oldest->started_ms() < 0 ? oldest : nullptr;
      // Blocked in a file system call for half the timeout or more: a
      // storage stall (a page fault names no file, and no file system).
      const v1::BlockedIo* storage = nullptr;
      for (const auto& b : s.blocked_io()) {
        if (b.call() == "page fault" || (b.blocked_ms() * kMillisecond + since_report) * 2 < timeout) continue;
        if (storage == nullptr || b.blocked_ms() > storage->blocked_ms()) storage = &b;
      }
      // Waiting for data and reading nothing (no file, pipe or socket read
      // by any of its processes) for half the timeout: its loader is stalled
      // on storage that waits interruptibly (an object store's socket, a
      // network file system's soft wait), which state D does not show.
      auto half_timeout = [&](std::int64_t ms) { return ms >= 0 && (ms * kMillisecond + since_report) * 2 >= timeout; };
      const bool data_stall = storage == nullptr && s.phase() == "data" && s.has_io() &&
                              half_timeout(s.io().read_age_ms()) && half_timeout(s.phase_age_ms());
      stuck.push_back({n, &s, age, s.proc_state() == "T" || s.proc_state() == "t",
                       not_started == nullptr && (oldest != nullptr || s.phase() == "backward"), quiet,
                       not_started, storage, data_stall});
    }
  }
  if (stuck.empty() || !(any_quiet || op_stuck)) return std::nullopt;
  Finding f;
  f.kind = FindingKind::kHang;
  json evidence = json::array();
  std::size_t waiting = 0, busy = 0;
  for (const Stuck& s : stuck) {
    waiting += s.waiting ? 1 : 0;
    busy += s.quiet ? 0 : 1;
  }
  // The culprit: a stopped process, else a rank outside communication while
  // others wait in it, else the quiet one, else the longest without progress.
  auto culprit_key = [&](const Stuck& s) {
    return std::make_tuple(s.stopped, s.storage != nullptr, s.data_stall, !s.waiting && waiting > 0, s.quiet, s.age);
  };
  const Stuck* culprit = &stuck.front();
  for (const Stuck& s : stuck) {
    if (culprit_key(s) > culprit_key(*culprit)) culprit = &s;
    f.hung_ranks.push_back(s.status->global_rank());
  }
  const std::string culprit_name = "rank " + std::to_string(culprit->status->global_rank());
  const Nanos step_time = culprit->status->max_step_ms() * kMillisecond;
  if (culprit->stopped) {
    f.culprit_evidence = culprit_name + "'s process is stopped (state T)";
  } else if (culprit->storage != nullptr) {
    const v1::BlockedIo& b = *culprit->storage;
    const std::string mount = b.mount_point().empty()
                                  ? "an unknown mount (the call was given a path, which is not read)"
                                  : b.mount_point() + " (" + b.fstype() + " " + b.source() + ")";
    f.culprit_evidence = culprit_name + " has been blocked " + std::to_string(b.blocked_ms() / 1000) + " s in " +
                         b.call() + "()" + (b.path().empty() ? "" : " of " + b.path()) + " on " + mount +
                         (culprit->status->phase().empty() ? "" : ", in phase '" + culprit->status->phase() + "'");
    const bool shared = b.fstype().empty() || IsSharedFilesystem(b.fstype());
    DetectorVerdict v;
    v.rule_id = "storage-stall";
    v.category = "storage";
    v.hardware = !shared;
    v.persistence = "transient";
    v.description = "a storage stall, not a hang of the collectives: " + f.culprit_evidence +
                    (shared ? "; the file system is shared, so no node is evicted"
                            : "; the file system is this node's own, so the node is evicted");
    if (!shared) v.evict_nodes = {culprit->node->node_id};
    f.verdict = v;
  } else if (culprit->data_stall) {
    const v1::RankStatus& st = *culprit->status;
    std::string where;
    for (const auto& file : st.io().data_files()) {
      where += std::string(where.empty() ? "" : ", ") + file.mount_point() + " (" + file.fstype() + " " +
               file.source() + ", " + file.path() + ")";
    }
    f.culprit_evidence = culprit_name + " has waited for data (phase 'data') " +
                         std::to_string(st.phase_age_ms() / 1000) + " s and its processes have read nothing for " +
                         std::to_string(st.io().read_age_ms() / 1000) + " s; " +
                         (where.empty() ? "it holds no data file open (a network or object-store read?)"
                                        : "its open files are on " + where);
    DetectorVerdict v;
    v.rule_id = "data-loader-stall";
    v.category = "storage";
    v.hardware = false;
    v.persistence = "transient";
    // A loader stalled with no call in a file system is also what a
    // deadlocked worker looks like: no node is evicted on this alone.
    v.description = "a storage stall of the data loader, not a hang of the collectives: " + f.culprit_evidence +
                    "; no node is evicted on this sign alone";
    f.verdict = v;
  } else if (culprit->not_started != nullptr && waiting > 0) {
    f.culprit_evidence = culprit_name + " issued " + culprit->not_started->op() + " " +
                         std::to_string(culprit->not_started->age_ms() / 1000) +
                         " s ago but its GPU never started it, while " + std::to_string(waiting) +
                         " rank(s) wait in communication";
  } else if (!culprit->waiting && waiting > 0) {
    f.culprit_evidence = culprit_name + " is outside any communication (phase '" +
                         culprit->status->phase() + "') while " + std::to_string(waiting) +
                         " rank(s) wait in one (in a collective, or in backward)";
  } else if (culprit->quiet && busy > 0) {
    f.culprit_evidence = culprit_name + " used no CPU or I/O while " + std::to_string(busy) +
                         " other stuck rank(s) kept busy (spinning in communication)";
  } else if (culprit->status->attached() && culprit->age == oldest &&
             oldest - second_oldest >= std::max<Nanos>(5 * kSecond, 3 * step_time)) {
    f.culprit_evidence = culprit_name + " stopped progressing " + Seconds(oldest - second_oldest) +
                         " before any other rank";
  }
  // Evidence, lines and stack captures for the culprit and a bounded number
  // of others: at 100,000 ranks a line and a stack dump of every rank is
  // megabytes per incident, and every Stop message would list them all.
  auto describe = [&](const Stuck& s) {
    int rank = s.status->global_rank();
    json e = RankJson(*s.status);
    e["node"] = s.node->node_id;
    e["age_ms"] = s.age / kMillisecond;
    evidence.push_back(e);
    f.capture_stacks_of.push_back(rank);
    f.lines.push_back({rank, s.node->node_id,
                       "trainguard: rank " + std::to_string(rank) + " made no progress for " +
                           std::to_string(s.age / kSecond) + " s at step " +
                           std::to_string(s.status->step()) + " (process state " +
                           s.status->proc_state() + ", phase '" + s.status->phase() + "')"});
  };
  describe(*culprit);
  for (const Stuck& s : stuck) {
    if (evidence.size() >= kHungRanksDescribed) break;
    if (&s != culprit) describe(s);
  }
  if (stuck.size() > kHungRanksDescribed) {
    f.lines.push_back({-1, "", "trainguard: " + std::to_string(stuck.size() - kHungRanksDescribed) +
                                   " more rank(s) made no progress (not listed)"});
  }
  f.rank = culprit->status->global_rank();
  f.node = culprit->node->node_id;
  f.rank_step = culprit->status->step();
  // The fault happened when the culprit last made progress.
  f.fault_wall = view.now_wall - culprit->age;
  f.description = std::to_string(stuck.size()) +
                  (any_quiet ? " rank(s) made no progress and used no CPU or I/O for longer than "
                             : " rank(s) made no progress, waiting in communication for longer than ") +
                  Seconds(timeout) + (config.hang_timeout_auto ? " (--hang-timeout auto)" : "") +
                  (f.culprit_evidence.empty()
                       ? std::string(kHangNoCulprit) + "noticed first: rank " + std::to_string(f.rank) +
                             " on " + f.node + AtStep(f.rank_step) + ")"
                       : kHangCulprit + culprit_name + " on " + f.node + AtStep(f.rank_step) + " (" +
                             f.culprit_evidence + ")");
  f.detail_json = json{{"hung_ranks", evidence}, {"hung_ranks_total", stuck.size()}}.dump(-1, ' ', false, kReplaceBadUtf8);
  return f;
}

}  // namespace trainguard
