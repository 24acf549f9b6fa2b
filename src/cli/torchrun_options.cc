#include "cli/torchrun_options.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

namespace trainguard {

namespace fs = std::filesystem;

namespace {

StatusOr<int> PositiveInt(const std::string& flag, const std::string& value) {
  std::size_t used = 0;
  int n = 0;
  try {
    n = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || n < 1) {
    return InvalidArgument(flag + " " + value + ": expected a positive number");
  }
  return n;
}

// A script path (runs under Python) rather than a program.
bool IsScript(const std::string& word) {
  if (word.size() > 3 && word.compare(word.size() - 3, 3, ".py") == 0) return true;
  std::error_code ec;
  return fs::is_regular_file(word, ec) && access(word.c_str(), X_OK) != 0;
}

}  // namespace

int CountGpus() {
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::string v = visible;
    if (v.empty() || v == "-1") return 0;
    int n = 1;
    for (char c : v) n += c == ',';
    return n;
  }
  int n = 0;
  std::error_code ec;
  static const std::regex device("nvidia[0-9]+");
  for (const auto& e : fs::directory_iterator("/dev", ec)) {
    n += std::regex_match(e.path().filename().string(), device) ? 1 : 0;
  }
  return n;
}

std::string ChoosePython(const std::string& requested) {
  if (!requested.empty()) return requested;
  if (const char* env = std::getenv("TRAINGUARD_PYTHON"); env != nullptr && *env) return env;
  // torchrun's own interpreter (its shebang), which has torch.
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
      fs::path candidate = fs::path(dir.empty() ? "." : dir) / "torchrun";
      std::ifstream f(candidate);
      std::string first;
      if (!f || !std::getline(f, first) || first.rfind("#!", 0) != 0) continue;
      std::string interpreter = first.substr(2);
      interpreter.erase(0, interpreter.find_first_not_of(" \t"));
      interpreter = interpreter.substr(0, interpreter.find_first_of(" \t"));
      std::error_code ec;
      if (interpreter.find("/env") == std::string::npos && fs::exists(interpreter, ec)) {
        return interpreter;
      }
      break;
    }
  }
  return "python3";
}

StatusOr<std::vector<std::string>> ResolveTorchrunOptions(const TorchrunOptions& t, JobOptions* o) {
  std::vector<std::string> notes;
  // --nnodes N or MIN:MAX.
  int min_nodes = 0;
  std::size_t colon = t.nnodes.find(':');
  if (colon == std::string::npos) {
    auto n = PositiveInt("--nnodes", t.nnodes);
    if (!n.ok()) return n.status();
    o->nnodes = *n;
  } else {
    auto lo = PositiveInt("--nnodes", t.nnodes.substr(0, colon));
    auto hi = PositiveInt("--nnodes", t.nnodes.substr(colon + 1));
    if (!lo.ok()) return lo.status();
    if (!hi.ok()) return hi.status();
    if (*lo > *hi) return InvalidArgument("--nnodes " + t.nnodes + ": MIN is larger than MAX");
    o->nnodes = *hi;
    min_nodes = *lo;
  }
  // --nproc-per-node N | auto | cpu | gpu.
  const std::string& np = t.nproc_per_node;
  if (np == "gpu") {
    o->nproc_per_node = CountGpus();
    if (o->nproc_per_node == 0) return InvalidArgument("--nproc-per-node gpu: no GPU is visible here");
  } else if (np == "cpu") {
    o->nproc_per_node = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  } else if (np == "auto") {
    int gpus = CountGpus();
    o->nproc_per_node = gpus > 0 ? gpus : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  } else {
    auto n = PositiveInt("--nproc-per-node", np);
    if (!n.ok()) return InvalidArgument("--nproc-per-node " + np + ": expected a number, auto, cpu or gpu");
    o->nproc_per_node = *n;
  }
  // One host, or one host of several: torchrun's multi-node command line names
  // a rendezvous endpoint (c10d) or a master address and a node rank (static).
  if (t.node_rank < -1) return InvalidArgument("--node-rank must not be negative");
  if (t.node_rank >= o->nnodes) {
    return InvalidArgument("--node-rank " + std::to_string(t.node_rank) + " with --nnodes " +
                           t.nnodes + ": a node rank is less than the number of nodes");
  }
  bool several_hosts = o->nnodes > 1 && !t.standalone &&
                       (!t.rdzv_endpoint.empty() || t.node_rank >= 0 || !t.master_addr.empty());
  if (min_nodes > 0 && min_nodes < o->nnodes) {
    o->min_nnodes = min_nodes;
    notes.push_back("--nnodes " + t.nnodes + ": elastic: " +
                    (several_hosts ? std::string("the job starts with every host that joined within "
                                                 "--elastic-wait once ") +
                                         std::to_string(min_nodes) + " have, and"
                                   : "all " + std::to_string(o->nnodes) + " nodes run on this host; the job") +
                    " goes on with fewer (down to " + std::to_string(min_nodes) +
                    ") when a failed node has no spare or replacement");
  }
  if (several_hosts) {
    std::string endpoint = t.rdzv_endpoint;
    if (endpoint.empty()) {  // the static rendezvous: MASTER_ADDR:MASTER_PORT, torchrun's defaults
      endpoint = (t.master_addr.empty() ? "127.0.0.1" : t.master_addr) + ":" +
                 std::to_string(t.master_port >= 0 ? t.master_port : 29500);
    } else if (endpoint.find(':') == std::string::npos || endpoint.back() == ']') {
      endpoint += ":29400";  // torchrun's default rendezvous port
    }
    o->rendezvous = endpoint;
    o->node_rank = t.node_rank;
    notes.push_back("one host of " + std::to_string(o->nnodes) + ": the host that owns " + endpoint +
                    " runs the controller there; every host runs an agent" +
                    (t.node_rank >= 0 ? " (this one asks for node rank " + std::to_string(t.node_rank) + ")" : ""));
  }
  if (!t.rdzv_backend.empty() && t.rdzv_backend != "c10d" && t.rdzv_backend != "static") {
    notes.push_back("--rdzv-backend " + t.rdzv_backend + ": trainguard's controller is the rendezvous");
  }
  if (!t.rdzv_conf.empty()) notes.push_back("--rdzv-conf is not used: trainguard's controller is the rendezvous");
  if (!t.rdzv_id.empty() && o->job_id.empty()) o->job_id = t.rdzv_id;  // TORCHELASTIC_RUN_ID
  if (!t.master_addr.empty() || t.master_port >= 0) {
    notes.push_back(std::string("--master-addr/--master-port: trainguard sets MASTER_ADDR and MASTER_PORT "
                    "itself, a free port for every restart") +
                    (several_hosts && t.rdzv_endpoint.empty() ? "; the controller listens at the given address" : ""));
  }
  if (t.monitor_interval >= 0) {
    notes.push_back("--monitor-interval: trainguard's agents reap exits every 20 ms and report "
                    "every --heartbeat-interval");
  }
  if (!t.role.empty()) o->env["ROLE_NAME"] = t.role;
  if (!t.log_dir.empty() && o->run_dir.empty()) {
    o->run_dir = (fs::path(t.log_dir) / (o->job_id.empty() ? "job" : o->job_id)).string();
  }
  if (!t.redirects.empty() || !t.tee.empty()) {
    notes.push_back("--redirects/--tee: every rank's stdout and stderr go to its log file and to "
                    "the console, prefixed with its rank");
  }
  if (!t.local_ranks_filter.empty()) {
    notes.push_back("--local-ranks-filter: every rank's output is shown; each line carries its rank");
  }
  // The command: a script under Python (as torchrun runs it), a module, or a program.
  if (o->command.empty()) return InvalidArgument("no command given: trainguard run [options] [--] SCRIPT|COMMAND [ARGS...]");
  if (o->command[0].size() > 1 && o->command[0][0] == '-') {
    return InvalidArgument("unknown option " + o->command[0] + " (see trainguard run --help)");
  }
  int modes = (t.no_python ? 1 : 0) + (t.module ? 1 : 0) + (t.run_path ? 1 : 0);
  if (modes > 1) return InvalidArgument("--no-python, -m/--module and --run-path exclude each other");
  std::string python = ChoosePython(t.python);
  if (t.module) {
    o->command.insert(o->command.begin(), {python, "-m"});
  } else if (t.run_path || (!t.no_python && IsScript(o->command[0]))) {
    o->command.insert(o->command.begin(), python);
  }
  return notes;
}

}  // namespace trainguard
