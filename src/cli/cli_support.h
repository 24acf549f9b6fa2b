// What the subcommands share: where this binary, its Python package and the
// shipped rules are, the host name, default job ids and store paths, the
// rule set with operator files merged, and the signal watcher the
// long-running commands use.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "attribution/attribution.h"
#include "cli/commands.h"
#include "store/event_store.h"
#include "trainguard/status.h"

namespace trainguard {

std::string SelfExe();
// Where the Python package sits next to the binary (build tree or install); "" if nowhere.
std::string PythonDir();
// The shipped attribution rules next to the binary or installed; "" if nowhere.
std::string DefaultRulesPath();
std::string DefaultJobId();
std::string Hostname();
// The shipped attribution rules ($TRAINGUARD_RULES overrides the file), with
// operator rule files merged over them.
StatusOr<RuleSet> LoadRulesFor(const std::vector<std::string>& extra);

// Opens o.store and picks the job: o.job_id, or the newest. False, with the
// error said on stderr, if the store is not there or has no such job.
bool OpenJob(const EventsOptions& o, std::unique_ptr<EventStore>* store, std::string* job_id);

// Blocks SIGINT/SIGTERM in every thread created after this and returns a
// thread that turns them into `on_signal` calls.
class SignalWatcher {
 public:
  template <typename F>
  explicit SignalWatcher(F on_signal) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGUSR2);  // used to wake the watcher on exit
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    signal(SIGPIPE, SIG_IGN);
    thread_ = std::thread([set, on_signal] {
      for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig) != 0) continue;
        if (sig == SIGUSR2) return;
        on_signal(sig);
      }
    });
  }
  ~SignalWatcher() {
    pthread_kill(thread_.native_handle(), SIGUSR2);
    thread_.join();
  }

 private:
  std::thread thread_;
};

}  // namespace trainguard
