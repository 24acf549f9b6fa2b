// `trainguard trace` and `trainguard heatmap`: pictures of a job's step
// timings from the store (docs/telemetry.md).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "store/event_store.h"
#include "trainguard/status.h"

namespace trainguard {

// One merged timeline of every rank's steps [from, to] in the Chrome
// trace-event format (Perfetto, chrome://tracing): a process per rank, in
// the order of the parallel layout (data-parallel replica, then pipeline
// stage, then tensor-parallel rank) when the job recorded one; threads for
// steps, phases (GC pauses among them), device time and communication;
// point-to-point sends and receives paired as flows. Times are on the
// controller's clock; each rank's clock uncertainty is in its metadata.
// "A:B", "A:", ":B" or "" (every step) as [from, to]. InvalidArgument
// quoting the text otherwise.
StatusOr<std::pair<std::int64_t, std::int64_t>> ParseStepRange(const std::string& text);

StatusOr<std::string> TraceJson(EventStore* store, const std::string& job_id, std::int64_t from, std::int64_t to);

struct HeatmapOptions {
  std::string phase;        // "": nodes x phases; else nodes x windows of steps of this phase
  bool ranks = false;       // rows are ranks instead of nodes
  std::int64_t window = 0;  // steps per column with `phase` (0: about 20 columns)
  bool html = false;        // an HTML page around the SVG, with a table of the values
  // "": step timings; else rows = node/GPU, columns = windows of time, of
  // this figure of the GPU series: sm_clock, memory_clock, temperature,
  // power or utilization.
  std::string gpu;
};

// Rows (nodes or ranks) x columns (phases, or windows of steps of one phase),
// each cell the median per step coloured by its ratio to its column's
// median; the job's straggler findings are marked on their rows. With
// `gpu`, rows are GPUs and columns windows of time, from the GPU series;
// red is worse (a lower clock, a higher temperature), and a GPU held down
// by a throttle reason in a window is marked there with the reason.
// InvalidArgument naming the figures for an unknown `gpu`.
StatusOr<std::string> Heatmap(EventStore* store, const std::string& job_id, const HeatmapOptions& o);

}  // namespace trainguard
