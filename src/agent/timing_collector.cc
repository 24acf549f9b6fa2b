#include "agent/timing_collector.h"

#include <algorithm>

namespace trainguard {

void TimingCollector::Poll(const StatusPage& page) {
  // Operations first: one that completed before a step record was written is
  // then already here when that step closes.
  AddOps(page.journal);
  for (TimingSample& t : cursor_.Drain(page.timings)) {
    if (t.kind == TimingKind::kStep) {
      CloseStep(t);
      continue;
    }
    CollectedInterval i;
    i.name = std::move(t.name);
    i.kind = t.kind == TimingKind::kGpu   ? IntervalKind::kDevice
             : t.kind == TimingKind::kCpu ? IntervalKind::kCpu
                                          : IntervalKind::kPhase;
    i.start_mono_ns = t.start_mono_ns;
    i.duration_ns = t.duration_ns;
    // A device time read back after its step closed joins that step while it
    // is held back.
    if (i.kind == IntervalKind::kDevice && !closed_.empty() && t.after_step < closed_.back().step) {
      for (CollectedStep& s : closed_) {
        if (s.step > t.after_step) {
          s.intervals.push_back(std::move(i));
          break;
        }
      }
      continue;
    }
    open_[t.after_step].push_back(std::move(i));
  }
  names_full_ = page.timings.names_full.load(std::memory_order_relaxed);
}

void TimingCollector::AddOps(const OpJournal& journal) {
  std::uint64_t head = journal.next_record.load(std::memory_order_acquire);
  if (head >= journal_seen_ && head - journal_seen_ > static_cast<std::uint64_t>(kJournalRecords)) {
    ops_dropped_ += static_cast<std::int64_t>(head - journal_seen_ - kJournalRecords);
  }
  journal_seen_ = head;
  JournalSnapshot snap = ReadJournal(journal);
  std::int64_t oldest_in_flight = -1;
  std::int64_t newest = ops_watermark_;
  for (const OpSnapshot& op : snap.ops) {
    if (op.completed_mono_ns == 0) {
      if (oldest_in_flight < 0 || op.issued_mono_ns < oldest_in_flight) oldest_in_flight = op.issued_mono_ns;
      continue;
    }
    newest = std::max(newest, op.issued_mono_ns);
    if (op.issued_mono_ns < ops_watermark_) continue;  // taken before
    auto key = std::make_tuple(op.issued_mono_ns, static_cast<int>(op.kind), op.seq, op.peer);
    if (!ops_taken_.insert(key).second) continue;
    CollectedInterval i;
    i.name = OpKindName(op.kind);
    i.kind = op.kind == OpKind::kSend   ? IntervalKind::kSend
             : op.kind == OpKind::kRecv ? IntervalKind::kRecv
                                        : IntervalKind::kCollective;
    i.start_mono_ns = op.issued_mono_ns;
    i.duration_ns = op.completed_mono_ns - op.issued_mono_ns;
    i.group_id = op.group_id;
    i.seq = op.seq;
    i.peer = op.peer;
    i.numel = op.numel;
    ops_.push_back(std::move(i));
  }
  // Everything older than what is still in flight has been seen complete.
  ops_watermark_ = oldest_in_flight >= 0 ? oldest_in_flight : newest;
  ops_taken_.erase(ops_taken_.begin(), ops_taken_.lower_bound(std::make_tuple(ops_watermark_, -1, INT64_MIN, INT32_MIN)));
}

void TimingCollector::CloseStep(const TimingSample& step) {
  CollectedStep s;
  s.step = step.step;
  s.start_mono_ns = step.start_mono_ns;
  s.duration_ns = step.duration_ns;
  // This step's phases, and any left from steps whose record was lost.
  auto end = open_.upper_bound(step.after_step);
  for (auto it = open_.begin(); it != end; ++it) {
    for (CollectedInterval& i : it->second) s.intervals.push_back(std::move(i));
  }
  open_.erase(open_.begin(), end);
  std::int64_t step_end = step.start_mono_ns + step.duration_ns;
  auto issued_later = std::stable_partition(ops_.begin(), ops_.end(), [&](const CollectedInterval& op) {
    return op.start_mono_ns < step_end;
  });
  for (auto it = ops_.begin(); it != issued_later; ++it) s.intervals.push_back(std::move(*it));
  ops_.erase(ops_.begin(), issued_later);
  std::stable_sort(s.intervals.begin(), s.intervals.end(),
                   [](const CollectedInterval& a, const CollectedInterval& b) {
                     return a.start_mono_ns < b.start_mono_ns;
                   });
  closed_.push_back(std::move(s));
}

std::vector<CollectedStep> TimingCollector::Take(bool flush) {
  std::vector<CollectedStep> out;
  std::size_t n = closed_.size();
  if (!flush && n > 0) --n;  // the newest is held back
  out.insert(out.end(), std::make_move_iterator(closed_.begin()),
             std::make_move_iterator(closed_.begin() + static_cast<std::ptrdiff_t>(n)));
  closed_.erase(closed_.begin(), closed_.begin() + static_cast<std::ptrdiff_t>(n));
  return out;
}

std::int64_t TimingCollector::dropped() const { return cursor_.dropped() + ops_dropped_ + names_full_; }

void AddSteps(int global_rank, const std::vector<CollectedStep>& steps, std::int64_t to_unix_ns,
              v1::Timings* t, std::map<std::string, int>* names) {
  for (const CollectedStep& cs : steps) {
    v1::StepTiming* st = t->add_steps();
    st->set_global_rank(global_rank);
    st->set_step(cs.step);
    st->set_start_unix_us((cs.start_mono_ns + to_unix_ns) / 1000);
    st->set_duration_us(cs.duration_ns / 1000);
    for (const CollectedInterval& ci : cs.intervals) {
      v1::PhaseInterval* pi = st->add_intervals();
      auto [it, added] = names->emplace(ci.name, static_cast<int>(names->size()));
      if (added) t->add_names(ci.name);
      pi->set_name(it->second);
      pi->set_kind(static_cast<int>(ci.kind));
      pi->set_start_us((ci.start_mono_ns - cs.start_mono_ns) / 1000);
      pi->set_duration_us(ci.duration_ns / 1000);
      if (ci.kind != IntervalKind::kPhase && ci.kind != IntervalKind::kDevice && ci.kind != IntervalKind::kCpu) {
        pi->set_group_id(ci.group_id);
        pi->set_seq(ci.seq);
        pi->set_peer(ci.peer);
        pi->set_numel(ci.numel);
      }
    }
  }
}

}  // namespace trainguard
