#include "agent/journal_status.h"

#include <algorithm>

namespace trainguard {
namespace {

constexpr int kRecentOps = 8;

void DescribeOp(const OpSnapshot& op, Nanos now_mono, v1::CommOp* out) {
  out->set_group_id(op.group_id);
  out->set_seq(op.seq);
  out->set_op(OpKindName(op.kind));
  out->set_dtype(DtypeName(op.dtype));
  out->set_numel(op.numel);
  out->set_peer(op.peer);
  out->set_age_ms(std::max<Nanos>(0, now_mono - op.issued_mono_ns) / kMillisecond);
  out->set_on_device(op.on_device);
  out->set_started_ms(op.on_device ? op.started_ms : -1);
  out->set_duration_ms(op.completed_mono_ns == 0
                           ? -1
                           : std::max<Nanos>(0, op.completed_mono_ns - op.issued_mono_ns) / kMillisecond);
}

}  // namespace

void DescribeJournal(const JournalSnapshot& journal, Nanos now_mono, v1::RankStatus* out) {
  for (const GroupSnapshot& g : journal.groups) {
    v1::CommGroup* cg = out->add_groups();
    cg->set_id(g.id);
    cg->set_name(g.name);
    cg->set_size(g.size);
    cg->set_issued(g.issued);
    cg->set_completed(g.completed);
    cg->set_truncated(g.truncated);
    // Send an arithmetic progression as such: a data-parallel group of
    // thousands of ranks stays three numbers.
    bool progression = g.members.size() >= 2 && !g.truncated;
    std::int32_t stride = progression ? g.members[1] - g.members[0] : 0;
    for (std::size_t i = 1; i < g.members.size() && progression; ++i) {
      progression = stride > 0 && g.members[i] - g.members[i - 1] == stride;
    }
    if (progression || g.members.size() == 1) {
      cg->set_first(g.members[0]);
      cg->set_stride(progression ? stride : 1);
    } else {
      for (std::int32_t m : g.members) cg->add_members(m);
    }
  }
  for (const PeerSnapshot& p : journal.peers) {
    v1::PeerCounts* pc = out->add_peers();
    pc->set_peer(p.peer);
    pc->set_sends(p.sends);
    pc->set_recvs(p.recvs);
  }
  int completed = 0;
  for (const OpSnapshot& op : journal.ops) completed += op.completed_mono_ns != 0;
  int skip = std::max(0, completed - kRecentOps);
  for (const OpSnapshot& op : journal.ops) {
    if (op.completed_mono_ns == 0) {
      DescribeOp(op, now_mono, out->add_ops_in_flight());
    } else if (skip > 0) {
      --skip;
    } else {
      DescribeOp(op, now_mono, out->add_recent_ops());
    }
  }
  out->set_ops_dropped(journal.dropped);
}

}  // namespace trainguard
