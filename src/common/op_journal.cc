#include "common/op_journal.h"

#include <algorithm>
#include <cstring>

namespace trainguard {
namespace {

constexpr const char* kOpNames[] = {"unknown",   "all_reduce", "broadcast", "reduce",
                                    "all_gather", "reduce_scatter", "all_to_all", "barrier",
                                    "gather",    "scatter",    "send",      "recv"};
constexpr const char* kDtypeNames[] = {"unknown",  "float32", "float16", "bfloat16", "float64",
                                       "int64",    "int32",   "int16",   "int8",     "uint8",
                                       "bool",     "complex64", "complex128"};

// Sequence-lock helpers: odd while written.
std::uint64_t BeginWrite(std::atomic<std::uint64_t>& v) {
  std::uint64_t s = v.load(std::memory_order_relaxed) | 1;
  v.store(s, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  return s;
}
void EndWrite(std::atomic<std::uint64_t>& v, std::uint64_t s) {
  v.store(s + 1, std::memory_order_release);
}

}  // namespace

const char* OpKindName(OpKind k) {
  auto i = static_cast<std::size_t>(k);
  return i < std::size(kOpNames) ? kOpNames[i] : "unknown";
}

OpKind OpKindFromName(const std::string& name) {
  for (std::size_t i = 1; i < std::size(kOpNames); ++i) {
    if (name == kOpNames[i]) return static_cast<OpKind>(i);
  }
  return OpKind::kUnknown;
}

bool IsPointToPoint(OpKind k) { return k == OpKind::kSend || k == OpKind::kRecv; }

const char* DtypeName(std::uint16_t code) {
  return code < std::size(kDtypeNames) ? kDtypeNames[code] : "unknown";
}

std::uint16_t DtypeCode(const std::string& name) {
  for (std::size_t i = 1; i < std::size(kDtypeNames); ++i) {
    if (name == kDtypeNames[i]) return static_cast<std::uint16_t>(i);
  }
  return 0;
}

void InitJournal(OpJournal* j) {
  std::memset(static_cast<void*>(j), 0, sizeof(OpJournal));
  for (auto& p : j->peers) p.peer.store(-1, std::memory_order_relaxed);
}

int JournalAddGroup(OpJournal* j, std::int32_t id, const std::string& name,
                    const std::vector<std::int32_t>& members) {
  int slot = j->groups_used.load(std::memory_order_relaxed);
  if (slot >= kJournalGroups) {
    j->dropped.fetch_add(1, std::memory_order_relaxed);
    return -1;
  }
  GroupEntry& g = j->groups[slot];
  std::uint64_t s = BeginWrite(g.version);
  g.id.store(id, std::memory_order_relaxed);
  g.size.store(static_cast<std::int32_t>(members.size()), std::memory_order_relaxed);
  // An arithmetic progression (TP, PP and DP groups usually are) is stored
  // as first + stride; anything else as a list.
  std::int32_t first = members.empty() ? 0 : members[0];
  std::int32_t stride = members.size() >= 2 ? members[1] - members[0] : 1;
  for (std::size_t i = 1; i < members.size() && stride > 0; ++i) {
    if (members[i] - members[i - 1] != stride) stride = 0;
  }
  g.first.store(first, std::memory_order_relaxed);
  g.stride.store(stride, std::memory_order_relaxed);
  std::size_t n = std::min<std::size_t>(name.size(), kGroupNameCapacity - 1);
  std::memcpy(g.name, name.data(), n);
  g.name[n] = '\0';
  std::size_t listed = std::min<std::size_t>(members.size(), kGroupInlineMembers);
  for (std::size_t i = 0; i < listed; ++i) g.members[i] = members[i];
  EndWrite(g.version, s);
  j->groups_used.store(slot + 1, std::memory_order_release);
  return slot;
}

std::int64_t JournalIssue(OpJournal* j, int group_slot, OpKind kind, std::uint16_t dtype,
                          std::int64_t numel, std::int32_t peer, std::int64_t now_mono_ns,
                          bool on_device) {
  std::int64_t seq = 0;
  std::int32_t group_id = -1;
  if (group_slot >= 0 && group_slot < j->groups_used.load(std::memory_order_relaxed)) {
    group_id = j->groups[group_slot].id.load(std::memory_order_relaxed);
  }
  if (IsPointToPoint(kind)) {
    // The n-th send to a peer pairs with the peer's n-th receive from us.
    int used = j->peers_used.load(std::memory_order_relaxed);
    PeerEntry* p = nullptr;
    for (int i = 0; i < used && p == nullptr; ++i) {
      if (j->peers[i].peer.load(std::memory_order_relaxed) == peer) p = &j->peers[i];
    }
    if (p == nullptr && used < kJournalPeers) {
      p = &j->peers[used];
      p->peer.store(peer, std::memory_order_relaxed);
      j->peers_used.store(used + 1, std::memory_order_release);
    }
    if (p == nullptr) {
      j->dropped.fetch_add(1, std::memory_order_relaxed);
      return -1;
    }
    auto& counter = kind == OpKind::kSend ? p->sends : p->recvs;
    seq = counter.load(std::memory_order_relaxed) + 1;
    counter.store(seq, std::memory_order_release);
  } else {
    if (group_id < 0) {
      j->dropped.fetch_add(1, std::memory_order_relaxed);
      return -1;
    }
    GroupEntry& g = j->groups[group_slot];
    seq = g.issued.load(std::memory_order_relaxed) + 1;
    g.issued.store(seq, std::memory_order_release);
  }
  // The next slot of the ring whose operation is not in flight; an operation
  // in flight is never overwritten (if all are, the oldest is).
  std::uint64_t head = j->next_record.load(std::memory_order_relaxed);
  int index = static_cast<int>(head % kJournalRecords);
  for (int tries = 0; tries < kJournalRecords; ++tries) {
    const OpRecord& r = j->records[(head + tries) % kJournalRecords];
    if (r.version.load(std::memory_order_relaxed) == 0 ||
        r.completed_mono_ns.load(std::memory_order_relaxed) != 0) {
      index = static_cast<int>((head + tries) % kJournalRecords);
      head += tries;
      break;
    }
  }
  OpRecord& r = j->records[index];
  std::uint64_t s = BeginWrite(r.version);
  r.seq.store(seq, std::memory_order_relaxed);
  r.issued_mono_ns.store(now_mono_ns, std::memory_order_relaxed);
  r.completed_mono_ns.store(0, std::memory_order_relaxed);
  r.numel.store(numel, std::memory_order_relaxed);
  r.group_id.store(group_id, std::memory_order_relaxed);
  r.peer.store(peer, std::memory_order_relaxed);
  r.kind_dtype.store(static_cast<std::uint32_t>(kind) << 16 | dtype, std::memory_order_relaxed);
  r.device.store(on_device ? kDeviceNotStarted : kHostOperation, std::memory_order_relaxed);
  EndWrite(r.version, s);
  j->next_record.store(head + 1, std::memory_order_release);
  // The token names the record and this use of it.
  return static_cast<std::int64_t>((s + 1) << 8) | index;
}

namespace {

// The record a token names, or null if the token is invalid or the record
// was reused since (more than kJournalRecords operations in flight): it
// belongs to another operation now.
OpRecord* RecordOf(OpJournal* j, std::int64_t token) {
  if (token < 0) return nullptr;
  int record = static_cast<int>(token & 0xff);
  if (record >= kJournalRecords) return nullptr;
  OpRecord& r = j->records[record];
  if (r.version.load(std::memory_order_relaxed) != static_cast<std::uint64_t>(token) >> 8) return nullptr;
  return &r;
}

}  // namespace

void JournalStarted(OpJournal* j, std::int64_t token, std::int64_t now_mono_ns) {
  OpRecord* found = RecordOf(j, token);
  if (found == nullptr) return;
  OpRecord& r = *found;
  if (r.device.load(std::memory_order_relaxed) != kDeviceNotStarted) return;
  std::int64_t ms = std::max<std::int64_t>(0, now_mono_ns - r.issued_mono_ns.load(std::memory_order_relaxed)) / 1'000'000;
  r.device.store(kDeviceStarted + static_cast<std::uint32_t>(std::min<std::int64_t>(ms, UINT32_MAX - kDeviceStarted)),
                 std::memory_order_release);
}

void JournalComplete(OpJournal* j, std::int64_t token, std::int64_t now_mono_ns) {
  OpRecord* found = RecordOf(j, token);
  if (found == nullptr) return;
  OpRecord& r = *found;
  if (r.completed_mono_ns.load(std::memory_order_relaxed) != 0) return;
  r.completed_mono_ns.store(std::max<std::int64_t>(now_mono_ns, 1), std::memory_order_release);
  std::uint32_t kd = r.kind_dtype.load(std::memory_order_relaxed);
  if (IsPointToPoint(static_cast<OpKind>(kd >> 16))) return;
  std::int32_t id = r.group_id.load(std::memory_order_relaxed);
  int used = j->groups_used.load(std::memory_order_relaxed);
  for (int i = 0; i < used; ++i) {
    if (j->groups[i].id.load(std::memory_order_relaxed) == id) {
      j->groups[i].completed.fetch_add(1, std::memory_order_release);
      break;
    }
  }
}

namespace {

// Copies a record under its lock; false if it is unused or kept changing.
bool ReadRecord(const OpRecord& r, OpSnapshot* out) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::uint64_t before = r.version.load(std::memory_order_acquire);
    if (before == 0) return false;
    if (before & 1) continue;
    OpSnapshot s;
    s.seq = r.seq.load(std::memory_order_relaxed);
    s.issued_mono_ns = r.issued_mono_ns.load(std::memory_order_relaxed);
    s.numel = r.numel.load(std::memory_order_relaxed);
    s.group_id = r.group_id.load(std::memory_order_relaxed);
    s.peer = r.peer.load(std::memory_order_relaxed);
    std::uint32_t kd = r.kind_dtype.load(std::memory_order_relaxed);
    s.kind = static_cast<OpKind>(kd >> 16);
    s.dtype = static_cast<std::uint16_t>(kd & 0xffff);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (r.version.load(std::memory_order_relaxed) != before) continue;
    s.completed_mono_ns = r.completed_mono_ns.load(std::memory_order_acquire);
    std::uint32_t device = r.device.load(std::memory_order_acquire);
    s.on_device = device != kHostOperation;
    s.started_ms = device >= kDeviceStarted ? static_cast<std::int64_t>(device - kDeviceStarted) : -1;
    *out = s;
    return true;
  }
  return false;
}

bool ReadGroup(const GroupEntry& g, GroupSnapshot* out) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::uint64_t before = g.version.load(std::memory_order_acquire);
    if (before == 0) return false;
    if (before & 1) continue;
    GroupSnapshot s;
    s.id = g.id.load(std::memory_order_relaxed);
    s.size = g.size.load(std::memory_order_relaxed);
    std::int32_t first = g.first.load(std::memory_order_relaxed);
    std::int32_t stride = g.stride.load(std::memory_order_relaxed);
    char name[kGroupNameCapacity];
    std::memcpy(name, g.name, sizeof(name));
    std::int32_t listed[kGroupInlineMembers];
    std::memcpy(listed, g.members, sizeof(listed));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (g.version.load(std::memory_order_relaxed) != before) continue;
    name[kGroupNameCapacity - 1] = '\0';
    s.name = name;
    if (s.size < 0) return false;
    if (stride > 0) {
      for (std::int32_t i = 0; i < s.size; ++i) s.members.push_back(first + i * stride);
    } else {
      std::int32_t n = std::min<std::int32_t>(s.size, kGroupInlineMembers);
      s.members.assign(listed, listed + n);
      s.truncated = s.size > kGroupInlineMembers;
    }
    s.issued = g.issued.load(std::memory_order_acquire);
    s.completed = g.completed.load(std::memory_order_acquire);
    *out = std::move(s);
    return true;
  }
  return false;
}

}  // namespace

JournalSnapshot ReadJournal(const OpJournal& j) {
  JournalSnapshot snap;
  int groups = std::clamp(j.groups_used.load(std::memory_order_acquire), 0, kJournalGroups);
  for (int i = 0; i < groups; ++i) {
    GroupSnapshot g;
    if (ReadGroup(j.groups[i], &g)) snap.groups.push_back(std::move(g));
  }
  int peers = std::clamp(j.peers_used.load(std::memory_order_acquire), 0, kJournalPeers);
  for (int i = 0; i < peers; ++i) {
    PeerSnapshot p;
    p.peer = j.peers[i].peer.load(std::memory_order_relaxed);
    p.sends = j.peers[i].sends.load(std::memory_order_acquire);
    p.recvs = j.peers[i].recvs.load(std::memory_order_acquire);
    snap.peers.push_back(p);
  }
  for (int i = 0; i < kJournalRecords; ++i) {
    OpSnapshot s;
    if (ReadRecord(j.records[i], &s)) snap.ops.push_back(s);
  }
  std::sort(snap.ops.begin(), snap.ops.end(),
            [](const OpSnapshot& a, const OpSnapshot& b) { return a.issued_mono_ns < b.issued_mono_ns; });
  snap.dropped = j.dropped.load(std::memory_order_relaxed);
  return snap;
}

}  // namespace trainguard
