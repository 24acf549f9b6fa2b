// SqliteEventStore: step timings and GPU samples, written in batches and thinned
// (the class: sqlite_event_store_impl.h).
#include "store/sqlite_event_store_impl.h"

namespace trainguard {

using namespace sqlite_store;  // NOLINT: this store's own helpers

Status SqliteEventStore::AppendStepTimings(const std::vector<StepTimingRecord>& rows) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("AppendStepTimings", [&]() -> Status {
    TG_RETURN_IF_ERROR(Begin());
    Stmt s(db_,
           "INSERT OR REPLACE INTO step_timings(job_id, generation, rank, step, node, start_us, "
           "duration_us, clock_error_us, totals, intervals) VALUES(?,?,?,?,?,?,?,?,?,?)");
    if (!s.ok()) {
      Rollback();
      return Error("prepare insert step timings");
    }
    for (const StepTimingRecord& r : rows) {
      s.Bind(1, r.job_id);
      s.Bind(2, r.generation);
      s.Bind(3, static_cast<std::int64_t>(r.rank));
      s.Bind(4, r.step);
      s.Bind(5, r.node);
      s.Bind(6, r.start_us);
      s.Bind(7, r.duration_us);
      s.Bind(8, r.clock_error_us);
      s.Bind(9, r.totals);
      s.Bind(10, r.intervals);
      if (sqlite3_step(s.get()) != SQLITE_DONE) {
        Status e = Error("insert step timings");
        Rollback();
        return e;
      }
      sqlite3_reset(s.get());
    }
    return Commit();
  });
}

StatusOr<std::vector<StepTimingRecord>> SqliteEventStore::StepTimings(const std::string& job_id,
                                                                      std::int64_t from,
                                                                      std::int64_t to) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "SELECT generation, rank, step, node, start_us, duration_us, clock_error_us, totals, "
         "intervals FROM step_timings WHERE job_id=? AND step>=? AND step<=? "
         "ORDER BY step, generation, rank");
  if (!s.ok()) return Error("prepare select step timings");
  s.Bind(1, job_id);
  s.Bind(2, from);
  s.Bind(3, to);
  std::vector<StepTimingRecord> out;
  int rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    StepTimingRecord r;
    r.job_id = job_id;
    r.generation = s.Int(0);
    r.rank = static_cast<int>(s.Int(1));
    r.step = s.Int(2);
    r.node = s.Text(3);
    r.start_us = s.Int(4);
    r.duration_us = s.Int(5);
    r.clock_error_us = s.Int(6);
    r.totals = s.Text(7);
    r.intervals = s.Text(8);
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return Error("read step timings of " + job_id);
  return out;
}

Status SqliteEventStore::CompactStepTimings(const std::string& job_id, std::int64_t before_step,
                                            int keep_every) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("CompactStepTimings", [&]() -> Status {
    Stmt thin(db_, "DELETE FROM step_timings WHERE job_id=? AND step<? AND step % ? != 0");
    Stmt strip(db_,
               "UPDATE step_timings SET intervals='' WHERE job_id=? AND step<? AND intervals!=''");
    if (!thin.ok() || !strip.ok()) return Error("prepare compact step timings");
    thin.Bind(1, job_id);
    thin.Bind(2, before_step);
    thin.Bind(3, static_cast<std::int64_t>(std::max(keep_every, 1)));
    if (sqlite3_step(thin.get()) != SQLITE_DONE) return Error("thin step timings of " + job_id);
    strip.Bind(1, job_id);
    strip.Bind(2, before_step);
    if (sqlite3_step(strip.get()) != SQLITE_DONE) return Error("strip step timings of " + job_id);
    return Status::Ok();
  });
}

Status SqliteEventStore::AppendGpuSamples(const std::vector<GpuSampleRecord>& rows) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("AppendGpuSamples", [&]() -> Status {
    TG_RETURN_IF_ERROR(Begin());
    Stmt s(db_,
           "INSERT OR REPLACE INTO gpu_samples(job_id, wall_ns, node, gpu, sm_clock_mhz, "
           "memory_clock_mhz, "
           "temperature_c, power_mw, utilization_pct, throttle_reasons, ecc_uncorrected) "
           "VALUES(?,?,?,?,?,?,?,?,?,?,?)");
    if (!s.ok()) {
      Rollback();
      return Error("prepare insert GPU samples");
    }
    for (const GpuSampleRecord& r : rows) {
      s.Bind(1, r.job_id);
      s.Bind(2, r.wall_ns);
      s.Bind(3, r.node);
      int c = 4;
      for (std::int64_t v :
           {static_cast<std::int64_t>(r.gpu), r.sm_clock_mhz, r.memory_clock_mhz, r.temperature_c,
            r.power_mw, r.utilization_pct, r.throttle_reasons, r.ecc_uncorrected}) {
        s.Bind(c++, v);
      }
      if (sqlite3_step(s.get()) != SQLITE_DONE) {
        Status e = Error("insert GPU samples");
        Rollback();
        return e;
      }
      sqlite3_reset(s.get());
    }
    return Commit();
  });
}

StatusOr<std::vector<GpuSampleRecord>> SqliteEventStore::GpuSamples(const std::string& job_id,
                                                                    Nanos from, Nanos to) {
  std::lock_guard<std::mutex> lock(mu_);
  Stmt s(db_,
         "SELECT wall_ns, node, gpu, sm_clock_mhz, memory_clock_mhz, temperature_c, power_mw, "
         "utilization_pct, throttle_reasons, ecc_uncorrected FROM gpu_samples "
         "WHERE job_id=? AND wall_ns>=? AND wall_ns<=? ORDER BY wall_ns, node, gpu");
  if (!s.ok()) return Error("prepare select GPU samples");
  s.Bind(1, job_id);
  s.Bind(2, from);
  s.Bind(3, to);
  std::vector<GpuSampleRecord> out;
  int rc;
  while ((rc = sqlite3_step(s.get())) == SQLITE_ROW) {
    GpuSampleRecord g;
    g.job_id = job_id;
    g.wall_ns = s.Int(0);
    g.node = s.Text(1);
    g.gpu = static_cast<int>(s.Int(2));
    g.sm_clock_mhz = s.Int(3);
    g.memory_clock_mhz = s.Int(4);
    g.temperature_c = s.Int(5);
    g.power_mw = s.Int(6);
    g.utilization_pct = s.Int(7);
    g.throttle_reasons = s.Int(8);
    g.ecc_uncorrected = s.Int(9);
    out.push_back(std::move(g));
  }
  if (rc != SQLITE_DONE) return Error("read GPU samples of " + job_id);
  return out;
}

Status SqliteEventStore::CompactGpuSamples(const std::string& job_id, Nanos before,
                                           Nanos keep_every) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("CompactGpuSamples", [&]() -> Status {
    Stmt thin(db_, "DELETE FROM gpu_samples WHERE job_id=? AND wall_ns<? AND wall_ns % ? != 0");
    if (!thin.ok()) return Error("prepare compact GPU samples");
    thin.Bind(1, job_id);
    thin.Bind(2, before);
    thin.Bind(3, std::max<Nanos>(keep_every, 1));
    if (sqlite3_step(thin.get()) != SQLITE_DONE) return Error("thin GPU samples of " + job_id);
    return Status::Ok();
  });
}

}  // namespace trainguard
