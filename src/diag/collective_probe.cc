#include "diag/collective_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <nlohmann/json.hpp>

namespace trainguard {

using nlohmann::json;

namespace {

Figure ProbeError(const std::string& why) { return Figure{"collective_probe", 0, why}; }

std::string LastLine(const std::string& text) {
  std::size_t end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return "";
  std::size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1, end + 1 - (begin == std::string::npos ? 0 : begin + 1));
}

}  // namespace

std::vector<Figure> CollectiveFiguresFromOutput(const std::string& stdout_text) {
  json out = json::parse(LastLine(stdout_text), nullptr, false);
  if (out.is_discarded() || !out.is_object()) {
    return {ProbeError("the collective probe printed no result: " + LastLine(stdout_text).substr(0, 200))};
  }
  if (out.contains("skipped") && out["skipped"].is_string()) {
    return {ProbeError("not run: " + out["skipped"].get<std::string>())};
  }
  std::vector<Figure> figures;
  if (!out.contains("figures") || !out["figures"].is_array()) return {ProbeError("the probe's result has no figures")};
  for (const auto& f : out["figures"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("value") ||
        !f["value"].is_number()) {
      return {ProbeError("the probe's figure is malformed: " + f.dump())};
    }
    Figure figure{f["name"].get<std::string>(), f["value"].get<double>(), ""};
    if (f.contains("error") && f["error"].is_string()) figure.error = f["error"].get<std::string>();
    figures.push_back(std::move(figure));
  }
  return figures;
}

std::vector<Figure> RunCollectiveProbe(const CollectivePlan& plan) {
  if (plan.local_ranks < 2 && plan.rack_size < 2) return {};
  std::vector<std::string> argv = {plan.python,
                                   plan.script,
                                   "--work-dir",
                                   plan.work_dir,
                                   "--local-ranks",
                                   std::to_string(plan.local_ranks),
                                   "--bytes",
                                   std::to_string(plan.bytes),
                                   "--iters",
                                   std::to_string(plan.iters),
                                   "--timeout",
                                   std::to_string(plan.timeout / kSecond)};
  if (plan.rack_size >= 2) {
    for (const std::string& a : {std::string("--rack-rank"), std::to_string(plan.rack_rank),
                                 std::string("--rack-size"), std::to_string(plan.rack_size),
                                 std::string("--rack-master"), plan.rack_master}) {
      argv.push_back(a);
    }
  }
  if (access(plan.script.c_str(), R_OK) != 0) return {ProbeError("no probe script at " + plan.script)};
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return {ProbeError(std::string("pipe: ") + std::strerror(errno))};
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return {ProbeError(std::string("fork: ") + std::strerror(errno))};
  }
  if (pid == 0) {
    setpgid(0, 0);
    dup2(pipe_fds[1], 1);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    execvp(cargv[0], cargv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(pipe_fds[1]);
  std::string output;
  const Nanos deadline = RealClock::Get()->MonotonicNanos() + plan.timeout + plan.grace;
  bool timed_out = false;
  for (;;) {
    const Nanos left = deadline - RealClock::Get()->MonotonicNanos();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{pipe_fds[0], POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(std::min<Nanos>(left / kMillisecond + 1, 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buf[4096];
    ssize_t n = read(pipe_fds[0], buf, sizeof(buf));
    if (n <= 0) break;  // the probe closed its output: it is done
    if (output.size() < (1 << 20)) output.append(buf, static_cast<std::size_t>(n));
  }
  close(pipe_fds[0]);
  if (timed_out) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  kill(-pid, SIGKILL);  // the all-to-all's forked ranks, should one outlive the probe
  if (timed_out) {
    return {ProbeError("the collective probe did not finish within " + std::to_string((plan.timeout + plan.grace) / kSecond) + " s")};
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) return {ProbeError("cannot run " + plan.python)};
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return {ProbeError("the collective probe failed (" +
                       (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                            : "exit " + std::to_string(WEXITSTATUS(status))) +
                       ")")};
  }
  return CollectiveFiguresFromOutput(output);
}

}  // namespace trainguard
