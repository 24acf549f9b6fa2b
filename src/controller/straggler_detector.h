// StragglerDetector: finds the nodes that set the job's pace, and a slow
// decline of the whole job, from per-step, per-rank phase timings.
//
// Steps are taken in windows of `window_steps`. At each step a node's value
// is the median of its ranks' (a slow node slows all its ranks), and its
// ratio is that value over the median of the other nodes' at the same step:
// whatever slows every node at once (the machine, the data, a checkpoint)
// cancels out. A node's ratio for the window is the median of its per-step
// ratios (one long GC pause moves it little), and the node is slow in the
// window when that is at least 1 + `min_slowdown`. Jobs with fewer than 3
// nodes are judged rank by rank (with two, which is the slow one?); the
// first window of a generation (start-up) is not judged. Two signals:
//   compute: device time of forward, backward and optimizer when the rank
//            measured it (CUDA events on the compute stream); else the time
//            of forward and optimizer (not backward: DDP's backward ends
//            waiting for the slowest rank's gradients, so there the fast
//            ranks look slow); else the step minus communication;
//   communication: time in collectives and send/recv, judged only for nodes
//            whose compute is not slow (a compute straggler makes the
//            others wait in their collectives, not itself).
// The journal adds evidence: for each collective (group, sequence number)
// of the window, the rank that entered it last is the one the others waited
// for; a finding says which share of its collectives the node entered last.
// Hysteresis: a node is reported after `windows_to_report` slow windows in a
// row, eligible for eviction after `windows_to_evict`, cleared after
// `windows_to_clear` normal ones. A GC pause or a checkpoint lasts a step or
// two: it moves a window's median little and never lasts several windows.
//
// Change point, step by step (compute only), on two measures, each with its
// own baselines and sums: the compute time above, and the CPU time the
// rank's forward and optimizer used ("cpu:" totals; IsCpuTimeKey). Time catches a node that takes longer for the
// same work (throttled, crowded); CPU time a rank that computes more, and
// where the machine is crowded it is steadier by an order of magnitude (a
// CPU job's step time moves by tens of percent from step to step, its CPU
// time by about one). A unit is named by whichever crosses first: two tests
// at most double the false namings of one. Once a unit's compute ratio
// (to the median of the others at that step) has a baseline, the median and
// spread (MAD) of its log over `change_baseline_steps` steps, each step's
// log ratio is standardised against it (clipped to +-3: one long GC pause
// counts as three deviations, not thirty). When the sum over the newest
// `change_steps` steps reaches `change_threshold` (a shift of that many
// standard deviations, which noise alone reaches about once in 30,000
// steps; or the sum over twice as many steps reaches sqrt(2) times the
// threshold, which a smaller shift reaches a few steps later) and the median
// of those steps' ratios is itself at least
// 1 + `min_slowdown` (a spike or two never is; nor is a unit that was
// faster than the others and is now a little slower), the unit
// is reported at once, the change point being where the newest steps'
// excess over half the threshold adds up to the most (CUSUM's estimate):
// a node that slows by 10 % is named within
// about 5 steps, not windows (published fail-slow detectors: 2-3
// iterations). The windows then decide eviction and clearing as before. A
// baseline offset below half the threshold is the unit's own; a unit
// slower from the start is the windows' to find.
//
// Slow trend: the job's median step time per window against the median of
// its first `trend_baseline_windows` windows (of the generation); growth of
// `trend_threshold` or more for `trend_windows` windows in a row is
// reported once (again only after it fell below half the threshold),
// naming the phase that grew most.
//
// Pure logic: no clock, no I/O. Not thread-safe (the controller's mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "controller/event_kind.h"
#include "controller/finding.h"

namespace trainguard {

struct StragglerPolicy {
  int window_steps = 10;
  double min_slowdown = 0.07;     // 7 % above the median of the other nodes
  // A slow window counts one up, a normal one one down (not to zero: a noisy
  // window does not wipe out the evidence), and:
  int windows_to_report = 3;      // reported at 3 (30 steps with the defaults)
  int windows_to_evict = 5;       // eligible for eviction at 5 (50 steps)
  int windows_to_clear = 3;       // normal windows in a row that clear a reported node
  double trend_threshold = 0.08;  // the job's step time 8 % above its baseline ...
  int trend_windows = 5;          // ... for this many windows in a row
  int trend_baseline_windows = 10;
  int change_baseline_steps = 30;  // per unit, after the start-up window
  int change_steps = 5;            // the newest steps summed
  double change_threshold = 11;    // their sum, in the unit's own standard deviations
  double change_min_spread = 0.02; // the smallest spread of a log ratio assumed (2 %)
  // A compute or communication straggler's excess must also cost the step
  // this share of its median time: a toy model's compute 16 % slower is a
  // tenth of a millisecond of a 60 ms step, and slows nobody.
  double min_step_share = 0.02;
  // The parts of the change-point test added for issue 43, each one that can
  // be switched off to measure what it brings (bench/straggler_sweep_bench):
  // the CPU-time measure beside time; the job's pooled noise as a floor of
  // each unit's spread; judging a unit against its peers while it learns its
  // baseline. All off is the test as it was before them.
  bool cpu_time_measure = true;
  bool pooled_noise = true;
  bool judge_while_learning = true;
  // Each unit's mean refined as the steps pass (not fixed by the baseline's 30).
  bool refine_mean = true;
  // A window's compute is slow only when its median ratio is also
  // `window_z` standard errors of a window's median above 1 (the errors
  // from the window's own step-to-step spread, pooled over the units); one
  // above the threshold but within the noise is undecided: it neither
  // counts toward naming nor toward clearing.
  bool window_noise_gate = true;
  double window_z = 3;
};

// One rank's step, as the detector needs it.
struct RankStep {
  std::string node;
  int rank = -1;
  std::int64_t step = 0;
  double step_us = 0;
  double compute_us = 0;
  double cpu_us = 0;   // CPU time of forward and optimizer (IsCpuTimeKey); 0 when not measured or on a device
  double comm_us = 0;
  std::map<std::string, double> phases;  // totals by key (step_timing_text.h)
  // Its collectives: (group id, sequence number, when it entered, µs on the
  // controller's clock), from the journal.
  std::vector<std::tuple<int, std::int64_t, double>> collectives{};
};

// forward, backward, optimizer (and their "gpu:" device times).
bool IsComputePhase(const std::string& key);
// "cpu:forward", "cpu:optimizer": the CPU time the change-point test judges.
// Not backward's: under DDP the process's CPU time in backward includes its
// gradient all-reduce threads, which spend it waiting for their peers
// (measured: 25 % spread a step, against 0.7 % for forward's).
bool IsCpuTimeKey(const std::string& key);

// For each value, the median of all the others, from one sort: O(n log n)
// per step, not a median per unit over every other unit (O(n^2)), which at
// 10,000 nodes is the difference between a millisecond and seconds under
// the controller's lock.
std::vector<double> MediansOfOthers(const std::vector<double>& v);
// compute_us, cpu_us and comm_us of a step from its totals.
void FillSignals(RankStep* step);

// What a finding says: a unit named, a named one cleared, the whole job
// slower, or the detector armed for a generation: its baselines learned
// from the generation's own steps (a restart, a promoted spare, a warm
// start are never judged against the steps before them).
enum class StragglerKind { kStraggler, kCleared, kSlowTrend, kBaseline };
// The event it is recorded as: straggler, straggler_cleared, slow_trend,
// straggler_baseline.
EventKind StragglerEventKind(StragglerKind kind);

// Where a straggler's time goes: its compute, its collectives, its wait for data.
enum class StragglerSignal { kNone, kCompute, kCommunication, kData };
// "", "compute", "communication", "data" (the events' detail.signal).
const char* StragglerSignalName(StragglerSignal signal);
// The inverse of StragglerSignalName (kNone for any other text).
StragglerSignal StragglerSignalFromName(const std::string& name);

struct StragglerFinding {
  StragglerKind kind = StragglerKind::kStraggler;
  std::string unit;       // what was judged: the node, or "NODE/rank N" in jobs of fewer than 3 nodes
  std::string node;       // "" for slow_trend
  int rank = -1;          // the node's slowest rank
  StragglerSignal signal = StragglerSignal::kNone;  // kNone for slow_trend
  std::string phase;      // the phase that is slower (or grew) the most
  // What a compute straggler was measured by: "time" (device time, else
  // the phases' wall time) or "cpu_time" (the CPU its compute phases used).
  std::string measure;
  double slowdown = 0;    // 0.12: 12 % above the median (slow_trend: above the baseline)
  std::int64_t steps = 0;       // how many steps it has lasted
  std::int64_t first_step = 0;
  std::int64_t last_step = 0;
  bool evict = false;     // "straggler": slow long enough for --straggler-action evict
  double value_us = 0;    // the node's (or job's) median per step
  double centre_us = 0;   // the median of the nodes (or the baseline)
  // Of the window's collectives the node took part in, the share it entered
  // last (the one the others waited for); -1 when none were journaled.
  double last_to_enter = -1;
  std::string message;
};

class StragglerDetector {
 public:
  explicit StragglerDetector(StragglerPolicy policy) : policy_(policy) {}

  void Add(const RankStep& step);
  // Judges every window that is complete; findings in order.
  std::vector<StragglerFinding> Evaluate();
  // A new generation of `world_size` ranks: ranks and nodes may have
  // changed; the baseline and every streak start over. A window is judged
  // once every rank of the world reported its last step (or, for ranks that
  // fall silent, once some rank is further by twice the most steps a rank
  // brings at a time: at least a window, at most three).
  void Reset(int world_size);
  // A restarted controller's: `unit` was named (a "straggler" event of the
  // running generation, not cleared since) at `named_step` (the event's
  // last step), with eviction already said if `evict_said`; it is not named
  // again, and is cleared as any named unit.
  void RestoreReported(const std::string& unit, StragglerSignal signal, std::int64_t first_step,
                       std::int64_t named_step, bool evict_said);
  // Nodes reported and not cleared.
  std::set<std::string> Stragglers() const;

 private:
  struct Window {
    std::map<int, std::vector<RankStep>> by_rank;
  };
  struct Streak {
    int slow = 0;
    int normal = 0;
    bool reported = false;
    bool evict_said = false;
    StragglerSignal signal = StragglerSignal::kNone;
    std::int64_t first_step = 0;
    // The newest step of its naming: windows ending at or before it are
    // evidence the naming already had, and never count toward clearing it
    // (a clear always follows the naming it clears).
    std::int64_t named_step = INT64_MIN;
  };
  // Change-point state of one unit.
  struct Cusum {
    std::vector<double> baseline;  // log ratios of its first steps
    double mu = 0, sigma = 0;
    // Steps the unit's mu is the mean of: the baseline's, then each step
    // that leaves the summed horizons while the unit is not named (up to
    // kMuSteps, then a moving mean of about that many). 30 steps fix mu
    // within a quarter of a standard deviation, which moves a 5-step sum by
    // more than one and multiplied false namings by ten in simulation.
    int mu_steps = 0;
    std::deque<std::pair<std::int64_t, double>> recent;  // the newest (step, standardised log ratio)
    std::deque<double> excess;     // their log ratios
    std::deque<std::pair<double, double>> values;  // (its compute, the others' median), newest steps
    // Per compute phase, its value minus the others' median, newest steps
    // (the phase a change-point finding names).
    std::deque<std::map<std::string, double>> phase_gaps;
  };
  // One rank's step as the change-point test keeps it until judged.
  struct StepValue {
    std::string node;
    double compute = 0;
    double cpu = 0;
    std::map<std::string, double> phases;      // its compute phases (IsComputePhase)
    std::map<std::string, double> cpu_phases;  // their CPU time, by phase ("forward")
  };
  // The change-point test runs on two measures of compute, each with its
  // own state: time (what the job waits for: a throttled or contended node
  // takes longer for the same work) and CPU time (what the rank computed:
  // steady within a percent where the time of a CPU job's step moves by
  // tens, so a rank that computes 20 % more shows in a few steps).
  enum class Measure { kTime, kCpuTime };
  void JudgeStep(std::int64_t step, const std::map<int, StepValue>& values, double step_centre,
                 std::vector<StragglerFinding>* out);
  // One measure's test at one step; CPU time first where both cross at
  // once (its change point is the sharper).
  void JudgeMeasure(Measure measure, std::int64_t step, const std::map<int, StepValue>& values,
                    double step_centre, std::vector<StragglerFinding>* out);
  // Starts the change-point sums of `unit` afresh in both measures (the baselines stay).
  void RestartSums(const std::string& unit);
  void Judge(std::int64_t index, const Window& w, std::vector<StragglerFinding>* out);
  void JudgeTrend(std::int64_t index, const Window& w, std::vector<StragglerFinding>* out);

  const StragglerPolicy policy_;
  std::map<std::int64_t, Window> windows_;   // by window index, not yet judged
  std::map<int, std::int64_t> rank_last_;    // each rank's newest step
  std::map<std::int64_t, int> last_counts_;  // newest step -> how many ranks are at it
  int world_size_ = 0;
  std::int64_t judged_below_ = INT64_MIN;    // windows below this index are done
  std::map<std::string, Streak> streaks_;
  std::vector<double> baseline_steps_;       // the job's window medians, first windows
  std::map<std::string, double> baseline_phases_;  // sums over the baseline windows
  std::int64_t trend_first_step_ = 0;  // the baseline's first step
  int trend_slow_ = 0;
  bool skip_window_ = true;  // the generation's first window is start-up
  bool trend_said_ = false;
  std::map<std::string, Cusum> cusum_;      // the time measure, by unit
  std::map<std::string, Cusum> cpu_cusum_;  // the CPU-time measure, by unit
  // The job's noise in a measure as it runs (time, CPU time): each judged
  // step, the median over the units of how far each one's log ratio is from
  // its own baseline, averaged over steps (EWMA). A unit's steps are
  // standardised by the larger of its baseline's spread and 1.4826 times
  // this: a baseline of 30 steps that happened to be quiet does not make
  // later ordinary noise look like a shift.
  struct Pool {
    double mad = 0;
    int steps = 0;
  };
  Pool pools_[2];
  // Steps not judged yet: step -> rank -> its values.
  std::map<std::int64_t, std::map<int, StepValue>> step_values_;
  bool baseline_said_ = false;  // this generation's kBaseline finding
  std::map<std::int64_t, std::vector<double>> step_durations_;  // the same steps' durations
  std::set<std::string> nodes_seen_;
  std::int64_t steps_from_ = INT64_MIN;     // the generation's steps below this are start-up
  std::int64_t stepped_below_ = INT64_MIN;  // steps below this are judged
  // How many steps ranks bring at a time (agents send a heartbeat's worth:
  // at 85 ms steps and one heartbeat a second, 12). A step or window is
  // judged without a rank that has not sent it only once some rank is
  // further than twice that (a moving mean over the Evaluate rounds; at
  // least a window, at most three): a margin
  // of one window judged the steps of a rank whose heartbeat came later
  // without it, and its steps were lost to the test (live, the slow rank's
  // most often: it is the one behind).
  struct Delivery {
    std::int64_t round = -1;  // the Evaluate round of its latest steps
    int steps = 0;            // how many it brought in that round
  };
  std::map<int, Delivery> delivered_;
  std::int64_t round_ = 0;
  int round_batch_ = 0;  // the most steps one rank brought this round
  double batch_ = 0;     // a moving mean of round_batch_ over the rounds that brought steps
  std::int64_t Margin() const;
};

// The failure a "straggler" finding with `evict` set becomes under
// --straggler-action evict: kind kStraggler, the node as the culprit, and the
// detector's verdict, by its signal: "straggler-compute" (other),
// "straggler-communication" (network) or "straggler-data" (storage: the
// node's data loader or its storage); persistent, supporting the eviction of
// `f.node` whatever the job's size (with fewer than 3 nodes the detector
// judged ranks, and `f.node` is the slow rank's node). `cause`: what the
// node's telemetry showed ("" when nothing stood out), kept in the verdict.
Finding StragglerFailure(const StragglerFinding& f, const std::string& cause, Nanos now_wall,
                         const std::string& detail_json);

}  // namespace trainguard
