#include "controller/hang_locator.h"
#include "common/json_text.h"
#include "controller/hang_detector.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <set>
#include <tuple>

namespace trainguard {
namespace {

using nlohmann::json;

struct GroupInfo {
  int id = -1;
  std::string name;
  std::vector<int> members;
};

std::vector<int> Members(const v1::CommGroup& g) {
  if (g.members_size() > 0) return {g.members().begin(), g.members().end()};
  std::vector<int> m;
  for (int i = 0; i < g.size(); ++i) m.push_back(g.first() + i * g.stride());
  return m;
}

bool NameSays(const std::string& name, std::initializer_list<const char*> words) {
  std::string lower;
  for (char c : name) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* w : words) {
    std::string word = w;
    // The word on its own or delimited: "tp", "tp_group", "pipeline", "mesh_dp".
    for (std::size_t at = lower.find(word); at != std::string::npos; at = lower.find(word, at + 1)) {
      bool left = at == 0 || !std::isalpha(static_cast<unsigned char>(lower[at - 1]));
      bool right = at + word.size() >= lower.size() ||
                   !std::isalpha(static_cast<unsigned char>(lower[at + word.size()])) ||
                   word.size() > 3;
      if (left && right) return true;
    }
  }
  return false;
}

// "1, 3 and 7"; long lists name the first 16 and count the rest.
std::string RankList(const std::vector<int>& ranks) {
  constexpr std::size_t kNamed = 16;
  std::string s;
  std::size_t named = ranks.size() > kNamed ? kNamed : ranks.size();
  for (std::size_t i = 0; i < named; ++i) {
    if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  if (ranks.size() > named) s += " and " + std::to_string(ranks.size() - named) + " more";
  return s;
}

struct Family {
  int size = 0;
  int stride = 0;
  std::vector<const GroupInfo*> groups;
  std::string name;
  struct ByMembers {
    bool operator()(const std::vector<int>* a, const std::vector<int>* b) const { return *a < *b; }
  };
  std::set<const std::vector<int>*, ByMembers> member_lists;
};

}  // namespace

std::string HangLocation::Name(int rank) const {
  std::string s = "rank " + std::to_string(rank);
  if (rank < 0 || rank >= static_cast<int>(ranks.size()) || layout.empty()) return s;
  std::string coords;
  for (const auto& d : layout) {
    auto it = ranks[rank].coords.find(d.name);
    if (it == ranks[rank].coords.end()) continue;
    coords += (coords.empty() ? "" : " ") + d.name + std::to_string(it->second);
  }
  return coords.empty() ? s : s + " (" + coords + ")";
}

json HangLocation::ToJson() const {
  json layout_json = json::array();
  for (const auto& d : layout) layout_json.push_back({{"name", d.name}, {"size", d.size}, {"stride", d.stride}});
  // At most kLocatedRanksListed ranks (a 100,000-rank hang listed in full
  // is 15 MB in every failure event): the roots, the ranks that are not
  // simply waiting and those waited for first, then in rank order. The
  // hang view shows the others as unknown.
  std::vector<char> listed(ranks.size(), 0);
  std::size_t count = 0;
  auto list = [&](std::size_t i) {
    if (i < ranks.size() && ranks[i].rank >= 0 && !listed[i] && count < kLocatedRanksListed) {
      listed[i] = 1;
      ++count;
    }
  };
  for (int r : roots) list(static_cast<std::size_t>(r));
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].state != "waiting") list(i);
    for (int w : ranks[i].waits_for) list(static_cast<std::size_t>(w));
  }
  for (std::size_t i = 0; i < ranks.size(); ++i) list(i);
  json ranks_json = json::array();
  for (const auto& r : ranks) {
    if (r.rank < 0 || !listed[static_cast<std::size_t>(r.rank)]) continue;
    json j = {{"rank", r.rank},   {"node", r.node},       {"state", r.state},
              {"coords", r.coords}, {"waits_for", r.waits_for},
              {"waits_for_total", r.waits_for_total}, {"phase", r.phase},
              {"step", r.step},   {"name", Name(r.rank)}};
    if (r.state == "waiting" || r.state == "device" || !r.op.empty()) {
      j["op"] = r.op;
      j["group_id"] = r.group_id;
      j["group"] = r.group;
      j["seq"] = r.seq;
      j["peer"] = r.peer;
      j["age_ms"] = r.age_ms;
      if (r.on_device) j["started_ms"] = r.started_ms;
    }
    ranks_json.push_back(j);
  }
  return {{"world_size", world_size}, {"layout", layout_json}, {"roots", roots},
          {"desynchronized", desynchronized}, {"explanation", explanation},
          {"has_journal", has_journal}, {"ranks", ranks_json}, {"ranks_total", world_size}};
}

namespace {

// What the ranks' journals say, gathered once: every phase below reads it.
struct Journals {
  std::map<int, const v1::RankStatus*> status;  // by rank
  std::map<int, std::string> node_of;
  std::map<int, GroupInfo> groups;  // by id
  std::map<std::pair<int, int>, std::int64_t> issued;                                 // (rank, group) -> count
  std::map<std::pair<int, int>, std::pair<std::int64_t, std::int64_t>> p2p;          // (rank, peer) -> (sends, recvs)
  std::map<std::tuple<int, int, std::int64_t>, const v1::CommOp*> op_at;             // (rank, group, seq)
  std::set<std::pair<int, int>> p2p_pairs;                                            // (low, high) that talked
};

// Groups (by id), what each rank issued on each, its point-to-point counters
// and every operation it reported, by (group, seq).
Journals Gather(const JobView& view, HangLocation* loc) {
  Journals j;
  for (const NodeView* n : view.nodes) {
    for (const auto& [rank, rv] : n->ranks) {
      j.status[rank] = &rv.status;
      j.node_of[rank] = n->node_id;
    }
  }
  for (const auto& [rank, s] : j.status) {
    for (const auto& g : s->groups()) {
      GroupInfo& info = j.groups[g.id()];
      info.id = g.id();
      if (info.members.empty()) info.members = Members(g);
      if (info.name.empty()) info.name = g.name();
      j.issued[{rank, g.id()}] = g.issued();
    }
    for (const auto& p : s->peers()) {
      j.p2p[{rank, p.peer()}] = {p.sends(), p.recvs()};
      if (p.sends() + p.recvs() > 0) j.p2p_pairs.insert({std::min(rank, p.peer()), std::max(rank, p.peer())});
    }
    for (const auto* list : {&s->recent_ops(), &s->ops_in_flight()}) {
      for (const auto& op : *list) {
        if (op.peer() < 0) j.op_at[{rank, op.group_id(), op.seq()}] = &op;
      }
    }
    loc->has_journal = loc->has_journal || s->groups_size() > 0 || s->peers_size() > 0;
  }
  return j;
}

// Whether point-to-point traffic runs inside one of the groups `group_of` assigns ranks to.
bool CarriesPointToPoint(const Journals& j, const std::map<int, std::size_t>& group_of) {
  for (const auto& [a, b] : j.p2p_pairs) {
    auto ga = group_of.find(a), gb = group_of.find(b);
    if (ga != group_of.end() && gb != group_of.end() && ga->second == gb->second) return true;
  }
  return false;
}

// Names the layout's dimensions, each name once.
class DimNames {
 public:
  void Claim(Family& f, const char* name) {
    if (f.name.empty() && !taken_.count(name)) {
      f.name = name;
      taken_.insert(name);
    }
  }

 private:
  std::set<std::string> taken_;
};

void SetCoords(const Family& f, HangLocation* loc) {
  for (const GroupInfo* g : f.groups) {
    for (std::size_t i = 0; i < g->members.size(); ++i) {
      int m = g->members[i];
      if (m >= 0 && m < loc->world_size) loc->ranks[m].coords[f.name] = static_cast<int>(i);
    }
  }
}

// Families of equal-size groups with one stride that do not overlap, named:
// by the framework's group names, then pipeline for the one carrying
// point-to-point traffic, tensor for the smallest stride, data for the next.
std::vector<Family> NamedFamilies(const Journals& j, int world_size, DimNames* names) {
  std::map<std::pair<int, int>, Family> by_shape;
  for (const auto& [id, g] : j.groups) {
    int size = static_cast<int>(g.members.size());
    if (size <= 1 || size >= world_size) continue;
    int stride = g.members[1] - g.members[0];
    for (std::size_t i = 2; i < g.members.size(); ++i) {
      if (g.members[i] - g.members[i - 1] != stride) stride = 0;
    }
    Family& f = by_shape[{size, stride}];
    f.size = size;
    f.stride = stride;
    // The same members twice (Megatron's embedding group is its first and
    // last pipeline stage: with two stages, a pipeline group again) are one
    // group of the family, not an overlap that would hide the dimension.
    if (f.member_lists.insert(&g.members).second) f.groups.push_back(&g);
  }
  std::vector<Family> families;
  for (auto& [shape, f] : by_shape) {
    std::set<int> seen;
    bool overlap = false;
    for (const GroupInfo* g : f.groups) {
      for (int m : g->members) overlap = overlap || !seen.insert(m).second;
    }
    if (!overlap) families.push_back(f);
  }
  for (Family& f : families) {  // names the framework gave
    for (const GroupInfo* g : f.groups) {
      if (NameSays(g->name, {"tp", "tensor"})) names->Claim(f, "tp");
      else if (NameSays(g->name, {"pp", "pipe", "pipeline"})) names->Claim(f, "pp");
      else if (NameSays(g->name, {"dp", "data"})) names->Claim(f, "dp");
      else if (NameSays(g->name, {"cp", "context"})) names->Claim(f, "cp");
      else if (NameSays(g->name, {"ep", "expert"})) names->Claim(f, "ep");
    }
  }
  for (Family& f : families) {  // the family that carries point-to-point traffic
    std::map<int, std::size_t> group_of;  // rank -> its group in this family
    for (std::size_t i = 0; i < f.groups.size(); ++i) {
      for (int m : f.groups[i]->members) group_of[m] = i;
    }
    if (CarriesPointToPoint(j, group_of)) names->Claim(f, "pp");
  }
  std::sort(families.begin(), families.end(), [](const Family& a, const Family& b) {
    return std::make_pair(a.stride == 0 ? 1 << 30 : a.stride, a.size) <
           std::make_pair(b.stride == 0 ? 1 << 30 : b.stride, b.size);
  });
  for (Family& f : families) names->Claim(f, "tp");
  for (Family& f : families) names->Claim(f, "dp");
  for (Family& f : families) {
    if (f.name.empty()) f.name = "g" + std::to_string(f.size) + "x" + std::to_string(f.stride);
  }
  return families;
}

// A dimension no group stands for: ranks whose coordinates are equal in
// every family differ in it. A pipeline written as send/recv on the world
// group (no pipeline new_group, as many scripts do) is one; its stage is
// the rank's place among them. Taken only when the classes are equal in
// size, and, for a single class (no families at all), when point-to-point
// traffic runs inside it (a pure pipeline, not plain data parallelism).
// Its groups are kept in `residual_groups`.
void AddResidualDimension(const Journals& j, std::vector<Family>* families, DimNames* names,
                          std::deque<GroupInfo>* residual_groups, HangLocation* loc) {
  std::map<std::vector<int>, std::vector<int>> classes;
  for (const auto& [rank, s] : j.status) {
    std::vector<int> key;
    for (const Family& f : *families) {
      auto c = loc->ranks[rank].coords.find(f.name);
      key.push_back(c == loc->ranks[rank].coords.end() ? -1 : c->second);
    }
    classes[key].push_back(rank);
  }
  std::size_t k = classes.begin()->second.size();
  bool equal = k >= 2 && std::all_of(classes.begin(), classes.end(),
                                     [&](const auto& c) { return c.second.size() == k; });
  std::map<int, std::size_t> class_of;
  std::size_t index = 0;
  for (const auto& [key, members] : classes) {
    for (int m : members) class_of[m] = index;
    ++index;
  }
  const bool carries = CarriesPointToPoint(j, class_of);
  if (!equal || (classes.size() <= 1 && !carries)) return;
  Family f;
  f.size = static_cast<int>(k);
  f.stride = classes.begin()->second[1] - classes.begin()->second[0];
  int id = -1;
  for (const auto& [key, members] : classes) {
    for (std::size_t i = 1; i < members.size(); ++i) {
      if (members[i] - members[i - 1] != f.stride) f.stride = 0;
    }
    residual_groups->push_back({id--, "", members});
    f.groups.push_back(&residual_groups->back());
  }
  if (carries) names->Claim(f, "pp");
  names->Claim(f, "dp");
  if (f.name.empty()) f.name = "g" + std::to_string(f.size) + "x" + std::to_string(f.stride);
  SetCoords(f, loc);
  families->push_back(f);
}

// The parallel layout into loc->layout and every rank's coordinates;
// returns each group's dimension name (group id -> "tp", ...).
std::map<int, std::string> InferLayout(const Journals& j, HangLocation* loc) {
  DimNames names;
  std::vector<Family> families = NamedFamilies(j, loc->world_size, &names);
  std::map<int, std::string> group_dim;
  for (const Family& f : families) {
    for (const GroupInfo* g : f.groups) group_dim[g->id] = f.name;
    SetCoords(f, loc);
  }
  std::deque<GroupInfo> residual_groups;  // the families' pointers into it live until the layout is out
  AddResidualDimension(j, &families, &names, &residual_groups, loc);
  auto dim_order = [](const std::string& n) {
    static const std::vector<std::string> order = {"tp", "pp", "dp", "cp", "ep"};
    auto it = std::find(order.begin(), order.end(), n);
    return it == order.end() ? 100 : static_cast<int>(it - order.begin());
  };
  std::sort(families.begin(), families.end(), [&](const Family& a, const Family& b) {
    return std::make_pair(dim_order(a.name), a.name) < std::make_pair(dim_order(b.name), b.name);
  });
  for (const Family& f : families) loc->layout.push_back({f.name, f.size, f.stride});
  return group_dim;
}

// A group as the explanation names it: its dimension, "world", or "group 7".
class GroupLabels {
 public:
  GroupLabels(const Journals& j, std::map<int, std::string> group_dim, int world_size)
      : j_(j), group_dim_(std::move(group_dim)), world_size_(world_size) {}
  std::string operator()(int id) const {
    auto d = group_dim_.find(id);
    if (d != group_dim_.end()) return d->second;
    auto g = j_.groups.find(id);
    if (g != j_.groups.end() && static_cast<int>(g->second.members.size()) >= world_size_) return "world";
    return "group " + std::to_string(id);
  }

 private:
  const Journals& j_;
  const std::map<int, std::string> group_dim_;
  const int world_size_;
};

// What each rank is doing: its oldest operation in flight and its state.
void ClassifyRanks(const Journals& j, const GroupLabels& label, HangLocation* loc) {
  for (int r = 0; r < loc->world_size; ++r) {
    RankWait& w = loc->ranks[r];
    w.rank = r;
    auto it = j.status.find(r);
    if (it == j.status.end()) {
      w.state = "unknown";
      continue;
    }
    const v1::RankStatus& s = *it->second;
    w.node = j.node_of.at(r);
    w.phase = s.phase();
    w.step = s.step();
    const v1::CommOp* oldest = nullptr;
    for (const auto& op : s.ops_in_flight()) {
      if (oldest == nullptr || op.age_ms() > oldest->age_ms()) oldest = &op;
    }
    if (oldest != nullptr) {
      w.op = oldest->op();
      w.group_id = oldest->group_id();
      w.group = oldest->peer() >= 0 ? "" : label(oldest->group_id());
      w.seq = oldest->seq();
      w.peer = oldest->peer();
      w.age_ms = oldest->age_ms();
      w.on_device = oldest->on_device();
      w.started_ms = oldest->on_device() ? oldest->started_ms() : -1;
    }
    if (!s.running()) {
      w.state = "exited";
    } else if (s.proc_state() == "T" || s.proc_state() == "t") {
      w.state = "stopped";
    } else if (oldest != nullptr && oldest->on_device() && oldest->started_ms() < 0) {
      w.state = "device";
    } else if (oldest != nullptr) {
      w.state = "waiting";
    } else if (s.groups_size() == 0 && s.peers_size() == 0) {
      w.state = "unknown";
    } else if (s.activity_sampled() && s.activity_age_ms() > 5000) {
      w.state = "idle";
    } else {
      w.state = "computing";
    }
  }
}

// Who waits for whom.
struct WaitGraph {
  struct Waiters {
    std::int64_t count = 0;
    std::vector<int> sample;  // at most kWaiterSample, the first seen
  };
  static constexpr std::size_t kWaiterSample = 8;
  std::map<int, Waiters> waited_by;
  std::vector<int> stuck_inside;  // waiting on an operation every peer entered
  bool cycle = false;             // nobody waited for waits for no one
};

// Wait-for edges into each rank's waits_for, and the roots into loc->roots,
// most waited-for first. The members that block collective #k of group G
// are found once per (G, k), not once per waiting rank, and each blocking
// rank keeps a count and a sample of its waiters: O(ranks x groups per
// rank) however many ranks wait in the same collective.
WaitGraph TraceWaits(const Journals& j, HangLocation* loc) {
  WaitGraph graph;
  auto cannot_proceed = [&](int m) {
    const std::string& st = loc->ranks[m].state;
    return st == "exited" || st == "stopped" || st == "unknown" || st == "device";
  };
  constexpr std::size_t kListedWaitsFor = 64;  // per rank; waits_for_total has them all
  auto add_waiters = [&](int m, const std::vector<int>& waiters) {
    WaitGraph::Waiters& ws = graph.waited_by[m];
    ws.count += static_cast<std::int64_t>(waiters.size());
    for (std::size_t i = 0; i < waiters.size() && ws.sample.size() < WaitGraph::kWaiterSample; ++i) {
      ws.sample.push_back(waiters[i]);
    }
  };
  std::map<std::pair<int, std::int64_t>, std::vector<int>> blocking;    // (group, seq) -> members
  std::map<std::pair<int, std::int64_t>, std::vector<int>> waiting_in;  // (group, seq) -> waiters
  for (RankWait& w : loc->ranks) {
    if (w.state != "waiting") continue;  // a stopped rank waits for no one: it is stopped
    if (w.peer >= 0) {
      if (w.peer >= loc->world_size) continue;
      auto counts = j.p2p.find({w.peer, w.rank});
      std::int64_t done = counts == j.p2p.end() ? 0
                          : w.op == "recv" ? counts->second.first    // the peer's sends to us
                                           : counts->second.second;  // the peer's receives from us
      if (done < w.seq || cannot_proceed(w.peer)) {
        w.waits_for.push_back(w.peer);
        w.waits_for_total = 1;
        add_waiters(w.peer, {w.rank});
      } else {
        graph.stuck_inside.push_back(w.rank);
      }
      continue;
    }
    auto g = j.groups.find(w.group_id);
    if (g == j.groups.end()) continue;
    std::pair<int, std::int64_t> key{w.group_id, w.seq};
    auto found = blocking.find(key);
    if (found == blocking.end()) {
      std::vector<int> members;
      for (int m : g->second.members) {
        if (m < 0 || m >= loc->world_size) continue;
        auto n = j.issued.find({m, w.group_id});
        std::int64_t count = n == j.issued.end() ? 0 : n->second;
        if (count < w.seq || cannot_proceed(m)) members.push_back(m);
      }
      found = blocking.emplace(key, std::move(members)).first;
    }
    for (int m : found->second) {
      if (m == w.rank) continue;
      ++w.waits_for_total;
      if (w.waits_for.size() < kListedWaitsFor) w.waits_for.push_back(m);
    }
    if (w.waits_for_total == 0) {
      graph.stuck_inside.push_back(w.rank);
    } else {
      waiting_in[key].push_back(w.rank);
    }
  }
  // A blocking member never issued #k (or cannot take part), so it is not
  // among the ranks waiting in #k: all of them wait for it.
  for (const auto& [key, waiters] : waiting_in) {
    for (int m : blocking[key]) add_waiters(m, waiters);
  }
  for (const auto& [m, ws] : graph.waited_by) {
    if (loc->ranks[m].waits_for_total == 0) loc->roots.push_back(m);
  }
  graph.cycle = loc->roots.empty() && !graph.waited_by.empty();
  if (graph.cycle) {
    for (const auto& [m, ws] : graph.waited_by) loc->roots.push_back(m);
  }
  std::stable_sort(loc->roots.begin(), loc->roots.end(), [&](int a, int b) {
    return graph.waited_by[a].count > graph.waited_by[b].count;
  });
  return graph;
}

// Desynchronised collectives: members that issued #k of a group as another
// operation (or all_reduce/broadcast of another size) than most of them.
// They lead the roots (the hang is theirs); returns the (group, seq) found so.
std::set<std::pair<int, std::int64_t>> FindDesynchronized(const Journals& j, const GroupLabels& label,
                                                          HangLocation* loc) {
  std::set<std::pair<int, std::int64_t>> checked;
  std::set<std::pair<int, std::int64_t>> desync;
  for (const RankWait& w : loc->ranks) {
    if (w.op.empty() || w.peer >= 0 || !checked.insert({w.group_id, w.seq}).second) continue;
    auto g = j.groups.find(w.group_id);
    if (g == j.groups.end()) continue;
    std::map<std::string, std::vector<int>> by_op;
    for (int m : g->second.members) {
      auto op = j.op_at.find({m, w.group_id, w.seq});
      if (op == j.op_at.end()) continue;
      std::string key = op->second->op();
      if (key == "all_reduce" || key == "broadcast") key += " of " + std::to_string(op->second->numel());
      by_op[key].push_back(m);
    }
    if (by_op.size() < 2) continue;
    desync.insert({w.group_id, w.seq});
    auto majority = std::max_element(by_op.begin(), by_op.end(), [](const auto& a, const auto& b) {
      return a.second.size() < b.second.size();
    });
    bool tie = std::count_if(by_op.begin(), by_op.end(), [&](const auto& e) {
                 return e.second.size() == majority->second.size();
               }) > 1;
    for (const auto& [key, ranks] : by_op) {
      if (&key == &majority->first && !tie) continue;
      for (int m : ranks) {
        if (std::count(loc->desynchronized.begin(), loc->desynchronized.end(), m) == 0) {
          loc->desynchronized.push_back(m);
        }
        loc->explanation_rank.push_back(m);
        loc->explanation.push_back(loc->Name(m) + " issued " + key + " as #" + std::to_string(w.seq) + " of its " +
                                   label(w.group_id) + " group while " +
                                   (tie ? "others" : RankList(majority->second)) + " issued " +
                                   (tie ? "something else" : majority->first) + ": desynchronised collectives");
      }
    }
  }
  std::sort(loc->desynchronized.begin(), loc->desynchronized.end());
  // A desynchronised rank is the root of the hang it causes, and comes first.
  for (int d : loc->desynchronized) {
    if (std::count(loc->roots.begin(), loc->roots.end(), d) == 0) loc->roots.insert(loc->roots.begin(), d);
  }
  if (!loc->desynchronized.empty()) {
    std::vector<int> first;
    for (int r : loc->roots) {
      if (std::count(loc->desynchronized.begin(), loc->desynchronized.end(), r)) first.push_back(r);
    }
    for (int r : loc->roots) {
      if (!std::count(first.begin(), first.end(), r)) first.push_back(r);
    }
    loc->roots = first;
  }
  return desync;
}

// What a root does, in words: why its waiters wait ("never entered
// all_reduce #7 of its dp group"), said through the closest waiter (the one
// in the smallest group: a pair for send/recv).
std::string WhatTheRootDid(const RankWait& x, const RankWait& first) {
  if (x.state == "exited") return " has exited";
  if (x.state == "stopped") return " is stopped (process state T)";
  if (x.state == "unknown") return " reports no journal";
  if (x.state == "device") {
    return " issued " + x.op + " #" + std::to_string(x.seq) +
           (x.peer >= 0 ? " with rank " + std::to_string(x.peer) : " of its " + x.group + " group") + " " +
           std::to_string(x.age_ms / 1000) +
           " s ago, but its GPU never started it: the device is busy or hung, stuck before the collective";
  }
  if (first.peer >= 0) {
    return first.op == "recv" ? " never sent what rank " + std::to_string(first.rank) + " waits to receive (#" +
                                    std::to_string(first.seq) + ")"
                              : " never received what rank " + std::to_string(first.rank) + " sends (#" +
                                    std::to_string(first.seq) + ")";
  }
  return " never entered " + first.op + " #" + std::to_string(first.seq) + " of its " + first.group + " group";
}

// What the root is doing itself, if anything: "it waits itself in ...", "it is computing ...".
std::string WhatTheRootDoes(const RankWait& x) {
  if (x.state == "waiting" && x.on_device && x.started_ms >= 0) {
    return "it waits itself in " + x.op + " #" + std::to_string(x.seq) +
           (x.peer >= 0 ? " with rank " + std::to_string(x.peer) : " of " + x.group) + ", started on its GPU";
  }
  if (x.state == "waiting") {
    return "it waits itself in " + x.op + " #" + std::to_string(x.seq) +
           (x.peer >= 0 ? " with rank " + std::to_string(x.peer) : " of " + x.group);
  }
  if (x.state == "computing" || x.state == "idle") {
    return "it is " + x.state + (x.phase.empty() ? "" : " in phase '" + x.phase + "'") +
           (x.step >= 0 ? " after step " + std::to_string(x.step) : "");
  }
  return "";
}

// The chain in words: a sentence per root, then a deadlock, then ranks stuck
// inside an operation every member entered (unless desynchronised members
// explain why it cannot finish).
void Explain(const Journals& j, const WaitGraph& graph, const std::set<std::pair<int, std::int64_t>>& desync,
             HangLocation* loc) {
  auto group_size = [&](const RankWait& w) {
    if (w.peer >= 0) return std::size_t{2};
    auto g = j.groups.find(w.group_id);
    return g == j.groups.end() ? std::size_t{1} << 30 : g->second.members.size();
  };
  for (int root : loc->roots) {
    auto by = graph.waited_by.find(root);
    if (by == graph.waited_by.end() || by->second.sample.empty()) continue;
    std::vector<int> waiters = by->second.sample;
    const std::int64_t waiter_count = by->second.count;
    std::sort(waiters.begin(), waiters.end());
    const RankWait* closest = &loc->ranks[waiters.front()];
    for (int w : waiters) {
      if (group_size(loc->ranks[w]) < group_size(*closest)) closest = &loc->ranks[w];
    }
    const RankWait& x = loc->ranks[root];
    const std::string doing = WhatTheRootDoes(x);
    std::string waits;
    for (std::size_t i = 0; i < waiters.size() && i < 8; ++i) {
      const RankWait& w = loc->ranks[waiters[i]];
      waits += (i == 0 ? "" : "; ") + std::to_string(w.rank) + " in " + w.op + " #" + std::to_string(w.seq) +
               (w.peer >= 0 ? " with rank " + std::to_string(w.peer) : " of " + w.group) + " for " +
               std::to_string(w.age_ms / 1000) + " s";
    }
    if (waiter_count > static_cast<std::int64_t>(waiters.size())) {
      waits += "; and " + std::to_string(waiter_count - static_cast<std::int64_t>(waiters.size())) + " more";
    }
    loc->explanation_rank.push_back(root);
    loc->explanation.push_back(loc->Name(root) + WhatTheRootDid(x, *closest) +
                               (doing.empty() ? "" : " (" + doing + ")") + "; " + std::to_string(waiter_count) +
                               " rank(s) wait for it: " + waits);
  }
  if (graph.cycle) {
    loc->explanation_rank.push_back(-1);
    loc->explanation.push_back("the waiting ranks wait for each other (" + RankList(loc->roots) +
                               "): a deadlock in the script's communication order");
  }
  std::vector<int> stuck;
  for (int r : graph.stuck_inside) {
    if (!desync.count({loc->ranks[r].group_id, loc->ranks[r].seq})) stuck.push_back(r);
  }
  if (!stuck.empty()) {
    const RankWait& w = loc->ranks[stuck.front()];
    loc->explanation_rank.push_back(-1);
    loc->explanation.push_back("rank(s) " + RankList(stuck) + " wait in " + w.op + " #" + std::to_string(w.seq) +
                               " of " + (w.peer >= 0 ? "the pair with rank " + std::to_string(w.peer) : w.group) +
                               ", which every member entered: the operation itself is stuck "
                               "(the network, or a peer's device)");
  }
}

}  // namespace

HangLocation LocateHang(const JobView& view) {
  HangLocation loc;
  const Journals journals = Gather(view, &loc);
  if (journals.status.empty()) return loc;
  loc.world_size = journals.status.rbegin()->first + 1;
  loc.ranks.resize(loc.world_size);
  const GroupLabels label(journals, InferLayout(journals, &loc), loc.world_size);
  ClassifyRanks(journals, label, &loc);
  const WaitGraph graph = TraceWaits(journals, &loc);
  const auto desync = FindDesynchronized(journals, label, &loc);
  Explain(journals, graph, desync, &loc);
  return loc;
}

void AttachLocation(const HangLocation& loc, Finding* f) {
  if (!loc.has_journal) return;
  json detail = json::parse(f->detail_json, nullptr, false);
  if (!detail.is_object()) detail = json::object();
  detail["location"] = loc.ToJson();
  f->detail_json = detail.dump(-1, ' ', false, kReplaceBadUtf8);
  f->roots = loc.roots;
  if (!loc.roots.empty()) {
    const RankWait& root = loc.ranks[loc.roots.front()];
    f->rank = root.rank;
    f->node = root.node;
    f->rank_step = root.step;
    // The journals name the culprit: they replace the detector's guess.
    for (const char* clause : {kHangCulprit, kHangNoCulprit}) {
      std::size_t guess = f->description.find(clause);
      if (guess != std::string::npos) f->description.resize(guess);
    }
    f->description += "; " + loc.explanation.front();
    f->culprit_evidence = loc.explanation.front();
  }
  for (std::size_t i = 0; i < loc.explanation.size(); ++i) {
    int rank = loc.explanation_rank[i];
    std::string node = rank >= 0 ? loc.ranks[rank].node : "";
    f->lines.push_back({rank, node, "trainguard: " + loc.explanation[i]});
  }
}

}  // namespace trainguard
