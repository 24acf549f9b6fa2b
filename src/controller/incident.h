// Incident: the failure being recovered from, and every fact gathered about
// it until the job restarts; what blame and the recovery policy read.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "attribution/attribution.h"
#include "common/clock.h"
#include "controller/finding.h"

namespace trainguard {

struct Incident {
  int number = 0;
  FindingKind kind = FindingKind::kRankFailed;
  std::optional<DetectorVerdict> verdict;  // the detector's own judgement, if it made one
  std::string description;
  Nanos fault_wall = 0;
  Nanos detected_wall = 0;
  Nanos detected_mono = 0;
  Nanos stopped_wall = 0;
  std::int64_t failure_step = -1;
  std::int64_t checkpoint_step = -1;
  std::int64_t generation = -1;
  Nanos last_step_wall = 0;         // newest step of any rank before the fault
  int first_rank = -1;              // the rank whose failure was seen first
  std::string first_node;
  std::int64_t first_rank_step = -1;
  std::vector<int> hung_ranks;
  std::string hang_evidence;        // Finding::culprit_evidence
  std::vector<int> hang_roots;      // located from the journals: the ranks the others wait for
  std::vector<LogLine> lines;       // what the attribution reads (add with AddLine)
  // What a verdict rests on: the finding's own lines (a detector's
  // measurement) and the scheduler backend's sentence on a lost node. With
  // a verdict they alone are its evidence: the ranks' output in `lines` is
  // no evidence of what was measured.
  std::vector<LogLine> verdict_lines;
  std::map<int, std::pair<std::string, std::string>> stacks;  // rank -> (state, python)
  std::map<int, std::int64_t> rank_steps;  // last step of each rank, as reported at the end
  std::map<int, Nanos> exit_times;         // ranks that failed on their own: when
  // Ranks the incident stopped that had written an error file (raised,
  // then were slow to exit): rank -> the file as RankErrorJson text.
  std::map<int, std::string> stopped_error_files;

  // Adds a line to `lines`, unless `unique` and the same text is there
  // already: from the same rank (rank >= 0) or the same node (rank -1, a
  // kernel line). A rank's exit and its node's Stopped may carry the same
  // lines. Constant time: an incident at 12,500 nodes collects millions.
  void AddLine(const LogLine& line, bool unique = false) {
    std::string key = line.rank >= 0 ? "r" + std::to_string(line.rank) : "n" + line.node;
    key += '\n';
    key += line.text;
    if (!seen_->insert(std::move(key)).second && unique) return;
    lines.push_back(line);
  }

 private:
  // "rRANK\nTEXT" or "nNODE\nTEXT" of every line added. Shared by copies:
  // a copy taken to be read elsewhere (the blame, off the lock) is cheap,
  // and only the original adds lines.
  std::shared_ptr<std::unordered_set<std::string>> seen_ = std::make_shared<std::unordered_set<std::string>>();
};

}  // namespace trainguard
