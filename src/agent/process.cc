#include "agent/process.h"

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace trainguard {

StatusOr<std::string> FindExecutable(const std::string& name) {
  if (name.empty()) return InvalidArgument("empty command");
  auto executable = [](const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) {
    if (executable(name)) return name;
    return NotFound("command not found or not executable: " + name);
  }
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (executable(candidate)) return candidate;
  }
  return NotFound("command not found in PATH: " + name);
}

std::map<std::string, std::string> CurrentEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    env[std::string(static_cast<const char*>(*e), eq)] = eq + 1;
  }
  return env;
}

void OutputPipes::CloseAll() {
  for (int* fd : {&out[0], &out[1], &err[0], &err[1]}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

StatusOr<OutputPipes> MakeOutputPipes() {
  OutputPipes p;
  if (pipe2(p.out, O_CLOEXEC) != 0 || pipe2(p.err, O_CLOEXEC) != 0) {
    int err = errno;
    p.CloseAll();
    return IoError(std::string("pipe: ") + std::strerror(err));
  }
  return p;
}

StatusOr<SpawnedProcess> Spawn(const SpawnSpec& spec) {
  if (spec.argv.empty()) return InvalidArgument("no command to run");
  auto exe = FindExecutable(spec.argv[0]);
  if (!exe.ok()) return exe.status();
  // Everything the child needs is prepared before fork: after fork only
  // async-signal-safe calls are allowed (the agent has other threads).
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string& path = exe.value();
  auto pipes = MakeOutputPipes();
  if (!pipes.ok()) return pipes.status();
  int* out_pipe = pipes->out;
  int* err_pipe = pipes->err;
  auto close_pipes = [&] { pipes->CloseAll(); };
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close_pipes();
    return IoError(std::string("fork: ") + std::strerror(err));
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the agent died already
    // Undo signal state the agent may have set up or inherited: a rank
    // starts with every signal at its default however the agent was
    // started (a shell's `&` ignores SIGINT and SIGQUIT, nohup SIGHUP), so
    // a cold start and a warm standby see the same.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);  // EINVAL for glibc's own: fine
    }
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);  // fd 0 gets a copy without O_CLOEXEC
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    if (spec.pass_fd >= 0) {
      if (spec.pass_fd == 3) {
        fcntl(3, F_SETFD, 0);
      } else {
        dup2(spec.pass_fd, 3);  // the copy does not inherit O_CLOEXEC
      }
    }
    if (spec.nice != 0) (void)!nice(spec.nice);
    if (spec.idle) {
      sched_param none{};
      sched_setscheduler(0, SCHED_IDLE, &none);
    }
    if (!spec.cwd.empty() && chdir(spec.cwd.c_str()) != 0) _exit(127);
    execve(path.c_str(), argv.data(), envp.data());
    const char msg[] = "trainguard: exec failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  setpgid(pid, pid);  // also from the parent, so signals never race the child's setpgid
  close(out_pipe[1]);
  close(err_pipe[1]);
  return SpawnedProcess{pid, out_pipe[0], err_pipe[0]};
}

std::optional<ExitInfo> TryReap(pid_t pid) {
  int status = 0;
  pid_t r = waitpid(pid, &status, WNOHANG);
  if (r == 0) return std::nullopt;
  if (r < 0) return ExitInfo{-1, 0};  // not our child any more: treat as gone
  ExitInfo info;
  if (WIFEXITED(status)) info.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) info.signal = WTERMSIG(status);
  return info;
}

void SignalGroup(pid_t pgid, int sig) {
  if (pgid > 0) kill(-pgid, sig);
}

std::string ProcState(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return "";
  // comm may contain spaces and parentheses: the state follows the last ')'.
  auto close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return "";
  return std::string(1, line[close_paren + 2]);
}

GroupActivity SampleGroupActivity(pid_t pgid) { return SampleGroupsActivity({pgid})[pgid]; }

std::map<pid_t, GroupActivity> SampleGroupsActivity(const std::vector<pid_t>& pgids) {
  std::map<pid_t, GroupActivity> groups;
  for (pid_t g : pgids) groups[g];
  static const long ticks_per_second = sysconf(_SC_CLK_TCK);
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return groups;
  while (dirent* entry = readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    std::string base = std::string("/proc/") + entry->d_name;
    std::ifstream stat(base + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    auto close_paren = line.rfind(')');
    if (close_paren == std::string::npos) continue;
    // Fields after the comm: state(3) ppid(4) pgrp(5) ... utime(14) stime(15).
    std::istringstream fields(line.substr(close_paren + 2));
    std::string field;
    std::vector<std::string> f;
    while (f.size() < 13 && fields >> field) f.push_back(field);
    if (f.size() < 13) continue;
    auto group = groups.find(static_cast<pid_t>(std::atol(f[2].c_str())));
    if (group == groups.end()) continue;
    GroupActivity& total = group->second;
    unsigned long long ticks = std::strtoull(f[11].c_str(), nullptr, 10) +
                               std::strtoull(f[12].c_str(), nullptr, 10);
    total.cpu += static_cast<Nanos>(ticks) * kSecond / ticks_per_second;
    ++total.processes;
    total.pids.push_back(static_cast<pid_t>(std::atol(entry->d_name)));
    if (f[0] == "D") total.uninterruptible.push_back(total.pids.back());
    std::ifstream io(base + "/io");
    std::string key;
    unsigned long long value;
    while (io >> key >> value) {
      if (key == "rchar:" || key == "wchar:") total.io_bytes += value;
      if (key == "rchar:") total.rchar += value;
      if (key == "wchar:") total.wchar += value;
      if (key == "syscr:") total.syscr += value;
      if (key == "syscw:") total.syscw += value;
      if (key == "read_bytes:") total.read_bytes += value;
      if (key == "write_bytes:") total.write_bytes += value;
    }
  }
  closedir(proc);
  return groups;
}

void ActivityTracker::Update(const GroupActivity& sample, Nanos now_mono) {
  Nanos elapsed = now_mono - last_sample_mono_;
  if (sampled_) {
    bool cpu = sample.cpu - last_.cpu > static_cast<Nanos>(kMinCpuShare * static_cast<double>(elapsed));
    bool io = sample.io_bytes != last_.io_bytes;
    if (cpu || io) last_change_ = now_mono;
  }
  sampled_ = true;
  last_ = sample;
  last_sample_mono_ = now_mono;
}

int FindFreePort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

}  // namespace trainguard
