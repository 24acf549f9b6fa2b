// InMemoryEventStore: the store of tests and the simulator; nothing survives
// the process.
#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>

#include "store/event_store.h"

namespace trainguard {

Status InMemoryEventStore::CreateJob(const JobRecord& job) {
  std::lock_guard<std::mutex> lock(mu_);
  TG_RETURN_IF_ERROR(Fence("CreateJob"));
  for (const auto& j : jobs_) {
    if (j.job_id == job.job_id) return InvalidArgument("job " + job.job_id + " already exists");
  }
  jobs_.push_back(job);
  return Status::Ok();
}

Status InMemoryEventStore::UpdateJob(const std::string& job_id, const std::string& state,
                                     const std::string& summary, Nanos ended_wall_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  TG_RETURN_IF_ERROR(Fence("UpdateJob"));
  for (auto& j : jobs_) {
    if (j.job_id == job_id) {
      j.state = state;
      j.summary = summary;
      j.ended_wall_ns = ended_wall_ns;
      return Status::Ok();
    }
  }
  return NotFound("job " + job_id);
}

Status InMemoryEventStore::Append(const Event& event) { return AppendEvents({event}); }

Status InMemoryEventStore::AppendEvents(const std::vector<Event>& events) {
  std::lock_guard<std::mutex> lock(mu_);
  TG_RETURN_IF_ERROR(Fence("AppendEvents"));
  for (const Event& event : events) {
    if (!NewUid(event.uid)) continue;  // stored already
    events_.push_back(event);
    events_.back().uid.clear();  // not read back
    events_.back().id = static_cast<std::int64_t>(events_.size());
  }
  return Status::Ok();
}

StatusOr<std::vector<Event>> InMemoryEventStore::EventsAfter(const std::string& job_id, std::int64_t after_id,
                                                             int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Event> out;
  for (const auto& e : events_) {
    if (limit >= 0 && static_cast<int>(out.size()) >= limit) break;
    if (e.job_id == job_id && e.id > after_id) out.push_back(e);
  }
  return out;
}

StatusOr<std::vector<JobRecord>> InMemoryEventStore::Jobs() {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_;
}

Status InMemoryEventStore::RecordIncident(const IncidentRecord& incident) {
  std::lock_guard<std::mutex> lock(mu_);
  TG_RETURN_IF_ERROR(Fence("RecordIncident"));
  if (NewUid(incident.uid)) incidents_.push_back(incident);
  return Status::Ok();
}

StatusOr<std::vector<IncidentRecord>> InMemoryEventStore::IncidentsOnNode(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<IncidentRecord> out;
  for (const auto& i : incidents_) {
    if (node.empty() || i.node == node) out.push_back(i);
  }
  return out;
}

Status InMemoryEventStore::SetNodeHealth(const NodeHealth& health) {
  std::lock_guard<std::mutex> lock(mu_);
  TG_RETURN_IF_ERROR(Fence("SetNodeHealth"));
  for (auto& h : health_) {
    if (h.node == health.node) {
      h = health;
      return Status::Ok();
    }
  }
  health_.push_back(health);
  return Status::Ok();
}

StatusOr<NodeHealth> InMemoryEventStore::GetNodeHealth(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& h : health_) {
    if (h.node == node) return h;
  }
  return NodeHealth{node, "", "", "", 0};
}

StatusOr<std::vector<NodeHealth>> InMemoryEventStore::ListNodeHealth() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NodeHealth> out = health_;
  std::sort(out.begin(), out.end(), [](const NodeHealth& a, const NodeHealth& b) { return a.node < b.node; });
  return out;
}

Status InMemoryEventStore::RecordNodeAction(const NodeAction& action) {
  std::lock_guard<std::mutex> lock(mu_);
  TG_RETURN_IF_ERROR(Fence("RecordNodeAction"));
  if (NewUid(action.uid)) actions_.push_back(action);
  return Status::Ok();
}

StatusOr<std::vector<NodeAction>> InMemoryEventStore::NodeActions(const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NodeAction> out;
  for (const auto& a : actions_) {
    if (node.empty() || a.node == node) out.push_back(a);
  }
  return out;
}

Status InMemoryEventStore::RecordDiagnostics(const DiagnosticsRecord& record) {
  std::lock_guard<std::mutex> lock(mu_);
  TG_RETURN_IF_ERROR(Fence("RecordDiagnostics"));
  if (NewUid(record.uid)) diagnostics_.push_back(record);
  return Status::Ok();
}

StatusOr<std::vector<DiagnosticsRecord>> InMemoryEventStore::LatestDiagnostics() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, DiagnosticsRecord> newest;  // later records replace earlier ones
  for (const auto& d : diagnostics_) newest[d.node] = d;
  std::vector<DiagnosticsRecord> out;
  for (auto& [node, d] : newest) out.push_back(std::move(d));
  return out;
}

Status InMemoryEventStore::AppendStepTimings(const std::vector<StepTimingRecord>& rows) {
  std::lock_guard<std::mutex> lock(mu_);
  TG_RETURN_IF_ERROR(Fence("AppendStepTimings"));
  for (const StepTimingRecord& r : rows) {
    auto same = std::find_if(timings_.begin(), timings_.end(), [&](const StepTimingRecord& t) {
      return t.job_id == r.job_id && t.generation == r.generation && t.rank == r.rank && t.step == r.step;
    });
    if (same != timings_.end()) {
      *same = r;
    } else {
      timings_.push_back(r);
    }
  }
  return Status::Ok();
}

StatusOr<std::vector<StepTimingRecord>> InMemoryEventStore::StepTimings(const std::string& job_id,
                                                                        std::int64_t from, std::int64_t to) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<StepTimingRecord> out;
  for (const auto& t : timings_) {
    if (t.job_id == job_id && t.step >= from && t.step <= to) out.push_back(t);
  }
  std::sort(out.begin(), out.end(), [](const StepTimingRecord& a, const StepTimingRecord& b) {
    return std::tie(a.step, a.generation, a.rank) < std::tie(b.step, b.generation, b.rank);
  });
  return out;
}

Status InMemoryEventStore::CompactStepTimings(const std::string& job_id, std::int64_t before_step,
                                              int keep_every) {
  std::lock_guard<std::mutex> lock(mu_);
  TG_RETURN_IF_ERROR(Fence("CompactStepTimings"));
  std::int64_t every = std::max(keep_every, 1);
  timings_.erase(std::remove_if(timings_.begin(), timings_.end(),
                                [&](const StepTimingRecord& t) {
                                  return t.job_id == job_id && t.step < before_step && t.step % every != 0;
                                }),
                 timings_.end());
  for (auto& t : timings_) {
    if (t.job_id == job_id && t.step < before_step) t.intervals.clear();
  }
  return Status::Ok();
}

Status InMemoryEventStore::AppendGpuSamples(const std::vector<GpuSampleRecord>& rows) {
  std::lock_guard<std::mutex> lock(mu_);
  TG_RETURN_IF_ERROR(Fence("AppendGpuSamples"));
  for (const GpuSampleRecord& r : rows) {
    auto same = std::find_if(gpu_samples_.begin(), gpu_samples_.end(), [&](const GpuSampleRecord& g) {
      return g.job_id == r.job_id && g.wall_ns == r.wall_ns && g.node == r.node && g.gpu == r.gpu;
    });
    if (same != gpu_samples_.end()) {
      *same = r;
    } else {
      gpu_samples_.push_back(r);
    }
  }
  return Status::Ok();
}

StatusOr<std::vector<GpuSampleRecord>> InMemoryEventStore::GpuSamples(const std::string& job_id, Nanos from,
                                                                      Nanos to) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<GpuSampleRecord> out;
  for (const auto& g : gpu_samples_) {
    if (g.job_id == job_id && g.wall_ns >= from && g.wall_ns <= to) out.push_back(g);
  }
  std::sort(out.begin(), out.end(), [](const GpuSampleRecord& a, const GpuSampleRecord& b) {
    return std::tie(a.wall_ns, a.node, a.gpu) < std::tie(b.wall_ns, b.node, b.gpu);
  });
  return out;
}

Status InMemoryEventStore::CompactGpuSamples(const std::string& job_id, Nanos before, Nanos keep_every) {
  std::lock_guard<std::mutex> lock(mu_);
  TG_RETURN_IF_ERROR(Fence("CompactGpuSamples"));
  const Nanos every = std::max<Nanos>(keep_every, 1);
  std::erase_if(gpu_samples_, [&](const GpuSampleRecord& g) {
    return g.job_id == job_id && g.wall_ns < before && g.wall_ns % every != 0;
  });
  return Status::Ok();
}

Status InMemoryEventStore::Fence(const std::string& what) {
  if (fence_epoch_ == 0) return Status::Ok();
  auto it = leases_.find(fence_job_);
  const std::int64_t now = it == leases_.end() ? 0 : it->second.epoch;
  if (now == fence_epoch_) return Status::Ok();
  fenced_by_ = now;
  return FailedPrecondition(what + ": the lead of job " + fence_job_ + " at epoch " + std::to_string(fence_epoch_) +
                            " passed to " + (it == leases_.end() ? std::string("nobody") : it->second.holder) +
                            " (epoch " + std::to_string(now) + "): this controller writes nothing more");
}

StatusOr<JobLease> InMemoryEventStore::AcquireLease(const std::string& job_id, const std::string& holder, Nanos ttl) {
  std::lock_guard<std::mutex> lock(mu_);
  const Nanos now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch()).count();
  Lease& l = leases_[job_id];
  JobLease out;
  if (l.holder == holder || l.holder.empty() || l.expires_mono < now) {
    if (l.holder != holder) ++l.epoch;
    l.holder = holder;
    l.expires_mono = now + ttl;
    out.granted = true;
  }
  out.holder = l.holder;
  out.epoch = l.epoch;
  out.expires_in = l.expires_mono - now;
  return out;
}

Status InMemoryEventStore::ReleaseLease(const std::string& job_id, const std::string& holder) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(job_id);
  if (it != leases_.end() && it->second.holder == holder) it->second.expires_mono = 0;
  return Status::Ok();
}

void InMemoryEventStore::FenceWrites(const std::string& job_id, std::int64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  fence_job_ = job_id;
  fence_epoch_ = epoch;
  fenced_by_ = 0;
}

std::int64_t InMemoryEventStore::FencedBy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fenced_by_;
}

}  // namespace trainguard
