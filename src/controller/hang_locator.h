// Hang localization: from the ranks' journals of communication operations,
// which rank the others wait for, and where it sits in the job's parallel
// layout.
//
// A rank waiting in operation #k of group G waits for the members of G that
// never issued #k (a receive waits for the peer that never sent, a send for
// the peer that never received). Those edges form a wait-for graph; its roots
// (ranks waited for that wait for no one themselves: computing, stopped, dead,
// or stuck outside any collective) are the culprits, the waiting ranks their
// symptoms. Members that issued #k as a different operation than their peers
// (or, for all_reduce and broadcast, with another element count) are
// desynchronised.
//
// The layout (tensor-, pipeline-, data-parallel) is inferred from the groups'
// memberships: families of equal-size groups that partition the world, named
// by the groups' names where the framework gave them, else pipeline for the
// family that carries point-to-point traffic, tensor for the one with the
// smallest stride, data for the next. A dimension without groups (a pipeline
// of send/recv on the world group) is what tells apart the ranks that agree
// in every other: pipeline where point-to-point traffic runs in it. Pure logic, O(ranks x groups per rank)
// (the members blocking one collective are found once, however many ranks
// wait in it).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "controller/finding.h"
#include "controller/job_view.h"

namespace trainguard {

// One family of groups that partitions the world: a parallel dimension.
struct LayoutDim {
  std::string name;   // "tp", "pp", "dp", or "g<size>x<stride>" if nothing says
  int size = 0;       // ranks per group
  int stride = 0;     // between consecutive members, 0 if irregular
};

struct RankWait {
  int rank = -1;
  std::string node;
  // "waiting": in a communication operation; "device": its oldest operation
  // in flight is on a GPU that never started it (the device is busy or hung:
  // stuck before the collective, not in it); "computing": none in flight and
  // busy; "idle": none in flight and quiet; "stopped": process stopped (T);
  // "exited"; "unknown": no journal (not instrumented).
  std::string state;
  // The oldest operation in flight (state "waiting").
  std::string op;
  int group_id = -1;
  std::string group;  // the group's layout name ("dp", "world", "group 7") or ""
  std::int64_t seq = 0;
  int peer = -1;
  std::int64_t age_ms = 0;
  bool on_device = false;        // the operation's tensors are on a GPU
  std::int64_t started_ms = -1;  // then: when its device reached it after issue (-1: never)
  std::vector<int> waits_for;       // the first 64 ranks it waits for
  std::int64_t waits_for_total = 0; // all of them
  std::map<std::string, int> coords;  // layout dim -> index in that dim
  std::string phase;
  std::int64_t step = -1;
};

constexpr std::size_t kLocatedRanksListed = 4096;

struct HangLocation {
  int world_size = 0;
  std::vector<LayoutDim> layout;
  std::vector<RankWait> ranks;      // by rank
  std::vector<int> roots;           // the culprits, most waited-for first
  std::vector<int> desynchronized;  // ranks that issued another operation than their peers
  std::vector<std::string> explanation;  // the wait-for chain in words
  std::vector<int> explanation_rank;     // the rank each sentence is about (-1: several)
  bool has_journal = false;         // false: no rank reported a journal; nothing located

  // "rank 5 (tp1 pp0 dp1)"
  std::string Name(int rank) const;
  // JSON for the failure event and the hang view: every field, and at most
  // kLocatedRanksListed of `ranks` (the roots and the ranks that are not
  // simply waiting first); "ranks_total" is the world size.
  nlohmann::json ToJson() const;
};

HangLocation LocateHang(const JobView& view);

// Adds the location to a hang finding: its culprit becomes the first root,
// its description and evidence lines say the chain, its detail holds the
// location under "location". Nothing changes when no rank kept a journal.
void AttachLocation(const HangLocation& location, Finding* finding);

}  // namespace trainguard
