// The GPU checks of the diagnostics suite, read from the driver's own tools
// so that nothing needs NVML or DCGM at build time:
//   nvidia-smi (NVML's command line): how many GPUs the node sees, and per
//     GPU i its volatile uncorrected ECC errors, pending page retirements,
//     pending and failed row remaps, and NVLinks that are down;
//   the kernel log: Xids that mean the GPU or its links are at fault (48
//     double-bit ECC, 62/63/64 remapping, 74 NVLink, 79 off the bus, 92 high
//     single-bit rate, 94/95 contained/uncontained ECC, 119/120 GSP);
//   dcgmi diag -r 1 (quick) or -r 2 (full) when DCGM is installed.
// A node without nvidia-smi has no GPU figures (a CPU node). The GPU's
// compute and host<->device bandwidth are measured with the job's PyTorch in
// the collective stage (python/trainguard/_collective_probe.py --gpu).
//
// Figures: gpu_count (judged against the nodes' median: a node that lost a
// GPU has fewer than its peers), gpu_ecc_uncorrected:I, gpu_retired_pending:I,
// gpu_remap_pending:I, gpu_remap_failed:I, gpu_nvlink_down:I, gpu_fatal_xids
// (each must be 0: a ceiling), dcgm_diag (1 passed, an error names the failed
// tests).
#pragma once

#include <string>
#include <vector>

#include "common/clock.h"
#include "diag/probes.h"

namespace trainguard {

struct GpuTools {
  std::string nvidia_smi = "nvidia-smi";
  std::string dcgmi = "dcgmi";
  std::string kmsg = "/dev/kmsg";
  Nanos timeout = 20 * kSecond;       // each nvidia-smi call
  Nanos dcgm_timeout = 120 * kSecond;  // dcgmi diag -r 1 takes about a minute on 8 GPUs
};

// `mode` "quick" or "full" (dcgmi's level 1 or 2). No figures when the node has no nvidia-smi.
std::vector<Figure> MeasureGpus(const std::string& mode, const GpuTools& tools = {});

// The parsers, exposed for tests.
// `nvidia-smi --query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total,retired_pages.pending
// --format=csv,noheader,nounits`, and `--query-remapped-rows=gpu_bus_id,remapped_rows.pending,
// remapped_rows.failure --format=csv,noheader` ("" when that query is not supported).
std::vector<Figure> GpuHealthFigures(const std::string& query_gpu, const std::string& query_remapped);
// `nvidia-smi nvlink -s`: inactive links per GPU (GPUs without NVLink are left out).
std::vector<Figure> NvLinkFigures(const std::string& nvlink_status);
// Kernel log lines: the fatal Xids among them.
Figure FatalXidFigure(const std::vector<std::string>& kernel_lines);
// `dcgmi diag -j` output.
Figure DcgmFigure(const std::string& json_text, int exit_code);

}  // namespace trainguard
