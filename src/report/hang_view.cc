#include "report/hang_view.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

namespace trainguard {

using nlohmann::json;

StatusOr<json> FindHang(const std::string& job_id, const std::vector<Event>& events, int incident) {
  json found;
  for (const auto& e : events) {
    if (e.kind != "failure") continue;
    json d = json::parse(e.detail_json, nullptr, false);
    if (!d.is_object() || d.value("failure_kind", "") != "hang") continue;
    int number = d.value("incident", 0);
    if (incident != 0 && number != incident) continue;
    found = {{"job_id", job_id},
             {"incident", number},
             {"description", e.message},
             {"detected_unix_ms", d.value("detected_unix_ms", 0LL)},
             {"culprit_rank", e.rank},
             {"culprit_node", e.node},
             {"culprit_ranks", e.rank >= 0 ? json::array({e.rank}) : json::array()},
             {"culprit_nodes", e.node.empty() ? json::array() : json::array({e.node})},
             {"culprit_evidence", ""},
             {"category", nullptr},
             {"blamed", false},
             {"location", d.contains("location") ? d["location"] : json(nullptr)}};
  }
  if (found.is_null()) {
    return NotFound(incident == 0 ? "job " + job_id + " had no hang"
                                  : "job " + job_id + " has no hang incident " + std::to_string(incident));
  }
  // The incident's attribution, once every rank stopped (stacks, the rules),
  // has the last word: the hang view names the culprit the incident, the
  // report and the dashboard name.
  for (const auto& e : events) {
    if (e.kind != "attribution") continue;
    json d = json::parse(e.detail_json, nullptr, false);
    if (!d.is_object() || d.value("incident", 0) != found["incident"].get<int>()) continue;
    found["culprit_rank"] = e.rank;
    found["culprit_node"] = e.node;
    found["culprit_ranks"] = d.value("culprit_ranks", json::array());
    found["culprit_nodes"] = d.value("culprit_nodes", json::array());
    found["culprit_evidence"] = d.value("culprit_evidence", "");
    found["category"] = d.value("category", "");
    found["blamed"] = true;
  }
  return found;
}

namespace {

// One letter per state, for the grid.
char Mark(const json& r, const std::set<int>& roots, const std::set<int>& desync) {
  int rank = r.value("rank", -1);
  if (desync.count(rank)) return 'D';
  if (roots.count(rank)) return 'R';
  std::string s = r.value("state", "");
  if (s == "waiting") return 'w';
  if (s == "stopped") return 'T';
  if (s == "device") return 'G';
  if (s == "exited") return 'X';
  if (s == "computing") return 'c';
  if (s == "idle") return 'i';
  return '?';
}

std::string Describe(const json& r) {
  std::string s = r.value("state", "");
  if (s == "waiting") {
    std::string what = r.value("op", "") + " #" + std::to_string(r.value("seq", 0LL));
    int peer = r.value("peer", -1);
    what += peer >= 0 ? " with rank " + std::to_string(peer) : " of " + r.value("group", "");
    what += " for " + std::to_string(r.value("age_ms", 0LL) / 1000) + " s";
    std::vector<int> waits = r.value("waits_for", std::vector<int>{});
    if (!waits.empty()) {
      std::string list;
      for (int w : waits) list += (list.empty() ? "" : ", ") + std::to_string(w);
      what += ", waiting for rank(s) " + list;
    }
    return "waits in " + what;
  }
  if (s == "device") {
    return "issued " + r.value("op", "") + " #" + std::to_string(r.value("seq", 0LL)) + " " +
           std::to_string(r.value("age_ms", 0LL) / 1000) + " s ago; its GPU never started it";
  }
  std::string phase = r.value("phase", "");
  return s + (phase.empty() ? "" : " (phase '" + phase + "')");
}

}  // namespace

std::string HangText(const json& hang) {
  std::string out = "job " + hang.value("job_id", "") + ", incident " +
                    std::to_string(hang.value("incident", 0)) + ": " +
                    hang.value("description", "") + "\n";
  std::string culprit;
  for (const auto& r : hang.value("culprit_ranks", json::array())) {
    culprit += (culprit.empty() ? "rank " : ", ") + std::to_string(r.get<int>());
  }
  std::string nodes;
  for (const auto& n : hang.value("culprit_nodes", json::array())) {
    nodes += (nodes.empty() ? "" : ", ") + n.get<std::string>();
  }
  if (hang.value("blamed", false)) {
    out += "culprit: " + (culprit.empty() ? std::string("unknown") : culprit) +
           (nodes.empty() ? "" : " on " + nodes) +
           (hang["category"].is_string() ? " (" + hang["category"].get<std::string>() + ")" : "") +
           (hang.value("culprit_evidence", "").empty() ? "" : ": " + hang.value("culprit_evidence", "")) + "\n";
  } else {
    out += "culprit: not yet blamed (the ranks are still stopping)\n";
  }
  const json& loc = hang["location"];
  if (!loc.is_object()) {
    return out + "\nno rank kept a journal of its communication (not instrumented): the hang "
                 "cannot be placed in the layout\n";
  }
  std::set<int> roots, desync;
  for (int r : loc.value("roots", std::vector<int>{})) roots.insert(r);
  // Blamed from stacks or the detector's evidence where the journals found
  // no root (DDP's buckets unjournaled): the same culprit, marked the same.
  if (roots.empty() && hang.value("blamed", false)) {
    for (const auto& r : hang.value("culprit_ranks", json::array())) roots.insert(r.get<int>());
  }
  for (int r : loc.value("desynchronized", std::vector<int>{})) desync.insert(r);
  out += "\n";
  for (const auto& sentence : loc["explanation"]) out += "  " + sentence.get<std::string>() + "\n";
  std::vector<std::string> dims;
  for (const auto& d : loc["layout"]) dims.push_back(d.value("name", ""));
  std::map<int, json> by_rank;
  for (const auto& r : loc["ranks"]) by_rank[r.value("rank", -1)] = r;
  auto coord = [&](const json& r, const std::string& dim) {
    return r.contains("coords") && r["coords"].contains(dim) ? r["coords"][dim].get<int>() : -1;
  };
  auto extent = [&](const std::string& dim) {
    int m = 0;
    for (const auto& [rank, r] : by_rank) m = std::max(m, coord(r, dim) + 1);
    return m;
  };
  if (dims.size() >= 2 && dims.size() <= 3) {
    // Blocks by the middle dimension (pp), rows by the first (tp), columns by
    // the last (dp).
    std::string row = dims[0], col = dims.back(), block = dims.size() == 3 ? dims[1] : "";
    out += "\nlayout (" ;
    for (std::size_t i = 0; i < dims.size(); ++i) out += (i ? " x " : "") + dims[i] + std::to_string(extent(dims[i]));
    out += "); R root, D desynchronised, w waiting, G GPU never started its operation, c computing, i idle, T stopped, X exited, ? unknown\n";
    int blocks = block.empty() ? 1 : extent(block);
    for (int b = 0; b < blocks; ++b) {
      out += "\n" + (block.empty() ? std::string("   ") : block + std::to_string(b)) + "\t";
      for (int c = 0; c < extent(col); ++c) out += col + std::to_string(c) + "\t";
      out += "\n";
      for (int rr = 0; rr < extent(row); ++rr) {
        out += "  " + row + std::to_string(rr) + "\t";
        for (int c = 0; c < extent(col); ++c) {
          std::string cell = "-";
          for (const auto& [rank, r] : by_rank) {
            if (coord(r, row) == rr && coord(r, col) == c && (block.empty() || coord(r, block) == b)) {
              cell = std::to_string(rank) + " " + Mark(r, roots, desync);
            }
          }
          out += cell + "\t";
        }
        out += "\n";
      }
    }
  }
  out += "\n";
  for (const auto& [rank, r] : by_rank) {
    bool waited = false;
    for (const auto& [other, o] : by_rank) {
      for (int w : o.value("waits_for", std::vector<int>{})) waited |= w == rank;
    }
    if (r.value("state", "") != "waiting" && !waited && !roots.count(rank) && !desync.count(rank)) continue;
    out += "  " + r.value("name", "rank " + std::to_string(rank)) + " on " + r.value("node", "?") + ": " +
           (roots.count(rank) ? "ROOT, " : "") + Describe(r) + "\n";
  }
  return out;
}

}  // namespace trainguard
