#include "diag/run_program.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace trainguard {

std::string ProgramResult::Describe(const std::string& program) const {
  if (!started) return "cannot run " + program + ": " + error;
  if (timed_out) return program + " was killed at its deadline";
  if (signal != 0) return program + " ended by signal " + std::to_string(signal);
  return program + " exited with " + std::to_string(exit_code);
}

ProgramResult RunProgram(const std::vector<std::string>& argv, Nanos timeout) {
  ProgramResult r;
  int out[2];
  int status_pipe[2];  // closed on a successful exec; carries errno otherwise
  if (pipe2(out, O_CLOEXEC) != 0) {
    r.error = std::string("pipe: ") + std::strerror(errno);
    return r;
  }
  if (pipe2(status_pipe, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    r.error = std::string("pipe: ") + std::strerror(errno);
    return r;
  }
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out[0], out[1], status_pipe[0], status_pipe[1]}) close(fd);
    r.error = std::string("fork: ") + std::strerror(errno);
    return r;
  }
  if (pid == 0) {
    // Killed with the thread that runs it (the agent going away): a probe
    // must never outlive its agent. Its own group keeps Ctrl-C off it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);
    dup2(out[1], 1);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, 0);
    execvp(cargv[0], cargv.data());
    int e = errno;
    (void)!write(status_pipe[1], &e, sizeof(e));
    _exit(127);
  }
  setpgid(pid, pid);
  close(out[1]);
  close(status_pipe[1]);
  int exec_errno = 0;
  const bool exec_failed = read(status_pipe[0], &exec_errno, sizeof(exec_errno)) == sizeof(exec_errno);
  close(status_pipe[0]);
  const Nanos deadline = RealClock::Get()->MonotonicNanos() + timeout;
  for (;;) {
    const Nanos left = deadline - RealClock::Get()->MonotonicNanos();
    if (left <= 0) {
      r.timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(std::min<Nanos>(left / kMillisecond + 1, 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buf[4096];
    ssize_t n = read(out[0], buf, sizeof(buf));
    if (n <= 0) break;  // it closed its output: it is done
    if (r.output.size() < (1 << 20)) r.output.append(buf, static_cast<std::size_t>(n));
  }
  close(out[0]);
  if (r.timed_out) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  kill(-pid, SIGKILL);  // what it forked, should anything outlive it
  if (exec_failed) {
    r.error = std::strerror(exec_errno);
    return r;
  }
  r.started = true;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status) && !r.timed_out) r.signal = WTERMSIG(status);
  return r;
}

}  // namespace trainguard
