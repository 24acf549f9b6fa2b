#include "diag/gpu_probe.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/gpu_reasons.h"
#include "diag/run_program.h"

namespace trainguard {

using nlohmann::json;

namespace {

std::string Trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  while (std::getline(ss, cell, ',')) out.push_back(Trim(cell));
  return out;
}

// nvidia-smi's cells: a number, Yes/No, or [N/A] / [Not Supported] (no figure).
bool Cell(const std::string& cell, double* value) {
  if (cell == "Yes") {
    *value = 1;
    return true;
  }
  if (cell == "No") {
    *value = 0;
    return true;
  }
  char* end = nullptr;
  double v = std::strtod(cell.c_str(), &end);
  if (cell.empty() || end == nullptr || *end != '\0') return false;
  *value = v;
  return true;
}

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Every test result that failed, anywhere in dcgmi's JSON (its layout
// differs between DCGM versions): the nearest name above a "status": "Fail".
void FailedTests(const json& j, const std::string& name, std::set<std::string>* out) {
  if (j.is_object()) {
    std::string here = name;
    for (const char* key : {"name", "test_name", "category"}) {
      if (j.contains(key) && j[key].is_string()) {
        here = j[key].get<std::string>();
        break;
      }
    }
    for (const char* key : {"status", "result"}) {
      if (j.contains(key) && j[key].is_string() && Lower(j[key].get<std::string>()) == "fail") out->insert(here);
    }
    for (const auto& [k, v] : j.items()) FailedTests(v, here, out);
  } else if (j.is_array()) {
    for (const auto& v : j) FailedTests(v, name, out);
  }
}

// The kernel's records of the last hour (/dev/kmsg stamps them in µs since
// boot); false when the log cannot be read (then nothing is claimed).
bool RecentKernelLines(const std::string& path, std::vector<std::string>* out) {
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  double uptime = 0;
  std::ifstream("/proc/uptime") >> uptime;
  const double since_us = (uptime - 3600) * 1e6;
  char buf[8192];
  for (int records = 0; records < 200000; ++records) {
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n < 0 && errno == EPIPE) continue;  // overwritten while we read: go on
    if (n <= 0) break;
    buf[n] = '\0';
    std::string record(buf);
    auto semi = record.find(';');
    if (semi == std::string::npos) continue;
    auto fields = SplitCsv(record.substr(0, semi));
    if (fields.size() >= 3 && std::strtod(fields[2].c_str(), nullptr) < since_us) continue;
    out->push_back(Trim(record.substr(semi + 1, record.find('\n', semi) - semi - 1)));
  }
  close(fd);
  return true;
}

}  // namespace

std::vector<Figure> GpuHealthFigures(const std::string& query_gpu, const std::string& query_remapped) {
  std::vector<Figure> out;
  std::map<std::string, std::string> index_of_bus;
  int count = 0;
  std::stringstream lines(query_gpu);
  std::string line;
  while (std::getline(lines, line)) {
    auto cells = SplitCsv(line);
    if (cells.size() < 4) continue;
    ++count;
    const std::string& index = cells[0];
    index_of_bus[Lower(cells[1])] = index;
    double v = 0;
    if (Cell(cells[2], &v)) out.push_back({"gpu_ecc_uncorrected:" + index, v, ""});
    if (Cell(cells[3], &v)) out.push_back({"gpu_retired_pending:" + index, v, ""});
  }
  out.insert(out.begin(), Figure{"gpu_count", static_cast<double>(count), ""});
  std::stringstream remapped(query_remapped);
  while (std::getline(remapped, line)) {
    auto cells = SplitCsv(line);
    if (cells.size() < 3) continue;
    auto it = index_of_bus.find(Lower(cells[0]));
    if (it == index_of_bus.end()) continue;
    double v = 0;
    if (Cell(cells[1], &v)) out.push_back({"gpu_remap_pending:" + it->second, v, ""});
    if (Cell(cells[2], &v)) out.push_back({"gpu_remap_failed:" + it->second, v, ""});
  }
  return out;
}

std::vector<Figure> NvLinkFigures(const std::string& nvlink_status) {
  std::vector<Figure> out;
  std::stringstream lines(nvlink_status);
  std::string line, gpu;
  int links = 0, down = 0;
  auto flush = [&] {
    if (!gpu.empty() && links > 0) out.push_back({"gpu_nvlink_down:" + gpu, static_cast<double>(down), ""});
    links = down = 0;
  };
  while (std::getline(lines, line)) {
    std::string t = Trim(line);
    if (t.rfind("GPU ", 0) == 0) {
      flush();
      gpu = t.substr(4, t.find(':') - 4);
    } else if (t.rfind("Link ", 0) == 0) {
      ++links;
      down += Lower(t).find("inactive") != std::string::npos ? 1 : 0;
    }
  }
  flush();
  return out;
}

Figure FatalXidFigure(const std::vector<std::string>& kernel_lines) {
  std::vector<std::string> seen;
  for (const auto& l : kernel_lines) {
    auto at = l.find("NVRM: Xid");
    if (at == std::string::npos) continue;
    auto colon = l.find("):", at);  // "NVRM: Xid (PCI:0000:3b:00): 79, ..."
    if (colon == std::string::npos) continue;
    int xid = std::atoi(l.c_str() + colon + 2);
    if (XidMeansHardware(xid)) seen.push_back(l.substr(at, 120));
  }
  Figure f{"gpu_fatal_xids", static_cast<double>(seen.size()), ""};
  if (!seen.empty()) f.error = "in the last hour: " + seen.front() + (seen.size() > 1 ? " (and " + std::to_string(seen.size() - 1) + " more)" : "");
  return f;
}

Figure DcgmFigure(const std::string& json_text, int exit_code) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded()) {
    return {"dcgm_diag", 0, "dcgmi diag printed no JSON (exit " + std::to_string(exit_code) + ")"};
  }
  std::set<std::string> failed;
  FailedTests(j, "", &failed);
  if (failed.empty()) return {"dcgm_diag", 1, ""};
  std::string names;
  for (const auto& n : failed) names += (names.empty() ? "" : ", ") + (n.empty() ? std::string("?") : n);
  return {"dcgm_diag", 0, "dcgmi diag failed: " + names};
}

std::vector<Figure> MeasureGpus(const std::string& mode, const GpuTools& tools) {
  ProgramResult gpus = RunProgram({tools.nvidia_smi, "--query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total,"
                                   "retired_pages.pending", "--format=csv,noheader,nounits"}, tools.timeout);
  if (!gpus.started) return {};  // no nvidia-smi: a node without NVIDIA GPUs
  std::vector<Figure> out;
  if (gpus.timed_out || gpus.exit_code != 0) {
    // 6: "No devices were found"; anything else: the driver cannot be reached.
    if (!gpus.timed_out && gpus.exit_code == 6) return {{"gpu_count", 0, ""}};
    return {{"gpu_count", 0, gpus.Describe("nvidia-smi") + ": " + Trim(gpus.output).substr(0, 160)}};
  }
  ProgramResult remapped = RunProgram({tools.nvidia_smi, "--query-remapped-rows=gpu_bus_id,remapped_rows.pending,"
                                       "remapped_rows.failure", "--format=csv,noheader"}, tools.timeout);
  out = GpuHealthFigures(gpus.output, remapped.started && remapped.exit_code == 0 ? remapped.output : "");
  ProgramResult links = RunProgram({tools.nvidia_smi, "nvlink", "-s"}, tools.timeout);
  if (links.started && links.exit_code == 0) {
    for (auto& f : NvLinkFigures(links.output)) out.push_back(std::move(f));
  }
  if (std::vector<std::string> kernel; RecentKernelLines(tools.kmsg, &kernel)) out.push_back(FatalXidFigure(kernel));
  ProgramResult dcgm = RunProgram({tools.dcgmi, "diag", "-r", mode == "full" ? "2" : "1", "-j"}, tools.dcgm_timeout);
  if (dcgm.started) {
    out.push_back(dcgm.timed_out ? Figure{"dcgm_diag", 0, "dcgmi diag did not finish in time"}
                                 : DcgmFigure(dcgm.output, dcgm.exit_code));
  }
  return out;
}

}  // namespace trainguard
