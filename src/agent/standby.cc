#include "agent/standby.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "common/utf8.h"

namespace trainguard {

using nlohmann::json;

const char* const kStandbyProgram = "from trainguard import _standby; raise SystemExit(_standby.main())";

namespace {

bool IsPythonName(const std::string& path) {
  std::string base = path.substr(path.rfind('/') + 1);
  if (base.rfind("python", 0) != 0) return false;
  for (char c : base.substr(6)) {
    if (!(c == '.' || (c >= '0' && c <= '9'))) return false;
  }
  return true;
}

}  // namespace

StatusOr<PythonCommand> ParsePythonCommand(const std::vector<std::string>& argv) {
  if (argv.empty() || !IsPythonName(argv[0])) {
    return InvalidArgument("not a Python interpreter: " + (argv.empty() ? std::string("(none)") : argv[0]));
  }
  PythonCommand cmd;
  cmd.interpreter = argv[0];
  static const std::string kFlags = "bBdhiOqsuvVxRP";  // single letters without an argument
  size_t i = 1;
  for (; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.empty() || a[0] != '-' || a == "-") break;
    if (a == "--") {
      ++i;
      break;
    }
    if (a.rfind("--", 0) == 0) {
      if (a == "--check-hash-based-pycs" && i + 1 < argv.size()) {
        cmd.options.push_back(a);
        cmd.options.push_back(argv[++i]);
        continue;
      }
      return InvalidArgument("interpreter option " + a + " is not run warm");
    }
    std::string kept = "-";
    for (size_t j = 1; j < a.size(); ++j) {
      char c = a[j];
      if (kFlags.find(c) != std::string::npos) {
        kept += c;
        continue;
      }
      if (c == 'E' || c == 'I' || c == 'S') {
        return InvalidArgument(std::string("the interpreter runs with -") + c +
                               ", which leaves out trainguard's sitecustomize");
      }
      if (c == 'c') return InvalidArgument("a -c program is not run warm");
      std::string value = a.substr(j + 1);
      if (c == 'W' || c == 'X' || c == 'm') {
        if (value.empty()) {
          if (i + 1 >= argv.size()) return InvalidArgument(std::string("-") + c + " without its argument");
          value = argv[++i];
        }
        if (kept.size() > 1) cmd.options.push_back(kept);
        kept = "-";
        if (c == 'm') {
          cmd.module = value;
          cmd.args.assign(argv.begin() + static_cast<long>(i) + 1, argv.end());
          return cmd;
        }
        cmd.options.push_back(std::string("-") + c);
        cmd.options.push_back(value);
        break;  // the rest of this argument was the value
      }
      return InvalidArgument(std::string("interpreter option -") + c + " is not run warm");
    }
    if (kept.size() > 1) cmd.options.push_back(kept);
  }
  if (i >= argv.size() || argv[i] == "-") return InvalidArgument("no script to run (standard input)");
  cmd.script = argv[i];
  cmd.args.assign(argv.begin() + static_cast<long>(i) + 1, argv.end());
  return cmd;
}

StatusOr<Standby> Standby::Launch(const PythonCommand& cmd, std::map<std::string, std::string> env,
                                  const std::string& cwd, const std::string& imports, int nice,
                                  Nanos now_mono) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return IoError(std::string("socketpair: ") + std::strerror(errno));
  }
  env["TRAINGUARD_STANDBY_FD"] = "3";
  env["TRAINGUARD_STANDBY_IMPORTS"] = imports;
  env["TRAINGUARD_STANDBY_TARGET"] = cmd.target();
  if (nice != 0) env["TRAINGUARD_STANDBY_NICE"] = std::to_string(getpriority(PRIO_PROCESS, 0));
  SpawnSpec spec;
  spec.argv.push_back(cmd.interpreter);
  spec.argv.insert(spec.argv.end(), cmd.options.begin(), cmd.options.end());
  spec.argv.push_back("-c");
  spec.argv.push_back(kStandbyProgram);
  spec.env = std::move(env);
  spec.cwd = cwd;
  spec.pass_fd = sv[1];
  spec.nice = nice;
  // Where it can be undone (the standby restores the ranks' policy and
  // niceness when its imports are done), it imports only on idle CPU time:
  // a training rank next to it loses nothing (a straggler test on this
  // 2-core machine judged a node slow while its standbys imported at nice 10).
  spec.idle = nice != 0;
  auto proc = Spawn(spec);
  close(sv[1]);
  if (!proc.ok()) {
    close(sv[0]);
    return proc.status();
  }
  Standby s;
  s.pid_ = proc->pid;
  s.control_fd_ = sv[0];
  s.stdout_fd_ = proc->stdout_fd;
  s.stderr_fd_ = proc->stderr_fd;
  s.target_ = cmd.target();
  s.launched_mono_ = now_mono;
  s.niced_ = spec.idle;
  s.ranks_nice_ = getpriority(PRIO_PROCESS, 0);
  for (int fd : {s.stdout_fd_, s.stderr_fd_}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  return s;
}

Standby::Standby(Standby&& other) noexcept { *this = std::move(other); }

Standby& Standby::operator=(Standby&& other) noexcept {
  if (this == &other) return *this;
  Kill("replaced");
  pid_ = std::exchange(other.pid_, -1);
  control_fd_ = std::exchange(other.control_fd_, -1);
  stdout_fd_ = std::exchange(other.stdout_fd_, -1);
  stderr_fd_ = std::exchange(other.stderr_fd_, -1);
  state_ = other.state_;
  reason_ = std::move(other.reason_);
  target_ = std::move(other.target_);
  rss_kb_ = other.rss_kb_;
  launched_mono_ = other.launched_mono_;
  ranks_nice_ = other.ranks_nice_;
  niced_ = std::exchange(other.niced_, false);
  other.state_ = State::kGone;
  return *this;
}

Standby::~Standby() { Kill("the agent let it go"); }

namespace {
std::mutex g_killed_mu;
std::vector<pid_t> g_killed;  // killed standbys not reaped yet
}  // namespace

void Standby::ReapKilled() {
  std::lock_guard<std::mutex> lock(g_killed_mu);
  std::erase_if(g_killed, [](pid_t pid) {
    int status;
    pid_t r = waitpid(pid, &status, WNOHANG);
    return r == pid || (r < 0 && errno == ECHILD);
  });
}

std::size_t Standby::KilledNotReaped() {
  std::lock_guard<std::mutex> lock(g_killed_mu);
  return g_killed.size();
}

void Standby::Kill(const std::string& why) {
  if (pid_ > 0) {
    kill(-pid_, SIGKILL);
    {
      std::lock_guard<std::mutex> lock(g_killed_mu);
      g_killed.push_back(pid_);
    }
    ReapKilled();  // at once if it is gone already
    pid_ = -1;
  }
  for (int* fd : {&control_fd_, &stdout_fd_, &stderr_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
  if (state_ != State::kGone) {
    state_ = State::kGone;
    reason_ = why;
  }
}

void Standby::Poll() {
  if (state_ == State::kGone) return;
  char sink[4096];
  for (int fd : {stdout_fd_, stderr_fd_}) {
    while (fd >= 0 && read(fd, sink, sizeof(sink)) > 0) {
    }
  }
  int status = 0;
  pid_t r = pid_ > 0 ? waitpid(pid_, &status, WNOHANG) : -1;
  if (state_ == State::kImporting) {
    char buf[4096];
    ssize_t n = recv(control_fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      json m = json::parse(std::string(buf, static_cast<size_t>(n)), nullptr, false);
      if (m.is_object() && m.value("ready", false)) {
        state_ = State::kReady;
        rss_kb_ = m.value("rss_kb", std::int64_t{0});
      } else {
        Kill(m.is_object() ? m.value("reason", std::string("not ready")) : std::string("a garbled message"));
        return;
      }
    }
  }
  if (r == pid_) {
    pid_ = -1;
    std::string how = WIFSIGNALED(status) ? "killed by signal " + std::to_string(WTERMSIG(status))
                                          : "exited with code " + std::to_string(WEXITSTATUS(status));
    Kill("the standby " + how);
  }
}

void Standby::Hurry() {
  if (!niced_ || pid_ <= 0 || state_ != State::kImporting) return;
  niced_ = false;
  // Every thread: the niceness and the policy are per thread on Linux. The
  // standby sets its own back the same way once its imports are done.
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/task", ec)) {
    const pid_t tid = static_cast<pid_t>(std::atoi(task.path().filename().c_str()));
    if (tid <= 0) continue;
    sched_param param{};
    sched_setscheduler(tid, SCHED_OTHER, &param);
    setpriority(PRIO_PROCESS, static_cast<id_t>(tid), ranks_nice_);
  }
}

StatusOr<SpawnedProcess> Standby::Activate(const PythonCommand& cmd, const std::vector<std::string>& argv,
                                           const std::map<std::string, std::string>& env,
                                           const std::string& cwd, Nanos timeout) {
  Poll();
  if (state_ != State::kReady) {
    std::string why = state_ == State::kImporting ? "the standby is still importing" : reason_;
    Kill(why);
    return FailedPrecondition(why);
  }
  json order;
  json e = json::object();
  for (const auto& [k, v] : env) {
    if (!IsValidUtf8(k) || !IsValidUtf8(v)) {
      Kill("the environment is not UTF-8");
      return FailedPrecondition("the environment is not UTF-8 (" + ValidUtf8(k) + ")");
    }
    e[k] = v;
  }
  for (const auto& a : argv) {
    if (!IsValidUtf8(a)) {
      Kill("the command is not UTF-8");
      return FailedPrecondition("the command is not UTF-8");
    }
  }
  order["env"] = e;
  char here[4096];
  order["cwd"] = !cwd.empty() ? cwd : (getcwd(here, sizeof(here)) != nullptr ? std::string(here) : "/");
  order["orig_argv"] = argv;
  json script_argv = json::array();
  if (cmd.module.empty()) {
    order["script"] = cmd.script;
    script_argv.push_back(cmd.script);
  } else {
    order["module"] = cmd.module;
    script_argv.push_back("-m");
  }
  for (const auto& a : cmd.args) script_argv.push_back(a);
  order["argv"] = script_argv;
  std::string text = order.dump();

  auto pipes = MakeOutputPipes();
  if (!pipes.ok()) return pipes.status();
  int* out_pipe = pipes->out;
  int* err_pipe = pipes->err;
  iovec iov{text.data(), text.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  int fds[2] = {out_pipe[1], err_pipe[1]};
  std::memcpy(CMSG_DATA(c), fds, sizeof(fds));
  ssize_t sent = sendmsg(control_fd_, &msg, MSG_NOSIGNAL);
  close(out_pipe[1]);
  close(err_pipe[1]);
  auto fail = [&](const std::string& why) -> Status {
    close(out_pipe[0]);
    close(err_pipe[0]);
    Kill(why);
    return FailedPrecondition(why);
  };
  if (sent != static_cast<ssize_t>(text.size())) {
    return fail(std::string("cannot hand the rank over: ") + (sent < 0 ? std::strerror(errno) : "short write"));
  }
  pollfd p{control_fd_, POLLIN, 0};
  int ready;
  do {
    ready = poll(&p, 1, static_cast<int>(timeout / kMillisecond));
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0) return fail("the standby did not answer in " + std::to_string(timeout / kMillisecond) + " ms");
  char buf[4096];
  ssize_t n = recv(control_fd_, buf, sizeof(buf), 0);
  json answer = n > 0 ? json::parse(std::string(buf, static_cast<size_t>(n)), nullptr, false) : json();
  if (!answer.is_object() || !answer.value("ok", false)) {
    return fail(answer.is_object() ? answer.value("reason", std::string("refused"))
                                   : std::string("the standby exited before it answered"));
  }
  SpawnedProcess proc{pid_, out_pipe[0], err_pipe[0]};
  pid_ = -1;  // the rank's now
  for (int* fd : {&control_fd_, &stdout_fd_, &stderr_fd_}) {
    close(*fd);
    *fd = -1;
  }
  state_ = State::kGone;
  reason_ = "became the rank";
  return proc;
}

}  // namespace trainguard
