// Bounded waits for tests: poll a condition until it holds or a deadline
// passes, never sleep and hope (STYLE.md, rule 10).
//
//   ASSERT_TRUE(WaitUntil([&] { return link.reconnect_calls() >= 2; }, 2s));
//   EXPECT_TRUE(HoldsFor([&] { return Alive(pid); }, 100ms));
//
// Header-only; linked into every test through the `tg_testing` target. Not
// for production code, which takes its clock and timers injected.
#pragma once

#include <chrono>
#include <thread>

namespace trainguard::testutil {

// Polls `done` every `poll` until it returns true (then true) or `timeout`
// has passed (then false, after one last call).
template <typename Pred>
bool WaitUntil(Pred&& done, std::chrono::milliseconds timeout,
               std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!static_cast<bool>(done())) {
    if (std::chrono::steady_clock::now() >= deadline) return static_cast<bool>(done());
    std::this_thread::sleep_for(poll);
  }
  return true;
}

// Whether `holds` stays true at every poll for the whole of `period`: for a
// test that something does NOT happen (a rank that must stay alive), where no
// event marks the end of the wait.
template <typename Pred>
bool HoldsFor(Pred&& holds, std::chrono::milliseconds period,
              std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  const auto end = std::chrono::steady_clock::now() + period;
  while (std::chrono::steady_clock::now() < end) {
    if (!static_cast<bool>(holds())) return false;
    std::this_thread::sleep_for(poll);
  }
  return static_cast<bool>(holds());
}

}  // namespace trainguard::testutil
