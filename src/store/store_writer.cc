#include "store/store_writer.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include "common/signal_free_thread.h"

namespace trainguard {

const char* StoreWriterLaneName(StoreWriter::Lane lane) {
  switch (lane) {
    case StoreWriter::Lane::kCritical: return "critical";
    case StoreWriter::Lane::kEvents: return "events";
    case StoreWriter::Lane::kBulk: return "bulk";
  }
  return "?";
}

StoreWriter::StoreWriter(EventStore* store) : StoreWriter(store, Options()) {}

namespace {

// 64 random bits in hex: no two writers (controllers, restarts, standbys) share one.
std::string RandomName() {
  std::random_device random;
  const std::uint64_t bits = (static_cast<std::uint64_t>(random()) << 32) ^ random();
  char name[24];
  std::snprintf(name, sizeof(name), "%016llx-", static_cast<unsigned long long>(bits));
  return name;
}

}  // namespace

StoreWriter::StoreWriter(EventStore* store, Options options)
    : store_(store), options_(options), uid_prefix_(RandomName()) {
  thread_ = SignalFreeThread([this] { Run(); });
}

StoreWriter::~StoreWriter() {
  // Drains while the store takes writes; a store that is away is not waited
  // for here (whoever needed the drain called Flush with its own bound).
  bool drained = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    drained = done_cv_.wait_for(lock, options_.drain_timeout, [&] {
      return (lanes_[0].empty() && lanes_[1].empty() && lanes_[2].empty() && !in_flight_) || stats_.failing;
    }) && !stats_.failing;
  }
  std::int64_t left = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (const auto& lane : lanes_) left += static_cast<std::int64_t>(lane.size());
    if (in_flight_) ++left;
  }
  work_cv_.notify_all();
  thread_.join();
  if (!drained && left > 0) {
    std::fprintf(stderr, "trainguard: %lld write(s) not stored: the store did not take them within %lld s (%s)\n",
                 static_cast<long long>(left), static_cast<long long>(options_.drain_timeout.count() / 1000),
                 stats_.last_error.c_str());
  }
}

bool StoreWriter::Retriable(const Status& s) {
  return s.code() != StatusCode::kInvalidArgument && s.code() != StatusCode::kFailedPrecondition;
}

StoreWriter::Ticket StoreWriter::Enqueue(Lane lane, Op op) {
  std::unique_lock<std::mutex> lock(mu_);
  const int l = static_cast<int>(lane);
  if (lane != Lane::kBulk) {
    auto full = [&] { return lanes_[0].size() + lanes_[1].size() >= options_.max_queued; };
    if (full()) {
      ++stats_.backpressure_waits;
      if (!done_cv_.wait_for(lock, options_.backpressure_wait, [&] { return !full() || stop_; })) {
        if (stats_.over_limit++ == 0 || !over_limit_said_) {
          over_limit_said_ = true;
          std::fprintf(stderr,
                       "trainguard: error: the store took no write for %.0f s (%s): %zu writes are queued, over "
                       "the limit of %zu; writes go on being queued in memory until it is back (nothing is "
                       "dropped)\n",
                       OldestQueuedSeconds(), stats_.last_error.empty() ? "no error yet" : stats_.last_error.c_str(),
                       lanes_[0].size() + lanes_[1].size(), options_.max_queued);
        }
      }
    } else if (lanes_[0].size() + lanes_[1].size() < options_.max_queued / 2) {
      over_limit_said_ = false;  // the episode is over: the next one is said again
    }
  }
  op.seq = next_seq_++;
  op.enqueued = std::chrono::steady_clock::now();
  Ticket t{lane, op.seq};
  lanes_[l].push_back(std::move(op));
  lock.unlock();
  work_cv_.notify_one();
  return t;
}

std::string StoreWriter::NextUid() { return uid_prefix_ + std::to_string(uids_.fetch_add(1) + 1); }

StoreWriter::Ticket StoreWriter::Append(Event event) {
  if (event.uid.empty()) event.uid = NextUid();
  Op op;
  op.what = "event " + event.kind;
  op.write = [e = event](EventStore* s) { return s->Append(e); };
  op.event = std::move(event);
  return Enqueue(Lane::kEvents, std::move(op));
}

StoreWriter::Ticket StoreWriter::UpdateJob(std::string job_id, std::string state, std::string summary,
                                           Nanos ended_wall_ns) {
  Op op;
  op.what = "job state " + state;
  op.write = [j = std::move(job_id), st = std::move(state), su = std::move(summary), ended_wall_ns](EventStore* s) {
    return s->UpdateJob(j, st, su, ended_wall_ns);
  };
  return Enqueue(Lane::kCritical, std::move(op));
}

StoreWriter::Ticket StoreWriter::RecordIncident(IncidentRecord incident) {
  if (incident.uid.empty()) incident.uid = NextUid();
  Op op;
  op.what = "incident " + std::to_string(incident.incident);
  op.write = [i = std::move(incident)](EventStore* s) { return s->RecordIncident(i); };
  return Enqueue(Lane::kCritical, std::move(op));
}

StoreWriter::Ticket StoreWriter::SetNodeHealth(NodeHealth health) {
  Op op;
  op.what = "health of node " + health.node;
  op.health = health;
  op.write = [h = std::move(health)](EventStore* s) { return s->SetNodeHealth(h); };
  return Enqueue(Lane::kCritical, std::move(op));
}

StoreWriter::Ticket StoreWriter::RecordNodeAction(NodeAction action) {
  if (action.uid.empty()) action.uid = NextUid();
  Op op;
  op.what = action.action + " of node " + action.node;
  op.write = [a = std::move(action)](EventStore* s) { return s->RecordNodeAction(a); };
  return Enqueue(Lane::kCritical, std::move(op));
}

StoreWriter::Ticket StoreWriter::RecordDiagnostics(DiagnosticsRecord record) {
  if (record.uid.empty()) record.uid = NextUid();
  Op op;
  op.what = "diagnostics of node " + record.node;
  op.write = [r = std::move(record)](EventStore* s) { return s->RecordDiagnostics(r); };
  return Enqueue(Lane::kEvents, std::move(op));
}

bool StoreWriter::EnqueueBulk(std::string what, std::function<Status(EventStore*)> write) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lanes_[2].size() >= options_.max_queued_bulk) {
      ++stats_.bulk_dropped;
      return false;
    }
  }
  Op op;
  op.what = std::move(what);
  op.write = std::move(write);
  Enqueue(Lane::kBulk, std::move(op));
  return true;
}

bool StoreWriter::AppendStepTimings(std::vector<StepTimingRecord> rows) {
  std::string what = std::to_string(rows.size()) + " step timing row(s)";
  return EnqueueBulk(std::move(what), [r = std::move(rows)](EventStore* s) { return s->AppendStepTimings(r); });
}

bool StoreWriter::CompactStepTimings(std::string job_id, std::int64_t before_step, int keep_every) {
  return EnqueueBulk("step timing compaction", [j = std::move(job_id), before_step, keep_every](EventStore* s) {
    return s->CompactStepTimings(j, before_step, keep_every);
  });
}

bool StoreWriter::AppendGpuSamples(std::vector<GpuSampleRecord> rows) {
  std::string what = std::to_string(rows.size()) + " GPU sample row(s)";
  return EnqueueBulk(std::move(what), [r = std::move(rows)](EventStore* s) { return s->AppendGpuSamples(r); });
}

bool StoreWriter::CompactGpuSamples(std::string job_id, Nanos before, Nanos keep_every) {
  return EnqueueBulk("GPU sample compaction", [j = std::move(job_id), before, keep_every](EventStore* s) {
    return s->CompactGpuSamples(j, before, keep_every);
  });
}

bool StoreWriter::WaitDurable(const Ticket& t, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return done_cv_.wait_for(lock, timeout, [&] { return done_through_[static_cast<int>(t.lane)] >= t.seq; });
}

bool StoreWriter::Flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  std::uint64_t through[3];
  for (int l = 0; l < 3; ++l) through[l] = lanes_[l].empty() ? 0 : lanes_[l].back().seq;
  return done_cv_.wait_for(lock, timeout, [&] {
    for (int l = 0; l < 3; ++l) {
      if (done_through_[l] < through[l]) return false;
    }
    return true;
  });
}

std::optional<NodeHealth> StoreWriter::PendingHealth(const std::string& node) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& lane = lanes_[static_cast<int>(Lane::kCritical)];
  for (auto it = lane.rbegin(); it != lane.rend(); ++it) {
    if (it->health && it->health->node == node) return it->health;
  }
  return std::nullopt;
}

double StoreWriter::OldestQueuedSeconds() const {
  auto oldest = std::chrono::steady_clock::time_point::max();
  for (const auto& lane : lanes_) {
    if (!lane.empty()) oldest = std::min(oldest, lane.front().enqueued);
  }
  if (oldest == std::chrono::steady_clock::time_point::max()) return 0;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - oldest).count();
}

StoreWriter::Stats StoreWriter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s = stats_;
  s.queued = 0;
  for (const auto& lane : lanes_) s.queued += static_cast<std::int64_t>(lane.size());
  s.oldest_queued_s = OldestQueuedSeconds();
  return s;
}

// Events written in one transaction at most.
constexpr std::size_t kMaxBatch = 1000;

void StoreWriter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  auto backoff = options_.retry_min;
  for (;;) {
    work_cv_.wait(lock, [&] {
      return stop_ || !lanes_[0].empty() || !lanes_[1].empty() || !lanes_[2].empty();
    });
    int l = 0;
    while (l < 3 && lanes_[l].empty()) ++l;
    if (l == 3) return;  // stop_ and nothing left
    if (stop_ && stats_.failing) return;  // the destructor gave up waiting for the store
    // The front write stays queued (PendingHealth sees it) until it is stored.
    // Events at the front go together, in one transaction.
    std::vector<Event> batch;
    if (single_left_ == 0) {
      for (const Op& op : lanes_[l]) {
        if (!op.event || batch.size() == kMaxBatch) break;
        batch.push_back(*op.event);
      }
    }
    std::function<Status(EventStore*)> write = lanes_[l].front().write;
    std::string what = batch.size() > 1 ? std::to_string(batch.size()) + " events" : lanes_[l].front().what;
    in_flight_ = true;
    lock.unlock();
    Status s = batch.size() > 1 ? store_->AppendEvents(batch) : write(store_);
    lock.lock();
    in_flight_ = false;
    if (batch.size() > 1 && s.ok()) {
      stats_.written += static_cast<std::int64_t>(batch.size());
      if (stats_.failing) {
        std::fprintf(stderr, "trainguard: the store takes writes again (%lld attempt(s) retried)\n",
                     static_cast<long long>(stats_.retries));
      }
      stats_.failing = false;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        done_through_[l] = lanes_[l].front().seq;
        lanes_[l].pop_front();
      }
      backoff = options_.retry_min;
      done_cv_.notify_all();
      continue;
    }
    if (batch.size() > 1 && !Retriable(s)) {
      single_left_ = batch.size();  // one of them is refused: find it, store the rest
      continue;
    }
    if (single_left_ > 0) --single_left_;
    if (s.ok() || !Retriable(s)) {
      if (s.ok()) {
        ++stats_.written;
      } else {
        ++stats_.given_up;
        stats_.last_error = s.ToString();
        std::fprintf(stderr, "trainguard: %s not stored, the store refuses it: %s\n", what.c_str(),
                     s.ToString().c_str());
      }
      if (stats_.failing) {
        std::fprintf(stderr, "trainguard: the store takes writes again (%lld attempt(s) retried); %lld write(s) still queued\n",
                     static_cast<long long>(stats_.retries),
                     static_cast<long long>(lanes_[0].size() + lanes_[1].size() + lanes_[2].size() - 1));
      }
      stats_.failing = false;
      done_through_[l] = lanes_[l].front().seq;
      lanes_[l].pop_front();
      backoff = options_.retry_min;
      done_cv_.notify_all();
      continue;
    }
    if (!stats_.failing) {
      std::fprintf(stderr, "trainguard: the store does not take writes (%s); %s and what follows wait and are retried\n",
                   s.ToString().c_str(), what.c_str());
    }
    ++stats_.retries;
    stats_.failing = true;
    stats_.last_error = s.ToString();
    done_cv_.notify_all();  // WaitDurable/Flush callers may be watching `failing`
    work_cv_.wait_for(lock, backoff, [&] { return stop_; });
    backoff = std::min(options_.retry_max, backoff * 2);
  }
}

}  // namespace trainguard
