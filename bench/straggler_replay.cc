// Replays a job's stored step timings (a trainguard store, SQLite) through
// the straggler detector under the policy shipped, the previous one, and
// the shipped one with each of its issue-43 parts switched off, and prints
// what each names and when: the same steps for every policy, so a change
// to the detector is judged apart from the run-to-run noise of real jobs.
//
//   build/bench/straggler_replay --store s.db --job JOB [--generation 0]
#include <sqlite3.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "controller/straggler_detector.h"
#include "store/step_timing_text.h"

using namespace trainguard;

namespace {

struct Variant {
  std::string name;
  StragglerPolicy policy;
};

std::vector<Variant> Variants() {
  struct Switch {
    const char* name;
    bool StragglerPolicy::*member;
  };
  const Switch switches[] = {{"refine_mean", &StragglerPolicy::refine_mean},
                             {"window_noise_gate", &StragglerPolicy::window_noise_gate},
                             {"pooled_noise", &StragglerPolicy::pooled_noise},
                             {"judge_while_learning", &StragglerPolicy::judge_while_learning},
                             {"cpu_time_measure", &StragglerPolicy::cpu_time_measure}};
  std::vector<Variant> v = {{"shipped", {}}};
  StragglerPolicy previous;
  for (const Switch& s : switches) {
    StragglerPolicy p;
    p.*s.member = false;
    previous.*s.member = false;
    v.push_back({std::string("without ") + s.name, p});
  }
  v.push_back({"previous (all five off)", previous});
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string store, job;
  int generation = 0;
  CLI::App app{"Replays a job's stored step timings through the straggler detector under several policies"};
  app.add_option("--store", store, "the trainguard store (SQLite file)")->required()->check(CLI::ExistingFile);
  app.add_option("--job", job, "the job id")->required();
  app.add_option("--generation", generation, "the generation replayed");
  CLI11_PARSE(app, argc, argv);

  sqlite3* db = nullptr;
  if (sqlite3_open_v2(store.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    std::fprintf(stderr, "cannot open %s: %s\n", store.c_str(), sqlite3_errmsg(db));
    return 2;
  }
  sqlite3_stmt* q = nullptr;
  const char* sql =
      "SELECT step, rank, node, duration_us, totals FROM step_timings WHERE job_id=? AND generation=? "
      "ORDER BY step, rank";
  if (sqlite3_prepare_v2(db, sql, -1, &q, nullptr) != SQLITE_OK) {
    std::fprintf(stderr, "%s: %s\n", store.c_str(), sqlite3_errmsg(db));
    sqlite3_close(db);
    return 2;
  }
  sqlite3_bind_text(q, 1, job.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(q, 2, generation);
  std::map<std::int64_t, std::vector<RankStep>> steps;
  int ranks = 0;
  while (sqlite3_step(q) == SQLITE_ROW) {
    RankStep s;
    s.step = sqlite3_column_int64(q, 0);
    s.rank = sqlite3_column_int(q, 1);
    s.node = reinterpret_cast<const char*>(sqlite3_column_text(q, 2));
    s.step_us = static_cast<double>(sqlite3_column_int64(q, 3));
    const unsigned char* text = sqlite3_column_text(q, 4);
    auto totals = DecodeTotals(text ? reinterpret_cast<const char*>(text) : "");
    if (!totals.ok()) {
      std::fprintf(stderr, "step %lld rank %d: %s\n", static_cast<long long>(s.step), s.rank,
                   totals.status().message().c_str());
      continue;
    }
    for (const auto& [key, us] : *totals) s.phases[key] += static_cast<double>(us);
    FillSignals(&s);
    ranks = std::max(ranks, s.rank + 1);
    steps[s.step].push_back(std::move(s));
  }
  sqlite3_finalize(q);
  sqlite3_close(db);
  if (steps.empty()) {
    std::fprintf(stderr, "no step timings of job %s, generation %d in %s\n", job.c_str(), generation, store.c_str());
    return 1;
  }
  std::printf("job %s generation %d: %zu steps of %d ranks\n", job.c_str(), generation, steps.size(), ranks);
  for (const Variant& v : Variants()) {
    StragglerDetector d(v.policy);
    d.Reset(ranks);
    std::printf("%-30s", v.name.c_str());
    int said = 0;
    for (const auto& [step, of_ranks] : steps) {
      for (const RankStep& s : of_ranks) d.Add(s);
      for (const auto& f : d.Evaluate()) {
        if (f.kind != StragglerKind::kStraggler) continue;
        std::printf("%s %s at %lld (%s, from %lld)", said++ ? ";" : "", f.unit.c_str(),
                    static_cast<long long>(f.last_step), f.measure.empty() ? "windows" : f.measure.c_str(),
                    static_cast<long long>(f.first_step));
      }
    }
    std::printf("%s\n", said ? "" : " nobody named");
  }
  return 0;
}
