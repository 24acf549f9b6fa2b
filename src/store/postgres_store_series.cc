// PostgresEventStore: step timings and GPU samples, written in batches and thinned
// (the class: postgres_event_store_impl.h).
#include "store/postgres_event_store_impl.h"

namespace trainguard {

using namespace postgres_store;  // NOLINT: this store's own helpers

Status PostgresEventStore::AppendStepTimings(const std::vector<StepTimingRecord>& rows) {
  // One statement may not touch a row twice (ON CONFLICT): a repeat in
  // the batch replaces the earlier one here, as it would in the table.
  std::map<std::tuple<std::string, std::int64_t, int, std::int64_t>, const StepTimingRecord*>
      unique;
  for (const StepTimingRecord& r : rows) unique[{r.job_id, r.step, r.rank, r.generation}] = &r;
  std::vector<const StepTimingRecord*> batch;
  for (const auto& [key, r] : unique) batch.push_back(r);
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("AppendStepTimings", [&]() -> Status {
    return InTransaction("insert step timings", [&]() -> Status {
      for (std::size_t from = 0; from < batch.size(); from += kTimingRowsPerStatement) {
        const std::size_t to = std::min(batch.size(), from + kTimingRowsPerStatement);
        std::string sql =
            "INSERT INTO step_timings(job_id, generation, rank, step, node, start_us, duration_us, "
            "clock_error_us, totals, intervals) VALUES";
        std::vector<Param> params;
        for (std::size_t i = from; i < to; ++i) {
          const StepTimingRecord& r = *batch[i];
          sql += i == from ? "(" : ",(";
          for (int c = 1; c <= 10; ++c) {
            sql += "$" + std::to_string(params.size() + c) + (c < 10 ? "," : ")");
          }
          for (Param p : {Text(r.job_id), Int(r.generation), Int(r.rank), Int(r.step), Text(r.node),
                          Int(r.start_us), Int(r.duration_us), Int(r.clock_error_us),
                          Text(r.totals), Text(r.intervals)}) {
            params.push_back(std::move(p));
          }
        }
        sql +=
            " ON CONFLICT(job_id, step, generation, rank) DO UPDATE SET node=excluded.node, "
            "start_us=excluded.start_us, duration_us=excluded.duration_us, "
            "clock_error_us=excluded.clock_error_us, totals=excluded.totals, "
            "intervals=excluded.intervals";
        auto r = Once("insert step timings", sql.c_str(), params);
        if (!r.ok()) return r.status();
      }
      return Status::Ok();
    });
  });
}

StatusOr<std::vector<StepTimingRecord>> PostgresEventStore::StepTimings(const std::string& job_id,
                                                                        std::int64_t from,
                                                                        std::int64_t to) {
  std::lock_guard<std::mutex> lock(mu_);
  auto r = Run(
      "read step timings of " + job_id,
      "SELECT generation, rank, step, node, start_us, duration_us, clock_error_us, totals, "
      "intervals "
      "FROM step_timings WHERE job_id=$1 AND step>=$2 AND step<=$3 ORDER BY step, generation, rank",
      {Text(job_id), Int(from), Int(to)});
  if (!r.ok()) return r.status();
  std::vector<StepTimingRecord> out;
  for (int i = 0; i < r->rows(); ++i) {
    StepTimingRecord t;
    t.job_id = job_id;
    t.generation = r->I64(i, 0);
    t.rank = r->I32(i, 1);
    t.step = r->I64(i, 2);
    t.node = r->Str(i, 3);
    t.start_us = r->I64(i, 4);
    t.duration_us = r->I64(i, 5);
    t.clock_error_us = r->I64(i, 6);
    t.totals = r->Str(i, 7);
    t.intervals = r->Str(i, 8);
    out.push_back(std::move(t));
  }
  return out;
}

Status PostgresEventStore::CompactStepTimings(const std::string& job_id, std::int64_t before_step,
                                              int keep_every) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("CompactStepTimings", [&]() -> Status {
    return InTransaction("compact step timings of " + job_id, [&]() -> Status {
      auto thin = Once("thin step timings of " + job_id,
                       "DELETE FROM step_timings WHERE job_id=$1 AND step<$2 AND step % $3 != 0",
                       {Text(job_id), Int(before_step), Int(std::max(keep_every, 1))});
      if (!thin.ok()) return thin.status();
      return Once("strip step timings of " + job_id,
                  "UPDATE step_timings SET intervals='' WHERE job_id=$1 AND step<$2 AND "
                  "intervals!=''",
                  {Text(job_id), Int(before_step)})
          .status();
    });
  });
}

Status PostgresEventStore::AppendGpuSamples(const std::vector<GpuSampleRecord>& rows) {
  std::map<std::tuple<std::string, Nanos, std::string, int>, const GpuSampleRecord*> unique;
  for (const GpuSampleRecord& r : rows) unique[{r.job_id, r.wall_ns, r.node, r.gpu}] = &r;
  std::vector<const GpuSampleRecord*> batch;
  for (const auto& [key, r] : unique) batch.push_back(r);
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("AppendGpuSamples", [&]() -> Status {
    return InTransaction("insert GPU samples", [&]() -> Status {
      for (std::size_t from = 0; from < batch.size(); from += kTimingRowsPerStatement) {
        const std::size_t to = std::min(batch.size(), from + kTimingRowsPerStatement);
        std::string sql =
            "INSERT INTO gpu_samples(job_id, wall_ns, node, gpu, sm_clock_mhz, memory_clock_mhz, "
            "temperature_c, "
            "power_mw, utilization_pct, throttle_reasons, ecc_uncorrected) VALUES";
        std::vector<Param> params;
        for (std::size_t i = from; i < to; ++i) {
          const GpuSampleRecord& r = *batch[i];
          sql += i == from ? "(" : ",(";
          for (int c = 1; c <= 11; ++c)
            sql += "$" + std::to_string(params.size() + c) + (c < 11 ? "," : ")");
          for (Param p :
               {Text(r.job_id), Int(r.wall_ns), Text(r.node), Int(r.gpu), Int(r.sm_clock_mhz),
                Int(r.memory_clock_mhz), Int(r.temperature_c), Int(r.power_mw),
                Int(r.utilization_pct), Int(r.throttle_reasons), Int(r.ecc_uncorrected)}) {
            params.push_back(std::move(p));
          }
        }
        sql +=
            " ON CONFLICT(job_id, wall_ns, node, gpu) DO UPDATE SET "
            "sm_clock_mhz=excluded.sm_clock_mhz, "
            "memory_clock_mhz=excluded.memory_clock_mhz, temperature_c=excluded.temperature_c, "
            "power_mw=excluded.power_mw, utilization_pct=excluded.utilization_pct, "
            "throttle_reasons=excluded.throttle_reasons, ecc_uncorrected=excluded.ecc_uncorrected";
        auto r = Once("insert GPU samples", sql.c_str(), params);
        if (!r.ok()) return r.status();
      }
      return Status::Ok();
    });
  });
}

StatusOr<std::vector<GpuSampleRecord>> PostgresEventStore::GpuSamples(const std::string& job_id,
                                                                      Nanos from, Nanos to) {
  std::lock_guard<std::mutex> lock(mu_);
  auto r =
      Run("read GPU samples of " + job_id,
          "SELECT wall_ns, node, gpu, sm_clock_mhz, memory_clock_mhz, temperature_c, power_mw, "
          "utilization_pct, throttle_reasons, ecc_uncorrected FROM gpu_samples "
          "WHERE job_id=$1 AND wall_ns>=$2 AND wall_ns<=$3 ORDER BY wall_ns, node, gpu",
          {Text(job_id), Int(from), Int(to)});
  if (!r.ok()) return r.status();
  std::vector<GpuSampleRecord> out;
  for (int i = 0; i < r->rows(); ++i) {
    GpuSampleRecord g;
    g.job_id = job_id;
    g.wall_ns = r->I64(i, 0);
    g.node = r->Str(i, 1);
    g.gpu = r->I32(i, 2);
    g.sm_clock_mhz = r->I64(i, 3);
    g.memory_clock_mhz = r->I64(i, 4);
    g.temperature_c = r->I64(i, 5);
    g.power_mw = r->I64(i, 6);
    g.utilization_pct = r->I64(i, 7);
    g.throttle_reasons = r->I64(i, 8);
    g.ecc_uncorrected = r->I64(i, 9);
    out.push_back(std::move(g));
  }
  return out;
}

Status PostgresEventStore::CompactGpuSamples(const std::string& job_id, Nanos before,
                                             Nanos keep_every) {
  std::lock_guard<std::mutex> lock(mu_);
  return Fenced("CompactGpuSamples", [&]() -> Status {
    return Once("thin GPU samples of " + job_id,
                "DELETE FROM gpu_samples WHERE job_id=$1 AND wall_ns<$2 AND wall_ns % $3 != 0",
                {Text(job_id), Int(before), Int(std::max<Nanos>(keep_every, 1))})
        .status();
  });
}

}  // namespace trainguard
