#include "controller/describe.h"

#include <cstdio>
#include <set>
#include <sstream>

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
  nlohmann::json j = {{"rank", r.global_rank()},   {"local_rank", r.local_rank()},
                      {"pid", r.pid()},            {"step", r.step()},
                      {"phase", r.phase()},        {"progress_age_ms", r.progress_age_ms()},
                      {"activity_age_ms", r.activity_sampled() ? r.activity_age_ms() : -1},
                      {"proc_state", r.proc_state()}, {"checkpoint_step", r.checkpoint_step()}};
  for (const auto& b : r.blocked_io()) {
    j["blocked_io"].push_back({{"pid", b.pid()}, {"tid", b.tid()}, {"call", b.call()}, {"path", b.path()},
                               {"mount_point", b.mount_point()}, {"fstype", b.fstype()},
                               {"source", b.source()}, {"blocked_ms", b.blocked_ms()}});
  }
  return j;
}

nlohmann::json RankErrorJson(const v1::RankError& e) {
  return {{"type", e.type()},
          {"message", e.message()},
          {"traceback", e.traceback()},
          {"timestamp_unix_s", e.timestamp_unix_s()},
          {"path", e.path()}};
}

std::vector<std::string> RankErrorLines(const v1::RankError& e,
                                        const std::vector<std::string>& seen) {
  std::vector<std::string> lines;
  std::set<std::string> known(seen.begin(), seen.end());
  std::istringstream traceback(e.traceback());
  for (std::string line; std::getline(traceback, line);) {
    if (!line.empty() && !known.count(line)) lines.push_back(line);
  }
  if (!e.message().empty() && !known.count(e.message())) lines.push_back(e.message());
  return lines;
}

}  // namespace trainguard
