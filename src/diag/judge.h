// Judging the diagnostics of a job's nodes: each figure against an absolute
// floor (broken hardware) and against the median of the same figure over the
// nodes (a node much slower than its peers). Pure: figures in, verdicts out.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "diag/probes.h"

namespace trainguard {

struct NodeFigures {
  std::string node;
  std::vector<Figure> figures;
};

struct JudgePolicy {
  // By kind (the figure name before ':'). A kind without a floor has none.
  std::map<std::string, double> floors = {{"compute_gflops", 0.05}, {"memory_gbps", 0.5},
                                          {"disk_write_mbps", 5},   {"disk_read_mbps", 5},
                                          {"disk_free_gib", 1.0},   {"net_tx_mbps", 1},
                                          {"net_rx_mbps", 1},       {"alltoall_gbps", 0.01},
                                          {"dcgm_diag", 1}};
  // By kind: a node below this fraction of the nodes' median fails. Kinds not
  // listed (free space: disks differ legitimately) are judged by floor only.
  std::map<std::string, double> fraction_of_median = {{"compute_gflops", 0.7}, {"memory_gbps", 0.7},
                                                      {"disk_write_mbps", 0.5}, {"disk_read_mbps", 0.5},
                                                      {"net_tx_mbps", 0.5},     {"net_rx_mbps", 0.5},
                                                      {"alltoall_gbps", 0.4},
                                                      // a node that lost a GPU has fewer than its peers
                                                      {"gpu_count", 1.0},
                                                      {"gpu_gemm_tflops", 0.7}, {"gpu_h2d_gbps", 0.7},
                                                      {"gpu_d2h_gbps", 0.7}};
  // By kind: a value above this fails (counts of faults that must be 0).
  std::map<std::string, double> ceilings = {{"gpu_ecc_uncorrected", 0}, {"gpu_retired_pending", 0},
                                            {"gpu_remap_pending", 0},   {"gpu_remap_failed", 0},
                                            {"gpu_nvlink_down", 0},     {"gpu_fatal_xids", 0},
                                            // silent data corruption: results computed wrong (docs/sdc.md)
                                            {"gemm_known_answer_mismatches", 0},
                                            {"gpu_known_answer_mismatches", 0}};
  // Kinds that are shown but never fail a node, not even with an error: the
  // round trip; the rack's all-reduce (one collective of several nodes: its
  // figure does not say which node is at fault, the ring probe does); a
  // collective probe that could not run (no torch for it is no node fault).
  std::set<std::string> shown_only = {"net_rtt_us", "rack_allreduce_gbps", "collective_probe"};
  std::size_t min_nodes_for_median = 3;  // fewer nodes: floors only
};

struct FigureVerdict {
  Figure figure;
  double median = 0;       // of the nodes that measured it; 0 when not compared
  std::size_t peers = 0;   // how many nodes the median is over
  std::string failure;     // "" if the figure passes
  bool relative = false;   // it fails only against its peers (not a floor, not an error)
};

struct NodeVerdict {
  std::string node;
  bool healthy = true;
  std::vector<FigureVerdict> figures;  // in the order measured
  std::vector<std::string> failures;   // one line each: "compute_gflops 1.2 is 48 % of the median 2.5 (min 70 %)"
};

// The kind of a figure: its name before ':' ("disk_write_mbps:ckpt" -> "disk_write_mbps").
std::string FigureKind(const std::string& name);

// One verdict per node, in the order given.
std::vector<NodeVerdict> JudgeNodes(const std::vector<NodeFigures>& nodes, const JudgePolicy& policy = {});

// Whether every failure of the verdict is against the peers' median: a
// measurement a noisy neighbour could have lowered, worth repeating before
// a node is evicted (a floor or an error is not).
bool FailsOnlyAgainstPeers(const NodeVerdict& verdict);

// Two runs of the suite on one node, figure by figure: the better value of
// those measured (a slow run does not hide a good one), an error only when
// no run measured it.
std::vector<Figure> BestOf(const std::vector<Figure>& first, const std::vector<Figure>& second);

}  // namespace trainguard
