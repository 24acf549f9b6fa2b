// A thread that takes no process signals: SIGINT and SIGTERM must reach the
// daemon's signal watcher (cli), whichever threads were made before it. The
// thread starts with every signal blocked, the mask it inherits from here.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

namespace trainguard {

template <typename F>
std::thread SignalFreeThread(F&& body) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  std::thread t(std::forward<F>(body));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return t;
}

}  // namespace trainguard
