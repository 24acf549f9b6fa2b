// Warm standby ranks (docs/restart.md): a Python interpreter per local rank
// that has imported what the ranks import and waits, so that a restart skips
// the interpreter start and the imports. The Python side is
// python/trainguard/_standby.py, which documents the protocol.
//
// The agent makes one after a generation's first step and, at the next start,
// hands it the rank's environment, argv, directory and output pipes; the
// standby checks that it is still like a cold start (nothing it imported, nor
// the script or the interpreter, changed; no thread; no CUDA context) and
// becomes the rank, or says why not and the rank starts cold.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/process.h"
#include "common/clock.h"
#include "trainguard/status.h"

namespace trainguard {

// A rank command as a Python interpreter sees it: `PYTHON [options] script
// args...` or `PYTHON [options] -m module args...`.
struct PythonCommand {
  std::string interpreter;           // argv[0] as given
  std::vector<std::string> options;  // interpreter options before the target
  std::string script;                // the script, or "" with a module
  std::string module;
  std::vector<std::string> args;     // after the script or module
  // What the standby is made for: the script path, or "-m module".
  std::string target() const { return module.empty() ? script : "-m " + module; }
};

// The command as a Python one, or why a warm start cannot run it (not a
// Python interpreter, `-c`, `-` or no script, options that leave out
// trainguard's sitecustomize: -E, -I, -S).
StatusOr<PythonCommand> ParsePythonCommand(const std::vector<std::string>& argv);

// The standby's program, run with `-c`.
extern const char* const kStandbyProgram;

class Standby {
 public:
  enum class State { kImporting, kReady, kGone };

  // Starts the standby of one local rank: `env` is the environment of the
  // rank's last start (its status page and stacks file left out), `imports`
  // the file the rank wrote its modules into. `nice` is added to its
  // niceness while it imports (it restores the niceness itself when done).
  static StatusOr<Standby> Launch(const PythonCommand& cmd, std::map<std::string, std::string> env,
                                  const std::string& cwd, const std::string& imports, int nice,
                                  Nanos now_mono);
  Standby(Standby&& other) noexcept;
  Standby& operator=(Standby&& other) noexcept;
  Standby(const Standby&) = delete;
  Standby& operator=(const Standby&) = delete;
  ~Standby();  // kills it unless it became a rank (ReapKilled reaps it)

  // Reaps the standbys killed so far that have exited; never blocks. A
  // killed standby is not waited for where it is killed: it runs niced, and
  // on a busy node its exit can take seconds, which a rank's start must not
  // wait for (a cold start behind a standby still importing was delayed 2 s).
  static void ReapKilled();
  // How many killed standbys are not reaped yet.
  static std::size_t KilledNotReaped();

  // Reads its ready message or notices its exit; never blocks.
  void Poll();
  State state() const { return state_; }
  // Why it is gone (state kGone), e.g. "import of numpy failed: ...".
  const std::string& reason() const { return reason_; }
  pid_t pid() const { return pid_; }
  std::int64_t rss_kb() const { return rss_kb_; }
  Nanos launched_mono() const { return launched_mono_; }
  const std::string& target() const { return target_; }

  // Its rank is wanted (a start came, or the node's ranks are stopping):
  // while it imports, it runs at the ranks' policy and niceness from now
  // on, not only on idle CPU time. Once; a no-op for a standby launched at
  // the ranks' priority, or one that is ready or gone.
  void Hurry();
  // Gives up on it (a start will not wait any longer): killed, `why` kept.
  void Abandon(const std::string& why) { Kill(why); }

  // Makes it the rank: `env`, `cwd` and `argv` are the rank's cold start
  // (argv[0] the interpreter). Waits at most `timeout` for its answer. On
  // success the process is the rank's (this object lets go of it); on
  // failure the standby is killed and the error says why.
  StatusOr<SpawnedProcess> Activate(const PythonCommand& cmd, const std::vector<std::string>& argv,
                                    const std::map<std::string, std::string>& env,
                                    const std::string& cwd, Nanos timeout);

 private:
  Standby() = default;
  void Kill(const std::string& why);

  pid_t pid_ = -1;
  int control_fd_ = -1;
  int stdout_fd_ = -1;  // the standby's own output (import warnings): drained, then closed
  int stderr_fd_ = -1;
  State state_ = State::kImporting;
  std::string reason_;
  std::string target_;
  std::int64_t rss_kb_ = 0;
  Nanos launched_mono_ = 0;
  int ranks_nice_ = 0;  // the niceness the ranks run at (the agent's)
  bool niced_ = false;  // launched at SCHED_IDLE and a higher niceness, not hurried yet
};

}  // namespace trainguard
