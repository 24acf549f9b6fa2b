// The journal of communication operations, a region of the status page
// (docs/status_page.md): for each process group the rank used, its members
// and how many collectives it issued and completed; for each point-to-point
// peer, how many sends and receives; and a ring of the latest operations,
// in flight or completed, each with its group, sequence number, kind, size
// and times. The client writes it (one writer at a time: the client holds a
// mutex); the agent reads it at any time without a lock, so a hung or dead
// rank's journal can still be read.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace trainguard {

constexpr int kJournalRecords = 128;
constexpr int kJournalGroups = 32;
constexpr int kJournalPeers = 16;
constexpr int kGroupNameCapacity = 32;  // including the terminating NUL
constexpr int kGroupInlineMembers = 64;

// Operation kinds, as stored (u16). 0 is "unknown".
enum class OpKind : std::uint16_t {
  kUnknown = 0,
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBarrier,
  kGather,
  kScatter,
  kSend,
  kRecv,
};
const char* OpKindName(OpKind k);
// By name ("all_reduce", "send", ...); kUnknown if none.
OpKind OpKindFromName(const std::string& name);
bool IsPointToPoint(OpKind k);

// Element types, as stored (u16); names as torch spells them without "torch.".
const char* DtypeName(std::uint16_t code);
std::uint16_t DtypeCode(const std::string& name);  // 0 if unknown

// One operation. `version` is a sequence lock over the other fields: odd
// while the client writes them, 0 if the record was never used.
// `completed_mono_ns` alone is written later, without the lock.
struct OpRecord {
  std::atomic<std::uint64_t> version;
  std::atomic<std::int64_t> seq;                // per group (collectives) or per peer and direction
  std::atomic<std::int64_t> issued_mono_ns;
  std::atomic<std::int64_t> completed_mono_ns;  // 0 while in flight
  std::atomic<std::int64_t> numel;
  std::atomic<std::int32_t> group_id;
  std::atomic<std::int32_t> peer;               // point-to-point: the peer's global rank, else -1
  std::atomic<std::uint32_t> kind_dtype;        // OpKind << 16 | dtype code
  // Device operations (CUDA tensors): kDeviceNotStarted until the device
  // reached the operation (an event recorded on the stream just before it
  // completed), then kDeviceStarted + milliseconds from issue to start.
  // kHostOperation for the rest. Written later, without the lock.
  std::atomic<std::uint32_t> device;
};
constexpr std::uint32_t kHostOperation = 0;
constexpr std::uint32_t kDeviceNotStarted = 1;
constexpr std::uint32_t kDeviceStarted = 2;

struct GroupEntry {
  std::atomic<std::uint64_t> version;   // sequence lock over id..members; 0: unused
  std::atomic<std::int32_t> id;         // the same on every rank
  std::atomic<std::int32_t> size;
  std::atomic<std::int32_t> first;      // members are first + i * stride ...
  std::atomic<std::int32_t> stride;     // ... when stride > 0; else listed in members
  std::atomic<std::int64_t> issued;     // collectives issued: the sequence number of the latest
  std::atomic<std::int64_t> completed;
  char name[kGroupNameCapacity];
  std::int32_t members[kGroupInlineMembers];  // irregular groups: the first members, in order
};

struct PeerEntry {
  std::atomic<std::int32_t> peer;       // global rank; -1: unused
  std::int32_t reserved;
  std::atomic<std::int64_t> sends;      // sends to peer issued
  std::atomic<std::int64_t> recvs;      // receives from peer issued
};

struct OpJournal {
  std::atomic<std::uint64_t> next_record;  // records written so far (the ring's head)
  std::atomic<std::int32_t> groups_used;
  std::atomic<std::int32_t> peers_used;
  std::atomic<std::int64_t> dropped;       // operations not recorded (tables full)
  GroupEntry groups[kJournalGroups];
  PeerEntry peers[kJournalPeers];
  OpRecord records[kJournalRecords];
};

// The layout docs/status_page.md gives.
static_assert(sizeof(GroupEntry) == 328 && sizeof(PeerEntry) == 24 && sizeof(OpRecord) == 56);
static_assert(offsetof(OpJournal, groups) == 24 && offsetof(OpJournal, peers) == 10520 &&
              offsetof(OpJournal, records) == 10904);

// Writer side. Callers serialize these (the client holds one mutex).
void InitJournal(OpJournal* j);
// Registers a group; returns its slot, or -1 if the table is full.
int JournalAddGroup(OpJournal* j, std::int32_t id, const std::string& name,
                    const std::vector<std::int32_t>& members);
// Records an operation issued now on the group in `group_slot` (collectives)
// or with `peer` (point-to-point: group_slot names the group it went through,
// or -1). `on_device`: its tensors are a device's, whose start JournalStarted
// records. Returns a token for JournalComplete, or -1 if not recorded.
std::int64_t JournalIssue(OpJournal* j, int group_slot, OpKind kind, std::uint16_t dtype,
                          std::int64_t numel, std::int32_t peer, std::int64_t now_mono_ns,
                          bool on_device = false);
// The device reached the operation (its stream ran what came before it).
void JournalStarted(OpJournal* j, std::int64_t token, std::int64_t now_mono_ns);
void JournalComplete(OpJournal* j, std::int64_t token, std::int64_t now_mono_ns);

// Reader side.
struct OpSnapshot {
  std::int32_t group_id = -1;
  std::int64_t seq = 0;
  OpKind kind = OpKind::kUnknown;
  std::uint16_t dtype = 0;
  std::int64_t numel = 0;
  std::int32_t peer = -1;
  std::int64_t issued_mono_ns = 0;
  std::int64_t completed_mono_ns = 0;  // 0: in flight
  bool on_device = false;
  std::int64_t started_ms = -1;        // device operations: from issue to start; -1: not started
};
struct GroupSnapshot {
  std::int32_t id = -1;
  std::string name;
  std::vector<std::int32_t> members;  // complete unless truncated
  std::int32_t size = 0;
  bool truncated = false;             // more than kGroupInlineMembers irregular members
  std::int64_t issued = 0;
  std::int64_t completed = 0;
};
struct PeerSnapshot {
  std::int32_t peer = -1;
  std::int64_t sends = 0;
  std::int64_t recvs = 0;
};
struct JournalSnapshot {
  std::vector<GroupSnapshot> groups;
  std::vector<PeerSnapshot> peers;
  std::vector<OpSnapshot> ops;  // oldest first
  std::int64_t dropped = 0;
};
JournalSnapshot ReadJournal(const OpJournal& j);

}  // namespace trainguard
