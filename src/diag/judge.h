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
  // Kinds that are a speed measured over a time: a busy host (another
  // process, a neighbour's burst, the node's own teardown) lowers them, so a
  // failure of one, below a floor as much as below the peers, is measured
  // again before it condemns a node. Counts, free space, errors and known
  // answers are not: they fail at once.
  std::set<std::string> speeds = {"compute_gflops", "memory_gbps",     "disk_write_mbps", "disk_read_mbps",
                                  "net_tx_mbps",    "net_rx_mbps",     "alltoall_gbps",   "gpu_gemm_tflops",
                                  "gpu_h2d_gbps",   "gpu_d2h_gbps"};
  std::size_t min_nodes_for_median = 3;  // fewer nodes: floors only
  // Floors of per-GPU figures by model, the model a word of the device's
  // name ("H100" in "NVIDIA H100 80GB HBM3", "A100" in "NVIDIA
  // A100-SXM4-80GB"). GEMM: about a third of the slowest variant's dense
  // FP16 tensor peak from the datasheet (a 4096-square GEMM reaches 60-75 %
  // of it), so that only a broken or badly throttled GPU is below; copies:
  // less than half of what a healthy x16 link of the GPU's PCIe generation
  // moves (Gen3 ~12, Gen4 ~25, Gen5 ~50 GB/s), so a link trained down to
  // x8 or an older generation is below. A model not listed: generic floors.
  std::map<std::string, std::map<std::string, double>> gpu_model_floors = {
      {"T4", {{"gpu_gemm_tflops", 15}, {"gpu_h2d_gbps", 5}, {"gpu_d2h_gbps", 5}}},
      {"V100", {{"gpu_gemm_tflops", 35}, {"gpu_h2d_gbps", 5}, {"gpu_d2h_gbps", 5}}},
      {"A10", {{"gpu_gemm_tflops", 35}, {"gpu_h2d_gbps", 10}, {"gpu_d2h_gbps", 10}}},
      {"L4", {{"gpu_gemm_tflops", 30}, {"gpu_h2d_gbps", 10}, {"gpu_d2h_gbps", 10}}},
      {"A100", {{"gpu_gemm_tflops", 100}, {"gpu_h2d_gbps", 10}, {"gpu_d2h_gbps", 10}}},
      {"L40S", {{"gpu_gemm_tflops", 100}, {"gpu_h2d_gbps", 10}, {"gpu_d2h_gbps", 10}}},
      {"H100", {{"gpu_gemm_tflops", 250}, {"gpu_h2d_gbps", 20}, {"gpu_d2h_gbps", 20}}},
      {"H200", {{"gpu_gemm_tflops", 300}, {"gpu_h2d_gbps", 20}, {"gpu_d2h_gbps", 20}}},
      {"GH200", {{"gpu_gemm_tflops", 300}, {"gpu_h2d_gbps", 20}, {"gpu_d2h_gbps", 20}}},
      {"B200", {{"gpu_gemm_tflops", 700}, {"gpu_h2d_gbps", 20}, {"gpu_d2h_gbps", 20}}}};
  // By kind, for per-GPU figures: a GPU below this fraction of the median of
  // its own node's other GPUs of the same model fails (with at least two
  // others), so that one node alone still finds its one slow GPU.
  std::map<std::string, double> fraction_of_node_gpus = {
      {"gpu_gemm_tflops", 0.7}, {"gpu_h2d_gbps", 0.7}, {"gpu_d2h_gbps", 0.7}};
};

// The key of `device` in `gpu_model_floors` ("H100" for "NVIDIA H100 80GB
// HBM3"); "" when none of its words is a listed model.
std::string GpuModel(const std::string& device, const JudgePolicy& policy);

struct FigureVerdict {
  Figure figure;
  double median = 0;       // of the nodes that measured it; 0 when not compared
  std::size_t peers = 0;   // how many nodes the median is over
  std::string failure;     // "" if the figure passes
  bool repeatable = false; // a speed that fails (below a floor or the peers): worth measuring again
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

// Whether every failure of the verdict is a measured speed (below a floor or
// the peers' median): a busy host could have lowered each, so the node is
// measured again before it is evicted. An error, a fault count, a known
// answer or free space is not worth repeating.
bool WorthMeasuringAgain(const NodeVerdict& verdict);

// Two runs of the suite on one node, figure by figure: the better value of
// those measured (a slow run does not hide a good one), an error only when
// no run measured it.
std::vector<Figure> BestOf(const std::vector<Figure>& first, const std::vector<Figure>& second);

}  // namespace trainguard
