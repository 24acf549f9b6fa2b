#include "cli/slurm.h"

#include <cstdlib>
#include <sstream>

#include "diag/run_program.h"

namespace trainguard {

namespace {

constexpr Nanos kCommandTimeout = 20 * kSecond;

// The value of ` Key=` up to the next space ("" if absent).
std::string Field(const std::string& line, const std::string& key) {
  std::size_t at = line.rfind(key + "=", 0) == 0 ? 0 : line.find(" " + key + "=");
  if (at == std::string::npos) return "";
  at = line.find('=', at) + 1;
  const std::size_t end = line.find(' ', at);
  return line.substr(at, end == std::string::npos ? std::string::npos : end - at);
}

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

StatusOr<std::string> Scontrol(const std::vector<std::string>& args, Nanos timeout = kCommandTimeout) {
  std::vector<std::string> argv = {"scontrol"};
  argv.insert(argv.end(), args.begin(), args.end());
  ProgramResult r = RunProgram(argv, timeout);
  if (!r.started || r.timed_out || r.exit_code != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return Unavailable(cmd + ": " + r.Describe("scontrol") + (r.output.empty() ? "" : ": " + OneLine(r.output)));
  }
  return r.output;
}

}  // namespace

bool SlurmNodeInfo::Failed() const {
  return state.find("DOWN") != std::string::npos || state.find("FAIL") != std::string::npos ||
         state.find("NOT_RESPONDING") != std::string::npos;
}

SlurmNodeInfo ParseScontrolNode(const std::string& line) {
  SlurmNodeInfo n;
  n.name = Field(line, "NodeName");
  n.address = Field(line, "NodeAddr");
  n.state = Field(line, "State");
  // The reason is the line's last field and may hold spaces.
  std::size_t at = line.find(" Reason=");
  if (at != std::string::npos) {
    n.reason = OneLine(line.substr(at + 8));
    // Slurm appends who set it and when: " [root@2026-11-23T22:14:45]".
    if (!n.reason.empty() && n.reason.back() == ']') {
      std::size_t open = n.reason.rfind(" [");
      if (open != std::string::npos) n.reason.erase(open);
    }
  }
  return n;
}

int ParseSlurmdPort(const std::string& show_config) {
  std::istringstream in(show_config);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("SlurmdPort", 0) != 0) continue;
    const std::size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const int port = std::atoi(line.c_str() + eq + 1);
    if (port > 0 && port < 65536) return port;
  }
  return 6818;
}

std::string SlurmReason(const std::string& text) {
  std::string reason = OneLine(text);
  if (reason.size() > 250) reason = reason.substr(0, 247) + "...";
  return reason;
}

std::string DrainReason(const std::string& job_id, const std::string& why) {
  return SlurmReason("trainguard job " + job_id + ": " + why);
}

StatusOr<SlurmAllocation> SlurmAllocationFromEnv(const std::function<const char*(const char*)>& getenv) {
  SlurmAllocation a;
  auto value = [&](const char* name) {
    const char* v = getenv(name);
    return std::string(v == nullptr ? "" : v);
  };
  a.job_id = value("SLURM_JOB_ID");
  a.nodelist = value("SLURM_JOB_NODELIST");
  a.this_node = value("SLURMD_NODENAME");
  if (a.job_id.empty()) {
    return InvalidArgument(
        "--scheduler slurm runs inside a Slurm allocation (an sbatch script or salloc): SLURM_JOB_ID is not set");
  }
  if (a.nodelist.empty()) return InvalidArgument("Slurm job " + a.job_id + ": SLURM_JOB_NODELIST is not set");
  if (a.this_node.empty()) {
    return InvalidArgument("Slurm job " + a.job_id +
                           ": SLURMD_NODENAME is not set (run trainguard in the batch script, on a node of the "
                           "allocation, not on the login node)");
  }
  return a;
}

StatusOr<std::vector<std::string>> Slurm::Hostnames(const std::string& nodelist) {
  auto out = Scontrol({"show", "hostnames", nodelist});
  if (!out.ok()) return out.status();
  std::vector<std::string> names;
  std::istringstream in(*out);
  for (std::string name; in >> name;) names.push_back(name);
  if (names.empty()) return InvalidArgument("Slurm's node list " + nodelist + " names no node");
  return names;
}

StatusOr<SlurmNodeInfo> Slurm::Node(const std::string& name, Nanos timeout) {
  auto out = Scontrol({"show", "node", name, "-o"}, timeout);
  if (!out.ok()) return out.status();
  SlurmNodeInfo n = ParseScontrolNode(*out);
  if (n.name.empty()) return NotFound("Slurm knows no node " + name);
  return n;
}

StatusOr<int> Slurm::SlurmdPort() {
  auto out = Scontrol({"show", "config"});
  if (!out.ok()) return out.status();
  return ParseSlurmdPort(*out);
}

Status Slurm::Drain(const std::string& name, const std::string& reason) {
  auto out = Scontrol({"update", "NodeName=" + name, "State=DRAIN", "Reason=" + reason});
  if (!out.ok()) {
    return Unavailable("cannot drain " + name + " in Slurm (" + out.status().message() +
                       "); draining needs Slurm operator rights for the job's user (docs/slurm.md)");
  }
  return Status::Ok();
}

}  // namespace trainguard
