#include "cli/local_launcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <utility>

#include "agent/process.h"

namespace trainguard {

LocalLauncher::LocalLauncher(std::string self_exe, std::vector<std::string> common_args)
    : self_exe_(std::move(self_exe)), common_args_(std::move(common_args)) {
  thread_ = std::thread([this] { Loop(); });
}

LocalLauncher::~LocalLauncher() { StopAll(0); }

void LocalLauncher::StartNode(const std::string& node_id, std::vector<std::string> node_args) {
  std::lock_guard<std::mutex> lock(mu_);
  node_args_[node_id] = std::move(node_args);
  requests_.push_back({node_id, false});
  cv_.notify_all();
}

void LocalLauncher::ReplaceNode(const std::string& node_id, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || !node_args_.count(node_id)) return;
  requests_.push_back({node_id, true});
  cv_.notify_all();
}

void LocalLauncher::PlaceNodesWith(std::function<StatusOr<NodeHost>(const std::string&)> place) {
  std::lock_guard<std::mutex> lock(mu_);
  place_ = std::move(place);
}

void LocalLauncher::PutNodesInRacks(std::function<std::string(const std::string&)> rack_of) {
  std::lock_guard<std::mutex> lock(mu_);
  rack_of_ = std::move(rack_of);
}

void LocalLauncher::ReplaceEvictedNodesWith(std::function<std::string()> fresh_node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  fresh_node_id_ = std::move(fresh_node_id);
}

void LocalLauncher::StopAgentsWith(int sig, int grace_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  stop_signal_ = sig;
  stop_grace_ms_ = grace_ms;
}

bool LocalLauncher::EvictNode(const std::string& node_id, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || !node_args_.count(node_id)) return false;
  requests_.push_back({node_id, true, false});
  std::string fresh = fresh_node_id_ ? fresh_node_id_() : "";
  if (!fresh.empty() && !node_args_.count(fresh)) {
    // The new node is reached like the old one but asks for no group rank: it takes the free one.
    std::vector<std::string> args;
    const auto& old = node_args_[node_id];
    for (std::size_t i = 0; i < old.size(); ++i) {
      if (old[i] == "--group-rank") {
        ++i;
        continue;
      }
      args.push_back(old[i]);
    }
    args.insert(args.end(), {"--group-rank", "-1"});
    node_args_[fresh] = std::move(args);
    requests_.push_back({fresh, false, true});
    std::fprintf(stderr, "trainguard: node %s evicted (%s); node %s takes its place\n", node_id.c_str(),
                 reason.c_str(), fresh.c_str());
    cv_.notify_all();
    return true;
  }
  cv_.notify_all();
  return false;
}

pid_t LocalLauncher::AgentPid(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = agents_.find(node_id);
  return it == agents_.end() ? -1 : it->second;
}

int LocalLauncher::StopAll(int timeout_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ && !thread_.joinable()) return killed_;
    stopping_ = true;
    stop_timeout_ms_ = timeout_ms;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
  return killed_;
}

void LocalLauncher::Launch(const std::string& node_id, const NodeHost* host) {
  SpawnSpec spec;
  if (host != nullptr) spec.argv = host->prefix;
  spec.argv.push_back(self_exe_);
  spec.argv.push_back("agent");
  for (const auto& a : common_args_) spec.argv.push_back(a);
  spec.argv.push_back("--node-id");
  spec.argv.push_back(node_id);
  const std::vector<std::string>& node_args = node_args_[node_id];
  for (std::size_t i = 0; i < node_args.size(); ++i) {
    if (host != nullptr && node_args[i] == "--address") {  // the node's namespace decides
      ++i;
      continue;
    }
    spec.argv.push_back(node_args[i]);
  }
  if (host != nullptr) spec.argv.insert(spec.argv.end(), {"--address", host->address});
  if (std::string rack = rack_of_ ? rack_of_(node_id) : ""; !rack.empty()) {
    spec.argv.insert(spec.argv.end(), {"--rack", rack});
  }
  bool has_group_rank =
      std::find(node_args.begin(), node_args.end(), "--group-rank") != node_args.end();
  if (!has_group_rank && node_id.rfind("node", 0) == 0 && node_id.size() > 4 &&
      node_id.find_first_not_of("0123456789", 4) == std::string::npos) {
    spec.argv.push_back("--group-rank");
    spec.argv.push_back(node_id.substr(4));
  }
  spec.env = CurrentEnvironment();
  if (host != nullptr) {
    for (const auto& [k, v] : host->env) spec.env.emplace(k, v);  // the user's own setting wins
  }
  auto proc = Spawn(spec);
  if (!proc.ok()) {
    std::fprintf(stderr, "trainguard: cannot start agent for %s: %s\n", node_id.c_str(),
                 proc.status().ToString().c_str());
    return;
  }
  // Spawn gave the agent two pipes; forward each on a small thread so that
  // output keeps its order per agent and stream.
  for (auto [fd, to] : {std::pair{proc->stdout_fd, stdout}, std::pair{proc->stderr_fd, stderr}}) {
    std::thread([fd, to] {
      char buf[8192];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) {
        if (fwrite(buf, 1, static_cast<size_t>(n), to) == 0) break;
        fflush(to);
      }
      close(fd);
    }).detach();
  }
  agents_[node_id] = proc->pid;
}

namespace {

std::string DescribeAgentExit(const std::string& node_id, const ExitInfo& e) {
  std::string how = e.signal != 0 ? "was killed by signal " + std::to_string(e.signal)
                                  : "exited with code " + std::to_string(e.exit_code);
  return "the agent of node " + node_id + " " + how +
         " while its host stayed up: a fault of the agent process, not of the node";
}

// How a child that has exited but is not reaped yet ended: field 52 of
// /proc/PID/stat (exit_code, in waitpid's encoding; Linux >= 3.5).
std::optional<ExitInfo> ZombieExit(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'Z') {
    return std::nullopt;
  }
  std::istringstream rest(stat.substr(close + 2));
  std::string field;
  int index = 3;  // the state is field 3
  int status = -1;
  while (rest >> field) {
    if (index == 52) status = std::atoi(field.c_str());
    ++index;
  }
  if (status < 0) return std::nullopt;
  ExitInfo e;
  if (WIFSIGNALED(status)) {
    e.signal = WTERMSIG(status);
  } else {
    e.exit_code = WEXITSTATUS(status);
  }
  return e;
}

}  // namespace

LossExplanation LocalLauncher::ExplainLoss(const std::string& node_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto live = agents_.find(node_id);
  if (live != agents_.end()) {
    // Connection gone, process exiting: it may not be a zombie yet.
    for (int i = 0; i < 20; ++i) {
      if (auto e = ZombieExit(live->second)) return {DescribeAgentExit(node_id, *e), AgentExitedVerdict()};
      if (kill(live->second, 0) != 0) break;  // reaped meanwhile
      usleep(1000);
    }
    return {};
  }
  auto gone = exits_.find(node_id);
  if (gone == exits_.end()) return {};
  return {DescribeAgentExit(node_id, gone->second), AgentExitedVerdict()};
}

void LocalLauncher::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  auto reap = [&] {
    for (auto it = agents_.begin(); it != agents_.end();) {
      if (auto exit = TryReap(it->second)) {
        exits_[it->first] = *exit;
        it = agents_.erase(it);
      } else {
        ++it;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    for (auto it = dying_.begin(); it != dying_.end();) {
      // One that a gentler signal did not end in time is killed.
      if (auto soft = soft_kills_.find(*it); soft != soft_kills_.end() && now > soft->second) {
        SignalGroup(*it, SIGKILL);
        soft_kills_.erase(soft);
      }
      if (TryReap(*it)) {
        soft_kills_.erase(*it);
        it = dying_.erase(it);
      } else {
        ++it;
      }
    }
  };
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(50),
                 [&] { return stopping_ || !requests_.empty(); });
    while (!requests_.empty() && !stopping_) {
      Request r = requests_.front();
      requests_.pop_front();
      auto it = agents_.find(r.node_id);
      if (it != agents_.end()) {
        if (!r.kill_first) continue;  // already running
        SignalGroup(it->second, stop_signal_);
        if (stop_signal_ != SIGKILL) {
          soft_kills_[it->second] = std::chrono::steady_clock::now() + std::chrono::milliseconds(stop_grace_ms_);
        }
        dying_.push_back(it->second);
        agents_.erase(it);
      }
      if (!r.launch) continue;
      if (!place_) {
        Launch(r.node_id, nullptr);
        continue;
      }
      auto place = place_;
      lock.unlock();  // making a namespace takes a while; ReplaceNode must not wait for it
      StatusOr<NodeHost> host = place(r.node_id);
      lock.lock();
      if (!host.ok()) {
        std::fprintf(stderr, "trainguard: cannot place node %s: %s\n", r.node_id.c_str(),
                     host.status().message().c_str());
        continue;
      }
      if (!stopping_) Launch(r.node_id, &host.value());
    }
    reap();
  }
  // Let agents finish on their own (they were told to shut down), then kill.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(stop_timeout_ms_);
  while ((!agents_.empty() || !dying_.empty()) && std::chrono::steady_clock::now() < deadline) {
    lock.unlock();
    usleep(10000);
    lock.lock();
    reap();
  }
  for (const auto& [id, pid] : agents_) {
    SignalGroup(pid, SIGKILL);
    dying_.push_back(pid);
    ++killed_;
  }
  agents_.clear();
  for (pid_t pid : dying_) {
    for (int i = 0; i < 500 && !TryReap(pid); ++i) usleep(10000);
  }
  dying_.clear();
  done_ = true;
}

}  // namespace trainguard
