// GpuSeries: each GPU's health downsampled to one row per interval for the
// store (EventStore::AppendGpuSamples): the interval's lowest SM clock,
// every throttle reason seen in it, and its latest other figures. Pure
// logic: heartbeats' GPU figures and wall times in, closed rows out. One
// open row per GPU: memory grows with the GPUs, not with time.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "proto/protocol.h"
#include "store/event_store.h"

namespace trainguard {

class GpuSeries {
 public:
  GpuSeries(std::string job_id, Nanos interval) : job_id_(std::move(job_id)), interval_(interval) {}

  // A node's GPUs at one heartbeat (`wall`: the controller's clock). Returns
  // the rows of the node's intervals that this heartbeat closed.
  std::vector<GpuSampleRecord> Add(const std::string& node, const std::vector<v1::GpuHealth>& gpus, Nanos wall);
  // Rows of intervals that ended before `wall` minus one interval and got
  // no later heartbeat (a node gone quiet or evicted); they are closed.
  std::vector<GpuSampleRecord> Flush(Nanos wall);
  // The retention step for rows older than `age`: a multiple of the
  // interval near `every`, so that thinned rows still fall on it.
  Nanos KeepEvery(Nanos every) const;
  Nanos interval() const { return interval_; }
  std::size_t open_rows() const { return open_.size(); }

 private:
  const std::string job_id_;
  const Nanos interval_;
  std::map<std::pair<std::string, int>, GpuSampleRecord> open_;  // (node, GPU) -> its open interval
};

}  // namespace trainguard
