// The GPU checks' parsers on the tools' output formats, and MeasureGpus
// against stand-in tools (this machine has no GPU): no nvidia-smi, no
// devices, a driver that cannot be reached, a healthy and a sick node.
#include "diag/gpu_probe.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <map>

#include "diag/judge.h"
#include "testing/scratch_dir.h"

namespace trainguard {
namespace {

std::map<std::string, Figure> ByName(const std::vector<Figure>& figures) {
  std::map<std::string, Figure> out;
  for (const auto& f : figures) out[f.name] = f;
  return out;
}

// A stand-in for a tool: prints `out` for arguments containing `key`, exits `code`.
// In a scratch directory of the test's, removed when the test ends.
std::string Tool(const testutil::ScratchDir& dir, const std::string& name,
                 const std::vector<std::tuple<std::string, std::string, int>>& cases) {
  std::string path = dir / name;
  std::ofstream f(path);
  f << "#!/bin/sh\ncase \"$*\" in\n";
  for (const auto& [key, out, code] : cases) {
    f << "  *\"" << key << "\"*) cat <<'EOF'\n" << out << "\nEOF\n  exit " << code << ";;\n";
  }
  f << "esac\nexit 2\n";
  f.close();
  chmod(path.c_str(), 0755);
  return path;
}

const char* kQueryGpu =
    "0, 00000000:18:00.0, 0, No\n"
    "1, 00000000:2A:00.0, 3, [N/A]\n";
const char* kRemapped =
    "00000000:18:00.0, No, No\n"
    "00000000:2a:00.0, Yes, No\n";
const char* kNvlink =
    "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)\n"
    "\t Link 0: 26.562 GB/s\n"
    "\t Link 1: 26.562 GB/s\n"
    "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb)\n"
    "\t Link 0: 26.562 GB/s\n"
    "\t Link 1: <inactive>\n";

TEST(GpuProbeTest, ReadsCountEccRetirementsAndRemapsPerGpu) {
  auto f = ByName(GpuHealthFigures(kQueryGpu, kRemapped));
  EXPECT_EQ(f["gpu_count"].value, 2);
  EXPECT_EQ(f["gpu_ecc_uncorrected:0"].value, 0);
  EXPECT_EQ(f["gpu_ecc_uncorrected:1"].value, 3);
  EXPECT_EQ(f["gpu_retired_pending:0"].value, 0);
  EXPECT_EQ(f.count("gpu_retired_pending:1"), 0u);  // [N/A]: no figure
  EXPECT_EQ(f["gpu_remap_pending:1"].value, 1);       // bus ids compared without case
  EXPECT_EQ(f["gpu_remap_failed:0"].value, 0);
}

TEST(GpuProbeTest, CountsInactiveNvLinksPerGpu) {
  auto f = ByName(NvLinkFigures(kNvlink));
  EXPECT_EQ(f["gpu_nvlink_down:0"].value, 0);
  EXPECT_EQ(f["gpu_nvlink_down:1"].value, 1);
  EXPECT_TRUE(NvLinkFigures("GPU 0: NVIDIA A10 (UUID: x)\n").empty());  // no NVLink: no figure
}

TEST(GpuProbeTest, OnlyXidsThatBlameTheGpuCount) {
  Figure f = FatalXidFigure({"NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception",
                             "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
                             "eth0: link up"});
  EXPECT_EQ(f.value, 1);
  EXPECT_NE(f.error.find("79, pid=1"), std::string::npos) << f.error;
  EXPECT_EQ(FatalXidFigure({"NVRM: Xid (PCI:0000:3b:00): 31, MMU Fault"}).value, 0);
}

TEST(GpuProbeTest, DcgmFailuresAreNamedWhateverTheLayout) {
  Figure pass = DcgmFigure(R"({"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment",
      "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]}]}})", 0);
  EXPECT_EQ(pass.value, 1);
  EXPECT_EQ(pass.error, "");
  Figure fail = DcgmFigure(R"({"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware",
      "tests": [{"name": "GPU Memory", "results": [{"gpu_id": "3", "status": "Fail",
      "warnings": [{"warning": "DBE detected"}]}]}]}]}})", 226);
  EXPECT_EQ(fail.value, 0);
  EXPECT_NE(fail.error.find("GPU Memory"), std::string::npos) << fail.error;
  EXPECT_NE(DcgmFigure("Error: unable to connect to host engine", 255).error.find("no JSON"), std::string::npos);
}

TEST(GpuProbeTest, ANodeWithoutNvidiaSmiHasNoGpuFigures) {
  GpuTools tools;
  tools.nvidia_smi = "/nonexistent/nvidia-smi";
  tools.dcgmi = "/nonexistent/dcgmi";
  EXPECT_TRUE(MeasureGpus("quick", tools).empty());
}

TEST(GpuProbeTest, NoDevicesIsNoGpusAndAnUnreachableDriverIsAnError) {
  testutil::ScratchDir tools_dir("gpu_probe_test");
  GpuTools tools;
  tools.dcgmi = "/nonexistent/dcgmi";
  tools.nvidia_smi = Tool(tools_dir, "smi-none", {{"query-gpu", "No devices were found", 6}});
  auto none = MeasureGpus("quick", tools);
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].value, 0);
  EXPECT_EQ(none[0].error, "");
  tools.nvidia_smi = Tool(tools_dir, "smi-broken", {{"query-gpu", "NVIDIA-SMI has failed because it couldn't communicate "
                                                       "with the NVIDIA driver.", 9}});
  auto broken = MeasureGpus("quick", tools);
  ASSERT_EQ(broken.size(), 1u);
  EXPECT_NE(broken[0].error.find("couldn't communicate"), std::string::npos) << broken[0].error;
}

TEST(GpuProbeTest, ASickNodeFailsItsChecksAndAHealthyOneDoesNot) {
  testutil::ScratchDir tools_dir("gpu_probe_test");
  GpuTools tools;
  tools.kmsg = "/nonexistent";
  tools.nvidia_smi = Tool(tools_dir, "smi-sick", {{"query-gpu", kQueryGpu, 0}, {"remapped", kRemapped, 0}, {"nvlink", kNvlink, 0}});
  tools.dcgmi = Tool(tools_dir, "dcgmi-sick", {{"diag -r 1", R"({"tests": [{"name": "PCIe", "status": "Fail"}]})", 226}});
  auto sick = MeasureGpus("quick", tools);
  tools.nvidia_smi = Tool(tools_dir, "smi-healthy", {{"query-gpu", "0, 00000000:18:00.0, 0, No\n1, 00000000:2A:00.0, 0, No", 0},
                                          {"remapped", "00000000:18:00.0, No, No\n00000000:2A:00.0, No, No", 0},
                                          {"nvlink", "GPU 0: X (UUID: a)\n Link 0: 26 GB/s\nGPU 1: X (UUID: b)\n Link 0: 26 GB/s", 0}});
  tools.dcgmi = Tool(tools_dir, "dcgmi-healthy", {{"diag -r 1", R"({"tests": [{"name": "PCIe", "status": "Pass"}]})", 0}});
  auto healthy = MeasureGpus("quick", tools);
  auto verdicts = JudgeNodes({{"sick", sick}, {"healthy", healthy}});
  EXPECT_TRUE(verdicts[1].healthy) << (verdicts[1].failures.empty() ? "" : verdicts[1].failures[0]);
  ASSERT_FALSE(verdicts[0].healthy);
  std::string all;
  for (const auto& line : verdicts[0].failures) all += line + "\n";
  for (const char* expected : {"gpu_ecc_uncorrected:1 3.00 is above 0", "gpu_remap_pending:1",
                               "gpu_nvlink_down:1", "dcgm_diag: dcgmi diag failed: PCIe"}) {
    EXPECT_NE(all.find(expected), std::string::npos) << expected << " in\n" << all;
  }
}

}  // namespace
}  // namespace trainguard
