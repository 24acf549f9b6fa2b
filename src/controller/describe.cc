#include "controller/describe.h"

#include <cstdio>

namespace trainguard {

std::string Seconds(Nanos d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f s", static_cast<double>(d) / kSecond);
  return buf;
}

std::string DescribeExit(const v1::RankStatus& r) {
  if (r.term_signal() != 0) return "was killed by signal " + std::to_string(r.term_signal());
  return "exited with code " + std::to_string(r.exit_code());
}

std::string AtStep(std::int64_t step) {
  return step >= 0 ? " at step " + std::to_string(step) : " before any step";
}

nlohmann::json RankJson(const v1::RankStatus& r) {
  return {{"rank", r.global_rank()},   {"local_rank", r.local_rank()},
          {"pid", r.pid()},            {"step", r.step()},
          {"phase", r.phase()},        {"progress_age_ms", r.progress_age_ms()},
          {"activity_age_ms", r.activity_sampled() ? r.activity_age_ms() : -1},
          {"proc_state", r.proc_state()}, {"checkpoint_step", r.checkpoint_step()}};
}

}  // namespace trainguard
