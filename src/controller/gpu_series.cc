#include "controller/gpu_series.h"

#include <algorithm>
#include <cmath>

namespace trainguard {
namespace {

std::int64_t Known(double v, double scale = 1) { return v < 0 ? -1 : std::llround(v * scale); }

}  // namespace

std::vector<GpuSampleRecord> GpuSeries::Add(const std::string& node, const std::vector<v1::GpuHealth>& gpus,
                                            Nanos wall) {
  std::vector<GpuSampleRecord> closed;
  if (interval_ <= 0) return closed;
  const Nanos start = wall - ((wall % interval_) + interval_) % interval_;
  for (const v1::GpuHealth& g : gpus) {
    auto [it, fresh] = open_.try_emplace({node, g.index()});
    GpuSampleRecord& row = it->second;
    if (!fresh && row.wall_ns != start) {
      if (row.wall_ns > start) continue;  // a heartbeat older than the open interval: late, left out
      closed.push_back(row);
      fresh = true;
    }
    if (fresh) {
      row = GpuSampleRecord{};
      row.job_id = job_id_;
      row.node = node;
      row.gpu = g.index();
      row.wall_ns = start;
    }
    const std::int64_t sm = Known(g.sm_clock_mhz());
    if (sm >= 0) row.sm_clock_mhz = row.sm_clock_mhz < 0 ? sm : std::min(row.sm_clock_mhz, sm);
    row.throttle_reasons |= std::max<std::int64_t>(g.throttle_reasons(), 0);
    auto latest = [](std::int64_t* into, std::int64_t v) {
      if (v >= 0) *into = v;
    };
    latest(&row.memory_clock_mhz, Known(g.memory_clock_mhz()));
    latest(&row.temperature_c, Known(g.temperature_c()));
    latest(&row.power_mw, Known(g.power_w(), 1000));
    latest(&row.utilization_pct, Known(g.utilization_pct()));
    latest(&row.ecc_uncorrected, g.ecc_uncorrected());
  }
  return closed;
}

std::vector<GpuSampleRecord> GpuSeries::Flush(Nanos wall) {
  std::vector<GpuSampleRecord> closed;
  for (auto it = open_.begin(); it != open_.end();) {
    if (it->second.wall_ns + 2 * interval_ <= wall) {
      closed.push_back(std::move(it->second));
      it = open_.erase(it);
    } else {
      ++it;
    }
  }
  return closed;
}

Nanos GpuSeries::KeepEvery(Nanos every) const {
  if (interval_ <= 0) return every;
  return std::max<Nanos>(1, (every + interval_ - 1) / interval_) * interval_;
}

}  // namespace trainguard
